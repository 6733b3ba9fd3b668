package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// PeerALPN is the ALPN protocol a node offers, next to "h2", when it dials
// another node: it asks for the peer side of the port (see the package
// documentation). It is never the negotiated protocol.
const PeerALPN = "shale-peer"

// DefaultReloadInterval is how often a node looks for changed certificate
// files when ServerConfig.ReloadInterval is zero.
const DefaultReloadInterval = 5 * time.Second

// ServerConfig is a node's TLS configuration. The zero value is plaintext.
// The field comments name the shale-server flags that set them.
type ServerConfig struct {
	// CertFile and KeyFile are the certificate the node presents to
	// clients, and on its HTTP port (--cert-file, --key-file).
	CertFile, KeyFile string
	// TrustedCAFile is the CA bundle client certificates are verified
	// against (--trusted-ca-file). Without it, clients cannot
	// authenticate with certificates.
	TrustedCAFile string
	// ClientCertAuth requires every client to present a certificate signed
	// by TrustedCAFile (--client-cert-auth); otherwise one is verified only
	// when given.
	ClientCertAuth bool
	// PeerCertFile and PeerKeyFile are the certificate the node presents
	// to other nodes, as server and as client (--peer-cert-file,
	// --peer-key-file); PeerTrustedCAFile is the CA bundle other nodes'
	// certificates are verified against (--peer-trusted-ca-file).
	PeerCertFile, PeerKeyFile, PeerTrustedCAFile string
	// PeerAllowedNames, when not empty, restricts peers to certificates
	// whose common name or one of whose DNS names matches one of these
	// patterns (path.Match syntax: "node-*.shale.svc") (--peer-allowed-cn).
	PeerAllowedNames []string
	// MinVersion is the oldest TLS version accepted (default TLS 1.3;
	// --tls-min-version).
	MinVersion uint16
	// ReloadInterval is how often Watch looks for changed files (default
	// DefaultReloadInterval).
	ReloadInterval time.Duration
}

// Enabled reports whether any TLS setting is given.
func (c ServerConfig) Enabled() bool {
	return c.CertFile != "" || c.KeyFile != "" || c.TrustedCAFile != "" || c.ClientCertAuth ||
		c.PeerCertFile != "" || c.PeerKeyFile != "" || c.PeerTrustedCAFile != "" || len(c.PeerAllowedNames) > 0
}

// Validate refuses half a configuration, naming the missing flag. The one
// port serves clients and peers, so TLS for one is TLS for both.
func (c ServerConfig) Validate() error {
	if !c.Enabled() {
		return nil
	}
	var missing []string
	need := func(v, flag string) {
		if v == "" {
			missing = append(missing, flag)
		}
	}
	need(c.CertFile, "--cert-file")
	need(c.KeyFile, "--key-file")
	need(c.PeerCertFile, "--peer-cert-file")
	need(c.PeerKeyFile, "--peer-key-file")
	need(c.PeerTrustedCAFile, "--peer-trusted-ca-file")
	if c.ClientCertAuth {
		need(c.TrustedCAFile, "--trusted-ca-file")
	}
	if len(missing) > 0 {
		given := c.givenFlags()
		why := "TLS on the node's port needs"
		if c.ClientCertAuth && c.TrustedCAFile == "" && len(missing) == 1 {
			why = "--client-cert-auth needs the CA that signs client certificates:"
		}
		return fmt.Errorf("incomplete TLS configuration: %s %s (given: %s; the peer flags may name the same files as the client ones)",
			why, strings.Join(missing, ", "), strings.Join(given, ", "))
	}
	for _, p := range c.PeerAllowedNames {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("--peer-allowed-cn %q: %w", p, err)
		}
	}
	switch c.MinVersion {
	case 0, tls.VersionTLS12, tls.VersionTLS13:
	default:
		return fmt.Errorf("TLS minimum version %#x: want TLS 1.2 or 1.3", c.MinVersion)
	}
	return nil
}

