package k8s

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/shale-db/shale/security/certgen"
)

// The TLS contract of the prod overlay: the Secret tlsSecret in
// cert-manager's layout (the keys secretCert, secretKey, secretCA), one
// node certificate shared by all pods, and client certificates required.
const (
	tlsSecret       = "shale-tls"
	clientTLSSecret = "shale-client-tls"
	secretCert      = "tls.crt"
	secretKey       = "tls.key"
	secretCA        = "ca.crt"
	// certManagerFile holds the example cert-manager objects (not part of
	// any kustomization).
	certManagerFile = "cert-manager/certificates.yaml"
	// readme documents making the Secret by hand.
	readme = "../../README.md"
)

// tlsEnv are the settings that turn TLS on in shale-server
// (SHALE_<FLAG>) and in shalectl run in a pod. A plaintext variant sets
// none of them.
var tlsEnv = []string{
	"SHALE_CERT_FILE", "SHALE_KEY_FILE", "SHALE_TRUSTED_CA_FILE", "SHALE_CLIENT_CERT_AUTH",
	"SHALE_PEER_CERT_FILE", "SHALE_PEER_KEY_FILE", "SHALE_PEER_TRUSTED_CA_FILE", "SHALE_PEER_ALLOWED_CN",
	"SHALE_TLS_MIN_VERSION", "SHALE_TLS_RELOAD_INTERVAL",
	"SHALE_CACERT", "SHALE_CERT", "SHALE_KEY",
}

// containerEnv is the container's environment as far as the manifests fix
// it: the ConfigMap's data, then env's literal values.
func containerEnv(c *corev1.Container, cfg map[string]string) map[string]string {
	env := map[string]string{}
	for k, v := range cfg {
		env[k] = v
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = expand(e.Value, env)
		}
	}
	return env
}

func preStopCommand(c *corev1.Container) []string {
	if l := c.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Exec != nil {
		return l.PreStop.Exec.Command
	}
	return nil
}

// podHosts are the hosts the pods of sts advertise (shale-N.shale-peer),
// for its replicas and the next pod a scale-up adds.
func podHosts(sts *appsv1.StatefulSet) []string {
	n := int32(1)
	if sts.Spec.Replicas != nil {
		n = *sts.Spec.Replicas
	}
	var out []string
	for i := range n + 1 {
		out = append(out, fmt.Sprintf("%s-%d.%s", sts.Name, i, sts.Spec.ServiceName))
	}
	return out
}

