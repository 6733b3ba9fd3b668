package k8s

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	shaleclient "github.com/shale-db/shale/client"
	"github.com/shale-db/shale/security/certgen"
)

// secretVolume is a directory laid out as the kubelet lays out a Secret
// volume: the files in a directory ..<timestamp>, the symlink ..data to
// it, and one symlink per key through ..data, with the volume's mode and
// the pod's fsGroup as group. write swaps ..data with one rename, as the
// kubelet does when the Secret changes, so that a reader sees either the
// old files or the new ones. Every pod binds the same directory, as every
// kubelet mounts the same Secret.
type secretVolume struct {
	dir  string
	mode os.FileMode
	gid  int    // -1: the test's own group
	cur  string // the current ..<timestamp> directory
	gen  int
}

func newSecretVolume(t *testing.T, mode os.FileMode, fsGroup *int64) *secretVolume {
	t.Helper()
	dir, err := os.MkdirTemp("", "shale-secret-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &secretVolume{dir: dir, mode: mode, gid: -1}
	if fsGroup != nil {
		s.gid = int(*fsGroup)
	}
	return s
}

func (s *secretVolume) write(t *testing.T, files map[string][]byte) {
	t.Helper()
	s.gen++
	ts := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), s.gen)
	tsDir := filepath.Join(s.dir, ts)
	if err := os.Mkdir(tsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, data := range files {
		p := filepath.Join(tsDir, k)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		mode := s.mode
		if s.gid >= 0 {
			if err := os.Chown(p, -1, s.gid); err != nil {
				// Only root may give a file to another group: let the
				// pods' user read it as "others" instead.
				if s.gen == 1 {
					t.Logf("Secret volume: chgrp %d: %v; making the files readable by all", s.gid, err)
				}
				mode |= 0o004
			}
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for k := range files {
		link := filepath.Join(s.dir, k)
		if _, err := os.Lstat(link); errors.Is(err, fs.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s.cur != "" {
		_ = os.RemoveAll(filepath.Join(s.dir, s.cur))
	}
	s.cur = ts
}

// testPKI is what the Secrets of a TLS cluster hold: a CA, the node
// certificate of cert-manager/certificates.yaml that all pods share, and a
// client certificate for user root (the Secret shale-client-tls).
type testPKI struct {
	ca, node, root *certgen.Pair
	nodeOpts       certgen.Options
	pool           *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := certgen.NewCA("Shale CA", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{ca: ca, nodeOpts: nodeCertOptions(t), pool: x509.NewCertPool()}
	p.pool.AddCert(ca.Cert)
	if p.node, err = ca.Issue(p.nodeOpts); err != nil {
		t.Fatal(err)
	}
	if p.root, err = ca.Issue(certgen.Options{CommonName: "root", Client: true}); err != nil {
		t.Fatal(err)
	}
	return p
}

// secretFiles is the Secret tlsSecret with node as the node certificate,
// in cert-manager's layout.
func (p *testPKI) secretFiles(node *certgen.Pair) map[string][]byte {
	return map[string][]byte{secretCert: node.CertPEM, secretKey: node.KeyPEM, secretCA: p.ca.CertPEM}
}

// tlsConfig is a client's: it trusts the CA, checks the nodes'
// certificates for serverName, and presents root's certificate if
// withCert.
func (p *testPKI) tlsConfig(serverName string, withCert bool) *tls.Config {
	cfg := &tls.Config{RootCAs: p.pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if withCert {
		cfg.Certificates = []tls.Certificate{{Certificate: [][]byte{p.root.Cert.Raw}, PrivateKey: p.root.Key, Leaf: p.root.Cert}}
	}
	return cfg
}

// podIP is pod p's address on the test network (the pod IP).
func (h *harness) podIP(ctx context.Context, p *pod) (string, error) {
	insp, err := p.ctr.Inspect(ctx)
	if err != nil {
		return "", err
	}
	ep := insp.NetworkSettings.Networks[h.netName]
	if ep == nil || !ep.IPAddress.IsValid() {
		return "", fmt.Errorf("%s has no address on network %s", p.name, h.netName)
	}
	return ep.IPAddress.String(), nil
}

// ready runs the pods' readiness probe, a grpc probe, as the kubelet runs
// it: a plaintext gRPC health check of the pod IP (the kubelet's gRPC
// probes cannot speak TLS, so under TLS this also checks that the node
// answers health checks in plaintext).
func (h *harness) ready(ctx context.Context, pods []*pod) error {
	probe := h.tp.readiness
	if probe == nil {
		return nil
	}
	for _, p := range pods {
		ip, err := h.podIP(ctx, p)
		if err != nil {
			return err
		}
		conn, err := grpc.NewClient(net.JoinHostPort(ip, strconv.Itoa(int(probe.GRPC.Port))),
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent("kube-probe/shale-deploy-test"))
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, time.Duration(max(probe.TimeoutSeconds, 1))*time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(pctx, &healthpb.HealthCheckRequest{Service: deref(probe.GRPC.Service)})
		cancel()
		_ = conn.Close()
		if err != nil {
			return fmt.Errorf("readiness probe of %s: %w", p.name, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("readiness probe of %s: %s", p.name, resp.GetStatus())
		}
	}
	return nil
}

// checkTLSServing checks what clients of a TLS cluster see: shalectl in a
// pod refused without TLS and without a client certificate; an
// application with a client certificate of the CA (the Go SDK from the
// host) served; the HTTP port serving HTTPS, /healthz to anyone and
// /metrics to holders of a client certificate only.
func (h *harness) checkTLSServing(ctx context.Context, pods []*pod, key, value string) {
	tp, p := h.tp, pods[0]

	// shalectl in a pod (as kubectl exec runs it, with the pod's SHALE_CACERT,
	// SHALE_CERT and SHALE_KEY), the TLS settings taken away.
	for _, tc := range []struct {
		what string
		args []string
		want string
	}{
		{"in plaintext", []string{"--cacert=", "--cert=", "--key="}, "requires TLS"},
		{"without a client certificate", []string{"--cert=", "--key="}, "certificate required"},
	} {
		r, err := h.ctl(ctx, p, tp.localEndpoint(), append(tc.args, "kv", "get", key)...)
		if err == nil || !strings.Contains(r.stderr, tc.want) {
			h.fatalf("shalectl kv get %s in %s: %v (stderr %q); want a refusal saying %q", tc.what, p.name, err, r.stderr, tc.want)
		}
	}

	// An application with root's client certificate. The host cannot
	// resolve the pods' names: the SDK dials their IPs and checks the
	// certificate for the client Service's name.
	eps := map[string]string{}
	for _, q := range pods {
		ip, err := h.podIP(ctx, q)
		if err != nil {
			h.fatalf("%v", err)
		}
		eps[tp.address(q.name)] = net.JoinHostPort(ip, strconv.Itoa(int(tp.grpcPort)))
	}
	eps[tp.clientEndpoint()] = eps[tp.address(p.name)]
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	c, err := shaleclient.New(sctx, []string{tp.clientEndpoint()},
		shaleclient.WithTLS(h.pki.tlsConfig(tp.clientService, true)),
		shaleclient.WithAddressMap(func(a string) string {
			if m, ok := eps[a]; ok {
				return m
			}
			return a
		}))
	if err != nil {
		h.fatalf("Go SDK with a client certificate: %v", err)
	}
	defer c.Close()
	kv, err := c.Get(sctx, []byte(key))
	if err != nil || string(kv.Value) != value {
		h.fatalf("Go SDK Get %s: %v, %+v; want %q", key, err, kv, value)
	}
	key2, value2 := key+"/sdk", value+"/sdk"
	if _, err := c.Put(sctx, []byte(key2), []byte(value2)); err != nil {
		h.fatalf("Go SDK Put %s: %v", key2, err)
	}
	if err := h.getValue(ctx, pods[len(pods)-1], tp.clientEndpoint(), key2, value2); err != nil {
		h.fatalf("kv get of the SDK's write: %v", err)
	}

	// Auth on: user root (who authenticates with the client certificate,
	// no password) holds the root role. From then on the rest of the run
	// (joins, preStop hooks, restarts, in-pod shalectl with the node
	// certificate) goes through the access checks.
	if err := c.UserAdd(sctx, "root", "", true); err != nil {
		h.fatalf("user add root: %v", err)
	}
	if err := c.UserGrantRole(sctx, "root", "root"); err != nil {
		h.fatalf("user grant-role root root: %v", err)
	}
	if err := c.AuthEnable(sctx); err != nil {
		h.fatalf("auth enable: %v", err)
	}
	h.poll(ctx, stepTimeout, "auth is enforced", func(ctx context.Context) error {
		st, err := c.AuthStatus(ctx)
		if err != nil {
			return err
		}
		if !st.GetEnabled() || st.GetUser() != "root" {
			return fmt.Errorf("auth status %v", st)
		}
		return nil
	})
	key4, value4 := key+"/auth", value+"/auth"
	if _, err := c.Put(sctx, []byte(key4), []byte(value4)); err != nil {
		h.fatalf("Go SDK Put as root (by certificate) with auth on: %v", err)
	}
	if err := h.getValue(ctx, pods[len(pods)-1], tp.localEndpoint(), key4, value4); err != nil {
		h.fatalf("in-pod kv get with the node certificate, auth on: %v", err)
	}
	// A certificate of the CA naming no user is refused.
	nobody, err := h.pki.ca.Issue(certgen.Options{CommonName: "nobody", Client: true})
	if err != nil {
		h.fatalf("issue: %v", err)
	}
	ncfg := h.pki.tlsConfig(tp.clientService, false)
	ncfg.Certificates = []tls.Certificate{{Certificate: [][]byte{nobody.Cert.Raw}, PrivateKey: nobody.Key, Leaf: nobody.Cert}}
	if nc, err := shaleclient.New(sctx, []string{tp.clientEndpoint()}, shaleclient.WithTLS(ncfg),
		shaleclient.WithAddressMap(func(a string) string {
			if m, ok := eps[a]; ok {
				return m
			}
			return a
		})); err == nil {
		nc.Close()
		h.fatalf("a certificate naming no user connected with auth on")
	} else if !errors.Is(err, shaleclient.ErrUnauthenticated) && !strings.Contains(err.Error(), "unauthenticated") {
		h.fatalf("a certificate naming no user: %v; want unauthenticated", err)
	}

	// The HTTP port.
	ip, _, _ := net.SplitHostPort(eps[tp.address(p.name)])
	hostPort := net.JoinHostPort(ip, strconv.Itoa(int(tp.httpPort)))
	for _, tc := range []struct {
		scheme, path string
		cert         bool
		want         int
	}{
		{"http", "/healthz", false, http.StatusBadRequest}, // plain HTTP to an HTTPS port
		{"https", "/healthz", false, http.StatusOK},
		{"https", "/metrics", false, http.StatusUnauthorized},
		{"https", "/metrics", true, http.StatusOK},
	} {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: h.pki.tlsConfig(tp.clientService, tc.cert)}}
		u := tc.scheme + "://" + hostPort + tc.path
		resp, err := hc.Get(u)
		if err != nil {
			h.fatalf("GET %s (client certificate %v): %v", u, tc.cert, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.want {
			h.fatalf("GET %s (client certificate %v): %s; want %d", u, tc.cert, resp.Status, tc.want)
		}
	}
}

// rotateNodeCert renews the node certificate as cert-manager does (a new
// key and certificate in the Secret, which the kubelet swaps in the
// volume) and waits until every pod serves it, then checks that the
// cluster still serves.
func (h *harness) rotateNodeCert(ctx context.Context, pods []*pod, key, value string) {
	tp := h.tp
	renewed, err := h.pki.ca.Issue(h.pki.nodeOpts)
	if err != nil {
		h.fatalf("renew the node certificate: %v", err)
	}
	h.secrets[tlsSecret].write(h.t, h.pki.secretFiles(renewed))
	h.pki.node = renewed
	h.poll(ctx, stepTimeout, "every pod serves the renewed certificate", func(ctx context.Context) error {
		for _, p := range pods {
			ip, err := h.podIP(ctx, p)
			if err != nil {
				return err
			}
			d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: h.pki.tlsConfig(tp.clientService, true)}
			conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(int(tp.grpcPort))))
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			serial := conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber
			_ = conn.Close()
			if serial.Cmp(renewed.Cert.SerialNumber) != 0 {
				return fmt.Errorf("%s serves certificate %x, not the renewed %x", p.name, serial, renewed.Cert.SerialNumber)
			}
		}
		return nil
	})
	key3, value3 := key+"/renewed", value+"/renewed"
	if _, err := h.ctl(ctx, pods[0], tp.clientEndpoint(), "kv", "put", key3, value3); err != nil {
		h.fatalf("kv put after the renewal: %v", err)
	}
	if err := h.getValue(ctx, pods[len(pods)-1], tp.localEndpoint(), key3, value3); err != nil {
		h.fatalf("kv get after the renewal: %v", err)
	}
}
