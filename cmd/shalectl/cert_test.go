package main

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/security/certgen"
)

// readCert parses the PEM certificate in file.
func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s holds no PEM certificate", file)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return c
}

// verifyAgainst verifies cert against the CA certificate in caFile for
// usage.
func verifyAgainst(t *testing.T, cert *x509.Certificate, caFile string, usage x509.ExtKeyUsage) error {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(readCert(t, caFile))
	_, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// fileBytes reads a file or fails the test.
func fileBytes(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkKeyMode checks that a key file is readable by its owner only.
func checkKeyMode(t *testing.T, name string) {
	t.Helper()
	if runtime.GOOS == "windows" {
		return
	}
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want 0600", name, fi.Mode().Perm())
	}
}

func TestCertCreate(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "certs")
	caCrt, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")

	// The CA.
	out := ok(t, "cert", "create-ca", "--certs-dir", dir)
	contains(t, "create-ca", out, caCrt, caKey, "Shale CA", "usages:       ca")
	ca := readCert(t, caCrt)
	if !ca.IsCA || ca.Subject.CommonName != "Shale CA" || ca.NotAfter.Sub(ca.NotBefore) != certgen.DefaultCALifetime {
		t.Errorf("CA: IsCA %v, CN %q, lifetime %v", ca.IsCA, ca.Subject.CommonName, ca.NotAfter.Sub(ca.NotBefore))
	}
	checkKeyMode(t, caKey)
	if _, err := certgen.Load(caCrt, caKey); err != nil {
		t.Errorf("load the CA: %v", err)
	}

	// A second create-ca refuses to replace it, and changes nothing.
	before := fileBytes(t, caCrt)
	contains(t, "create-ca again", fails(t, "cert", "create-ca", "--certs-dir", dir), caCrt+" already exists", "--overwrite")
	if !bytes.Equal(before, fileBytes(t, caCrt)) {
		t.Error("a refused create-ca changed ca.crt")
	}

	// A node: server and client usages, the hosts as SANs, signed by the
	// CA.
	out = ok(t, "cert", "create-node", "node1", "localhost", "127.0.0.1", "node1.shale.svc", "::1", "--certs-dir", dir)
	nodeCrt, nodeKey := filepath.Join(dir, "node1.crt"), filepath.Join(dir, "node1.key")
	contains(t, "create-node", out, nodeCrt, nodeKey, "server,client", "localhost,node1.shale.svc,127.0.0.1,::1", "issuer:       Shale CA")
	node := readCert(t, nodeCrt)
	if node.Subject.CommonName != "node1" || node.IsCA {
		t.Errorf("node cert: CN %q, IsCA %v", node.Subject.CommonName, node.IsCA)
	}
	if !slices.Equal(node.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Errorf("node cert usages %v", node.ExtKeyUsage)
	}
	if !slices.Equal(node.DNSNames, []string{"localhost", "node1.shale.svc"}) {
		t.Errorf("node cert DNS names %q", node.DNSNames)
	}
	if len(node.IPAddresses) != 2 || node.IPAddresses[0].String() != "127.0.0.1" || node.IPAddresses[1].String() != "::1" {
		t.Errorf("node cert IPs %v", node.IPAddresses)
	}
	if got := node.NotAfter.Sub(node.NotBefore); got != certgen.DefaultCertLifetime {
		t.Errorf("node cert lifetime %v, want %v", got, certgen.DefaultCertLifetime)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if err := verifyAgainst(t, node, caCrt, u); err != nil {
			t.Errorf("node cert, usage %v: %v", u, err)
		}
	}
	if err := node.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("node cert for 127.0.0.1: %v", err)
	}
	checkKeyMode(t, nodeKey)
	if _, err := certgen.Load(nodeCrt, nodeKey); err != nil {
		t.Errorf("load node1: %v", err)
	}

	// create-node refuses to replace the node's files without
	// --overwrite, and replaces them with it.
	before = fileBytes(t, nodeCrt)
	contains(t, "create-node again", fails(t, "cert", "create-node", "node1", "localhost", "--certs-dir", dir), nodeCrt+" already exists", "--overwrite")
	if !bytes.Equal(before, fileBytes(t, nodeCrt)) {
		t.Error("a refused create-node changed node1.crt")
	}
	ok(t, "cert", "create-node", "node1", "node1.example", "--certs-dir", dir, "--overwrite", "--lifetime", "48h")
	node = readCert(t, nodeCrt)
	if !slices.Equal(node.DNSNames, []string{"node1.example"}) || node.NotAfter.Sub(node.NotBefore) != 48*time.Hour {
		t.Errorf("overwritten node cert: DNS names %q, lifetime %v", node.DNSNames, node.NotAfter.Sub(node.NotBefore))
	}
	if _, err := certgen.Load(nodeCrt, nodeKey); err != nil {
		t.Errorf("load the overwritten node1: %v", err)
	}

	// A client: CN = the user, client usage only, default file name
	// client.
	out = ok(t, "cert", "create-client", "root", "--certs-dir", dir)
	clCrt := filepath.Join(dir, "client.crt")
	contains(t, "create-client", out, clCrt, filepath.Join(dir, "client.key"), "common name:  root", "usages:       client")
	cl := readCert(t, clCrt)
	if cl.Subject.CommonName != "root" || !slices.Equal(cl.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) ||
		len(cl.DNSNames)+len(cl.IPAddresses) != 0 {
		t.Errorf("client cert: CN %q, usages %v, SANs %v %v", cl.Subject.CommonName, cl.ExtKeyUsage, cl.DNSNames, cl.IPAddresses)
	}
	if err := verifyAgainst(t, cl, caCrt, x509.ExtKeyUsageClientAuth); err != nil {
		t.Errorf("client cert: %v", err)
	}
	if err := verifyAgainst(t, cl, caCrt, x509.ExtKeyUsageServerAuth); err == nil {
		t.Error("client cert verifies for server authentication")
	}
	checkKeyMode(t, filepath.Join(dir, "client.key"))
	contains(t, "create-client again", fails(t, "cert", "create-client", "root", "--certs-dir", dir), clCrt+" already exists")

	// --out names the files; -o json describes them.
	out = ok(t, "cert", "create-client", "alice smith", "--out", "alice", "--certs-dir", dir, "-o", "json")
	var rec certRecord
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("create-client -o json: %v\n%s", err, out)
	}
	if rec.File != filepath.Join(dir, "alice.crt") || rec.KeyFile == nil || *rec.KeyFile != filepath.Join(dir, "alice.key") ||
		rec.Key != "ok" || rec.CommonName != "alice smith" || !slices.Equal(rec.Usages, []string{"client"}) ||
		len(rec.Hosts) != 0 || rec.Issuer != "Shale CA" || rec.Expired || rec.Error != nil {
		t.Errorf("create-client -o json: %+v", rec)
	}
	if readCert(t, filepath.Join(dir, "alice.crt")).Subject.CommonName != "alice smith" {
		t.Error("alice.crt has another CN")
	}

	// create-ca --overwrite makes a new CA: the old certificates no longer
	// verify against it.
	ok(t, "cert", "create-ca", "--certs-dir", dir, "--overwrite")
	if bytes.Equal(before, fileBytes(t, caCrt)) {
		t.Error("create-ca --overwrite left ca.crt as it was")
	}
	if err := verifyAgainst(t, cl, caCrt, x509.ExtKeyUsageClientAuth); err == nil {
		t.Error("a certificate of the old CA verifies against the new one")
	}
}

