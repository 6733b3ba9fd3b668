package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// newCA makes a CA or fails the test.
func newCA(t *testing.T, opts Options) *Pair {
	t.Helper()
	ca, err := NewCA("Test CA", opts)
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	return ca
}

// issue issues a certificate or fails the test.
func issue(t *testing.T, ca *Pair, opts Options) *Pair {
	t.Helper()
	p, err := ca.Issue(opts)
	if err != nil {
		t.Fatalf("Issue(%+v): %v", opts, err)
	}
	return p
}

// verify checks cert against ca for usage (and host, when not empty) at
// time now (the zero time: time.Now).
func verify(cert *x509.Certificate, ca *Pair, usage x509.ExtKeyUsage, host string, now time.Time) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err := cert.Verify(x509.VerifyOptions{
		Roots:       roots,
		DNSName:     host,
		KeyUsages:   []x509.ExtKeyUsage{usage},
		CurrentTime: now,
	})
	return err
}

func TestCA(t *testing.T) {
	t.Parallel()
	before := time.Now()
	ca := newCA(t, Options{})
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("CA basic constraints: IsCA %v, valid %v, MaxPathLen %d, zero %v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA key usage %v lacks certSign", c.KeyUsage)
	}
	if c.Subject.CommonName != "Test CA" || c.Issuer.CommonName != "Test CA" {
		t.Errorf("CA subject %q, issuer %q", c.Subject, c.Issuer)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("CA is not self-signed: %v", err)
	}
	if k, ok := ca.Key.(*ecdsa.PrivateKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("CA key is %T, want an ECDSA P-256 key", ca.Key)
	}
	// Default validity: from an hour ago (clock skew), for ten years.
	if nb := c.NotBefore; nb.After(before.Add(-59*time.Minute)) || nb.Before(before.Add(-61*time.Minute)) {
		t.Errorf("CA NotBefore %v, want about an hour before %v", nb, before)
	}
	if got := c.NotAfter.Sub(c.NotBefore); got != DefaultCALifetime {
		t.Errorf("CA lifetime %v, want %v", got, DefaultCALifetime)
	}
	if _, err := NewCA("", Options{}); err == nil {
		t.Error("NewCA with no name succeeded")
	}
}

// TestNodeCertificate issues a node's certificate (server and client
// usages, DNS and IP names) and verifies it against the CA for both
// usages, as the two ends of a peer connection do.
func TestNodeCertificate(t *testing.T) {
	t.Parallel()
	ca := newCA(t, Options{})
	node := issue(t, ca, Options{
		CommonName: "node1",
		Hosts:      []string{"node1.shale.svc", "localhost", "127.0.0.1", "::1", "", "LOCALHOST", "127.0.0.1"},
		Server:     true,
		Client:     true,
	})
	c := node.Cert
	if c.Subject.CommonName != "node1" || c.Issuer.CommonName != "Test CA" || c.IsCA {
		t.Errorf("node cert: subject %q, issuer %q, IsCA %v", c.Subject, c.Issuer, c.IsCA)
	}
	// Empty hosts are skipped and duplicates dropped.
	if !slices.Equal(c.DNSNames, []string{"node1.shale.svc", "localhost"}) {
		t.Errorf("DNS SANs %q", c.DNSNames)
	}
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	if !slices.Equal(ips, []string{"127.0.0.1", "::1"}) {
		t.Errorf("IP SANs %q", ips)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Errorf("extended key usages %v, want server and client auth", c.ExtKeyUsage)
	}
	if got := c.NotAfter.Sub(c.NotBefore); got != DefaultCertLifetime {
		t.Errorf("lifetime %v, want %v", got, DefaultCertLifetime)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, host := range []string{"", "node1.shale.svc", "localhost", "127.0.0.1", "::1"} {
			if err := verify(c, ca, usage, host, time.Time{}); err != nil {
				t.Errorf("verify for usage %v, host %q: %v", usage, host, err)
			}
		}
	}
	var hostErr x509.HostnameError
	if err := verify(c, ca, x509.ExtKeyUsageServerAuth, "node2.shale.svc", time.Time{}); !errors.As(err, &hostErr) {
		t.Errorf("verify for a host not in the certificate: %v, want a HostnameError", err)
	}
	var unknown x509.UnknownAuthorityError
	if err := verify(c, newCA(t, Options{}), x509.ExtKeyUsageServerAuth, "", time.Time{}); !errors.As(err, &unknown) {
		t.Errorf("verify against another CA: %v, want an UnknownAuthorityError", err)
	}
}