func (c ServerConfig) givenFlags() []string {
	var out []string
	add := func(ok bool, flag string) {
		if ok {
			out = append(out, flag)
		}
	}
	add(c.CertFile != "", "--cert-file")
	add(c.KeyFile != "", "--key-file")
	add(c.TrustedCAFile != "", "--trusted-ca-file")
	add(c.ClientCertAuth, "--client-cert-auth")
	add(c.PeerCertFile != "", "--peer-cert-file")
	add(c.PeerKeyFile != "", "--peer-key-file")
	add(c.PeerTrustedCAFile != "", "--peer-trusted-ca-file")
	add(len(c.PeerAllowedNames) > 0, "--peer-allowed-cn")
	return out
}

// ParseMinVersion parses "1.2" or "1.3" (the --tls-min-version values).
func ParseMinVersion(s string) (uint16, error) {
	switch s {
	case "1.2":
		return tls.VersionTLS12, nil
	case "1.3", "":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("TLS version %q: want 1.2 or 1.3", s)
}

// Server is a node's TLS: the credentials of its gRPC port (for clients and
// peers), of its HTTP port, and of its dials to other nodes, all reading
// the current material of its files.
type Server struct {
	cfg          ServerConfig
	client, peer *Source
	log          *slog.Logger
}

// NewServer validates cfg and reads its files. log receives handshake
// failures and reloads (nil: discard).
func NewServer(cfg ServerConfig, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, errors.New("tlsconfig: no TLS configuration given")
	}
	if cfg.MinVersion == 0 {
		cfg.MinVersion = tls.VersionTLS13
	}
	if cfg.ReloadInterval <= 0 {
		cfg.ReloadInterval = DefaultReloadInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	client, err := NewSource(Files{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, CAFile: cfg.TrustedCAFile}, log.With("tls", "client"))
	if err != nil {
		return nil, err
	}
	peerSrc, err := NewSource(Files{CertFile: cfg.PeerCertFile, KeyFile: cfg.PeerKeyFile, CAFile: cfg.PeerTrustedCAFile}, log.With("tls", "peer"))
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, client: client, peer: peerSrc, log: log}, nil
}

// Reload re-reads every file now (on SIGHUP, say), reporting errors of
// files that could not be used; the previous material then stays.
func (s *Server) Reload() error {
	_, e1 := s.client.Reload()
	_, e2 := s.peer.Reload()
	return errors.Join(e1, e2)
}

// Watch reloads the files every ReloadInterval until ctx ends.
func (s *Server) Watch(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.client.Watch(ctx, s.cfg.ReloadInterval)
	}()
	s.peer.Watch(ctx, s.cfg.ReloadInterval)
	<-done
}

