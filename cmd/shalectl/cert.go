package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	"github.com/shale-db/shale/security/certgen"
)

// The cert commands (create-ca, create-node, create-client, list), modelled
// on `cockroach cert`, make the certificate authority and the certificates
// a cluster with TLS needs, on top of package security/certgen. They work on
// files alone and never contact the cluster.

// caCommonName is the subject of the CAs create-ca makes.
const caCommonName = "Shale CA"

// certFlags are the cert commands' flags.
type certFlags struct {
	*globalFlags
	certsDir  string
	caCert    string
	caKey     string
	overwrite bool
}

// certRecord describes one certificate: the JSON output of the create
// commands and one element of that of list.
type certRecord struct {
	// File is the certificate's path (for list: its name in the
	// directory).
	File string `json:"file"`
	// KeyFile is the key's path (for list: NAME.key next to NAME.crt;
	// null when there is none).
	KeyFile *string `json:"key_file"`
	// Key is "ok" when KeyFile holds the certificate's key, "none" when
	// there is no key file, "mismatch" when it holds another
	// certificate's key and "invalid" when it cannot be read.
	Key        string    `json:"key"`
	CommonName string    `json:"common_name"`
	Usages     []string  `json:"usages"`
	Hosts      []string  `json:"hosts"`
	NotBefore  time.Time `json:"not_before"`
	NotAfter   time.Time `json:"not_after"`
	// Issuer is the common name of the certificate's issuer (its own for
	// a CA).
	Issuer  string `json:"issuer"`
	Expired bool   `json:"expired"`
	// Error says why list could not read the certificate (null
	// otherwise; the other fields are then empty).
	Error *string `json:"error"`
}