// TestClientCertificate: a user's certificate authenticates a client and
// cannot serve.
func TestClientCertificate(t *testing.T) {
	t.Parallel()
	ca := newCA(t, Options{})
	cl := issue(t, ca, Options{CommonName: "root", Client: true})
	if !slices.Equal(cl.Cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("extended key usages %v, want client auth only", cl.Cert.ExtKeyUsage)
	}
	if len(cl.Cert.DNSNames)+len(cl.Cert.IPAddresses) != 0 {
		t.Errorf("client cert has SANs %v %v", cl.Cert.DNSNames, cl.Cert.IPAddresses)
	}
	if err := verify(cl.Cert, ca, x509.ExtKeyUsageClientAuth, "", time.Time{}); err != nil {
		t.Errorf("verify for client auth: %v", err)
	}
	var inv x509.CertificateInvalidError
	err := verify(cl.Cert, ca, x509.ExtKeyUsageServerAuth, "", time.Time{})
	if !errors.As(err, &inv) || inv.Reason != x509.IncompatibleUsage {
		t.Errorf("verify a client-only cert for server auth: %v, want an IncompatibleUsage error", err)
	}
	// And a server-only certificate cannot authenticate a client.
	srv := issue(t, ca, Options{CommonName: "web", Hosts: []string{"localhost"}, Server: true})
	err = verify(srv.Cert, ca, x509.ExtKeyUsageClientAuth, "", time.Time{})
	if !errors.As(err, &inv) || inv.Reason != x509.IncompatibleUsage {
		t.Errorf("verify a server-only cert for client auth: %v, want an IncompatibleUsage error", err)
	}
}

// TestMutualTLS runs a TLS 1.3 handshake with the certificates as a node
// and a client use them: each side verifies the other against the CA, and
// the server sees the client's CN.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca := newCA(t, Options{})
	node := issue(t, ca, Options{CommonName: "node1", Hosts: []string{"localhost"}, Server: true, Client: true})
	user := issue(t, ca, Options{CommonName: "alice", Client: true})
	keyPair := func(p *Pair) tls.Certificate {
		c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatalf("tls.X509KeyPair(%s): %v", p.Cert.Subject.CommonName, err)
		}
		return c
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.CertPEM) {
		t.Fatal("CA PEM not accepted by CertPool")
	}
	handshake := func(client tls.Certificate) (string, error) {
		cc, sc := net.Pipe()
		defer cc.Close()
		defer sc.Close()
		srv := tls.Server(sc, &tls.Config{
			Certificates: []tls.Certificate{keyPair(node)},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS13,
		})
		cn := make(chan string, 1)
		go func() {
			defer close(cn)
			if err := srv.Handshake(); err == nil {
				cn <- srv.ConnectionState().PeerCertificates[0].Subject.CommonName
			}
			srv.Close()
		}()
		cli := tls.Client(cc, &tls.Config{
			Certificates: []tls.Certificate{client},
			RootCAs:      pool,
			ServerName:   "localhost",
			MinVersion:   tls.VersionTLS13,
		})
		err := cli.Handshake()
		if err == nil {
			// In TLS 1.3 the server checks the client's certificate after
			// the client's handshake ends: read to learn its verdict.
			_, err = cli.Read(make([]byte, 1))
		}
		return <-cn, err
	}
	for _, c := range []struct {
		name string
		cert tls.Certificate
		cn   string
	}{{"user", keyPair(user), "alice"}, {"node", keyPair(node), "node1"}} {
		cn, err := handshake(c.cert)
		if cn != c.cn {
			t.Errorf("%s: server saw client CN %q (client error %v), want %q", c.name, cn, err, c.cn)
		}
	}
	// A server-only certificate is refused as a client's.
	web := issue(t, ca, Options{CommonName: "web", Hosts: []string{"localhost"}, Server: true})
	if cn, err := handshake(keyPair(web)); cn != "" || err == nil {
		t.Errorf("server-only cert as a client's: server saw %q, client error %v; want a failed handshake", cn, err)
	}
}