// clientSideConfig is the configuration of a client's connection.
func (s *Server) clientSideConfig(nextProtos []string) *tls.Config {
	cfg := &tls.Config{
		Certificates: []tls.Certificate{*s.client.Certificate()},
		MinVersion:   s.cfg.MinVersion,
		NextProtos:   nextProtos,
	}
	if pool := s.client.Pool(); pool != nil {
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if s.cfg.ClientCertAuth {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return cfg
}

// peerSideConfig is the configuration of another node's connection.
func (s *Server) peerSideConfig() *tls.Config {
	return &tls.Config{
		Certificates:     []tls.Certificate{*s.peer.Certificate()},
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        s.peer.Pool(),
		MinVersion:       s.cfg.MinVersion,
		NextProtos:       []string{"h2"},
		VerifyConnection: s.checkPeerName,
	}
}

// checkPeerName applies PeerAllowedNames to the other end's certificate.
func (s *Server) checkPeerName(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tlsconfig: the peer presented no certificate")
	}
	if !s.allowedPeer(cs.PeerCertificates[0]) {
		c := cs.PeerCertificates[0]
		return fmt.Errorf("tlsconfig: peer certificate %q (DNS names %v) is not allowed by --peer-allowed-cn %v", c.Subject.CommonName, c.DNSNames, s.cfg.PeerAllowedNames)
	}
	return nil
}

func (s *Server) allowedPeer(c *x509.Certificate) bool {
	if len(s.cfg.PeerAllowedNames) == 0 {
		return true
	}
	names := append([]string{c.Subject.CommonName}, c.DNSNames...)
	for _, p := range s.cfg.PeerAllowedNames {
		for _, n := range names {
			if ok, _ := path.Match(p, n); ok {
				return true
			}
		}
	}
	return false
}

// configForHello chooses the peer or the client side of the port.
func (s *Server) configForHello(hello *tls.ClientHelloInfo) (*tls.Config, error) {
	if slices.Contains(hello.SupportedProtos, PeerALPN) {
		return s.peerSideConfig(), nil
	}
	return s.clientSideConfig([]string{"h2"}), nil
}

// peerName returns the peer identity the connection's certificate proves:
// a node certificate (usable both as server and as client certificate, as
// node certificates are and user certificates are not) chaining to the
// current peer CA, allowed by PeerAllowedNames.
func (s *Server) peerName(cs tls.ConnectionState) (string, bool) {
	if len(cs.PeerCertificates) == 0 {
		return "", false
	}
	leaf := cs.PeerCertificates[0]
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return "", false
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         s.peer.Pool(),
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return "", false
	}
	if !s.allowedPeer(leaf) {
		return "", false
	}
	return leaf.Subject.CommonName, true
}

// AuthInfo is the gRPC AuthInfo of a connection to a node's TLS port: the
// TLS state, and the peer identity its certificate proves, if any.
type AuthInfo struct {
	credentials.TLSInfo
	// Peer is set when the connection's certificate is a node's (signed by
	// the peer CA and allowed); PeerName is then its common name.
	Peer     bool
	PeerName string
}

// PeerName returns the common name of the node certificate the caller of
// an RPC connected with; ok is false for connections that are not a
// node's (plaintext ones included).
func PeerName(ctx context.Context) (name string, ok bool) {
	p, found := peer.FromContext(ctx)
	if !found {
		return "", false
	}
	ai, isOurs := p.AuthInfo.(AuthInfo)
	if !isOurs || !ai.Peer {
		return "", false
	}
	return ai.PeerName, true
}

// ClientCertName returns the common name of the verified client
// certificate the caller of an RPC connected with, if any.
func ClientCertName(ctx context.Context) (string, bool) {
	p, found := peer.FromContext(ctx)
	if !found {
		return "", false
	}
	var cs tls.ConnectionState
	switch ai := p.AuthInfo.(type) {
	case AuthInfo:
		cs = ai.State
	case credentials.TLSInfo:
		cs = ai.State
	default:
		return "", false
	}
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", false
	}
	return cs.VerifiedChains[0][0].Subject.CommonName, true
}

// ServerCredentials are the transport credentials of the node's gRPC port.
func (s *Server) ServerCredentials() credentials.TransportCredentials {
	return &serverCreds{s: s}
}

type serverCreds struct {
	s *Server
}

func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn := tls.Server(raw, &tls.Config{GetConfigForClient: c.s.configForHello, MinVersion: c.s.cfg.MinVersion})
	if err := conn.Handshake(); err != nil {
		c.s.log.Warn("TLS handshake refused", "remote", raw.RemoteAddr().String(), "err", err)
		lingerForAlert(raw)
		raw.Close()
		return nil, nil, err
	}
	state := conn.ConnectionState()
	info := credentials.TLSInfo{State: state, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	name, isPeer := c.s.peerName(state)
	return conn, AuthInfo{TLSInfo: info, Peer: isPeer, PeerName: name}, nil
}

// alertLinger bounds how long a refused connection is kept open for the
// client to read the TLS alert that says why.
const alertLinger = time.Second

