package testcluster

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/shale-db/shale/security/certgen"
	"github.com/shale-db/shale/security/tlsconfig"
)

// Certs are the certificate files of a TLS test cluster, all in Dir: a CA
// (ca.crt, ca.key), one certificate per node for clients and peers alike
// (nodeN.crt, nodeN.key, valid for 127.0.0.1 and localhost), and a client
// certificate for the user "root" (client.crt, client.key). Tests may
// overwrite the files to rotate them; the nodes re-read them.
type Certs struct {
	Dir string
	CA  *certgen.Pair
}

// newCerts makes the CA and the client certificate in dir.
func newCerts(t testing.TB, dir string) *Certs {
	t.Helper()
	ca, err := certgen.NewCA("shale test CA", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs := &Certs{Dir: dir, CA: ca}
	if err := ca.Write(cs.CAFile(), filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	cl, err := ca.Issue(certgen.Options{CommonName: "root", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Write(cs.ClientCertFile(), cs.ClientKeyFile()); err != nil {
		t.Fatal(err)
	}
	return cs
}

// CAFile is the CA bundle the nodes and the clients trust.
func (cs *Certs) CAFile() string { return filepath.Join(cs.Dir, "ca.crt") }

// ClientCertFile and ClientKeyFile are the client certificate of user
// "root".
func (cs *Certs) ClientCertFile() string { return filepath.Join(cs.Dir, "client.crt") }

// ClientKeyFile is the key of ClientCertFile.
func (cs *Certs) ClientKeyFile() string { return filepath.Join(cs.Dir, "client.key") }

// NodeCertFile and NodeKeyFile are node id's certificate and key.
func (cs *Certs) NodeCertFile(id uint64) string {
	return filepath.Join(cs.Dir, fmt.Sprintf("node%d.crt", id))
}

// NodeKeyFile is the key of NodeCertFile.
func (cs *Certs) NodeKeyFile(id uint64) string {
	return filepath.Join(cs.Dir, fmt.Sprintf("node%d.key", id))
}

// IssueNode writes node id's certificate signed by ca (valid for
// 127.0.0.1 and localhost, named nodeN).
func (cs *Certs) IssueNode(t testing.TB, ca *certgen.Pair, id uint64) {
	t.Helper()
	p, err := ca.Issue(certgen.Options{CommonName: fmt.Sprintf("node%d", id), Hosts: []string{"127.0.0.1", "localhost"}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(cs.NodeCertFile(id), cs.NodeKeyFile(id)); err != nil {
		t.Fatal(err)
	}
}

// ServerConfig is node id's TLS configuration: its certificate for clients
// and peers, the CA for both, client certificates verified when given.
func (cs *Certs) ServerConfig(id uint64) tlsconfig.ServerConfig {
	return tlsconfig.ServerConfig{
		CertFile:          cs.NodeCertFile(id),
		KeyFile:           cs.NodeKeyFile(id),
		TrustedCAFile:     cs.CAFile(),
		PeerCertFile:      cs.NodeCertFile(id),
		PeerKeyFile:       cs.NodeKeyFile(id),
		PeerTrustedCAFile: cs.CAFile(),
	}
}
