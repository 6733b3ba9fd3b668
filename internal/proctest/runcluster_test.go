//go:build unix

package proctest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/security/certgen"
)

// scriptOutput collects a script's output and tells when a line appears.
type scriptOutput struct {
	mu    sync.Mutex
	buf   strings.Builder
	ready chan struct{}
	once  sync.Once
}

func (o *scriptOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	// The ready line heads a banner that ends with how to stop the
	// cluster; wait for all of it.
	if out := o.buf.String(); strings.Contains(out, "Shale cluster is ready") && strings.Contains(out, "Press Ctrl-C to stop") {
		o.once.Do(func() { close(o.ready) })
	}
	return len(p), nil
}

func (o *scriptOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// runScript is one run of scripts/run-cluster.sh.
type runScript struct {
	cmd  *exec.Cmd
	out  *scriptOutput
	done chan struct{}
	err  error
	// tty is the controlling side of the script's terminal (startScriptPTY).
	tty *os.File
}

// startScript runs the script with env added to the environment, in a
// session of its own (so that a failed test kills everything it started:
// the servers have process groups of their own).
func startScript(t *testing.T, script string, env []string) *runScript {
	return startScriptOn(t, script, env, false)
}

// startScriptPTY is startScript with a pseudo-terminal as the script's
// controlling terminal, stdin and output, as in a user's shell: ctrlC then
// types Ctrl-C at it.
func startScriptPTY(t *testing.T, script string, env []string) *runScript {
	return startScriptOn(t, script, env, true)
}

func startScriptOn(t *testing.T, script string, env []string, withPTY bool) *runScript {
	t.Helper()
	r := &runScript{out: &scriptOutput{ready: make(chan struct{})}, done: make(chan struct{})}
	r.cmd = exec.Command("bash", script)
	r.cmd.Env = append(os.Environ(), env...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if withPTY {
		tty, term, err := openPTY()
		if err != nil {
			t.Skip("no pseudo-terminal:", err)
		}
		r.tty = tty
		r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = term, term, term
		r.cmd.SysProcAttr.Setctty = true
		r.cmd.SysProcAttr.Ctty = 0 // the child's stdin
		defer term.Close()         // the child has its own
		go func() { _, _ = io.Copy(r.out, tty) }()
		t.Cleanup(func() { tty.Close() })
	}
	r.cmd.WaitDelay = 5 * time.Second
	// bash cannot trap a signal that was ignored when it started, and a
	// test binary started in the background by a non-interactive shell
	// ignores SIGINT: catch SIGINT here while starting the script, so that
	// it inherits the default disposition instead.
	if signal.Ignored(os.Interrupt) {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt)
		defer signal.Stop(ch)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", script, err)
	}
	sid := r.cmd.Process.Pid
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		// Whatever is left of this run: the script and its servers.
		_ = syscall.Kill(-sid, syscall.SIGKILL)
		for _, pid := range sessionProcesses(sid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		<-r.done
	})
	return r
}

// waitReady waits for the script's ready line.
func (r *runScript) waitReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.out.ready:
	case <-r.done:
		t.Fatalf("script exited before the cluster was ready (%v); output:\n%s", r.err, r.out)
	case <-time.After(timeout):
		t.Fatalf("cluster not ready after %v; output:\n%s", timeout, r.out)
	}
}

var pidRE = regexp.MustCompile(`(?m)^\s+\d+\s+127\.0\.0\.1:\d+\s+https?://\S+\s+(\d+)\s`)