// newCertCmd builds the "cert" command group.
func newCertCmd(g *globalFlags) *cobra.Command {
	f := &certFlags{globalFlags: g}

	var caLifetime time.Duration
	createCA := &cobra.Command{
		Use:   "create-ca --certs-dir DIR [--lifetime D] [--overwrite]",
		Short: "Create the certificate authority that signs the cluster's certificates",
		Long: `create-ca makes a new certificate authority (CN "` + caCommonName + `", an ECDSA P-256 key)
and writes its certificate to DIR/ca.crt and its key to DIR/ca.key (readable by
its owner only). --ca-cert and --ca-key write them elsewhere: keep the CA key
off the nodes, and give it to create-node and create-client with --ca-key.

Existing files are not replaced: the command fails unless --overwrite is
given. A new CA does not sign the certificates of the old one, so they stop
verifying until they are made again with create-node and create-client.

It prints the files written and the certificate's common name, usages and
validity (--lifetime, default ten years). With -o json: {file, key_file, key,
common_name, usages, hosts, not_before, not_after, issuer, expired, error}.`,
		Example: `  shalectl cert create-ca --certs-dir certs
  shalectl cert create-ca --certs-dir certs --ca-key /secure/ca.key --lifetime 43800h`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := f.setup(cmd, caLifetime)
			if err != nil {
				return err
			}
			crt, key := f.caFiles()
			if samePath(crt, key) {
				return &usageError{cmd: cmd, msg: fmt.Sprintf("the CA's certificate and key must be two files, not both %s", crt)}
			}
			if err := f.checkFree(crt, key); err != nil {
				return fmt.Errorf("cert create-ca: %w", err)
			}
			ca, err := certgen.NewCA(caCommonName, certgen.Options{Lifetime: caLifetime})
			if err != nil {
				return fmt.Errorf("cert create-ca: %w", err)
			}
			if err := ca.Write(crt, key); err != nil {
				return fmt.Errorf("cert create-ca: %w", err)
			}
			return writeCreated(cmd, asJSON, ca, crt, key, "")
		},
	}
	createCA.Flags().DurationVar(&caLifetime, "lifetime", certgen.DefaultCALifetime, "how long the CA stays valid")

	var nodeLifetime time.Duration
	createNode := &cobra.Command{
		Use:   "create-node NAME HOST... --certs-dir DIR [--lifetime D] [--overwrite]",
		Short: "Create a node's certificate and key, signed by the CA",
		Long: `create-node makes the certificate and key of the node NAME, signed by the CA
in DIR/ca.crt and DIR/ca.key (--ca-cert and --ca-key name other files), and
writes them to DIR/NAME.crt and DIR/NAME.key (the key readable by its owner
only). The certificate's common name is NAME; it is valid for the HOSTs,
the DNS names and IP addresses clients and peers reach the node by (at least
one: its --advertise host, and localhost, 127.0.0.1 for local tools); and it
serves (server authentication) and connects to other nodes (client
authentication), so one certificate does for shale-server's --cert-file and
--peer-cert-file.

NAME is 1-64 letters, digits, '.', '_' or '-'. Existing files are not replaced
unless --overwrite is given. The certificate is valid for --lifetime (default
8736h, 364 days), and never beyond the CA. It prints what create-ca prints.`,
		Example: `  shalectl cert create-node node1 node1.shale.svc localhost 127.0.0.1 --certs-dir certs
  shalectl cert create-node node2 10.0.0.12 --certs-dir certs --ca-key /secure/ca.key -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return &usageError{cmd: cmd, msg: fmt.Sprintf("%s takes NAME and at least one HOST; got %d argument(s)", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := f.setup(cmd, nodeLifetime)
			if err != nil {
				return err
			}
			name, hosts := args[0], args[1:]
			if err := checkFileName(cmd, "NAME", name); err != nil {
				return err
			}
			for _, h := range hosts {
				if strings.TrimSpace(h) == "" {
					return &usageError{cmd: cmd, msg: "HOST must not be empty"}
				}
			}
			return f.issue(cmd, asJSON, name, certgen.Options{
				CommonName: name, Hosts: hosts, Server: true, Client: true, Lifetime: nodeLifetime,
			})
		},
	}
	createNode.Flags().DurationVar(&nodeLifetime, "lifetime", certgen.DefaultCertLifetime, "how long the certificate stays valid (at most as long as the CA)")

	var clientLifetime time.Duration
	var out string
	createClient := &cobra.Command{
		Use:   "create-client USER --certs-dir DIR [--out NAME] [--lifetime D] [--overwrite]",
		Short: "Create a client certificate and key for a user, signed by the CA",
		Long: `create-client makes the certificate and key of a client acting as the user
USER, signed by the CA in DIR/ca.crt and DIR/ca.key (--ca-cert and --ca-key
name other files), and writes them to DIR/client.crt and DIR/client.key, or
DIR/NAME.crt and DIR/NAME.key with --out NAME (the key readable by its owner
only). Its common name is USER (with client certificate authentication, the
server takes the CN as the user); it authenticates a client only and cannot
serve. Give the files to shalectl's --cert and --key, with --cacert DIR/ca.crt.

USER is 1-64 printable characters. NAME is 1-64 letters, digits, '.', '_' or
'-'. Existing files are not replaced unless --overwrite is given. The
certificate is valid for --lifetime (default 8736h, 364 days), and never
beyond the CA. It prints what create-ca prints.`,
		Example: `  shalectl cert create-client root --certs-dir certs
  shalectl --cacert certs/ca.crt --cert certs/client.crt --key certs/client.key kv get hello
  shalectl cert create-client alice --out alice --certs-dir certs --lifetime 720h`,
		Args: exactArgs("USER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := f.setup(cmd, clientLifetime)
			if err != nil {
				return err
			}
			user := args[0]
			if err := checkUser(cmd, user); err != nil {
				return err
			}
			if err := checkFileName(cmd, "--out", out); err != nil {
				return err
			}
			return f.issue(cmd, asJSON, out, certgen.Options{CommonName: user, Client: true, Lifetime: clientLifetime})
		},
	}
	createClient.Flags().StringVar(&out, "out", "client", "write the certificate and key to DIR/`NAME`.crt and DIR/NAME.key")
	createClient.Flags().DurationVar(&clientLifetime, "lifetime", certgen.DefaultCertLifetime, "how long the certificate stays valid (at most as long as the CA)")

	list := &cobra.Command{
		Use:   "list --certs-dir DIR",
		Short: "List the certificates in a directory",
		Long: `list prints a table of the certificates in DIR (every *.crt file, by name):
FILE, CN (common name), USAGES (ca; server, client: what the certificate may
authenticate), HOSTS (the DNS names and IP addresses it is valid for), EXPIRES
(UTC, "(expired)" once past), ISSUER (the issuer's common name) and KEY: ok
when NAME.key holds the certificate's key, "-" when there is no NAME.key,
MISMATCH when it holds another certificate's key, INVALID when it cannot be
read. A file that is not a certificate is reported below the table. With -o
json: an array of {file, key_file, key, common_name, usages, hosts,
not_before, not_after, issuer, expired, error}.`,
		Example: `  shalectl cert list --certs-dir certs
  shalectl cert list --certs-dir certs -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := f.setup(cmd, 0)
			if err != nil {
				return err
			}
			recs, err := listCerts(f.certsDir, time.Now())
			if err != nil {
				return fmt.Errorf("cert list: %w", err)
			}
			if asJSON {
				return output.WriteJSON(cmd.OutOrStdout(), recs)
			}
			return writeCertList(cmd.OutOrStdout(), f.certsDir, recs)
		},
	}

	for _, c := range []*cobra.Command{createCA, createNode, createClient, list} {
		c.Flags().StringVar(&f.certsDir, "certs-dir", "", "the directory `DIR` of the certificates and keys (required; made if missing)")
	}
	for _, c := range []*cobra.Command{createCA, createNode, createClient} {
		c.Flags().StringVar(&f.caCert, "ca-cert", "", "the CA's certificate `FILE` (default DIR/ca.crt)")
		c.Flags().StringVar(&f.caKey, "ca-key", "", "the CA's key `FILE` (default DIR/ca.key)")
		c.Flags().BoolVar(&f.overwrite, "overwrite", false, "replace existing files")
	}

	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Create and list the certificates of a cluster with TLS",
		Long: `The cert commands make the certificate authority (CA) of a cluster with TLS
and the certificates it signs, for nodes and for clients, and list them. They
write PEM files into the directory --certs-dir DIR (keys readable by their
owner only) and never contact the cluster. Keys are ECDSA P-256.

  create-ca              DIR/ca.crt and DIR/ca.key
  create-node NAME HOST  DIR/NAME.crt and DIR/NAME.key, for shale-server's
                         --cert-file, --key-file, --peer-cert-file, --peer-key-file
  create-client USER     DIR/client.crt and DIR/client.key, for shalectl's --cert, --key

Every node trusts DIR/ca.crt (shale-server --trusted-ca-file and
--peer-trusted-ca-file), and so does every client (shalectl --cacert). The CA
key is only needed to sign: --ca-key keeps it outside DIR.`,
		Example: `  shalectl cert create-ca --certs-dir certs
  shalectl cert create-node node1 localhost 127.0.0.1 --certs-dir certs
  shalectl cert create-client root --certs-dir certs
  shalectl cert list --certs-dir certs`,
		Args: noArgs,
		RunE: groupHelp,
	}
	cmd.AddCommand(createCA, createNode, createClient, list)
	return cmd
}