// allowedPeer applies --peer-allowed-cn as shale-server does: a pattern
// (path.Match) matching the common name or a DNS name.
func allowedPeer(patterns []string, names ...string) bool {
	for _, p := range patterns {
		for _, n := range names {
			if ok, _ := path.Match(p, n); ok {
				return true
			}
		}
	}
	return false
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// checkTLS checks a variant's TLS wiring: for a TLS variant the Secret
// volume (whole, so that updates reach the pods), the TLS settings naming
// its files, HTTPS probes, and a preStop hook that speaks TLS; for the
// others, none of it.
func checkTLS(t *testing.T, v variant, sts *appsv1.StatefulSet, c *corev1.Container, cfg map[string]string) {
	pod := &sts.Spec.Template.Spec
	env := containerEnv(c, cfg)
	hook := preStopCommand(c)
	var secretVols []corev1.Volume
	for _, vol := range pod.Volumes {
		if vol.Secret != nil {
			secretVols = append(secretVols, vol)
		}
	}
	probes := map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "livenessProbe": c.LivenessProbe}
	scheme := sts.Spec.Template.Annotations["prometheus.io/scheme"]

	if !v.tls {
		for _, k := range tlsEnv {
			if val, ok := env[k]; ok {
				t.Errorf("%s=%q set; want a plaintext cluster", k, val)
			}
		}
		for _, vol := range secretVols {
			t.Errorf("Secret volume %s (%s); want none in a plaintext cluster", vol.Name, vol.Secret.SecretName)
		}
		for name, p := range probes {
			if p != nil && p.HTTPGet != nil && p.HTTPGet.Scheme != "" && p.HTTPGet.Scheme != corev1.URISchemeHTTP {
				t.Errorf("%s scheme %s; want HTTP in a plaintext cluster", name, p.HTTPGet.Scheme)
			}
		}
		for _, f := range []string{"--cacert", "--cert", "--key"} {
			if val := flagValue(hook, f); val != "" {
				t.Errorf("preStop %s %q; want none in a plaintext cluster", f, val)
			}
		}
		if scheme != "" && scheme != "http" {
			t.Errorf("prometheus.io/scheme %q; want http (or none) in a plaintext cluster", scheme)
		}
		return
	}

	// The Secret, mounted whole and read-only.
	var vol *corev1.Volume
	for i := range secretVols {
		if secretVols[i].Secret.SecretName == tlsSecret {
			if vol != nil {
				t.Errorf("Secret %s is in two volumes, %s and %s", tlsSecret, vol.Name, secretVols[i].Name)
			}
			vol = &secretVols[i]
		}
	}
	if vol == nil {
		t.Fatalf("no volume of the Secret %s (volumes %+v)", tlsSecret, pod.Volumes)
	}
	src := vol.Secret
	if len(src.Items) != 0 {
		t.Errorf("volume %s: items %+v; want the Secret's keys as they are (cert-manager's layout)", vol.Name, src.Items)
	}
	if deref(src.Optional) {
		t.Errorf("volume %s: optional; a pod without its certificate must not start", vol.Name)
	}
	if src.DefaultMode == nil || *src.DefaultMode&0o007 != 0 || *src.DefaultMode&0o040 == 0 {
		t.Errorf("volume %s: defaultMode %v; want the files readable by the group (fsGroup) and not by others, e.g. 0440",
			vol.Name, fmtMode(src.DefaultMode))
	}
	var dir string
	for _, ctr := range allContainers(pod) {
		for _, m := range ctr.VolumeMounts {
			if m.Name != vol.Name {
				continue
			}
			// A subPath mount is a copy the kubelet never updates: a
			// renewed certificate would not reach the pod.
			if m.SubPath != "" || m.SubPathExpr != "" {
				t.Errorf("container %s mounts %s with subPath %q (subPathExpr %q); want the whole volume (updates do not reach subPath mounts)",
					ctr.Name, vol.Name, m.SubPath, m.SubPathExpr)
			}
			if !m.ReadOnly {
				t.Errorf("container %s mounts %s read-write; want readOnly", ctr.Name, vol.Name)
			}
			if ctr.Name == c.Name {
				dir = m.MountPath
			}
		}
	}
	if dir == "" {
		t.Fatalf("container %s does not mount the volume %s", c.Name, vol.Name)
	}

	// The settings name the Secret's files; client certificates are required.
	cert, key, ca := path.Join(dir, secretCert), path.Join(dir, secretKey), path.Join(dir, secretCA)
	for k, want := range map[string]string{
		"SHALE_CERT_FILE": cert, "SHALE_KEY_FILE": key, "SHALE_TRUSTED_CA_FILE": ca,
		"SHALE_PEER_CERT_FILE": cert, "SHALE_PEER_KEY_FILE": key, "SHALE_PEER_TRUSTED_CA_FILE": ca,
		"SHALE_CLIENT_CERT_AUTH": "true",
		"SHALE_CACERT":           ca, "SHALE_CERT": cert, "SHALE_KEY": key,
	} {
		if got := env[k]; got != want {
			t.Errorf("%s=%q; want %q", k, got, want)
		}
	}
	if mv, ok := env["SHALE_TLS_MIN_VERSION"]; ok && mv != "1.3" && mv != "1.2" {
		t.Errorf("SHALE_TLS_MIN_VERSION=%q; want 1.2 or 1.3", mv)
	}
	allowed := splitList(env["SHALE_PEER_ALLOWED_CN"])
	if len(allowed) == 0 {
		t.Error("SHALE_PEER_ALLOWED_CN not set; one CA signs node and client certificates, so the node names must be listed")
	}
	for _, h := range podHosts(sts) {
		if !allowedPeer(allowed, h) {
			t.Errorf("SHALE_PEER_ALLOWED_CN %q does not allow pod host %s", allowed, h)
		}
	}
	if allowedPeer(allowed, "root") {
		t.Errorf("SHALE_PEER_ALLOWED_CN %q allows a client certificate for user root", allowed)
	}

	// Probes: HTTPS on the HTTP port; readiness stays gRPC (answered in
	// plaintext), which checkManifests checks.
	for name, p := range probes {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s %+v; want httpGet with scheme HTTPS", name, p)
		}
	}

	// preStop: trusts the CA and presents the pod's certificate.
	for f, want := range map[string]string{"--cacert": ca, "--cert": cert, "--key": key} {
		if got := flagValue(hook, f); got != want {
			t.Errorf("preStop %s %q; want %q (hook %q)", f, got, want, hook)
		}
	}
	if scheme != "https" {
		t.Errorf("pod annotation prometheus.io/scheme %q; want https", scheme)
	}
}