func TestValidity(t *testing.T) {
	t.Parallel()
	now := time.Now().Truncate(time.Second)
	// A CA valid since three days ago, so that Verify can go back in time.
	ca := newCA(t, Options{NotBefore: now.Add(-72 * time.Hour)})

	nb, na := now.Add(-2*time.Hour), now.Add(3*time.Hour)
	p := issue(t, ca, Options{CommonName: "n", Server: true, NotBefore: nb, NotAfter: na})
	if !p.Cert.NotBefore.Equal(nb) || !p.Cert.NotAfter.Equal(na) {
		t.Errorf("validity %v to %v, want %v to %v", p.Cert.NotBefore, p.Cert.NotAfter, nb, na)
	}
	// Lifetime counts from NotBefore when NotAfter is open.
	p = issue(t, ca, Options{CommonName: "n", Server: true, NotBefore: nb, Lifetime: 5 * time.Hour})
	if !p.Cert.NotAfter.Equal(nb.Add(5 * time.Hour)) {
		t.Errorf("NotAfter %v, want NotBefore + 5h = %v", p.Cert.NotAfter, nb.Add(5*time.Hour))
	}

	var inv x509.CertificateInvalidError
	expired := issue(t, ca, Options{CommonName: "old", Client: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)})
	if err := verify(expired.Cert, ca, x509.ExtKeyUsageClientAuth, "", time.Time{}); !errors.As(err, &inv) || inv.Reason != x509.Expired {
		t.Errorf("verify an expired cert now: %v, want an Expired error", err)
	}
	if err := verify(expired.Cert, ca, x509.ExtKeyUsageClientAuth, "", now.Add(-36*time.Hour)); err != nil {
		t.Errorf("verify an expired cert within its validity: %v", err)
	}
	future := issue(t, ca, Options{CommonName: "new", Client: true, NotBefore: now.Add(time.Hour)})
	if err := verify(future.Cert, ca, x509.ExtKeyUsageClientAuth, "", time.Time{}); !errors.As(err, &inv) || inv.Reason != x509.Expired {
		t.Errorf("verify a not yet valid cert now: %v, want an Expired error", err)
	}

	if _, err := ca.Issue(Options{CommonName: "n", Server: true, NotBefore: nb, NotAfter: nb}); err == nil {
		t.Error("Issue with NotAfter == NotBefore succeeded")
	}
	if _, err := ca.Issue(Options{CommonName: "n", Server: true, Lifetime: -time.Hour}); err == nil {
		t.Error("Issue with a negative lifetime succeeded")
	}
}