// setup validates -o, --certs-dir and, when the command has one,
// --lifetime, and returns whether JSON output was requested.
func (f *certFlags) setup(cmd *cobra.Command, lifetime time.Duration) (asJSON bool, err error) {
	format, err := f.format()
	if err != nil {
		return false, &usageError{cmd: cmd, msg: err.Error()}
	}
	if strings.TrimSpace(f.certsDir) == "" {
		return false, &usageError{cmd: cmd, msg: "--certs-dir DIR is required"}
	}
	if cmd.Flags().Lookup("lifetime") != nil && lifetime <= 0 {
		return false, &usageError{cmd: cmd, msg: fmt.Sprintf("--lifetime must be positive, got %v", lifetime)}
	}
	return format == output.JSON, nil
}

// caFiles returns the paths of the CA's certificate and key.
func (f *certFlags) caFiles() (crt, key string) {
	crt, key = f.caCert, f.caKey
	if crt == "" {
		crt = filepath.Join(f.certsDir, "ca.crt")
	}
	if key == "" {
		key = filepath.Join(f.certsDir, "ca.key")
	}
	return crt, key
}

// checkFree fails when one of files exists, unless --overwrite was given.
func (f *certFlags) checkFree(files ...string) error {
	for _, name := range files {
		_, err := os.Lstat(name)
		switch {
		case err == nil && f.overwrite:
		case err == nil:
			return fmt.Errorf("%s already exists; pass --overwrite to replace it", name)
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
	}
	return nil
}

// issue signs the certificate opts describes with the CA and writes it and
// its key to DIR/name.crt and DIR/name.key.
func (f *certFlags) issue(cmd *cobra.Command, asJSON bool, name string, opts certgen.Options) error {
	what := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ") + " " + opts.CommonName
	caCrt, caKey := f.caFiles()
	crt, key := filepath.Join(f.certsDir, name+".crt"), filepath.Join(f.certsDir, name+".key")
	for _, p := range []string{crt, key} {
		if samePath(p, caCrt) || samePath(p, caKey) {
			return &usageError{cmd: cmd, msg: fmt.Sprintf("%s is a file of the CA: choose another name", p)}
		}
	}
	if err := f.checkFree(crt, key); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	ca, err := loadCA(caCrt, caKey, f.certsDir)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	p, err := ca.Issue(opts)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := p.Write(crt, key); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if p.Cert.NotAfter.Equal(ca.Cert.NotAfter) && p.Cert.NotAfter.Sub(p.Cert.NotBefore) < opts.Lifetime {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: the certificate expires with its CA, at %s\n", p.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return writeCreated(cmd, asJSON, p, crt, key, caCrt)
}

// loadCA loads the CA's certificate and key, saying how to make or name
// them when they are missing.
func loadCA(crt, key, certsDir string) (*certgen.Pair, error) {
	for _, m := range []struct{ file, what, flag string }{{crt, "certificate", "--ca-cert"}, {key, "key", "--ca-key"}} {
		if _, err := os.Stat(m.file); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no CA %s at %s: make the CA with 'shalectl cert create-ca --certs-dir %s', or name its %s with %s",
				m.what, m.file, certsDir, m.what, m.flag)
		}
	}
	ca, err := certgen.Load(crt, key)
	if err != nil {
		return nil, fmt.Errorf("load the CA: %w", err)
	}
	return ca, nil
}

