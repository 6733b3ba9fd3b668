//go:build unix

package proctest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/certgen"
)

// pythonSDKSplits are the initial splits of the Python SDK's cluster, as
// `make run`'s: four user shards, so that scans, MultiGet and DeleteRange
// cross shard boundaries.
const pythonSDKSplits = "g,n,t"

// The format of the SDK's log lines in a failing pytest's report: local
// wall-clock times to the millisecond, as in the nodes' logs.
const (
	pytestLogFormat     = "log_format=%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(threadName)s %(message)s"
	pytestLogDateFormat = "log_date_format=%Y-%m-%dT%H:%M:%S"
)

// TestPythonSDK runs the Python SDK's tests (clients/python/tests, with
// Debian's pytest) against a 3-process cluster: every call of shale.Client,
// request IDs that make a retried write apply once, unknown outcomes, bad
// input raising the documented exception at once, leader following, splits
// learnt from EpochMismatch, scans across the shards, watches (every change
// once across shards, splits and merges, a node restart the tests ask for
// through serveNodeControl, dropped connections; Compacted; progress
// notifications), the asyncio client (shale.aio), a shard's leader killed
// (SIGKILL, through serveNodeControl) and started again under a workload of
// both clients, a linearizability smoke while leadership moves, and `pip
// install` of the package on top of Debian's grpcio and protobuf. The tests
// get the cluster's endpoints in SHALE_ENDPOINTS; pytest's output is the
// failure message. It takes about a minute.
func TestPythonSDK(t *testing.T) {
	bins := requireBinaries(t)
	requirePytest(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 3, pythonSDKSplits)
	readyClient(ctx, t, c, 3) // waits until every shard has a leader

	pkg := filepath.Join(bins.root, "clients", "python")
	// -p no:cacheprovider and PYTHONDONTWRITEBYTECODE leave nothing in the
	// work tree; -rs lists skipped tests, which must not happen here.
	// clients/python/tests/tls needs a cluster with TLS and auth: see
	// TestPythonSDKTLSAuth.
	// A failing test's report holds the SDK's debug log (its watch streams'
	// starts and ends, routing refreshes), timed to line up with the
	// nodes' logs.
	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
		"--basetemp", t.TempDir(), "-o", "log_level=DEBUG", "-o", pytestLogFormat, "-o", pytestLogDateFormat,
		"--ignore", filepath.Join(pkg, "tests", "tls"), filepath.Join(pkg, "tests"))
	cmd.Dir = bins.root
	cmd.Env = append(os.Environ(),
		"SHALE_ENDPOINTS="+strings.Join(c.endpoints(), ","),
		"SHALE_TEST_CONTROL="+serveNodeControl(t, bins, c),
		"PYTHONPATH="+pkg,
		"PYTHONDONTWRITEBYTECODE=1",
	)
	checkPytest(t, cmd)
}

