package harness

import (
	"crypto/x509"
	"testing"
)

// TestSecurityCertificates: a node's certificate names its host and serves
// and dials peers; the users' client certificates carry their names (with
// --client-cert-auth the name is the user) and only authenticate clients.
func TestSecurityCertificates(t *testing.T) {
	s, err := newSecurity("shale-chaos-test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.nodeCert("n7")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.Cert)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, name := range []string{"n7", "localhost", "127.0.0.1"} {
			if _, err := p.Cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("node certificate for %s, usage %v: %v", name, usage, err)
			}
		}
	}
	if err := p.Cert.VerifyHostname("n8"); err == nil {
		t.Error("node n7's certificate is valid for n8")
	}
	for user, cfg := range map[string]*x509.Certificate{RootUser: s.rootTLS.Certificates[0].Leaf, WorkloadUser: s.userTLS.Certificates[0].Leaf} {
		if cfg.Subject.CommonName != user {
			t.Errorf("client certificate of %s names %q", user, cfg.Subject.CommonName)
		}
		if _, err := cfg.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("client certificate of %s: %v", user, err)
		}
		if _, err := cfg.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
			t.Errorf("client certificate of %s may serve", user)
		}
	}
}