// serverPIDs are the pids the script printed for its servers.
func (r *runScript) serverPIDs(t *testing.T) []int {
	t.Helper()
	var pids []int
	for _, m := range pidRE.FindAllStringSubmatch(r.out.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	if len(pids) != 3 {
		t.Fatalf("found %d server pids in the script's output, want 3:\n%s", len(pids), r.out)
	}
	return pids
}

// interrupt sends SIGINT to the script alone (as `kill -INT` would: the
// script must stop the servers itself) and checks that it and its servers
// exit cleanly within bound.
func (r *runScript) interrupt(t *testing.T, bound time.Duration) {
	t.Helper()
	r.stopAndCheck(t, bound, "SIGINT", func() error { return r.cmd.Process.Signal(os.Interrupt) })
}

// ctrlC types Ctrl-C at the script's terminal (startScriptPTY): the
// terminal sends SIGINT to its foreground process group, as in a user's
// shell. It checks that the script and its servers exit cleanly within
// bound.
func (r *runScript) ctrlC(t *testing.T, bound time.Duration) {
	t.Helper()
	r.stopAndCheck(t, bound, "Ctrl-C", func() error {
		_, err := r.tty.Write([]byte{0x03})
		return err
	})
}

func (r *runScript) stopAndCheck(t *testing.T, bound time.Duration, what string, stop func() error) {
	t.Helper()
	pids := r.serverPIDs(t)
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	select {
	case <-r.done:
	case <-time.After(bound):
		t.Fatalf("script still running %v after %s; output:\n%s", bound, what, r.out)
	}
	took := time.Since(start)
	if r.err != nil {
		t.Fatalf("script exited with %v after %s; output:\n%s", r.err, what, r.out)
	}
	// The terminal's last output can still be on its way to r.out (a
	// goroutine copies it) when the script has exited: a loaded CI run
	// lost the final line that way.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(r.out.String(), "all 3 nodes stopped cleanly"); {
		if time.Now().After(deadline) {
			t.Fatalf("script did not report a clean stop; output:\n%s", r.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("shale-server pid %d still exists after the script exited", pid)
		}
	}
	// Nothing at all is left of the run.
	if err := syscall.Kill(-r.cmd.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("processes left in the script's process group (kill -0: %v)", err)
	}
	if left := sessionProcesses(r.cmd.Process.Pid); len(left) > 0 {
		t.Errorf("processes left in the script's session: %v", left)
	}
	// Each node got one signal (the script's SIGTERM), drained and
	// stopped: none was cut short by a second one.
	if strings.Contains(r.out.String(), "exited with status") {
		t.Errorf("a node did not exit cleanly; output:\n%s", r.out)
	}
	t.Logf("script and its 3 servers exited cleanly %v after %s", took.Round(time.Millisecond), what)
	if took > 10*time.Second {
		t.Errorf("stopping took %v after %s; want a few seconds", took, what)
	}
}

// TestRunClusterScript runs scripts/run-cluster.sh (what `make run` runs)
// with the test's binaries, a temporary data dir and free ports: it must
// start a cluster that serves a write, stop it cleanly and within seconds
// on a Ctrl-C typed at its terminal, on a second run restart the same
// cluster from its data, restart, stop and start one node on request from
// another process, and stop cleanly on SIGINT.
func TestRunClusterScript(t *testing.T) {
	bins := requireBinaries(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not on PATH:", err)
	}
	script := filepath.Join(bins.root, "scripts", "run-cluster.sh")
	dataDir := t.TempDir()
	ports := freePorts(t, 6)
	var grpcPorts, httpPorts, endpoints []string
	for i := range 3 {
		grpcPorts = append(grpcPorts, strconv.Itoa(ports[i]))
		httpPorts = append(httpPorts, strconv.Itoa(ports[3+i]))
		endpoints = append(endpoints, fmt.Sprintf("127.0.0.1:%d", ports[i]))
	}
	env := []string{
		"SHALE_BIN_DIR=" + filepath.Dir(bins.server),
		"SHALE_DATA_DIR=" + dataDir,
		"SHALE_PORTS=" + strings.Join(grpcPorts, ","),
		"SHALE_HTTP_PORTS=" + strings.Join(httpPorts, ","),
	}
	dumpLogsOnFailure(t, filepath.Join(dataDir, "node1.log"), filepath.Join(dataDir, "node2.log"), filepath.Join(dataDir, "node3.log"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// First run: a new cluster, in a terminal.
	start := time.Now()
	r := startScriptPTY(t, script, env)
	r.waitReady(t, 60*time.Second)
	t.Logf("first run ready after %v", time.Since(start).Round(time.Millisecond))
	if out := r.out.String(); !strings.Contains(out, "starting a new 3-node cluster") || !strings.Contains(out, "kv put hello world") {
		t.Errorf("first run's output lacks the new-cluster line or the shalectl example:\n%s", out)
	}
	cli, err := client.New(ctx, endpoints, client.WithLogger(testLogger()))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if _, err := cli.Put(ctx, []byte("hello"), []byte("world")); err != nil {
		t.Fatalf("put: %v", err)
	}
	if kv, err := cli.Get(ctx, []byte("hello")); err != nil || string(kv.Value) != "world" {
		t.Fatalf("get hello = %v, %v; want world", kv, err)
	}
	cli.Close()
	r.ctrlC(t, 30*time.Second)

	// A second script on busy ports fails clearly (here: a listener on the
	// first HTTP port).
	busy := startScriptOnBusyPort(t, script, env, httpPorts[0])
	if !strings.Contains(busy, "already in use") || !strings.Contains(busy, httpPorts[0]) {
		t.Errorf("run on a busy port: want an 'already in use' error naming port %s, got:\n%s", httpPorts[0], busy)
	}

	// Second run: the same cluster from the same data.
	start = time.Now()
	r = startScript(t, script, env)
	r.waitReady(t, 60*time.Second)
	t.Logf("second run ready after %v", time.Since(start).Round(time.Millisecond))
	if out := r.out.String(); !strings.Contains(out, "reusing the data") {
		t.Errorf("second run does not say it reuses the data:\n%s", out)
	}
	cli, err = client.New(ctx, endpoints, client.WithLogger(testLogger()))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if kv, err := cli.Get(ctx, []byte("hello")); err != nil || string(kv.Value) != "world" {
		t.Fatalf("after the restart, get hello = %v, %v; want world", kv, err)
	}

	// One node at a time, from another terminal: the running script
	// stops, starts and restarts it, and keeps supervising it.
	control := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	pids := r.serverPIDs(t)
	if out, err := control("restart", "2"); err != nil || !strings.Contains(out, "node 2 restarted") {
		t.Fatalf("restart 2: %v\n%s", err, out)
	}
	if !processGone(pids[1]) {
		t.Errorf("node 2's old process %d still exists after its restart", pids[1])
	}
	if out, err := control("stop", "3"); err != nil || !strings.Contains(out, "node 3 stopped cleanly") {
		t.Fatalf("stop 3: %v\n%s", err, out)
	}
	if out, err := control("stop", "3"); err == nil || !strings.Contains(out, "node 3 is not running") {
		t.Errorf("stop 3 again: %v\n%s; want an error saying it is not running", err, out)
	}
	if _, err := cli.Put(ctx, []byte("while3down"), []byte("x")); err != nil {
		t.Fatalf("put with node 3 stopped: %v", err)
	}
	if out, err := control("start", "3"); err != nil || !strings.Contains(out, "node 3 started") {
		t.Fatalf("start 3: %v\n%s", err, out)
	}
	if out, err := control("restart", "7"); err == nil || !strings.Contains(out, "this cluster has nodes 1 to 3") {
		t.Errorf("restart 7: %v\n%s; want an error naming the nodes", err, out)
	}
	if _, err := cli.Put(ctx, []byte("after"), []byte("restarts")); err != nil {
		t.Fatalf("put after the restarts: %v", err)
	}
	cli.Close()
	r.interrupt(t, 30*time.Second)
	if out, err := control("restart", "1"); err == nil || !strings.Contains(out, "no cluster of this script is running") {
		t.Errorf("restart with no cluster running: %v\n%s", err, out)
	}
}

// startScriptOnBusyPort runs the script while port is taken and returns its
// output; it must fail at once, starting no server.
func startScriptOnBusyPort(t *testing.T, script string, env []string, port string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("listen on %s: %v", port, err)
	}
	defer l.Close()
	r := startScript(t, script, env)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("script on a busy port still running after 20s; output:\n%s", r.out)
	}
	var ee *exec.ExitError
	if !errors.As(r.err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("script on a busy port: exit %v, want status 1", r.err)
	}
	if err := syscall.Kill(-r.cmd.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("processes left after the failed run (kill -0: %v)", err)
	}
	return r.out.String()
}

// TestRunClusterScriptTLS runs scripts/run-cluster.sh with SHALE_TLS=1: it
// must make a CA and the nodes' and a client's certificates in
// DATA_DIR/certs with shalectl cert, start a cluster with mutual TLS that
// serves shalectl given the client certificate and refuses it without TLS,
// serve HTTPS on the HTTP ports, print the TLS flags clients need, and on a
// second run restart from the same certificates.
func TestRunClusterScriptTLS(t *testing.T) {
	bins := requireBinaries(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not on PATH:", err)
	}
	script := filepath.Join(bins.root, "scripts", "run-cluster.sh")
	dataDir := t.TempDir()
	certs := filepath.Join(dataDir, "certs")
	ports := freePorts(t, 6)
	var grpcPorts, httpPorts []string
	for i := range 3 {
		grpcPorts = append(grpcPorts, strconv.Itoa(ports[i]))
		httpPorts = append(httpPorts, strconv.Itoa(ports[3+i]))
	}
	endpoints := "127.0.0.1:" + strings.Join(grpcPorts, ",127.0.0.1:")
	env := []string{
		"SHALE_TLS=1",
		"SHALE_BIN_DIR=" + filepath.Dir(bins.server),
		"SHALE_DATA_DIR=" + dataDir,
		"SHALE_PORTS=" + strings.Join(grpcPorts, ","),
		"SHALE_HTTP_PORTS=" + strings.Join(httpPorts, ","),
	}
	dumpLogsOnFailure(t, filepath.Join(dataDir, "node1.log"), filepath.Join(dataDir, "node2.log"), filepath.Join(dataDir, "node3.log"))
	tlsFlags := []string{
		"--cacert", filepath.Join(certs, "ca.crt"),
		"--cert", filepath.Join(certs, "client.crt"),
		"--key", filepath.Join(certs, "client.key"),
	}
	// shalectl runs the shalectl binary against the cluster (with none of
	// the TLS flags' environment defaults).
	shalectl := func(args ...string) (string, string, error) {
		cmd := exec.Command(bins.ctl, append([]string{"--endpoints", endpoints, "--timeout", "10s"}, args...)...)
		cmd.Env = append(os.Environ(), "SHALE_CACERT=", "SHALE_CERT=", "SHALE_KEY=")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	withTLS := func(args ...string) []string { return append(append([]string{}, tlsFlags...), args...) }

	start := time.Now()
	r := startScript(t, script, env)
	r.waitReady(t, 60*time.Second)
	t.Logf("TLS cluster ready after %v", time.Since(start).Round(time.Millisecond))
	out := r.out.String()
	for _, want := range []string{
		"TLS: made the certificates ca node1 node2 node3 client",
		"mutual TLS",
		"--cacert " + filepath.Join(certs, "ca.crt") + " --cert " + filepath.Join(certs, "client.crt") + " --key " + filepath.Join(certs, "client.key"),
		"https://127.0.0.1:" + httpPorts[0] + "/metrics",
		"https://127.0.0.1:" + httpPorts[2] + "/metrics",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the script's output lacks %q:\n%s", want, out)
		}
	}

	// The certificates: a CA, the nodes' (server and client, for
	// 127.0.0.1), root's (client only).
	ca, err := certgen.Load(filepath.Join(certs, "ca.crt"), filepath.Join(certs, "ca.key"))
	if err != nil {
		t.Fatalf("load the CA: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, c := range []struct {
		name  string
		cn    string
		usage []x509.ExtKeyUsage
		host  string
	}{
		{"node1", "node1", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, "127.0.0.1"},
		{"node3", "node3", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, "localhost"},
		{"client", "root", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, ""},
	} {
		p, err := certgen.Load(filepath.Join(certs, c.name+".crt"), filepath.Join(certs, c.name+".key"))
		if err != nil {
			t.Errorf("load %s: %v", c.name, err)
			continue
		}
		if p.Cert.Subject.CommonName != c.cn {
			t.Errorf("%s.crt: CN %q, want %q", c.name, p.Cert.Subject.CommonName, c.cn)
		}
		for _, u := range c.usage {
			if _, err := p.Cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: c.host, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
				t.Errorf("%s.crt for usage %v, host %q: %v", c.name, u, c.host, err)
			}
		}
	}

	// shalectl with the client certificate works; without TLS, or
	// trusting another CA, it fails.
	if o, e, err := shalectl(withTLS("kv", "put", "tls-key", "tls-value")...); err != nil {
		t.Fatalf("kv put with TLS: %v\n%s%s", err, o, e)
	}
	if o, e, err := shalectl(withTLS("kv", "get", "tls-key")...); err != nil || strings.TrimSpace(o) != "tls-value" {
		t.Fatalf("kv get with TLS = %q, %v; want tls-value\n%s", o, err, e)
	}
	var ee *exec.ExitError
	if o, e, err := shalectl("--timeout", "5s", "kv", "get", "tls-key"); !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Contains(o, "tls-value") {
		t.Errorf("plaintext kv get: exit %v, stdout %q; want a failure (exit 1)\nstderr: %s", err, o, e)
	}
	other, err := certgen.NewCA("Other CA", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := certgen.WriteFile(otherCA, other.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if o, e, err := shalectl("--timeout", "5s", "--cacert", otherCA, "kv", "get", "tls-key"); !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Contains(o, "tls-value") {
		t.Errorf("kv get trusting another CA: exit %v, stdout %q; want a failure (exit 1)\nstderr: %s", err, o, e)
	}
	// The nodes require a client certificate (--client-cert-auth).
	if o, e, err := shalectl("--timeout", "5s", "--cacert", filepath.Join(certs, "ca.crt"), "kv", "get", "tls-key"); !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(e, "certificate required") {
		t.Errorf("kv get without a client certificate: exit %v, stdout %q; want a failure naming the missing certificate\nstderr: %s", err, o, e)
	}

	// The HTTP port serves HTTPS, with a certificate of the CA.
	clientPair, err := tls.LoadX509KeyPair(filepath.Join(certs, "client.crt"), filepath.Join(certs, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: roots, Certificates: []tls.Certificate{clientPair}, MinVersion: tls.VersionTLS12,
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://127.0.0.1:" + httpPorts[1] + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics over HTTPS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("# TYPE")) {
		t.Errorf("GET /metrics over HTTPS: %s\n%.300s", resp.Status, body)
	}
	r.interrupt(t, 30*time.Second)

	// A second run reuses the certificates and the data.
	caPEM, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	r = startScript(t, script, env)
	r.waitReady(t, 60*time.Second)
	if out := r.out.String(); !strings.Contains(out, "TLS: using the certificates in") || !strings.Contains(out, "reusing the data") {
		t.Errorf("second run: want it to reuse the certificates and the data:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(certs, "ca.crt")); err != nil || !bytes.Equal(b, caPEM) {
		t.Errorf("the second run changed ca.crt (%v)", err)
	}
	if o, e, err := shalectl(withTLS("kv", "get", "tls-key")...); err != nil || strings.TrimSpace(o) != "tls-value" {
		t.Errorf("after the restart, kv get with TLS = %q, %v; want tls-value\n%s", o, err, e)
	}
	r.interrupt(t, 30*time.Second)
}