// serveNodeControl serves, for the Python tests
// (clients/python/tests/helpers.py), on a local HTTP port:
//
//   - POST /restart?node=N: node N is stopped (SIGTERM; SIGKILL with
//     kill=1) and started again from its data;
//   - POST /kill?node=N: node N is SIGKILLed (kill -9), and the answer
//     comes once it has exited;
//   - POST /start?node=N: node N, stopped, is started again from its data.
//
// A start's answer (200) comes once the node listens again; one that
// cannot start is answered with 500 and the reason, as is a node that is
// not in the state the request needs (409). Requests are served one at a
// time. It returns the base URL (SHALE_TEST_CONTROL).
func serveNodeControl(t *testing.T, bins binaries, c *procCluster) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // one request at a time
	// start runs on the handler's goroutine: it reports a failure to the
	// caller, never through t (t.Fatal must not be called there).
	start := func(p *serverProc) error {
		if err := p.launch(bins.server); err != nil {
			return err
		}
		if !p.running() {
			return fmt.Errorf("node %d did not start again: %v", p.id, p.err)
		}
		return nil
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.URL.Query().Get("node"), 10, 64)
		if r.Method != http.MethodPost || err != nil || id < 1 || id > uint64(len(c.nodes)) {
			http.Error(w, "want POST /restart, /kill or /start with ?node=N", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		p := c.node(id)
		switch r.URL.Path {
		case "/restart":
			if !p.running() {
				http.Error(w, fmt.Sprintf("node %d is not running (POST /start)", id), http.StatusConflict)
				return
			}
			t.Logf("python tests: restarting node %d", id)
			if r.URL.Query().Get("kill") == "1" {
				p.kill()
			} else if err := p.stop(20 * time.Second); err != nil {
				t.Errorf("restart of node %d: %v", id, err)
			}
			if err := start(p); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintf(w, "node %d restarted\n", id)
		case "/kill":
			if !p.running() {
				http.Error(w, fmt.Sprintf("node %d is not running: %v", id, p.err), http.StatusConflict)
				return
			}
			t.Logf("python tests: SIGKILL of node %d", id)
			p.kill()
			fmt.Fprintf(w, "node %d killed\n", id)
		case "/start":
			if p.running() {
				http.Error(w, fmt.Sprintf("node %d is running", id), http.StatusConflict)
				return
			}
			t.Logf("python tests: starting node %d", id)
			if err := start(p); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintf(w, "node %d started\n", id)
		default:
			http.Error(w, "want POST /restart, /kill or /start with ?node=N", http.StatusNotFound)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		// Wait for a request being served (pytest killed at the deadline
		// mid-request), so that it does not start a node behind the
		// cleanups that kill them.
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// TestPythonSDKTLSAuth runs clients/python/tests/tls against a 3-process
// cluster with TLS for clients and between the nodes, and authentication
// enabled: users root (role root) and alice (read-write on the prefix
// alice/). The tests connect with the CA's certificate and a user's
// password, and check the refusals: a wrong password, no credentials,
// plaintext, a certificate of another CA, a key outside alice's roles.
func TestPythonSDKTLSAuth(t *testing.T) {
	bins := requireBinaries(t)
	requirePytest(t)
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	ca, err := certgen.NewCA("Shale Python SDK test CA", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.Issue(certgen.Options{CommonName: "node", Hosts: []string{"localhost", "127.0.0.1"}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	other, err := certgen.NewCA("Another CA", certgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.crt": ca.CertPEM, "other-ca.crt": other.CertPEM} {
		if err := certgen.WriteFile(file(name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := node.Write(file("node.crt"), file("node.key")); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 3, pythonSDKSplits,
		"--cert-file", file("node.crt"), "--key-file", file("node.key"), "--trusted-ca-file", file("ca.crt"),
		"--peer-cert-file", file("node.crt"), "--peer-key-file", file("node.key"), "--peer-trusted-ca-file", file("ca.crt"),
		"--auth-password-cost", "4")
	cli, err := client.New(ctx, c.endpoints(), client.WithTLSFiles(file("ca.crt"), "", ""), client.WithLogger(testLogger()))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	waitReady(ctx, t, cli, 3)
	const rootPassword, alicePassword = "root-secret", "alice-secret"
	steps := []struct {
		what string
		do   func() error
	}{
		{"add root", func() error { return cli.UserAdd(ctx, "root", rootPassword, false) }},
		{"grant root", func() error { return cli.UserGrantRole(ctx, "root", "root") }},
		{"add alice", func() error { return cli.UserAdd(ctx, "alice", alicePassword, false) }},
		{"add role", func() error { return cli.RoleAdd(ctx, "alice-rw") }},
		{"grant permission", func() error {
			return cli.RoleGrantPermission(ctx, "alice-rw", &shalev1.Permission{
				Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Key: []byte("alice/"), Prefix: true})
		}},
		{"grant alice", func() error { return cli.UserGrantRole(ctx, "alice", "alice-rw") }},
		{"enable auth", func() error { return cli.AuthEnable(ctx) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
	}

	pkg := filepath.Join(bins.root, "clients", "python")
	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
		"--basetemp", t.TempDir(), filepath.Join(pkg, "tests", "tls"))
	cmd.Dir = bins.root
	cmd.Env = append(os.Environ(),
		"SHALE_ENDPOINTS="+strings.Join(c.endpoints(), ","),
		"SHALE_TLS_CA="+file("ca.crt"),
		"SHALE_TLS_OTHER_CA="+file("other-ca.crt"),
		"SHALE_ROOT_PASSWORD="+rootPassword,
		"SHALE_ALICE_PASSWORD="+alicePassword,
		"PYTHONPATH="+pkg,
		"PYTHONDONTWRITEBYTECODE=1",
	)
	checkPytest(t, cmd)
}

// requirePytest is requirePython, with pytest.
func requirePytest(t *testing.T) {
	t.Helper()
	requirePython(t)
	if out, err := exec.Command(python, "-c", "import pytest").CombinedOutput(); err != nil {
		msg := "pytest is needed (make python-deps): " + err.Error() + "\n" + string(out)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// checkPytest runs a pytest command and fails t with pytest's output unless
// every test ran and passed.
func checkPytest(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v (after %v)\n%s", strings.Join(cmd.Args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("pytest (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	summary := regexp.MustCompile(`(?m)^(\d+) passed(, .*)? in [\d.]+s`).FindStringSubmatch(string(out))
	if summary == nil {
		t.Fatalf("no pytest summary line in the output")
	}
	if regexp.MustCompile(`skipped|deselected|xfail|xpass`).MatchString(summary[2]) {
		t.Errorf("pytest: %s passed%s: every test must run and pass", summary[1], summary[2])
	}
}