// TestCertCAElsewhere keeps the CA key out of the certificates' directory
// with --ca-key, and names a CA certificate with --ca-cert.
func TestCertCAElsewhere(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	dir, safe := filepath.Join(tmp, "certs"), filepath.Join(tmp, "safe")
	safeKey := filepath.Join(safe, "ca.key")
	ok(t, "cert", "create-ca", "--certs-dir", dir, "--ca-key", safeKey)
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("create-ca --ca-key wrote DIR/ca.key too (stat: %v)", err)
	}
	checkKeyMode(t, safeKey)

	// Without --ca-key, the key is looked for in DIR.
	contains(t, "no CA key", fails(t, "cert", "create-node", "n1", "localhost", "--certs-dir", dir),
		"no CA key at "+filepath.Join(dir, "ca.key"), "--ca-key")
	ok(t, "cert", "create-node", "n1", "localhost", "--certs-dir", dir, "--ca-key", safeKey)
	if err := verifyAgainst(t, readCert(t, filepath.Join(dir, "n1.crt")), filepath.Join(dir, "ca.crt"), x509.ExtKeyUsageServerAuth); err != nil {
		t.Errorf("n1.crt: %v", err)
	}

	// Another directory, with the CA named by both flags.
	other := filepath.Join(tmp, "other")
	ok(t, "cert", "create-client", "bob", "--certs-dir", other, "--ca-cert", filepath.Join(dir, "ca.crt"), "--ca-key", safeKey)
	if err := verifyAgainst(t, readCert(t, filepath.Join(other, "client.crt")), filepath.Join(dir, "ca.crt"), x509.ExtKeyUsageClientAuth); err != nil {
		t.Errorf("other/client.crt: %v", err)
	}

	// The key of another CA.
	ok(t, "cert", "create-ca", "--certs-dir", other)
	contains(t, "mismatched CA key", fails(t, "cert", "create-node", "n2", "localhost", "--certs-dir", dir, "--ca-key", filepath.Join(other, "ca.key")),
		"load the CA", "does not belong to the certificate")
	if _, err := os.Stat(filepath.Join(dir, "n2.crt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed create-node wrote n2.crt (stat: %v)", err)
	}
}

