package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/security/certgen"
)

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := certgen.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func newCA(t *testing.T, name string) *certgen.Pair {
	t.Helper()
	ca, err := certgen.NewCA(name, certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *certgen.Pair, cn string) *certgen.Pair {
	t.Helper()
	p, err := ca.Issue(certgen.Options{CommonName: cn, Hosts: []string{"127.0.0.1"}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSourceReload: a Source switches to changed files when they are valid,
// keeps its material when they are not (a key not yet written, a broken CA
// file), and reports nothing changed when nothing did.
func TestSourceReload(t *testing.T) {
	dir := t.TempDir()
	files := Files{CertFile: filepath.Join(dir, "n.crt"), KeyFile: filepath.Join(dir, "n.key"), CAFile: filepath.Join(dir, "ca.crt")}
	ca1 := newCA(t, "ca1")
	n1 := issue(t, ca1, "one")
	writeFile(t, files.CertFile, n1.CertPEM)
	writeFile(t, files.KeyFile, n1.KeyPEM)
	writeFile(t, files.CAFile, ca1.CertPEM)
	s, err := NewSource(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func() string {
		c, err := x509.ParseCertificate(s.Certificate().Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c.Subject.CommonName
	}
	if leaf() != "one" {
		t.Fatalf("certificate %q", leaf())
	}
	if changed, err := s.Reload(); changed || err != nil {
		t.Fatalf("reload of unchanged files: %v %v", changed, err)
	}
	// A new certificate whose key is not written yet: refused, kept.
	n2 := issue(t, ca1, "two")
	writeFile(t, files.CertFile, n2.CertPEM)
	if changed, err := s.Reload(); changed || err == nil || !strings.Contains(err.Error(), "n.key") {
		t.Fatalf("mismatched key: changed %v, err %v", changed, err)
	}
	if leaf() != "one" {
		t.Fatal("a half-written pair replaced the certificate")
	}
	writeFile(t, files.KeyFile, n2.KeyPEM)
	if changed, err := s.Reload(); !changed || err != nil {
		t.Fatalf("reload of a new pair: %v %v", changed, err)
	}
	if leaf() != "two" {
		t.Fatalf("certificate %q after reload", leaf())
	}
	// A CA bundle of two CAs trusts both.
	ca2 := newCA(t, "ca2")
	writeFile(t, files.CAFile, append(append([]byte{}, ca1.CertPEM...), ca2.CertPEM...))
	if _, err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, ca := range []*certgen.Pair{ca1, ca2} {
		c := issue(t, ca, "x")
		if _, err := c.Cert.Verify(x509.VerifyOptions{Roots: s.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("bundle does not trust %s: %v", ca.Cert.Subject.CommonName, err)
		}
	}
	writeFile(t, files.CAFile, []byte("garbage"))
	if _, err := s.Reload(); err == nil {
		t.Fatal("a broken CA file was accepted")
	}
	if s.Pool() == nil {
		t.Fatal("the pool was dropped")
	}
	// Unreadable files: an error, the material kept.
	os.Remove(files.CAFile)
	if _, err := s.Reload(); err == nil {
		t.Fatal("a missing file was accepted")
	}
	if leaf() != "two" {
		t.Fatal("material lost")
	}
}

func TestValidateNamesMissingFlags(t *testing.T) {
	full := ServerConfig{CertFile: "c", KeyFile: "k", PeerCertFile: "c", PeerKeyFile: "k", PeerTrustedCAFile: "ca"}
	if err := full.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (ServerConfig{}).Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  ServerConfig
		want string
	}{
		{ServerConfig{CertFile: "c"}, "--key-file, --peer-cert-file, --peer-key-file, --peer-trusted-ca-file (given: --cert-file"},
		{ServerConfig{PeerAllowedNames: []string{"n"}}, "--cert-file"},
		{func() ServerConfig { c := full; c.ClientCertAuth = true; return c }(), "--trusted-ca-file"},
		{func() ServerConfig { c := full; c.PeerAllowedNames = []string{"[bad"}; return c }(), "--peer-allowed-cn"},
		{func() ServerConfig { c := full; c.MinVersion = tls.VersionTLS10; return c }(), "TLS 1.2 or 1.3"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := ParseMinVersion("1.1"); err == nil {
		t.Fatal("TLS 1.1 accepted")
	}
}

// TestSplitListener: TLS connections and plaintext ones on one port reach
// their own listener, every byte intact; closing both closes the port.
func TestSplitListener(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsL, plainL := SplitListener(lis, nil)
	sendErr := make(chan error, 2)
	send := func(payload []byte) {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err == nil {
			_, err = c.Write(payload)
			// Keep the connection open until the reader is done.
			time.Sleep(100 * time.Millisecond)
			c.Close()
		}
		sendErr <- err
	}
	readAll := func(l net.Listener, n int) []byte {
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, n)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	hello := []byte{0x16, 0x03, 0x01, 0x00, 0x05, 'h', 'e', 'l', 'l', 'o'}
	go send(hello)
	if got := readAll(tlsL, len(hello)); !bytes.Equal(got, hello) {
		t.Fatalf("TLS side got %q", got)
	}
	preface := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	go send(preface)
	if got := readAll(plainL, len(preface)); !bytes.Equal(got, preface) {
		t.Fatalf("plaintext side got %q", got)
	}
	for range 2 {
		if err := <-sendErr; err != nil {
			t.Fatal(err)
		}
	}
	tlsL.Close()
	if _, err := tlsL.Accept(); err == nil {
		t.Fatal("accept on a closed half")
	}
	// The port stays open while one half is.
	if c, err := net.DialTimeout("tcp", lis.Addr().String(), time.Second); err != nil {
		t.Fatalf("the port closed with one half open: %v", err)
	} else {
		c.Close()
	}
	plainL.Close()
	if c, err := net.DialTimeout("tcp", lis.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the port still accepts connections after both halves closed")
	}
}

// FuzzParseCertificates: any bytes in a CA file give certificates or an
// error, never a panic.
func FuzzParseCertificates(f *testing.F) {
	ca, err := certgen.NewCA("fuzz", certgen.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ca.CertPEM)
	f.Add(append(append([]byte{}, ca.CertPEM...), ca.CertPEM...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCertificates(data)
		if err == nil && len(certs) == 0 {
			t.Fatal("no error and no certificate")
		}
	})
}

// FuzzSourceFiles: any bytes as a certificate, key or CA file make
// NewSource fail cleanly or load, never panic.
func FuzzSourceFiles(f *testing.F) {
	ca, err := certgen.NewCA("fuzz", certgen.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ca.CertPEM, ca.KeyPEM, ca.CertPEM)
	f.Add([]byte("x"), []byte("y"), []byte("z"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, cert, key, cas []byte) {
		files := Files{CertFile: filepath.Join(dir, "c"), KeyFile: filepath.Join(dir, "k"), CAFile: filepath.Join(dir, "a")}
		for name, b := range map[string][]byte{files.CertFile: cert, files.KeyFile: key, files.CAFile: cas} {
			if err := os.WriteFile(name, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		s, err := NewSource(files, nil)
		if err == nil && (s.Certificate() == nil || s.Pool() == nil) {
			t.Fatal("loaded without material")
		}
	})
}