// samePath reports whether a and b name the same file (by path, or as the
// same existing file).
func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// checkFileName checks a name the files NAME.crt and NAME.key are made of.
func checkFileName(cmd *cobra.Command, what, name string) error {
	bad := func(why string) error {
		return &usageError{cmd: cmd, msg: fmt.Sprintf("%s %q: %s", what, name, why)}
	}
	if name == "" || len(name) > 64 {
		return bad("must be 1 to 64 characters")
	}
	if ext := filepath.Ext(name); ext == ".crt" || ext == ".key" {
		return bad(fmt.Sprintf("leave out %s: NAME.crt and NAME.key are written", ext))
	}
	if name == "." || name == ".." {
		return bad("not a file name")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return bad(fmt.Sprintf("%q is not allowed (letters, digits, '.', '_' and '-' are)", c))
		}
	}
	return nil
}

// checkUser checks a user name for a client certificate's CN.
func checkUser(cmd *cobra.Command, user string) error {
	if n := utf8.RuneCountInString(user); n == 0 || n > 64 || !utf8.ValidString(user) {
		return &usageError{cmd: cmd, msg: fmt.Sprintf("USER %q must be 1 to 64 characters of UTF-8", user)}
	}
	for _, c := range user {
		if !unicode.IsPrint(c) {
			return &usageError{cmd: cmd, msg: fmt.Sprintf("USER %q: %q is not printable", user, c)}
		}
	}
	return nil
}

// describeCert makes the record of a certificate.
func describeCert(c *x509.Certificate, now time.Time) certRecord {
	r := certRecord{
		CommonName: c.Subject.CommonName,
		Usages:     certUsages(c),
		Hosts:      append([]string{}, c.DNSNames...),
		NotBefore:  c.NotBefore.UTC(),
		NotAfter:   c.NotAfter.UTC(),
		Issuer:     c.Issuer.CommonName,
		Expired:    now.After(c.NotAfter),
	}
	for _, ip := range c.IPAddresses {
		r.Hosts = append(r.Hosts, ip.String())
	}
	return r
}

// certUsages names what a certificate may do: "ca" (sign certificates),
// "server", "client", or "any" for a certificate that does not restrict
// its usages.
func certUsages(c *x509.Certificate) []string {
	u := []string{}
	if c.IsCA {
		u = append(u, "ca")
	}
	for _, e := range c.ExtKeyUsage {
		switch e {
		case x509.ExtKeyUsageServerAuth:
			u = append(u, "server")
		case x509.ExtKeyUsageClientAuth:
			u = append(u, "client")
		case x509.ExtKeyUsageAny:
			u = append(u, "any")
		}
	}
	if len(c.ExtKeyUsage) == 0 && !c.IsCA {
		u = append(u, "any")
	}
	return u
}