func TestCertErrors(t *testing.T) {
	t.Parallel()
	empty := t.TempDir()
	dir := t.TempDir()
	ok(t, "cert", "create-ca", "--certs-dir", dir)
	notCA := t.TempDir()
	ok(t, "cert", "create-ca", "--certs-dir", notCA)
	ok(t, "cert", "create-node", "n", "localhost", "--certs-dir", notCA)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"cert", "create-ca"}, []string{"--certs-dir DIR is required", "Run 'shalectl cert create-ca --help'"}},
		{[]string{"cert", "list"}, []string{"--certs-dir DIR is required"}},
		{[]string{"cert", "create-ca", "--certs-dir", empty, "extra"}, []string{"takes no arguments"}},
		{[]string{"cert", "create-ca", "--certs-dir", empty, "--lifetime", "0s"}, []string{"--lifetime must be positive"}},
		{[]string{"cert", "create-ca", "--certs-dir", empty, "--ca-cert", "x", "--ca-key", "x"}, []string{"must be two files"}},
		{[]string{"cert", "create-ca", "--certs-dir", empty, "-o", "yaml"}, []string{`unknown output format "yaml"`}},
		{[]string{"cert", "create-node", "n1", "--certs-dir", dir}, []string{"takes NAME and at least one HOST", "--help"}},
		{[]string{"cert", "create-node", "--certs-dir", dir}, []string{"takes NAME and at least one HOST"}},
		{[]string{"cert", "create-node", "n1", "", "--certs-dir", dir}, []string{"HOST must not be empty"}},
		{[]string{"cert", "create-node", "n1", "localhost:7001", "--certs-dir", dir}, []string{"cert create-node n1", "without a port"}},
		{[]string{"cert", "create-node", "n1", "bad host", "--certs-dir", dir}, []string{"neither an IP address nor a DNS name"}},
		{[]string{"cert", "create-node", "../n1", "localhost", "--certs-dir", dir}, []string{`NAME "../n1"`, `'/' is not allowed`}},
		{[]string{"cert", "create-node", "n1.crt", "localhost", "--certs-dir", dir}, []string{"leave out .crt"}},
		{[]string{"cert", "create-node", "..", "localhost", "--certs-dir", dir}, []string{"not a file name"}},
		{[]string{"cert", "create-node", strings.Repeat("n", 65), "localhost", "--certs-dir", dir}, []string{"1 to 64 characters"}},
		{[]string{"cert", "create-node", "ca", "localhost", "--certs-dir", dir}, []string{"is a file of the CA"}},
		{[]string{"cert", "create-node", "ca", "localhost", "--certs-dir", dir, "--overwrite"}, []string{"is a file of the CA"}},
		{[]string{"cert", "create-node", "n1", "localhost", "--certs-dir", dir, "--lifetime", "-1h"}, []string{"--lifetime must be positive"}},
		{[]string{"cert", "create-node", "n1", "localhost", "--certs-dir", empty}, []string{"no CA certificate at " + filepath.Join(empty, "ca.crt"), "shalectl cert create-ca --certs-dir " + empty, "--ca-cert"}},
		{[]string{"cert", "create-node", "n1", "localhost", "--certs-dir", dir,
			"--ca-cert", filepath.Join(notCA, "n.crt"), "--ca-key", filepath.Join(notCA, "n.key")}, []string{"is not a CA certificate"}},
		{[]string{"cert", "create-client", "--certs-dir", dir}, []string{"takes 1 argument(s), USER; got 0"}},
		{[]string{"cert", "create-client", "", "--certs-dir", dir}, []string{"must be 1 to 64 characters"}},
		{[]string{"cert", "create-client", "a\tb", "--certs-dir", dir}, []string{"is not printable"}},
		{[]string{"cert", "create-client", strings.Repeat("é", 65), "--certs-dir", dir}, []string{"must be 1 to 64 characters"}},
		{[]string{"cert", "create-client", "u", "--out", "a/b", "--certs-dir", dir}, []string{`--out "a/b"`}},
		{[]string{"cert", "create-client", "u", "--certs-dir", empty}, []string{"no CA certificate"}},
		{[]string{"cert", "list", "--certs-dir", filepath.Join(empty, "missing")}, []string{"cert list", "no such file or directory"}},
		{[]string{"cert", "bogus"}, []string{`unknown command "bogus" for "shalectl cert"`}},
	} {
		contains(t, strings.Join(c.args, " "), fails(t, c.args...), c.want...)
	}
	// Nothing was written by the failed commands.
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Errorf("failed commands wrote into an empty directory: %v", ents)
	}
	// The bare group prints its help.
	contains(t, "help", ok(t, "cert"), "Available Commands:", "create-ca", "create-node", "create-client", "list")
}