// lingerForAlert reads and drops what the client sends until it closes the
// connection, for at most alertLinger. Under TLS 1.3 a client learns that
// its certificate was refused only after its handshake is done and it has
// written its first request: closing at once would answer that request
// with a reset ("broken pipe") instead of the alert ("unknown certificate
// authority", "certificate required").
func lingerForAlert(raw net.Conn) {
	_ = raw.SetReadDeadline(time.Now().Add(alertLinger))
	buf := make([]byte, 4096)
	for {
		if _, err := raw.Read(buf); err != nil {
			return
		}
	}
}

func (c *serverCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsconfig: server credentials cannot dial")
}

func (c *serverCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (c *serverCreds) Clone() credentials.TransportCredentials { return &serverCreds{s: c.s} }

//nolint:staticcheck // required by the interface
func (c *serverCreds) OverrideServerName(string) error { return nil }

// PeerDialCredentials are the transport credentials of the node's
// connections to other nodes: the peer certificate, the peer CA, the
// PeerALPN mark, and the allow-list applied to the other node too.
func (s *Server) PeerDialCredentials() credentials.TransportCredentials {
	return &dialCreds{build: func() *tls.Config {
		cert := s.peer.Certificate()
		return &tls.Config{
			GetClientCertificate: alwaysPresent(cert),
			RootCAs:              s.peer.Pool(),
			MinVersion:           s.cfg.MinVersion,
			NextProtos:           []string{"h2", PeerALPN},
			VerifyConnection:     s.checkPeerName,
		}
	}}
}

// HTTPConfig is the TLS configuration of the node's HTTP port: the client
// certificate, and client certificates verified when given (HTTPAllowed
// tells a handler whether a request may see more than /healthz).
func (s *Server) HTTPConfig() *tls.Config {
	return &tls.Config{
		MinVersion: s.cfg.MinVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cfg := s.clientSideConfig([]string{"h2", "http/1.1"})
			if cfg.ClientAuth == tls.RequireAndVerifyClientCert {
				// Probes (kubelet) present no certificate; the
				// handlers require one where it matters.
				cfg.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return cfg, nil
		},
	}
}

// HTTPAllowed reports whether a request of the HTTP port with this TLS
// state may read metrics and profiles: always, unless client certificates
// are required, and then only with a verified one.
func (s *Server) HTTPAllowed(cs *tls.ConnectionState) bool {
	if !s.cfg.ClientCertAuth {
		return true
	}
	return cs != nil && len(cs.VerifiedChains) > 0
}

// ClientCredentials are transport credentials for a client of a TLS node:
// they trust src's CAs (the system's when src has none) and present src's
// certificate when it has one, reading src's current material on every
// handshake.
func ClientCredentials(src *Source) credentials.TransportCredentials {
	return &dialCreds{build: func() *tls.Config {
		cfg := &tls.Config{RootCAs: src.Pool(), MinVersion: tls.VersionTLS12}
		if c := src.Certificate(); c != nil {
			cfg.GetClientCertificate = alwaysPresent(c)
		}
		return cfg
	}}
}

// alwaysPresent presents cert whatever CAs the server names as acceptable
// (crypto/tls would otherwise send no certificate when cert's issuer is
// not among them, and the server could only say "certificate required"
// instead of "unknown certificate authority").
func alwaysPresent(cert *tls.Certificate) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
}

// dialCreds build a fresh tls.Config for every handshake, so that rotated
// files take effect on the next connection.
type dialCreds struct {
	build func() *tls.Config
}

func (c *dialCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.build()).ClientHandshake(ctx, authority, raw)
}

func (c *dialCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsconfig: dial credentials cannot serve")
}

func (c *dialCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (c *dialCreds) Clone() credentials.TransportCredentials { return &dialCreds{build: c.build} }

//nolint:staticcheck // required by the interface
func (c *dialCreds) OverrideServerName(string) error { return nil }