// TestIssueCappedAtCA: no certificate outlives its CA.
func TestIssueCappedAtCA(t *testing.T) {
	t.Parallel()
	ca := newCA(t, Options{Lifetime: 48 * time.Hour})
	p := issue(t, ca, Options{CommonName: "n", Server: true})
	if !p.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter %v, want the CA's %v", p.Cert.NotAfter, ca.Cert.NotAfter)
	}
	p = issue(t, ca, Options{CommonName: "n", Server: true, NotAfter: ca.Cert.NotAfter.Add(time.Hour)})
	if !p.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("explicit NotAfter: %v, want the CA's %v", p.Cert.NotAfter, ca.Cert.NotAfter)
	}
	p = issue(t, ca, Options{CommonName: "n", Server: true, Lifetime: time.Hour})
	if !p.Cert.NotAfter.Before(ca.Cert.NotAfter) {
		t.Errorf("a shorter lifetime is kept: NotAfter %v, CA's %v", p.Cert.NotAfter, ca.Cert.NotAfter)
	}

	// An expired CA issues nothing.
	old := newCA(t, Options{NotBefore: time.Now().Add(-72 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	if _, err := old.Issue(Options{CommonName: "n", Server: true}); err == nil || !strings.Contains(err.Error(), "expires") {
		t.Errorf("Issue by an expired CA: %v, want an error saying it expired", err)
	}
}

func TestIssueRefuses(t *testing.T) {
	t.Parallel()
	ca := newCA(t, Options{})
	leaf := issue(t, ca, Options{CommonName: "node1", Hosts: []string{"localhost"}, Server: true, Client: true})
	for _, c := range []struct {
		name   string
		issuer *Pair
		opts   Options
		want   string
	}{
		{"non-CA issuer", leaf, Options{CommonName: "x", Client: true}, "not a CA certificate"},
		{"nil issuer", nil, Options{CommonName: "x", Client: true}, "needs a certificate and its key"},
		{"issuer without key", &Pair{Cert: ca.Cert}, Options{CommonName: "x", Client: true}, "needs a certificate and its key"},
		{"empty CN", ca, Options{Server: true, Client: true}, "common name"},
		{"no usage", ca, Options{CommonName: "x", Hosts: []string{"localhost"}}, "server, a client or both"},
		{"host with port", ca, Options{CommonName: "x", Server: true, Hosts: []string{"localhost:7001"}}, "without a port"},
		{"host with space", ca, Options{CommonName: "x", Server: true, Hosts: []string{"my host"}}, `' ' is not allowed`},
		{"empty label", ca, Options{CommonName: "x", Server: true, Hosts: []string{"a..b"}}, "labels are 1 to 63"},
		{"long label", ca, Options{CommonName: "x", Server: true, Hosts: []string{strings.Repeat("a", 64) + ".com"}}, "labels are 1 to 63"},
		{"inner wildcard", ca, Options{CommonName: "x", Server: true, Hosts: []string{"a.*.com"}}, `'*' is not allowed`},
	} {
		_, err := c.issuer.Issue(c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Issue = %v, want an error containing %q", c.name, err, c.want)
		}
	}
	// A CA without the certSign key usage (say, loaded from elsewhere).
	noSign := *ca
	cert := *ca.Cert
	cert.KeyUsage = x509.KeyUsageDigitalSignature
	noSign.Cert = &cert
	if _, err := noSign.Issue(Options{CommonName: "x", Client: true}); err == nil || !strings.Contains(err.Error(), "certSign") {
		t.Errorf("Issue by a CA without certSign: %v", err)
	}
	// Wildcards in the first label and underscores are accepted.
	p := issue(t, ca, Options{CommonName: "x", Server: true, Hosts: []string{"*.shale.svc", "shale_1.local"}})
	if !slices.Equal(p.Cert.DNSNames, []string{"*.shale.svc", "shale_1.local"}) {
		t.Errorf("DNS SANs %q", p.Cert.DNSNames)
	}
}

func TestWriteLoad(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "a", "certs") // missing directories are made
	ca := newCA(t, Options{})
	node := issue(t, ca, Options{CommonName: "node1", Hosts: []string{"localhost", "10.0.0.1"}, Server: true, Client: true})
	caCrt, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	nodeCrt, nodeKey := filepath.Join(dir, "node1.crt"), filepath.Join(dir, "node1.key")
	if err := ca.Write(caCrt, caKey); err != nil {
		t.Fatalf("write CA: %v", err)
	}
	if err := node.Write(nodeCrt, nodeKey); err != nil {
		t.Fatalf("write node: %v", err)
	}
	if runtime.GOOS != "windows" {
		for name, want := range map[string]fs.FileMode{caCrt: 0o644, caKey: 0o600, nodeCrt: 0o644, nodeKey: 0o600} {
			fi, err := os.Stat(name)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s: mode %v, want %v", filepath.Base(name), fi.Mode().Perm(), want)
			}
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"ca.crt", "ca.key", "node1.crt", "node1.key"}) {
		t.Errorf("files in the directory: %q (temporary files left?)", names)
	}

	got, err := Load(nodeCrt, nodeKey)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if !got.Cert.Equal(node.Cert) || string(got.CertPEM) != string(node.CertPEM) || string(got.KeyPEM) != string(node.KeyPEM) {
		t.Error("loaded certificate differs from the written one")
	}
	if !got.Key.Public().(*ecdsa.PublicKey).Equal(node.Key.Public()) {
		t.Error("loaded key differs from the written one")
	}
	if b, _ := pem.Decode(node.KeyPEM); b == nil || b.Type != "PRIVATE KEY" {
		t.Errorf("key PEM block %v, want PRIVATE KEY (PKCS#8)", b)
	}
	// A loaded CA issues certificates that verify against the original.
	loadedCA, err := Load(caCrt, caKey)
	if err != nil {
		t.Fatalf("Load CA: %v", err)
	}
	cl := issue(t, loadedCA, Options{CommonName: "root", Client: true})
	if err := verify(cl.Cert, ca, x509.ExtKeyUsageClientAuth, "", time.Time{}); err != nil {
		t.Errorf("cert issued by the loaded CA: %v", err)
	}

	// Writing again replaces the files.
	node2 := issue(t, ca, Options{CommonName: "node1", Server: true, Client: true})
	if err := node2.Write(nodeCrt, nodeKey); err != nil {
		t.Fatal(err)
	}
	if got, err := Load(nodeCrt, nodeKey); err != nil || !got.Cert.Equal(node2.Cert) {
		t.Errorf("after overwriting: Load = %v, %v", got, err)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t, Options{})
	node := issue(t, ca, Options{CommonName: "node1", Server: true})
	write := func(name string, data []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	crt, key := write("node.crt", node.CertPEM), write("node.key", node.KeyPEM)
	caKey := write("ca.key", ca.KeyPEM)

	// The key of another certificate.
	_, err := Load(crt, caKey)
	if !errors.Is(err, ErrKeyMismatch) || !strings.Contains(err.Error(), "ca.key") || !strings.Contains(err.Error(), "node.crt") {
		t.Errorf("Load with another certificate's key: %v, want ErrKeyMismatch naming both files", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.crt"), key); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing certificate: %v, want fs.ErrNotExist", err)
	}
	if _, err := Load(crt, filepath.Join(dir, "missing.key")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing key: %v, want fs.ErrNotExist", err)
	}
	if _, err := Load(key, key); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("Load of a key as the certificate: %v", err)
	}
	if _, err := Load(crt, crt); err == nil || !strings.Contains(err.Error(), "unsupported PEM block") {
		t.Errorf("Load of a certificate as the key: %v", err)
	}
	garbage := write("garbage", []byte("not pem\n"))
	if _, err := Load(crt, garbage); err == nil || !strings.Contains(err.Error(), "holds no PEM key") {
		t.Errorf("Load of a non-PEM key: %v", err)
	}
	bad := write("bad.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}))
	if _, err := Load(bad, key); err == nil || !strings.Contains(err.Error(), "bad.crt") {
		t.Errorf("Load of a corrupt certificate: %v", err)
	}

	// Keys in other encodings load: SEC 1 (with the curve's parameters
	// first, as openssl ecparam -genkey writes it) and PKCS#1 RSA (which
	// here belongs to no certificate).
	sec1, err := x509.MarshalECPrivateKey(node.Key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	params := pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}})
	ecKey := write("ec.key", append(params, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})...))
	if _, err := Load(crt, ecKey); err != nil {
		t.Errorf("Load of a SEC 1 key: %v", err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaFile := write("rsa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)}))
	if _, err := Load(crt, rsaFile); !errors.Is(err, ErrKeyMismatch) {
		t.Errorf("Load with an RSA key of no certificate: %v, want ErrKeyMismatch", err)
	}
}

func TestWriteFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory where the file should go, and a file where a directory
	// should.
	if err := WriteFile(dir, []byte("x"), 0o600); err == nil {
		t.Error("WriteFile over a directory succeeded")
	}
	if err := WriteFile(filepath.Join(file, "x.crt"), []byte("x"), 0o600); err == nil {
		t.Error("WriteFile below a regular file succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("files left after failed writes: %v", ents)
	}
}
