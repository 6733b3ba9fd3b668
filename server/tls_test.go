package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/certgen"
	"github.com/shale-db/shale/security/tlsconfig"
	"github.com/shale-db/shale/server"
)

// logBuffer is a concurrency-safe log sink for a node's logs.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// since returns what was logged after offset, and the new offset.
func (l *logBuffer) since(off int) (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	return s[off:], len(s)
}

func issue(t *testing.T, ca *certgen.Pair, o certgen.Options) *certgen.Pair {
	t.Helper()
	p, err := ca.Issue(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func writePair(t *testing.T, p *certgen.Pair, certFile, keyFile string) {
	t.Helper()
	if err := p.Write(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
}

// connectErr opens an SDK client with opts and returns why it failed,
// failing the test if it connected or took longer than a refusal should.
func connectErr(t *testing.T, eps []string, opts ...client.Option) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	cl, err := client.New(ctx, eps, opts...)
	if err == nil {
		cl.Close()
		t.Fatal("connected; want a refusal")
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("the refusal took %v (a hang, not a clear error): %v", d, err)
	}
	return err
}

// TestTLSHandshakeMatrix: a node with TLS, client certificates required,
// serves a client with the right CA and certificate, and refuses with an
// error naming the cause (and a line in its log) a plaintext client, an
// unknown CA, an expired, not yet valid or misnamed server certificate, a
// client without a certificate, with one from another CA or an expired
// one. On the peer side of the port: no certificate, another CA, an
// expired certificate and a name off the allow-list are refused; a client
// certificate cannot make node-to-node calls; a node with certificates
// from another CA cannot join; the HTTP port serves /healthz to anyone and
// metrics only with a client certificate.
func TestTLSHandshakeMatrix(t *testing.T) {
	logs := &logBuffer{}
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, TLS: true, Configure: func(cfg *server.Config) {
		cfg.TLS.ClientCertAuth = true
		cfg.TLS.PeerAllowedNames = []string{"node*"}
		cfg.HTTPAddr = "127.0.0.1:0"
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}})
	cs := c.Certs()
	eps := c.Endpoints()
	node := c.Node(1)
	dir := t.TempDir()
	other, err := certgen.NewCA("another CA", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := certgen.WriteFile(filepath.Join(dir, "other-ca.crt"), other.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	good := []client.Option{client.WithTLSFiles(cs.CAFile(), cs.ClientCertFile(), cs.ClientKeyFile()), client.WithDefaultTimeout(15 * time.Second)}

	// The good client is served.
	cl, err := client.New(context.Background(), eps, good...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}

	expectLog := func(off int, want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, _ := logs.since(off)
			if strings.Contains(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the node logged no %q; it logged:\n%s", want, got)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	t.Run("plaintext client", func(t *testing.T) {
		_, off := logs.since(0)
		err := connectErr(t, eps)
		if !strings.Contains(err.Error(), "requires TLS") {
			t.Fatalf("got %v; want 'requires TLS'", err)
		}
		expectLog(off, "plaintext connection to a TLS port")
		// A call of the raw API gets the same answer, as Unauthenticated.
		cc, err := grpc.NewClient(eps[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = shalev1.NewKVClient(cc).Get(context.Background(), &shalev1.GetRequest{Key: []byte("k")})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "requires TLS") {
			t.Fatalf("plaintext Get: %v; want Unauthenticated, requires TLS", err)
		}
	})

	t.Run("unknown CA", func(t *testing.T) {
		err := connectErr(t, eps, client.WithTLSFiles(filepath.Join(dir, "other-ca.crt"), cs.ClientCertFile(), cs.ClientKeyFile()))
		if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("got %v", err)
		}
	})

	// Server certificate variants: the node re-reads its files.
	serverVariants := []struct {
		name string
		opts certgen.Options
		want string
	}{
		{"expired server certificate", certgen.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}, "expired"},
		{"server certificate not yet valid", certgen.Options{NotBefore: time.Now().Add(24 * time.Hour), NotAfter: time.Now().Add(48 * time.Hour)}, "not yet valid"},
		{"server certificate for another name", certgen.Options{Hosts: []string{"db.example.org"}}, "doesn't contain any IP SANs"},
	}
	// serveNodeCert has the node serve a certificate of the test CA issued
	// with o; the function it returns puts the node's own back.
	serveNodeCert := func(t *testing.T, o certgen.Options) func() {
		t.Helper()
		writePair(t, issue(t, cs.CA, o), cs.NodeCertFile(1), cs.NodeKeyFile(1))
		if err := node.ReloadTLS(); err != nil {
			t.Fatal(err)
		}
		return func() {
			cs.IssueNode(t, cs.CA, 1)
			if err := node.ReloadTLS(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, v := range serverVariants {
		t.Run(v.name, func(t *testing.T) {
			o := v.opts
			o.CommonName, o.Server, o.Client = "node1", true, true
			if o.Hosts == nil {
				o.Hosts = []string{"127.0.0.1", "localhost"}
			}
			defer serveNodeCert(t, o)()
			_, off := logs.since(0)
			err := connectErr(t, eps, good...)
			if !strings.Contains(err.Error(), v.want) {
				t.Fatalf("got %v; want %q", err, v.want)
			}
			expectLog(off, "TLS handshake refused")
		})
	}

	// A certificate for a name the client sets as its tls.Config's
	// ServerName, dialed by address (a pod's certificate for its Service's
	// name, its IP dialed): every connection checks that name, the SDK's
	// own KV.Calls connection included.
	t.Run("server certificate for the client's ServerName", func(t *testing.T) {
		defer serveNodeCert(t, certgen.Options{CommonName: "node1", Server: true, Client: true, Hosts: []string{"db.example.org"}})()
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(cs.CA.CertPEM)
		cert, err := tls.LoadX509KeyPair(cs.ClientCertFile(), cs.ClientKeyFile())
		if err != nil {
			t.Fatal(err)
		}
		cfg := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "db.example.org", MinVersion: tls.VersionTLS12}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		named, err := client.New(ctx, eps, client.WithTLS(cfg), client.WithDefaultTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer named.Close()
		if _, err := named.Put(ctx, []byte("named"), []byte("v")); err != nil {
			t.Fatalf("put with ServerName %q: %v", cfg.ServerName, err)
		}
		if kv, err := named.Get(ctx, []byte("named")); err != nil || string(kv.Value) != "v" {
			t.Fatalf("get with ServerName %q: %+v, %v", cfg.ServerName, kv, err)
		}
	})

	clientVariants := []struct {
		name string
		opts []client.Option
		want string
	}{
		{"no client certificate", []client.Option{client.WithTLSFiles(cs.CAFile(), "", "")}, "certificate required"},
		{"client certificate of another CA", nil, "unknown certificate authority"},
		{"expired client certificate", nil, "expired certificate"},
	}
	otherClient := issue(t, other, certgen.Options{CommonName: "root", Client: true})
	writePair(t, otherClient, filepath.Join(dir, "other.crt"), filepath.Join(dir, "other.key"))
	clientVariants[1].opts = []client.Option{client.WithTLSFiles(cs.CAFile(), filepath.Join(dir, "other.crt"), filepath.Join(dir, "other.key"))}
	expired := issue(t, cs.CA, certgen.Options{CommonName: "root", Client: true, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	writePair(t, expired, filepath.Join(dir, "expired.crt"), filepath.Join(dir, "expired.key"))
	clientVariants[2].opts = []client.Option{client.WithTLSFiles(cs.CAFile(), filepath.Join(dir, "expired.crt"), filepath.Join(dir, "expired.key"))}
	for _, v := range clientVariants {
		t.Run(v.name, func(t *testing.T) {
			_, off := logs.since(0)
			err := connectErr(t, eps, v.opts...)
			if !strings.Contains(err.Error(), v.want) {
				t.Fatalf("got %v; want %q", err, v.want)
			}
			expectLog(off, "TLS handshake refused")
		})
	}

	// The peer side of the port.
	caPool := x509.NewCertPool()
	caPool.AddCert(cs.CA.Cert)
	peerDial := func(t *testing.T, cert *certgen.Pair, alpn []string) *grpc.ClientConn {
		t.Helper()
		cfg := &tls.Config{RootCAs: caPool, NextProtos: alpn, MinVersion: tls.VersionTLS13}
		if cert != nil {
			kp, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
			if err != nil {
				t.Fatal(err)
			}
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp, nil }
		}
		cc, err := grpc.NewClient(eps[0], grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	health := func(cc *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	peerALPN := []string{"h2", tlsconfig.PeerALPN}
	peerVariants := []struct {
		name string
		cert *certgen.Pair
		want string
	}{
		{"peer without a certificate", nil, "certificate required"},
		{"peer certificate of another CA", issue(t, other, certgen.Options{CommonName: "node7", Server: true, Client: true}), "unknown certificate authority"},
		{"expired peer certificate", issue(t, cs.CA, certgen.Options{CommonName: "node7", Server: true, Client: true, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), "expired certificate"},
		{"peer name off the allow-list", issue(t, cs.CA, certgen.Options{CommonName: "intruder", Server: true, Client: true}), "bad certificate"},
	}
	for _, v := range peerVariants {
		t.Run(v.name, func(t *testing.T) {
			_, off := logs.since(0)
			err := health(peerDial(t, v.cert, peerALPN))
			if err == nil || !strings.Contains(err.Error(), v.want) {
				t.Fatalf("got %v; want %q", err, v.want)
			}
			expectLog(off, "TLS handshake refused")
		})
	}
	t.Run("node certificate is a peer", func(t *testing.T) {
		cc := peerDial(t, issue(t, cs.CA, certgen.Options{CommonName: "node7", Server: true, Client: true}), peerALPN)
		if err := health(cc); err != nil {
			t.Fatal(err)
		}
		// A node-to-node call passes the peer check (and fails later, on
		// its content).
		_, err := shalev1.NewAdminClient(cc).Heartbeat(context.Background(), &shalev1.HeartbeatRequest{})
		if status.Code(err) == codes.PermissionDenied {
			t.Fatalf("a node's heartbeat was refused: %v", err)
		}
	})
	t.Run("client certificate makes no node-to-node calls", func(t *testing.T) {
		root := &certgen.Pair{CertPEM: mustRead(t, cs.ClientCertFile()), KeyPEM: mustRead(t, cs.ClientKeyFile())}
		cc := peerDial(t, root, nil)
		if err := health(cc); err != nil {
			t.Fatal(err)
		}
		_, err := shalev1.NewAdminClient(cc).Heartbeat(context.Background(), &shalev1.HeartbeatRequest{})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("Heartbeat from a client: %v; want PermissionDenied", err)
		}
		stream, err := shalev1.NewRaftClient(cc).SendMessages(context.Background())
		if err == nil {
			_, err = stream.CloseAndRecv()
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("Raft SendMessages from a client: %v; want PermissionDenied", err)
		}
		snap, err := shalev1.NewRaftClient(cc).SendSnapshot(context.Background())
		if err == nil {
			_, err = snap.CloseAndRecv()
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("Raft SendSnapshot from a client: %v; want PermissionDenied", err)
		}
		// The same certificate offering itself as a peer is refused:
		// a client certificate is not a node's (no server use, and off
		// the allow-list).
		if err := health(peerDial(t, root, peerALPN)); err == nil {
			t.Fatal("a client certificate passed as a peer")
		}
	})
	t.Run("node of another CA cannot join", func(t *testing.T) {
		jdir := t.TempDir()
		joiner := issue(t, other, certgen.Options{CommonName: "node9", Hosts: []string{"127.0.0.1"}, Server: true, Client: true})
		writePair(t, joiner, filepath.Join(jdir, "n.crt"), filepath.Join(jdir, "n.key"))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		n, err := server.Start(ctx, server.Config{
			DataDir: filepath.Join(jdir, "data"), ListenAddr: "127.0.0.1:0", Join: eps[0],
			Logger: testcluster.Logger(),
			TLS: tlsconfig.ServerConfig{
				CertFile: filepath.Join(jdir, "n.crt"), KeyFile: filepath.Join(jdir, "n.key"),
				PeerCertFile: filepath.Join(jdir, "n.crt"), PeerKeyFile: filepath.Join(jdir, "n.key"),
				PeerTrustedCAFile: filepath.Join(dir, "other-ca.crt"),
			},
		})
		if err == nil {
			n.Stop()
			t.Fatal("a node with another CA's certificate joined")
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("join failed without naming the certificate: %v", err)
		}
	})

	t.Run("HTTP port", func(t *testing.T) {
		base := "https://" + node.HTTPAddr()
		get := func(withCert bool, path string) (int, string) {
			t.Helper()
			cfg := &tls.Config{RootCAs: caPool}
			if withCert {
				kp, err := tls.LoadX509KeyPair(cs.ClientCertFile(), cs.ClientKeyFile())
				if err != nil {
					t.Fatal(err)
				}
				cfg.Certificates = []tls.Certificate{kp}
			}
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
			resp, err := hc.Get(base + path)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := get(false, "/healthz"); code != 200 || body != "ok\n" {
			t.Fatalf("/healthz without a certificate: %d %q", code, body)
		}
		if code, _ := get(false, "/metrics"); code != http.StatusUnauthorized {
			t.Fatalf("/metrics without a client certificate: %d; want 401", code)
		}
		if code, body := get(true, "/metrics"); code != 200 || !strings.Contains(body, "shale_") {
			t.Fatalf("/metrics with a client certificate: %d", code)
		}
		resp, err := http.Get("http://" + node.HTTPAddr() + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS") {
			t.Fatalf("plain HTTP to the HTTPS port: %d %q", resp.StatusCode, b)
		}
	})

	// After all of that, the good client still works.
	if _, err := cl.Get(context.Background(), []byte("k")); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTLSStartRefusesHalfAConfiguration: a node given part of a TLS
// configuration does not start, and says which flag is missing.
func TestTLSStartRefusesHalfAConfiguration(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		cfg  tlsconfig.ServerConfig
		want string
	}{
		{tlsconfig.ServerConfig{CertFile: "a.crt"}, "--key-file"},
		{tlsconfig.ServerConfig{KeyFile: "a.key"}, "--cert-file"},
		{tlsconfig.ServerConfig{CertFile: "a.crt", KeyFile: "a.key"}, "--peer-cert-file, --peer-key-file, --peer-trusted-ca-file"},
		{tlsconfig.ServerConfig{PeerTrustedCAFile: "ca.crt"}, "--cert-file, --key-file, --peer-cert-file, --peer-key-file"},
		{tlsconfig.ServerConfig{CertFile: "a.crt", KeyFile: "a.key", PeerCertFile: "a.crt", PeerKeyFile: "a.key", PeerTrustedCAFile: "ca.crt", ClientCertAuth: true}, "--client-cert-auth needs the CA that signs client certificates: --trusted-ca-file"},
	} {
		_, err := server.Start(context.Background(), server.Config{DataDir: filepath.Join(dir, "d"), ListenAddr: "127.0.0.1:0",
			InitialCluster: map[uint64]string{1: "127.0.0.1:1"}, NodeID: 1, TLS: tc.cfg, Logger: testcluster.Logger()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v; want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	// Files that do not parse are named too.
	bad := filepath.Join(dir, "bad.crt")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := server.Start(context.Background(), server.Config{DataDir: filepath.Join(dir, "d"), ListenAddr: "127.0.0.1:0",
		InitialCluster: map[uint64]string{1: "127.0.0.1:1"}, NodeID: 1, Logger: testcluster.Logger(),
		TLS: tlsconfig.ServerConfig{CertFile: bad, KeyFile: bad, PeerCertFile: bad, PeerKeyFile: bad, PeerTrustedCAFile: bad}})
	if err == nil || !strings.Contains(err.Error(), "bad.crt") {
		t.Fatalf("unparsable files: %v", err)
	}
}

// TestTLSRotationUnderLoad: while clients write without pause, every
// node's CA file gains a second CA, every certificate is replaced by one
// of the new CA (a node restarted on it rejoins its peers over new
// connections), and the old CA is dropped: no request fails, new
// connections use the new material, and a client that trusts only the old
// CA is refused by then.
func TestTLSRotationUnderLoad(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{TLS: true, Splits: [][]byte{[]byte("m")}, Configure: func(cfg *server.Config) {
		cfg.TLS.ReloadInterval = 50 * time.Millisecond
	}})
	cs := c.Certs()
	eps := c.Endpoints()
	dir := t.TempDir()
	oldCA := cs.CA
	if err := certgen.WriteFile(filepath.Join(dir, "old-ca.crt"), oldCA.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(context.Background(), eps, client.WithTLSFiles(cs.CAFile(), cs.ClientCertFile(), cs.ClientKeyFile()),
		client.WithTLSReloadInterval(50*time.Millisecond), client.WithDefaultTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var puts, failures atomic.Int64
	var firstErr atomic.Value
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("%c/%d/%d", "aqz"[i%3], w, i)
				if _, err := cl.Put(context.Background(), []byte(k), []byte("v")); err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				puts.Add(1)
			}
		}()
	}
	settle := func() { time.Sleep(500 * time.Millisecond) }
	waitPuts := func(n int64) {
		t.Helper()
		target := puts.Load() + n
		deadline := time.Now().Add(30 * time.Second)
		for puts.Load() < target {
			if time.Now().After(deadline) {
				t.Fatalf("writes stalled at %d", puts.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitPuts(50)

	newCA, err := certgen.NewCA("shale test CA 2", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 1. Trust both CAs everywhere.
	bundle := append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...)
	if err := certgen.WriteFile(cs.CAFile(), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	settle()
	waitPuts(50)
	// 2. New certificates for every node and the client.
	for _, id := range c.NodeIDs() {
		cs.IssueNode(t, newCA, id)
	}
	writePair(t, issue(t, newCA, certgen.Options{CommonName: "root", Client: true}), cs.ClientCertFile(), cs.ClientKeyFile())
	settle()
	waitPuts(50)
	// A node restarted now dials and is dialed over new connections.
	c.Stop(3)
	c.Restart(3)
	waitPuts(50)
	// 3. Drop the old CA.
	if err := certgen.WriteFile(cs.CAFile(), newCA.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	settle()
	waitPuts(200)
	stop()
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d writes failed during the rotation; first: %v", n, puts.Load()+n, firstErr.Load())
	}
	t.Logf("%d writes during the rotation, none failed", puts.Load())

	// Every node now presents a certificate of the new CA to new
	// connections, and a client trusting only the old CA is refused.
	newPool := x509.NewCertPool()
	newPool.AddCert(newCA.Cert)
	for _, ep := range eps {
		conn, err := tls.Dial("tcp", ep, &tls.Config{RootCAs: newPool, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("%s with the new CA: %v", ep, err)
		}
		if issuer := conn.ConnectionState().PeerCertificates[0].Issuer.CommonName; issuer != "shale test CA 2" {
			t.Fatalf("%s presents a certificate of %q", ep, issuer)
		}
		conn.Close()
	}
	err = connectErr(t, eps, client.WithTLSFiles(filepath.Join(dir, "old-ca.crt"), cs.ClientCertFile(), cs.ClientKeyFile()))
	if !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a client trusting only the old CA: %v", err)
	}
	fresh := newClient(t, c)
	if _, err := fresh.Get(context.Background(), []byte("a/0/0")); err != nil && !errors.Is(err, client.ErrNotFound) {
		t.Fatal(err)
	}
}