// writeCreated prints what a create command wrote.
func writeCreated(cmd *cobra.Command, asJSON bool, p *certgen.Pair, crt, key, caCrt string) error {
	r := describeCert(p.Cert, time.Now())
	r.File, r.KeyFile, r.Key = crt, &key, "ok"
	if asJSON {
		return output.WriteJSON(cmd.OutOrStdout(), r)
	}
	tw := newTable(cmd.OutOrStdout())
	fmt.Fprintf(tw, "certificate:\t%s\n", crt)
	fmt.Fprintf(tw, "key:\t%s (keep it secret)\n", key)
	fmt.Fprintf(tw, "common name:\t%s\n", r.CommonName)
	fmt.Fprintf(tw, "usages:\t%s\n", strings.Join(r.Usages, ","))
	if len(r.Hosts) > 0 {
		fmt.Fprintf(tw, "hosts:\t%s\n", strings.Join(r.Hosts, ","))
	}
	fmt.Fprintf(tw, "valid:\t%s to %s\n", r.NotBefore.Format(time.RFC3339), r.NotAfter.Format(time.RFC3339))
	if caCrt != "" {
		fmt.Fprintf(tw, "issuer:\t%s (%s)\n", r.Issuer, caCrt)
	}
	return tw.Flush()
}

// listCerts describes the *.crt files in dir, by name.
func listCerts(dir string, now time.Time) ([]certRecord, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	recs := []certRecord{}
	for _, e := range ents {
		if e.IsDir() || filepath.Ext(e.Name()) != ".crt" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		recs = append(recs, describeFile(dir, e.Name(), now))
	}
	slices.SortFunc(recs, func(a, b certRecord) int { return strings.Compare(a.File, b.File) })
	return recs, nil
}

// describeFile makes the record of the certificate file dir/name and its
// key dir/NAME.key.
func describeFile(dir, name string, now time.Time) certRecord {
	fail := func(err error) certRecord {
		msg := err.Error()
		return certRecord{File: name, Key: "none", Usages: []string{}, Hosts: []string{}, Error: &msg}
	}
	crtPath := filepath.Join(dir, name)
	b, err := os.ReadFile(crtPath)
	if err != nil {
		return fail(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return fail(errors.New("no PEM certificate"))
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fail(err)
	}
	r := describeCert(c, now)
	r.File, r.Key = name, "none"
	keyName := strings.TrimSuffix(name, ".crt") + ".key"
	keyPath := filepath.Join(dir, keyName)
	if _, err := os.Stat(keyPath); err != nil {
		return r
	}
	r.KeyFile = &keyName
	switch _, err := certgen.Load(crtPath, keyPath); {
	case err == nil:
		r.Key = "ok"
	case errors.Is(err, certgen.ErrKeyMismatch):
		r.Key = "mismatch"
	default:
		r.Key = "invalid"
	}
	return r
}

// writeCertList prints list's table.
func writeCertList(w io.Writer, dir string, recs []certRecord) error {
	if len(recs) == 0 {
		_, err := fmt.Fprintf(w, "no certificates (*.crt) in %s\n", dir)
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "FILE\tCN\tUSAGES\tHOSTS\tEXPIRES\tISSUER\tKEY")
	var bad []certRecord
	for _, r := range recs {
		if r.Error != nil {
			bad = append(bad, r)
			continue
		}
		hosts := strings.Join(r.Hosts, ",")
		if hosts == "" {
			hosts = "-"
		}
		expires := r.NotAfter.Format(time.RFC3339)
		if r.Expired {
			expires += " (expired)"
		}
		key := map[string]string{"ok": "ok", "none": "-", "mismatch": "MISMATCH", "invalid": "INVALID"}[r.Key]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.File, r.CommonName, strings.Join(r.Usages, ","), hosts, expires, r.Issuer, key)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range bad {
		if _, err := fmt.Fprintf(w, "%s: not readable: %s\n", r.File, *r.Error); err != nil {
			return err
		}
	}
	return nil
}
