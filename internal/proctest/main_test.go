//go:build unix

package proctest

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shale-db/shale/internal/freeport"
)

// modulePath is the main module, found by walking up from the working
// directory.
const modulePath = "github.com/shale-db/shale"

// binaries are the programs TestMain built.
type binaries struct {
	root   string // module root (for scripts/)
	server string // shale-server
	ctl    string // shalectl
}

var (
	bins      binaries
	skipWhy   string // set when the tests cannot run here
	buildFail string // set when the build failed (the tests then fail)
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() {
			skipWhy = "process-level tests (real server processes, about 20s) are skipped in -short mode"
			return m.Run()
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			skipWhy = "the go tool is not on PATH, so the shale-server binary cannot be built: " + err.Error()
			return m.Run()
		}
		root, err := moduleRoot()
		if err != nil {
			buildFail = err.Error()
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "shale-proctest-bin-")
		if err != nil {
			buildFail = err.Error()
			return m.Run()
		}
		defer os.RemoveAll(dir)
		// One go build for both binaries; a normal build (no -race) even
		// when the tests run with -race.
		start := time.Now()
		cmd := exec.Command(goTool, "build", "-o", dir+string(filepath.Separator), "./cmd/shale-server", "./cmd/shalectl")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildFail = fmt.Sprintf("go build ./cmd/shale-server ./cmd/shalectl in %s: %v\n%s", root, err, out)
			return m.Run()
		}
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "proctest: built shale-server and shalectl in %v\n", time.Since(start).Round(time.Millisecond))
		}
		bins = binaries{root: root, server: filepath.Join(dir, "shale-server"), ctl: filepath.Join(dir, "shalectl")}
		return m.Run()
	}()
	os.Exit(code)
}

// requireBinaries skips or fails t when TestMain could not build the
// binaries, and returns them otherwise.
func requireBinaries(t *testing.T) binaries {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	if buildFail != "" {
		t.Fatal(buildFail)
	}
	return bins
}

// moduleRoot walks up from the working directory to the go.mod of
// modulePath.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" && f[1] == modulePath {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// freePorts returns n distinct free loopback ports (see freeport.Ports).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := freeport.Ports(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// testLogger is the clients' logger: silent unless SHALE_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("SHALE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// serverProc is one shale-server process.
type serverProc struct {
	id      uint64
	addr    string // gRPC
	args    []string
	logPath string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its Wait error, valid after done
}

// startServer starts bin with args, appending stdout and stderr to logPath.
// The process is SIGKILLed at the end of the test if it still runs.
func startServer(t *testing.T, bin string, id uint64, addr, logPath string, args []string) *serverProc {
	t.Helper()
	p := &serverProc{id: id, addr: addr, args: args, logPath: logPath}
	p.start(t, bin)
	return p
}

// start starts the process (again) and waits until it listens (see
// waitListening), failing t if it cannot be started; it is SIGKILLed at
// the end of the test if it still runs. Only from the test's goroutine:
// elsewhere use launch.
func (p *serverProc) start(t *testing.T, bin string) {
	t.Helper()
	if err := p.launch(bin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.kill() })
}

// launch starts the process (again), appending its output to its log, and
// waits until it listens (see waitListening). It returns an error when the
// process could not be started; one that started and exited shows in
// running and err. It never touches a testing.T, so any goroutine may call
// it: whoever does makes sure the process is killed at the end (kill
// reaches the current process, so a cleanup registered by an earlier start
// covers it).
func (p *serverProc) launch(bin string) error {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start node %d: %w", p.id, err)
	}
	fmt.Fprintf(f, "=== proctest: starting node %d at %s: %s %s\n", p.id, time.Now().Format(time.RFC3339Nano), bin, strings.Join(p.args, " "))
	cmd := exec.Command(bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = serverSysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start node %d: %w", p.id, err)
	}
	f.Close() // the child has its own descriptor
	p.cmd = cmd
	p.done = make(chan struct{})
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	p.waitListening(30 * time.Second)
	return nil
}

// waitListening returns once the node accepts connections on its address,
// or has exited, or timeout has passed (the test then fails on what it
// tries next). A client made before would find every node refusing, which
// the SDK gives up on within seconds.
func (p *serverProc) waitListening(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && p.running() {
		if c, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// running reports whether the process has not exited.
func (p *serverProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill SIGKILLs the process (if it still runs) and waits for it.
func (p *serverProc) kill() {
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// stop sends SIGTERM and waits up to timeout for a clean exit, then
// SIGKILLs; it returns an error unless the process exited with status 0 in
// time.
func (p *serverProc) stop(timeout time.Duration) error {
	if !p.running() {
		return fmt.Errorf("node %d had already exited: %v", p.id, p.err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("node %d exited with %v after SIGTERM", p.id, p.err)
		}
		return nil
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("node %d did not exit within %v of SIGTERM; killed", p.id, timeout)
	}
}

// logTail returns the last n lines of a log file.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dumpLogsOnFailure prints the end of each log when t fails.
func dumpLogsOnFailure(t *testing.T, paths ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range paths {
			t.Logf("--- last lines of %s ---\n%s", p, logTail(p, 150))
		}
	})
}

// processGone reports whether no process has the given pid (a zombie counts
// as gone only once reaped, so this also proves it was waited for).
func processGone(pid int) bool {
	err := syscall.Kill(pid, 0)
	return errors.Is(err, syscall.ESRCH)
}
