package harness

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/certgen"
)

// Users of a secured cluster (every cluster but Options.Insecure): root
// (role root) for the harness's and the tests' admin calls, and the
// workload user, who may read and write every key and nothing else.
const (
	RootUser     = "root"
	WorkloadUser = "chaos"
	// workloadRole is the workload user's role: READWRITE on the whole
	// key space.
	workloadRole = "chaos-readwrite"
)

// Where a node's TLS files are in its container, copied there before it
// first starts (they stay across restarts: the container is the same).
const (
	tlsDir      = "/tls"
	tlsCAFile   = tlsDir + "/ca.crt"
	tlsCertFile = tlsDir + "/node.crt"
	tlsKeyFile  = tlsDir + "/node.key"
)

// security is a secured cluster's CA, its users' client certificates and
// passwords.
type security struct {
	ca *certgen.Pair
	// rootTLS and userTLS trust the CA and present a client certificate
	// whose common name is root, or the workload user.
	rootTLS, userTLS *tls.Config
	rootPassword     string
	userPassword     string
}

func randomPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newSecurity makes a CA named after the cluster and the two users'
// client certificates.
func newSecurity(name string) (*security, error) {
	ca, err := certgen.NewCA(name+"-ca", certgen.Options{})
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	s := &security{ca: ca, rootPassword: randomPassword(), userPassword: randomPassword()}
	for _, u := range []struct {
		name string
		cfg  **tls.Config
	}{{RootUser, &s.rootTLS}, {WorkloadUser, &s.userTLS}} {
		p, err := ca.Issue(certgen.Options{CommonName: u.name, Client: true})
		if err != nil {
			return nil, fmt.Errorf("harness: client certificate of %s: %w", u.name, err)
		}
		*u.cfg = &tls.Config{
			RootCAs:      pool,
			Certificates: []tls.Certificate{{Certificate: [][]byte{p.Cert.Raw}, PrivateKey: p.Key, Leaf: p.Cert}},
			MinVersion:   tls.VersionTLS13,
		}
	}
	return s, nil
}

// tlsArgs are the TLS flags of every node: one certificate (for host,
// both key usages) for clients and peers, client certificates of the CA
// required, and peers only with a node's name (n1, n2, ...).
func tlsArgs() []string {
	return []string{
		"--cert-file=" + tlsCertFile, "--key-file=" + tlsKeyFile,
		"--trusted-ca-file=" + tlsCAFile, "--client-cert-auth",
		"--peer-cert-file=" + tlsCertFile, "--peer-key-file=" + tlsKeyFile,
		"--peer-trusted-ca-file=" + tlsCAFile, "--peer-allowed-cn=n*",
	}
}

// nodeCert issues the certificate of the node advertising host: for
// host, localhost and 127.0.0.1, to serve and to dial its peers.
func (s *security) nodeCert(host string) (*certgen.Pair, error) {
	p, err := s.ca.Issue(certgen.Options{CommonName: host, Hosts: []string{host, "localhost", "127.0.0.1"}, Server: true, Client: true})
	if err != nil {
		return nil, fmt.Errorf("harness: certificate of node %s: %w", host, err)
	}
	return p, nil
}

// installCertificates issues node n's certificate (for its advertised
// host, localhost and 127.0.0.1) and copies it, its key and the CA into
// the node's created container.
func (c *Cluster) installCertificates(ctx context.Context, n *Node) error {
	p, err := c.sec.nodeCert(n.Host)
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{{"ca.crt", c.sec.ca.CertPEM}, {"node.crt", p.CertPEM}, {"node.key", p.KeyPEM}}
	err = c.copyTar(ctx, n, "/", func(tw *tar.Writer) error {
		now := time.Now()
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: tlsDir[1:] + "/", Mode: 0o755, ModTime: now}); err != nil {
			return err
		}
		for _, f := range files {
			// Readable by the image's non-root user: docker cp makes the
			// files root's.
			if err := tw.WriteHeader(&tar.Header{Name: tlsDir[1:] + "/" + f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: now}); err != nil {
				return err
			}
			if _, err := tw.Write(f.data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("harness: copy the TLS files into node %s: %w", n.Host, err)
	}
	return nil
}

// enableAuth adds root and the workload user, and turns auth on.
func (c *Cluster) enableAuth(ctx context.Context) error {
	cl, err := c.newClient(ctx, c.sec.rootTLS, client.WithDefaultTimeout(30*time.Second))
	if err != nil {
		return fmt.Errorf("harness: enable auth: %w", err)
	}
	defer cl.Close()
	steps := []struct {
		what string
		do   func() error
	}{
		{"add user root", func() error { return cl.UserAdd(ctx, RootUser, c.sec.rootPassword, false) }},
		{"grant root the role root", func() error { return cl.UserGrantRole(ctx, RootUser, "root") }},
		{"add role " + workloadRole, func() error { return cl.RoleAdd(ctx, workloadRole) }},
		{"grant " + workloadRole + " the key space", func() error {
			return cl.RoleGrantPermission(ctx, workloadRole, &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Key: nil, Prefix: true})
		}},
		{"add user " + WorkloadUser, func() error { return cl.UserAdd(ctx, WorkloadUser, c.sec.userPassword, false) }},
		{"grant " + WorkloadUser + " its role", func() error { return cl.UserGrantRole(ctx, WorkloadUser, workloadRole) }},
		{"enable auth", func() error { return cl.AuthEnable(ctx) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("harness: %s: %w", s.what, err)
		}
	}
	c.log.Info("harness: TLS and auth on", "root", RootUser, "workload user", WorkloadUser)
	return nil
}

// Secure reports whether the cluster runs with TLS and auth (not
// Options.Insecure).
func (c *Cluster) Secure() bool { return c.sec != nil }

// nodeDialOption is the transport credentials of the harness's own gRPC
// connections to node n (dialed by its client network address): TLS
// checking the node's certificate for its host name and presenting
// root's client certificate (the node identifies the caller as root by it),
// or plaintext.
func (c *Cluster) nodeDialOption(n *Node) grpc.DialOption {
	if c.sec == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	cfg := c.sec.rootTLS.Clone()
	cfg.ServerName = n.Host
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}