func fmtMode(m *int32) string {
	if m == nil {
		return "unset"
	}
	return fmt.Sprintf("%#o", *m)
}

// cmObject is a cert-manager object of certManagerFile.
type cmObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// cmCertificate is the part of cert-manager's Certificate spec the file
// uses; decoding is strict, so a misspelled field fails.
type cmCertificate struct {
	IsCA        bool     `json:"isCA,omitempty"`
	CommonName  string   `json:"commonName,omitempty"`
	SecretName  string   `json:"secretName"`
	DNSNames    []string `json:"dnsNames,omitempty"`
	IPAddresses []string `json:"ipAddresses,omitempty"`
	Usages      []string `json:"usages,omitempty"`
	Duration    string   `json:"duration,omitempty"`
	RenewBefore string   `json:"renewBefore,omitempty"`
	PrivateKey  *struct {
		Algorithm      string `json:"algorithm"`
		Size           int    `json:"size"`
		RotationPolicy string `json:"rotationPolicy,omitempty"`
	} `json:"privateKey,omitempty"`
	IssuerRef struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
	} `json:"issuerRef"`
}

type cmIssuer struct {
	SelfSigned *struct{} `json:"selfSigned,omitempty"`
	CA         *struct {
		SecretName string `json:"secretName"`
	} `json:"ca,omitempty"`
}

// certManagerObjects decodes certManagerFile: Certificates by secretName,
// Issuers by name.
func certManagerObjects(t *testing.T) (certs map[string]*cmCertificate, issuers map[string]*cmIssuer) {
	t.Helper()
	data, err := os.ReadFile(certManagerFile)
	if err != nil {
		t.Fatal(err)
	}
	certs, issuers = map[string]*cmCertificate{}, map[string]*cmIssuer{}
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var o cmObject
		if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
			t.Fatalf("%s document %d: %v", certManagerFile, i, err)
		}
		if o.APIVersion != "cert-manager.io/v1" || o.Metadata.Name == "" {
			t.Errorf("%s document %d: apiVersion %q name %q; want cert-manager.io/v1 and a name", certManagerFile, i, o.APIVersion, o.Metadata.Name)
		}
		if o.Metadata.Namespace != "" {
			t.Errorf("%s %s: namespace %q; apply it with -n instead", o.Kind, o.Metadata.Name, o.Metadata.Namespace)
		}
		switch o.Kind {
		case "Certificate":
			var c cmCertificate
			if err := yaml.UnmarshalStrict(o.Spec, &c); err != nil {
				t.Fatalf("Certificate %s: %v", o.Metadata.Name, err)
			}
			if certs[c.SecretName] != nil {
				t.Errorf("two Certificates write the Secret %s", c.SecretName)
			}
			certs[c.SecretName] = &c
		case "Issuer":
			var is cmIssuer
			if err := yaml.UnmarshalStrict(o.Spec, &is); err != nil {
				t.Fatalf("Issuer %s: %v", o.Metadata.Name, err)
			}
			issuers[o.Metadata.Name] = &is
		default:
			t.Errorf("%s: unexpected kind %q", certManagerFile, o.Kind)
		}
	}
	return certs, issuers
}

