// Package certgen makes X.509 certificate authorities and the certificates
// they sign for Shale nodes and clients, with Go's crypto/x509 only (no
// openssl). `shalectl cert`, `SHALE_TLS=1 make run` and the TLS tests use
// it. Keys are ECDSA P-256; certificates carry the key usages that
// crypto/tls checks (a node's certificate serves and authenticates as a
// client, for its peer connections; a client's only authenticates).
package certgen

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultCALifetime and DefaultCertLifetime are how long a CA and an
// issued certificate stay valid when Options leave it open: ten years and
// a year less a day (some clients refuse longer leaf lifetimes).
const (
	DefaultCALifetime   = 10 * 365 * 24 * time.Hour
	DefaultCertLifetime = 364 * 24 * time.Hour
)

// ErrKeyMismatch is returned (wrapped) by Load when the key file holds the
// key of another certificate.
var ErrKeyMismatch = errors.New("the key does not belong to the certificate")

// Pair is a certificate and its private key, parsed and PEM-encoded.
type Pair struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// Options describe a certificate to issue.
type Options struct {
	// CommonName is the subject's CN: a node's name, or a client's user
	// name (with client-certificate authentication, the CN is the user).
	CommonName string
	// Hosts are the DNS names and IP addresses the certificate is valid
	// for (a node's --advertise host, localhost, 127.0.0.1, ...).
	Hosts []string
	// Server and Client set the extended key usages: a node's certificate
	// has both, a user's only Client.
	Server, Client bool
	// NotBefore and NotAfter bound the validity. Zero NotBefore: an hour
	// ago (clocks differ); zero NotAfter: NotBefore + Lifetime.
	NotBefore, NotAfter time.Time
	// Lifetime is used when NotAfter is zero (default
	// DefaultCertLifetime, or DefaultCALifetime for a CA).
	Lifetime time.Duration
}

// NewCA makes a self-signed certificate authority named cn.
func NewCA(cn string, opts Options) (*Pair, error) {
	if cn == "" {
		return nil, errors.New("certgen: a CA needs a name")
	}
	opts.CommonName = cn
	if opts.Lifetime == 0 {
		opts.Lifetime = DefaultCALifetime
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certgen: generate CA key: %w", err)
	}
	tmpl, err := template(opts)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = nil
	return sign(tmpl, tmpl, key, key)
}

// Issue signs a new certificate described by opts with ca. The
// certificate's validity ends no later than the CA's.
func (ca *Pair) Issue(opts Options) (*Pair, error) {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return nil, errors.New("certgen: the issuer needs a certificate and its key")
	}
	if !ca.Cert.IsCA {
		return nil, fmt.Errorf("certgen: %q is not a CA certificate", ca.Cert.Subject.CommonName)
	}
	if ca.Cert.KeyUsage != 0 && ca.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("certgen: CA %q may not sign certificates (no certSign key usage)", ca.Cert.Subject.CommonName)
	}
	if opts.CommonName == "" {
		return nil, errors.New("certgen: a certificate needs a common name")
	}
	if !opts.Server && !opts.Client {
		return nil, errors.New("certgen: a certificate must be for a server, a client or both")
	}
	if opts.Lifetime == 0 {
		opts.Lifetime = DefaultCertLifetime
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certgen: generate key: %w", err)
	}
	tmpl, err := template(opts)
	if err != nil {
		return nil, err
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	if !tmpl.NotAfter.After(tmpl.NotBefore) {
		return nil, fmt.Errorf("certgen: CA %q expires (%v) before the certificate's validity starts (%v)",
			ca.Cert.Subject.CommonName, ca.Cert.NotAfter, tmpl.NotBefore)
	}
	return sign(tmpl, ca.Cert, key, ca.Key)
}

func template(opts Options) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certgen: serial number: %w", err)
	}
	nb := opts.NotBefore
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour).Truncate(time.Second)
	}
	na := opts.NotAfter
	if na.IsZero() {
		na = nb.Add(opts.Lifetime)
	}
	if !na.After(nb) {
		return nil, fmt.Errorf("certgen: validity ends (%v) before it starts (%v)", na, nb)
	}
	t := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: opts.CommonName, Organization: []string{"Shale"}},
		NotBefore:    nb,
		NotAfter:     na,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if opts.Server {
		t.ExtKeyUsage = append(t.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if opts.Client {
		t.ExtKeyUsage = append(t.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	seen := make(map[string]bool)
	for _, h := range opts.Hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			if !seen[ip.String()] {
				seen[ip.String()] = true
				t.IPAddresses = append(t.IPAddresses, ip)
			}
			continue
		}
		if err := checkDNSName(h); err != nil {
			return nil, err
		}
		if name := strings.ToLower(h); !seen[name] {
			seen[name] = true
			t.DNSNames = append(t.DNSNames, h)
		}
	}
	return t, nil
}

// checkDNSName accepts a host name for a certificate: dot-separated labels
// of letters, digits, '-' and '_', the first label possibly "*".
func checkDNSName(h string) error {
	bad := func(why string) error {
		return fmt.Errorf("certgen: host %q is neither an IP address nor a DNS name: %s", h, why)
	}
	if strings.Contains(h, ":") {
		return bad("it has a ':' (give the host without a port)")
	}
	if len(h) > 253 {
		return bad("longer than 253 characters")
	}
	for i, label := range strings.Split(h, ".") {
		if label == "*" && i == 0 {
			continue
		}
		if label == "" || len(label) > 63 {
			return bad("labels are 1 to 63 characters")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad(fmt.Sprintf("%q is not allowed", c))
			}
		}
	}
	return nil
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey crypto.Signer) (*Pair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("certgen: sign %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certgen: parse %q: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certgen: encode key: %w", err)
	}
	return &Pair{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// Load reads a certificate and its key from PEM files (for example a CA
// made by an earlier `shalectl cert create-ca`).
func Load(certFile, keyFile string) (*Pair, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("certgen: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("certgen: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("certgen: %s holds no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: %w", certFile, err)
	}
	kb, rest := pem.Decode(keyPEM)
	if kb != nil && kb.Type == "EC PARAMETERS" {
		// openssl ecparam -genkey writes the curve's parameters first.
		kb, _ = pem.Decode(rest)
	}
	if kb == nil {
		return nil, fmt.Errorf("certgen: %s holds no PEM key", keyFile)
	}
	var key any
	switch kb.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	default:
		return nil, fmt.Errorf("certgen: %s: unsupported PEM block %q", keyFile, kb.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: %w", keyFile, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("certgen: %s: the key cannot sign", keyFile)
	}
	if !publicKeysEqual(signer.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("certgen: %s and %s: %w", keyFile, certFile, ErrKeyMismatch)
	}
	return &Pair{Cert: cert, Key: signer, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

// Write stores the certificate and key as PEM files (the key readable by
// its owner only), each through a temporary file renamed into place, so a
// process re-reading them never sees half a file. Missing directories are
// made. The key is written first.
func (p *Pair) Write(certFile, keyFile string) error {
	if err := WriteFile(keyFile, p.KeyPEM, 0o600); err != nil {
		return err
	}
	return WriteFile(certFile, p.CertPEM, 0o644)
}

// WriteFile writes data to name with permissions perm through a
// temporary file in the same directory, synced and renamed into place; the
// directory is then synced too, so the new file survives a crash.
func WriteFile(name string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(perm)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, name)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("certgen: write %s: %w", name, werr)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("certgen: write %s: sync directory: %w", name, err)
	}
	return nil
}

// syncDir fsyncs a directory, making a rename in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