func TestCertList(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	contains(t, "list of an empty directory", ok(t, "cert", "list", "--certs-dir", dir), "no certificates (*.crt) in "+dir)
	if out := ok(t, "cert", "list", "--certs-dir", dir, "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("list -o json of an empty directory: %q, want []", out)
	}

	ok(t, "cert", "create-ca", "--certs-dir", dir)
	ok(t, "cert", "create-node", "node1", "localhost", "127.0.0.1", "--certs-dir", dir)
	ok(t, "cert", "create-client", "root", "--certs-dir", dir)
	// An expired certificate, a key of another certificate, a certificate
	// without a key, and a file that is not a certificate.
	ca, err := certgen.Load(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old, err := ca.Issue(certgen.Options{CommonName: "old", Client: true, NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Write(filepath.Join(dir, "old.crt"), filepath.Join(dir, "old.key")); err != nil {
		t.Fatal(err)
	}
	if err := certgen.WriteFile(filepath.Join(dir, "old.key"), ca.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := certgen.WriteFile(filepath.Join(dir, "nokey.crt"), old.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := certgen.WriteFile(filepath.Join(dir, "junk.crt"), []byte("junk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := certgen.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not listed\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	out := ok(t, "cert", "list", "--certs-dir", dir)
	matches(t, "list", out,
		`(?m)^FILE\s+CN\s+USAGES\s+HOSTS\s+EXPIRES\s+ISSUER\s+KEY$`,
		`(?m)^ca\.crt\s+Shale CA\s+ca\s+-\s+\S+Z\s+Shale CA\s+ok$`,
		`(?m)^client\.crt\s+root\s+client\s+-\s+\S+Z\s+Shale CA\s+ok$`,
		`(?m)^node1\.crt\s+node1\s+server,client\s+localhost,127\.0\.0\.1\s+\S+Z\s+Shale CA\s+ok$`,
		`(?m)^old\.crt\s+old\s+client\s+-\s+\S+Z \(expired\)\s+Shale CA\s+MISMATCH$`,
		`(?m)^nokey\.crt\s+old\s+client\s+-\s+\S+Z \(expired\)\s+Shale CA\s+-$`,
		`(?m)^junk\.crt: not readable: no PEM certificate$`)
	if strings.Contains(out, "notes.txt") {
		t.Errorf("list shows a file that is not a .crt:\n%s", out)
	}
	var names []string
	for _, l := range lines(out)[1:] {
		names = append(names, strings.Fields(l)[0])
	}
	if want := []string{"ca.crt", "client.crt", "node1.crt", "nokey.crt", "old.crt", "junk.crt:"}; !slices.Equal(names, want) {
		t.Errorf("list rows %q, want %q", names, want)
	}

	var recs []certRecord
	if err := json.Unmarshal([]byte(ok(t, "cert", "list", "--certs-dir", dir, "-o", "json")), &recs); err != nil {
		t.Fatalf("list -o json: %v", err)
	}
	byFile := map[string]certRecord{}
	for _, r := range recs {
		byFile[r.File] = r
	}
	if len(recs) != 6 {
		t.Errorf("list -o json: %d records, want 6: %+v", len(recs), recs)
	}
	if r := byFile["node1.crt"]; r.CommonName != "node1" || !slices.Equal(r.Usages, []string{"server", "client"}) ||
		!slices.Equal(r.Hosts, []string{"localhost", "127.0.0.1"}) || r.Issuer != "Shale CA" || r.Key != "ok" ||
		r.KeyFile == nil || *r.KeyFile != "node1.key" || r.Expired || r.Error != nil || r.NotAfter.Before(now) {
		t.Errorf("node1.crt record: %+v", r)
	}
	if r := byFile["ca.crt"]; !slices.Equal(r.Usages, []string{"ca"}) || r.CommonName != "Shale CA" {
		t.Errorf("ca.crt record: %+v", r)
	}
	if r := byFile["old.crt"]; !r.Expired || r.Key != "mismatch" {
		t.Errorf("old.crt record: %+v", r)
	}
	if r := byFile["nokey.crt"]; r.Key != "none" || r.KeyFile != nil {
		t.Errorf("nokey.crt record: %+v", r)
	}
	if r := byFile["junk.crt"]; r.Error == nil || r.CommonName != "" {
		t.Errorf("junk.crt record: %+v", r)
	}
}