// nodeCertOptions are the certgen options of the node certificate that
// certManagerFile describes (the Secret tlsSecret).
func nodeCertOptions(t *testing.T) certgen.Options {
	t.Helper()
	certs, _ := certManagerObjects(t)
	c := certs[tlsSecret]
	if c == nil {
		t.Fatalf("%s: no Certificate with secretName %s", certManagerFile, tlsSecret)
	}
	return c.options()
}

func (c *cmCertificate) options() certgen.Options {
	return certgen.Options{
		CommonName: c.CommonName,
		Hosts:      append(slices.Clone(c.DNSNames), c.IPAddresses...),
		Server:     slices.Contains(c.Usages, "server auth"),
		Client:     slices.Contains(c.Usages, "client auth"),
	}
}

// issue makes a throwaway certificate as described by opts, to check it
// the way Go's TLS does.
func issue(t *testing.T, opts certgen.Options) *x509.Certificate {
	t.Helper()
	ca, err := certgen.NewCA("test CA", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Issue(opts)
	if err != nil {
		t.Fatalf("issue %+v: %v", opts, err)
	}
	return p.Cert
}

// TestCertManagerExample checks the example cert-manager objects against
// the prod overlay: the node certificate is signed by a CA the Secret
// carries (ca.crt), is good for server and client use, names every host
// the pods are reached by (checked as Go's TLS checks names) and passes
// SHALE_PEER_ALLOWED_CN; the client certificate does not.
func TestCertManagerExample(t *testing.T) {
	certs, issuers := certManagerObjects(t)
	o := decodeAll(t, render(t, filesys.MakeFsOnDisk(), "overlays/prod"))
	if len(o.statefulSets) != 1 || len(o.configMaps) != 1 {
		t.Fatal("overlays/prod: want one StatefulSet and one ConfigMap")
	}
	sts := o.statefulSets[0]
	var cfg map[string]string
	for _, cm := range o.configMaps {
		cfg = cm.Data
	}
	c := &sts.Spec.Template.Spec.Containers[0]
	allowed := splitList(containerEnv(c, cfg)["SHALE_PEER_ALLOWED_CN"])

	for secret, cert := range certs {
		is := issuers[cert.IssuerRef.Name]
		if cert.IssuerRef.Kind != "Issuer" || is == nil {
			t.Errorf("Certificate for %s: issuerRef %+v is not an Issuer of the file", secret, cert.IssuerRef)
			continue
		}
		if is.CA != nil && (certs[is.CA.SecretName] == nil || !certs[is.CA.SecretName].IsCA) {
			t.Errorf("Issuer %s: ca.secretName %q is not a CA Certificate of the file", cert.IssuerRef.Name, is.CA.SecretName)
		}
		if cert.Duration != "" {
			d, err1 := time.ParseDuration(cert.Duration)
			r, err2 := time.ParseDuration(orDefault(cert.RenewBefore, "0s"))
			if err1 != nil || err2 != nil || r >= d {
				t.Errorf("Certificate for %s: duration %q renewBefore %q", secret, cert.Duration, cert.RenewBefore)
			}
		}
	}
	for _, secret := range []string{tlsSecret, clientTLSSecret} {
		cert := certs[secret]
		if cert == nil {
			t.Fatalf("no Certificate with secretName %s", secret)
		}
		// The Secret has ca.crt only when a CA issuer signs it.
		if is := issuers[cert.IssuerRef.Name]; is == nil || is.CA == nil {
			t.Errorf("Certificate for %s is not signed by a CA Issuer: its Secret would lack %s", secret, secretCA)
		}
		if cert.IsCA {
			t.Errorf("Certificate for %s is a CA", secret)
		}
	}

	node := issue(t, certs[tlsSecret].options())
	if !slices.Contains(node.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(node.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Errorf("node certificate usages %q; want server auth and client auth", certs[tlsSecret].Usages)
	}
	hosts := podHosts(sts)
	hosts = append(hosts, clientService, "localhost")
	if ep := flagValue(preStopCommand(c), "--endpoints"); ep != "" {
		h, _, err := net.SplitHostPort(ep)
		if err != nil {
			t.Fatalf("preStop --endpoints %q: %v", ep, err)
		}
		hosts = append(hosts, h)
	}
	for _, h := range hosts {
		if err := node.VerifyHostname(h); err != nil {
			t.Errorf("node certificate: %v", err)
		}
	}
	if !allowedPeer(allowed, append([]string{node.Subject.CommonName}, node.DNSNames...)...) {
		t.Errorf("node certificate (CN %q, DNS names %q) is not allowed by SHALE_PEER_ALLOWED_CN %q", node.Subject.CommonName, node.DNSNames, allowed)
	}

	user := issue(t, certs[clientTLSSecret].options())
	if slices.Contains(user.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(user.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Errorf("client certificate usages %q; want client auth only", certs[clientTLSSecret].Usages)
	}
	if user.Subject.CommonName == "" || allowedPeer(allowed, append([]string{user.Subject.CommonName}, user.DNSNames...)...) {
		t.Errorf("client certificate CN %q: want a user name that SHALE_PEER_ALLOWED_CN %q does not allow", user.Subject.CommonName, allowed)
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestREADMECertCommands checks the by-hand way of README.md: the node
// certificate `shalectl cert create-node` makes names at least what the
// cert-manager example's does, and `kubectl create secret` puts its files
// and the CA under the keys the prod overlay reads.
func TestREADMECertCommands(t *testing.T) {
	cmds := readmeCommands(t)
	want := nodeCertOptions(t)
	var node, dir string
	var hosts []string
	var secret []string
	for _, words := range cmds {
		switch {
		case len(words) > 3 && slices.Equal(words[:3], []string{"shalectl", "cert", "create-node"}):
			node = words[3]
			for _, w := range words[4:] {
				if strings.HasPrefix(w, "-") {
					break
				}
				hosts = append(hosts, w)
			}
			dir = flagValue(words, "--certs-dir")
		case len(words) > 4 && words[0] == "kubectl" && slices.Contains(words, "secret") && slices.Contains(words, tlsSecret):
			secret = words
		}
	}
	if node == "" || dir == "" {
		t.Fatalf("README.md: no `shalectl cert create-node NAME HOST... --certs-dir DIR` in the Kubernetes section (commands %q)", cmds)
	}
	for _, h := range want.Hosts {
		if !slices.Contains(hosts, h) {
			t.Errorf("README.md: create-node hosts %q lack %s", hosts, h)
		}
	}
	if secret == nil {
		t.Fatalf("README.md: no `kubectl create secret generic %s` in the Kubernetes section", tlsSecret)
	}
	var files []string
	for i, w := range secret {
		if v, ok := strings.CutPrefix(w, "--from-file="); ok {
			files = append(files, v)
		} else if w == "--from-file" && i+1 < len(secret) {
			files = append(files, secret[i+1])
		}
	}
	slices.Sort(files)
	wantFiles := []string{
		secretCA + "=" + path.Join(dir, "ca.crt"),
		secretCert + "=" + path.Join(dir, node+".crt"),
		secretKey + "=" + path.Join(dir, node+".key"),
	}
	if !slices.Equal(files, wantFiles) {
		t.Errorf("README.md: kubectl create secret %s --from-file %q; want %q", tlsSecret, files, wantFiles)
	}
}

// readmeCommands returns the shell commands of the sh blocks in README.md's
// "Deploy on Kubernetes" section, split into words (continuation lines
// joined, comments and quotes removed, $NS as "default").
func readmeCommands(t *testing.T) [][]string {
	t.Helper()
	f, err := os.Open(readme)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]string
	in, block := false, false
	var line string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## Deploy on Kubernetes"
			continue
		case !in:
			continue
		case strings.HasPrefix(l, "```"):
			block = !block && strings.TrimPrefix(l, "```") == "sh"
			continue
		case !block:
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		if c, ok := strings.CutSuffix(strings.TrimSpace(l), "\\"); ok {
			line += c + " "
			continue
		}
		line += l
		line = strings.NewReplacer(`"`, "", "'", "", "$NS", "default", "${NS}", "default").Replace(line)
		if words := strings.Fields(line); len(words) > 0 {
			out = append(out, words)
		}
		line = ""
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no sh blocks in the section \"Deploy on Kubernetes\"", readme)
	}
	return out
}
