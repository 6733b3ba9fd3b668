package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	shaleclient "github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/freeport"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/certgen"
)

// The Shale peer: a cluster of shale-server processes (one per member,
// node IDs 1..Members) started with shale-server's default settings (every
// Raft log write synced, 100 ms tick, 10-tick election timeout, ReadIndex
// linearizable reads, quiescence on) plus --initial-splits, which cuts the
// benchmark key space into a few shards, and --http, which serves pprof.
// Once every shard has a leader, the leadership of user shard i (in key
// order) is moved to node i mod Members + 1, so that every node leads the
// same share of the key space. Clients use the Go SDK (package client),
// one client.Client per connection, with every member as an endpoint; Get
// is the SDK's default, linearizable, read.
//
// Its variants run the same cluster secured (ShaleSecurity): "shale+tls"
// with TLS on every node's port (a CA, one node certificate with both key
// usages for 127.0.0.1 and localhost, used for clients and peers, and a
// client certificate, all made with certgen in the cluster's directory,
// tls/), the clients connecting with client.WithTLSFiles; "shale+tls+auth"
// also with authentication enabled: users root (role root) and bench (role
// bench: readwrite on every key), and the clients logging in as bench
// (client.WithCredentials), so that every request carries a token that is
// verified and every key permission-checked.

func init() {
	Register("shale", startShale)
	RegisterVariant(ShaleEngineName(ShaleSecurity{TLS: true}), func(ctx context.Context, cfg ClusterConfig) (Cluster, error) {
		return startShaleWith(ctx, cfg, ShaleSecurity{TLS: true})
	})
	RegisterVariant(ShaleEngineName(ShaleSecurity{TLS: true, Auth: true}), func(ctx context.Context, cfg ClusterConfig) (Cluster, error) {
		return startShaleWith(ctx, cfg, ShaleSecurity{TLS: true, Auth: true})
	})
	RegisterVariant(ShaleUnaryName, startShaleUnary)
}

// ShaleUnaryName is the variant of the Shale peer whose clients make every
// request a unary gRPC call (client.WithUnaryCalls) instead of sending a
// connection's requests over one KV.Calls stream.
const ShaleUnaryName = "shale+unary"

// startShaleUnary starts a plaintext Shale cluster whose clients make
// unary calls.
func startShaleUnary(ctx context.Context, cfg ClusterConfig) (Cluster, error) {
	cl, err := startShaleWith(ctx, cfg, ShaleSecurity{})
	if err != nil {
		return nil, err
	}
	c := cl.(*shaleCluster)
	c.nodes.unaryCalls, c.name = true, ShaleUnaryName
	return c, nil
}

// ShaleSecurity is how a Shale cluster of the benchmark is secured.
type ShaleSecurity struct {
	// TLS: TLS for clients and mutual TLS between the nodes.
	TLS bool
	// Auth: authentication and access control enabled (needs TLS); the
	// clients log in as BenchUser.
	Auth bool
}

// ShaleEngineName is the engine (or variant) name of the Shale peer
// secured as sec: "shale", "shale+tls", "shale+tls+auth".
func ShaleEngineName(sec ShaleSecurity) string {
	name := "shale"
	if sec.TLS {
		name += "+tls"
	}
	if sec.Auth {
		name += "+auth"
	}
	return name
}

// The users of a "shale+tls+auth" cluster. The benchmark's clients log in
// as BenchUser, whose one role grants readwrite on every key.
const (
	BenchUser     = "bench"
	benchPassword = "bench-password"
	benchRole     = "bench"
	rootPassword  = "root-password"
	// benchPasswordCost is the secured cluster's --auth-password-cost:
	// bcrypt's cheapest, so that the logins of a cell's hundreds of
	// connections, made before its timed phase, do not take minutes of
	// the machine's CPU (at the default cost 10 each costs about 64 ms of
	// a core). Requests carry tokens and never hash a password, so the
	// timed phase does not depend on it.
	benchPasswordCost = "4"
)

// shaleTLS are the PEM files of a TLS cluster.
type shaleTLS struct {
	caFile, nodeCert, nodeKey, clientCert, clientKey string
}

// writeShaleCerts makes a CA, a node certificate (server and client key
// usages, for 127.0.0.1 and localhost) and a client certificate (CN
// BenchUser) with certgen, in dir.
func writeShaleCerts(dir string) (*shaleTLS, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f := &shaleTLS{
		caFile:     filepath.Join(dir, "ca.pem"),
		nodeCert:   filepath.Join(dir, "node.pem"),
		nodeKey:    filepath.Join(dir, "node-key.pem"),
		clientCert: filepath.Join(dir, "client.pem"),
		clientKey:  filepath.Join(dir, "client-key.pem"),
	}
	ca, err := certgen.NewCA("shale-bench CA", certgen.Options{})
	if err != nil {
		return nil, err
	}
	node, err := ca.Issue(certgen.Options{CommonName: "shale-bench node", Hosts: []string{"127.0.0.1", "localhost"}, Server: true, Client: true})
	if err != nil {
		return nil, err
	}
	cl, err := ca.Issue(certgen.Options{CommonName: BenchUser, Client: true})
	if err != nil {
		return nil, err
	}
	if err := certgen.WriteFile(f.caFile, ca.CertPEM, 0o644); err != nil {
		return nil, err
	}
	if err := node.Write(f.nodeCert, f.nodeKey); err != nil {
		return nil, err
	}
	if err := cl.Write(f.clientCert, f.clientKey); err != nil {
		return nil, err
	}
	return f, nil
}

// args are the shale-server flags of a TLS node: one certificate for
// clients and peers, one CA for both.
func (f *shaleTLS) args() []string {
	return []string{
		"--cert-file", f.nodeCert, "--key-file", f.nodeKey, "--trusted-ca-file", f.caFile,
		"--peer-cert-file", f.nodeCert, "--peer-key-file", f.nodeKey, "--peer-trusted-ca-file", f.caFile,
	}
}

// DefaultShaleSplits are the split keys of the Shale peer's user shards:
// the benchmark's keys are 16 lowercase hex digits spread uniformly over
// the key order, so these five keys cut them into six shards of one sixth
// each (two shard leaders per node of a 3-node cluster).
const DefaultShaleSplits = "2aab,5555,8000,aaab,d555"

// ShaleOptions configure how the Shale peer and RunIdle start shale-server.
type ShaleOptions struct {
	// ServerPath is the shale-server binary. Empty: build it once per
	// process (go build of github.com/shale-db/shale/cmd/shale-server in
	// the bench module, found from the working directory or the
	// executable's), or else use a prebuilt bin/shale-server.
	ServerPath string
	// Splits is the benchmark cluster's --initial-splits (default
	// DefaultShaleSplits); NoSplits starts with one user shard, which load
	// splits then cut as a real workload's keys would be.
	Splits string
	// ExtraArgs are appended to every shale-server command line.
	ExtraArgs []string
}

var (
	shaleMu   sync.Mutex
	shaleOpts ShaleOptions
	built     struct {
		path, dir string
		err       error
		done      bool
	}
)

// SetShaleOptions sets the options of every Shale cluster started after
// the call.
func SetShaleOptions(o ShaleOptions) {
	shaleMu.Lock()
	defer shaleMu.Unlock()
	shaleOpts = o
}

func currentShaleOptions() ShaleOptions {
	shaleMu.Lock()
	defer shaleMu.Unlock()
	o := shaleOpts
	switch strings.TrimSpace(o.Splits) {
	case "":
		o.Splits = DefaultShaleSplits
	case NoSplits:
		o.Splits = ""
	}
	return o
}

// NoSplits, as ShaleOptions.Splits (--shale-splits none), starts the
// cluster with one user shard.
const NoSplits = "none"

// CleanupShaleServer removes the shale-server binary built by this process,
// if any. Call it once no Shale cluster runs any more.
func CleanupShaleServer() {
	shaleMu.Lock()
	defer shaleMu.Unlock()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	built.path, built.dir, built.err, built.done = "", "", nil, false
}

// ShaleServerBinary returns the shale-server binary to run: the configured
// one, else one built once per process, else a prebuilt bin/shale-server.
func ShaleServerBinary(log io.Writer) (string, error) {
	o := currentShaleOptions()
	if o.ServerPath != "" {
		p, err := filepath.Abs(o.ServerPath)
		if err == nil {
			_, err = os.Stat(p)
		}
		if err != nil {
			return "", fmt.Errorf("--shale-server: %w", err)
		}
		return p, nil
	}
	shaleMu.Lock()
	defer shaleMu.Unlock()
	if built.done {
		return built.path, built.err
	}
	built.done = true
	built.path, built.dir, built.err = buildShaleServer(log)
	return built.path, built.err
}

// buildShaleServer builds shale-server into a new temporary directory from
// the bench module (whose replace directive makes the main module's
// packages buildable), falling back to a prebuilt binary.
func buildShaleServer(log io.Writer) (path, dir string, err error) {
	logf := func(format string, args ...any) { logLine(log, format, args...) }
	var buildErr error
	if mod := findBenchModule(); mod == "" {
		buildErr = errors.New("bench module not found from the working directory or the executable")
	} else if goBin, err := exec.LookPath("go"); err != nil {
		buildErr = fmt.Errorf("no go command: %w", err)
	} else {
		dir, err := os.MkdirTemp("", "shale-bench-server-")
		if err != nil {
			return "", "", err
		}
		out := filepath.Join(dir, "shale-server")
		t := time.Now()
		cmd := exec.Command(goBin, "build", "-o", out, "github.com/shale-db/shale/cmd/shale-server")
		cmd.Dir = mod
		msg, err := cmd.CombinedOutput()
		if err == nil {
			logf("shale: built %s in %s (go build in %s)", out, time.Since(t).Round(time.Millisecond), mod)
			return out, dir, nil
		}
		_ = os.RemoveAll(dir)
		buildErr = fmt.Errorf("go build of shale-server in %s: %v: %s", mod, err, bytes.TrimSpace(msg))
	}
	for _, c := range prebuiltCandidates() {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			logf("shale: cannot build shale-server (%v); using prebuilt %s", buildErr, c)
			return c, "", nil
		}
	}
	return "", "", fmt.Errorf("no shale-server binary: %v; and no prebuilt bin/shale-server found (give --shale-server PATH)", buildErr)
}

// findBenchModule finds the bench module's directory from the working
// directory or the executable's, looking upwards for its go.mod or the main
// module's (whose bench/ subdirectory it then is).
func findBenchModule() string {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, d := range starts {
		for {
			switch modulePath(filepath.Join(d, "go.mod")) {
			case "github.com/shale-db/shale/bench":
				return d
			case "github.com/shale-db/shale":
				if modulePath(filepath.Join(d, "bench", "go.mod")) == "github.com/shale-db/shale/bench" {
					return filepath.Join(d, "bench")
				}
			}
			parent := filepath.Dir(d)
			if parent == d {
				break
			}
			d = parent
		}
	}
	return ""
}

// modulePath is the module path declared by a go.mod file, "" if none.
func modulePath(gomod string) string {
	f, err := os.Open(gomod)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

func prebuiltCandidates() []string {
	var out []string
	if wd, err := os.Getwd(); err == nil {
		out = append(out, filepath.Join(wd, "bin", "shale-server"), filepath.Join(wd, "..", "bin", "shale-server"))
	}
	if exe, err := os.Executable(); err == nil {
		out = append(out, filepath.Join(filepath.Dir(exe), "shale-server"))
	}
	return out
}

// ShaleNodes is a running set of shale-server processes forming one new
// cluster.
type ShaleNodes struct {
	// Endpoints are the nodes' gRPC addresses, node i+1 at index i.
	Endpoints []string
	// HTTP are the nodes' /metrics and /debug/pprof addresses.
	HTTP  []string
	procs []*childProc
	// tls are the certificates of a TLS cluster (nil: plaintext), and
	// user and password the credentials NewClient logs in with (user "":
	// none).
	tls            *shaleTLS
	user, password string
	// unaryCalls makes NewClient's clients use client.WithUnaryCalls.
	unaryCalls bool
}

// Pids are the processes' IDs, node i+1 at index i.
func (c *ShaleNodes) Pids() []int {
	out := make([]int, len(c.procs))
	for i, p := range c.procs {
		out[i] = p.cmd.Process.Pid
	}
	return out
}

// StartShaleNodes starts members shale-server processes, node i+1 in
// dir/node<i+1> (data in data/, output in server.log), on free loopback
// ports, as a new cluster with the given --initial-splits and
// ShaleOptions.ExtraArgs. It returns once every process runs; it does not
// wait for the cluster to be ready (see WaitShaleReady). Ports taken by
// another process before a node binds them are retried.
func StartShaleNodes(ctx context.Context, dir string, members int, splits string, log io.Writer) (*ShaleNodes, error) {
	return startShaleNodes(ctx, dir, members, splits, ShaleSecurity{}, log)
}

// startShaleNodes is StartShaleNodes with TLS when sec.TLS (certificates
// in dir/tls) and a --auth-password-cost for sec.Auth; it does not enable
// auth (see shaleCluster.enableAuth).
func startShaleNodes(ctx context.Context, dir string, members int, splits string, sec ShaleSecurity, log io.Writer) (*ShaleNodes, error) {
	if sec.Auth && !sec.TLS {
		return nil, errors.New("auth needs TLS: Shale refuses to enable authentication on a plaintext cluster")
	}
	bin, err := ShaleServerBinary(log)
	if err != nil {
		return nil, err
	}
	var tls *shaleTLS
	if sec.TLS {
		if tls, err = writeShaleCerts(filepath.Join(dir, "tls")); err != nil {
			return nil, fmt.Errorf("make certificates: %w", err)
		}
	}
	var secArgs []string
	if tls != nil {
		secArgs = tls.args()
	}
	if sec.Auth {
		secArgs = append(secArgs, "--auth-password-cost", benchPasswordCost)
	}
	for attempt := 1; ; attempt++ {
		c, err := startShaleOnce(ctx, bin, dir, members, splits, secArgs, log)
		if c != nil {
			c.tls = tls
		}
		if err == nil {
			return c, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		if log != nil {
			fmt.Fprintf(log, "shale: %v; retrying on other ports\n", err)
		}
		for i := range members {
			if err := os.RemoveAll(filepath.Join(dir, fmt.Sprintf("node%d", i+1))); err != nil {
				return nil, err
			}
		}
	}
}

func startShaleOnce(ctx context.Context, bin, dir string, members int, splits string, secArgs []string, log io.Writer) (*ShaleNodes, error) {
	ports, err := freeport.Ports(2 * members)
	if err != nil {
		return nil, fmt.Errorf("pick ports: %w", err)
	}
	c := &ShaleNodes{}
	var initial []string
	for i := range members {
		c.Endpoints = append(c.Endpoints, fmt.Sprintf("127.0.0.1:%d", ports[2*i]))
		c.HTTP = append(c.HTTP, fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]))
		initial = append(initial, fmt.Sprintf("%d=%s", i+1, c.Endpoints[i]))
	}
	extra := currentShaleOptions().ExtraArgs
	for i := range members {
		ndir := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			_ = c.Stop()
			return nil, err
		}
		args := []string{
			"--node-id", strconv.Itoa(i + 1),
			"--data-dir", filepath.Join(ndir, "data"),
			"--listen", c.Endpoints[i],
			"--http", c.HTTP[i],
			"--initial-cluster", strings.Join(initial, ","),
		}
		if splits != "" {
			args = append(args, "--initial-splits", splits)
		}
		args = append(args, secArgs...)
		args = append(args, extra...)
		cmd := exec.Command(bin, args...)
		// Only the flags above configure the node: drop SHALE_* settings
		// from the environment.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SHALE_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		p, err := startChild(fmt.Sprintf("shale-server node %d", i+1), cmd, filepath.Join(ndir, "server.log"), "")
		if err != nil {
			_ = c.Stop()
			return nil, err
		}
		c.procs = append(c.procs, p)
		if log != nil {
			extraNote := ""
			if len(extra) > 0 {
				extraNote = " " + strings.Join(extra, " ")
			}
			switch {
			case slices.Contains(secArgs, "--auth-password-cost"):
				extraNote = " (TLS, auth)" + extraNote
			case len(secArgs) > 0:
				extraNote = " (TLS)" + extraNote
			}
			fmt.Fprintf(log, "shale: node %d pid %d, grpc %s, http %s%s\n", i+1, cmd.Process.Pid, c.Endpoints[i], c.HTTP[i], extraNote)
		}
	}
	// A node that cannot bind its port exits at once: give it a moment so
	// the port retry above sees it.
	select {
	case <-ctx.Done():
	case <-time.After(200 * time.Millisecond):
	}
	if err := c.checkRunning(); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// StartJoiningNode starts one more shale-server process that joins the
// running cluster (--join the first node's address), in dir/node<k> where
// k is its index in c plus one (data in data/, output in server.log), on
// free loopback ports, with extraArgs and then ShaleOptions.ExtraArgs. The
// cluster gives it its node ID (match it by its Endpoints address). It
// returns once the process runs; the join itself completes in the
// background (see ListNodes). It returns the new node's index in c.
func (c *ShaleNodes) StartJoiningNode(ctx context.Context, dir string, extraArgs []string, log io.Writer) (int, error) {
	if len(c.Endpoints) == 0 {
		return 0, errors.New("no cluster to join")
	}
	bin, err := ShaleServerBinary(log)
	if err != nil {
		return 0, err
	}
	k := len(c.procs) + 1
	ndir := filepath.Join(dir, fmt.Sprintf("node%d", k))
	for attempt := 1; ; attempt++ {
		if err := os.RemoveAll(ndir); err != nil {
			return 0, err
		}
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			return 0, err
		}
		ports, err := freeport.Ports(2)
		if err != nil {
			return 0, fmt.Errorf("pick ports: %w", err)
		}
		grpcAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		httpAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
		args := []string{
			"--data-dir", filepath.Join(ndir, "data"),
			"--listen", grpcAddr,
			"--advertise", grpcAddr,
			"--http", httpAddr,
			"--join", c.Endpoints[0],
		}
		args = append(args, extraArgs...)
		args = append(args, currentShaleOptions().ExtraArgs...)
		cmd := exec.Command(bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SHALE_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		p, err := startChild(fmt.Sprintf("shale-server node%d (joining)", k), cmd, filepath.Join(ndir, "server.log"), "")
		if err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
		if p.exited() {
			err := fmt.Errorf("%s exited (%v); %s", p.name, p.waitErr, p.tail())
			p.out.Close()
			if attempt < 3 && strings.Contains(err.Error(), "address already in use") {
				continue
			}
			return 0, err
		}
		c.procs = append(c.procs, p)
		c.Endpoints = append(c.Endpoints, grpcAddr)
		c.HTTP = append(c.HTTP, httpAddr)
		if log != nil {
			fmt.Fprintf(log, "shale: joining node%d pid %d, grpc %s, http %s, --join %s %s\n", k, cmd.Process.Pid, grpcAddr, httpAddr, c.Endpoints[0], strings.Join(args[10:], " "))
		}
		return k - 1, nil
	}
}

func (c *ShaleNodes) checkRunning() error {
	for _, p := range c.procs {
		if p.exited() {
			return fmt.Errorf("%s exited (%v); %s", p.name, p.waitErr, p.tail())
		}
	}
	return nil
}

// NewClient opens a Go SDK client with every node as an endpoint (with
// TLS on a TLS cluster, logged in once auth is enabled). Its warnings go
// to log (nil: dropped).
func (c *ShaleNodes) NewClient(ctx context.Context, log io.Writer) (*shaleclient.Client, error) {
	return c.newClient(ctx, c.Endpoints, c.user, c.password, log)
}

func (c *ShaleNodes) newClient(ctx context.Context, endpoints []string, user, password string, log io.Writer) (*shaleclient.Client, error) {
	if log == nil {
		log = io.Discard
	}
	l := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := []shaleclient.Option{shaleclient.WithLogger(l)}
	if c.tls != nil {
		opts = append(opts, shaleclient.WithTLSFiles(c.tls.caFile, c.tls.clientCert, c.tls.clientKey))
	}
	if user != "" {
		opts = append(opts, shaleclient.WithCredentials(user, password))
	}
	if c.unaryCalls {
		opts = append(opts, shaleclient.WithUnaryCalls())
	}
	if err := c.waitListening(ctx, endpoints); err != nil {
		return nil, err
	}
	return shaleclient.New(ctx, endpoints, opts...)
}

// waitListening returns once one of endpoints accepts connections: the SDK
// gives up within seconds when every endpoint refuses, and a node just
// started (or founding from a backup) may not listen yet.
func (c *ShaleNodes) waitListening(ctx context.Context, endpoints []string) error {
	var d net.Dialer
	for {
		for _, e := range endpoints {
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err := d.DialContext(dctx, "tcp", e)
			cancel()
			if err == nil {
				conn.Close()
				return nil
			}
		}
		if err := c.checkRunning(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no shale node listening at %s: %w", strings.Join(endpoints, ", "), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// readyPoll is how often WaitReady asks the cluster again: it bounds how
// late WaitReady sees a ready cluster, which the restore benchmark times
// (200 ms until 2026-12-03, which rounded a timed restore up by 0-200 ms).
const readyPoll = 50 * time.Millisecond

// WaitReady waits until the cluster lists wantShards shards (the system
// shard included) and every one of them has a leader that reports itself
// as such, asking every readyPoll. It returns the shards.
func (c *ShaleNodes) WaitReady(ctx context.Context, cli *shaleclient.Client, wantShards int) ([]*shalev1.ShardStatus, error) {
	var last error
	for {
		if err := c.checkRunning(); err != nil {
			return nil, err
		}
		shards, err := c.readyShards(ctx, cli, wantShards)
		if err == nil {
			return shards, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("shale cluster not ready: %w (last check: %v)", ctx.Err(), last)
		case <-time.After(readyPoll):
		}
	}
}

func (c *ShaleNodes) readyShards(ctx context.Context, cli *shaleclient.Client, want int) ([]*shalev1.ShardStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	shards, err := cli.ListShards(ctx)
	if err != nil {
		return nil, err
	}
	if len(shards) != want {
		return nil, fmt.Errorf("%d shards listed, want %d", len(shards), want)
	}
	noLeader := 0
	for _, s := range shards {
		if s.GetLeaderNodeId() == 0 || s.GetLeaderNodeId() != s.GetReportedBy() {
			noLeader++
		}
	}
	if noLeader > 0 {
		return nil, fmt.Errorf("%d of %d shards without a leader", noLeader, want)
	}
	return shards, nil
}

// Stop sends SIGTERM to every node (each stops cleanly and exits), and
// SIGKILL to any node still running 20 s later, and waits for them all.
func (c *ShaleNodes) Stop() error {
	errs := stopChildren(c.procs)
	c.procs = nil
	return errors.Join(errs...)
}

// shaleCluster is the Shale peer: a ShaleNodes cluster of the benchmark.
type shaleCluster struct {
	nodes *ShaleNodes
	log   io.Writer
	sec   ShaleSecurity
	// name overrides the engine name derived from sec (a variant's).
	name string
}

// startShale starts the nodes, waits for every shard to have a leader,
// spreads the user shards' leaders over the nodes and checks that every
// user shard serves a linearizable read.
func startShale(ctx context.Context, cfg ClusterConfig) (Cluster, error) {
	return startShaleWith(ctx, cfg, ShaleSecurity{})
}

// startShaleWith is startShale secured as sec; with sec.Auth it enables
// auth once the leaders are spread, before the probe reads, which then
// run as BenchUser.
func startShaleWith(ctx context.Context, cfg ClusterConfig, sec ShaleSecurity) (Cluster, error) {
	o := currentShaleOptions()
	nodes, err := startShaleNodes(ctx, cfg.Dir, cfg.Members, o.Splits, sec, cfg.Log)
	if err != nil {
		return nil, err
	}
	c := &shaleCluster{nodes: nodes, log: cfg.Log, sec: sec}
	if err := c.prepare(ctx, o.Splits, cfg); err != nil {
		_ = nodes.Stop()
		return nil, err
	}
	return c, nil
}

func (c *shaleCluster) prepare(ctx context.Context, splits string, cfg ClusterConfig) error {
	cli, err := c.nodes.NewClient(ctx, cfg.Log)
	if err != nil {
		if e := c.nodes.checkRunning(); e != nil {
			return e
		}
		return fmt.Errorf("connect: %w", err)
	}
	defer cli.Close()
	want := 2 // the system shard and one user shard
	if strings.TrimSpace(splits) != "" {
		want += len(strings.Split(splits, ","))
	}
	shards, err := c.nodes.WaitReady(ctx, cli, want)
	if err != nil {
		return err
	}
	// Move user shard i's leadership to node i mod members + 1.
	var user []*shalev1.ShardStatus
	for _, s := range shards {
		if !s.GetDescriptor_().GetSystem() {
			user = append(user, s)
		}
	}
	members := uint64(len(c.nodes.Endpoints))
	for i, s := range user {
		id := s.GetDescriptor_().GetShardId()
		target := uint64(i)%members + 1
		if err := c.moveLeader(ctx, cli, id, target); err != nil {
			return fmt.Errorf("move the leadership of shard %d to node %d: %w", id, target, err)
		}
	}
	shards, err = c.nodes.WaitReady(ctx, cli, want)
	if err != nil {
		return err
	}
	var layout []string
	for _, s := range shards {
		d := s.GetDescriptor_()
		name := "system"
		if !d.GetSystem() {
			name = fmt.Sprintf("[%q,%q)", d.GetStartKey(), d.GetEndKey())
		}
		layout = append(layout, fmt.Sprintf("shard %d %s leader %d", d.GetShardId(), name, s.GetLeaderNodeId()))
	}
	cfg.logf("shale: %s", strings.Join(layout, "; "))
	if c.sec.Auth {
		t := time.Now()
		if err := c.enableAuth(ctx, cli); err != nil {
			return fmt.Errorf("enable auth: %w", err)
		}
		cfg.logf("shale: auth enabled (users root and %s, role %s: readwrite on every key) and enforced by every node after %s",
			BenchUser, benchRole, time.Since(t).Round(time.Millisecond))
		// The probes below run as the benchmark's clients do.
		if cli, err = c.nodes.NewClient(ctx, cfg.Log); err != nil {
			return fmt.Errorf("connect as %s: %w", BenchUser, err)
		}
		defer cli.Close()
	}
	// Every user shard serves a linearizable read.
	for _, s := range user {
		key := append([]byte(nil), s.GetDescriptor_().GetStartKey()...)
		if len(key) == 0 {
			key = []byte{0}
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := cli.Get(rctx, key)
		cancel()
		if err != nil && !errors.Is(err, shaleclient.ErrNotFound) {
			return fmt.Errorf("probe read in shard %d: %w", s.GetDescriptor_().GetShardId(), err)
		}
	}
	return nil
}

// enableAuth adds the users root (role root) and BenchUser (role
// benchRole, readwrite on every key), enables auth, makes NewClient log in
// as BenchUser, and waits until every node enforces auth (answers
// AuthStatus for BenchUser's token with auth enabled).
func (c *shaleCluster) enableAuth(ctx context.Context, cli *shaleclient.Client) error {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	steps := []struct {
		what string
		do   func() error
	}{
		{"add user root", func() error { return cli.UserAdd(actx, "root", rootPassword, false) }},
		{"grant role root to root", func() error { return cli.UserGrantRole(actx, "root", "root") }},
		{"add role " + benchRole, func() error { return cli.RoleAdd(actx, benchRole) }},
		{"grant readwrite on every key to role " + benchRole, func() error {
			return cli.RoleGrantPermission(actx, benchRole, &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Prefix: true})
		}},
		{"add user " + BenchUser, func() error { return cli.UserAdd(actx, BenchUser, benchPassword, false) }},
		{"grant role " + benchRole + " to " + BenchUser, func() error { return cli.UserGrantRole(actx, BenchUser, benchRole) }},
		{"enable auth", func() error { return cli.AuthEnable(actx) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
	}
	c.nodes.user, c.nodes.password = BenchUser, benchPassword
	for i, ep := range c.nodes.Endpoints {
		var last error
		for {
			last = c.authEnforced(actx, ep)
			if last == nil {
				break
			}
			select {
			case <-actx.Done():
				return fmt.Errorf("node %d (%s) does not enforce auth: %w (last: %v)", i+1, ep, actx.Err(), last)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// authEnforced checks that the node at ep has auth enabled and knows
// BenchUser: its AuthStatus, asked with BenchUser's token, says so.
func (c *shaleCluster) authEnforced(ctx context.Context, ep string) error {
	cli, err := c.nodes.newClient(ctx, []string{ep}, BenchUser, benchPassword, c.log)
	if err != nil {
		return err
	}
	defer cli.Close()
	st, err := cli.AuthStatus(ctx)
	if err != nil {
		return err
	}
	if !st.GetEnabled() || st.GetUser() != BenchUser {
		return fmt.Errorf("auth status: enabled %v, user %q", st.GetEnabled(), st.GetUser())
	}
	return nil
}

// moveLeader makes target the leader of shard id, retrying for a while:
// a shard that just elected its first leader may refuse a transfer at
// first.
func (c *shaleCluster) moveLeader(ctx context.Context, cli *shaleclient.Client, id, target uint64) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := cli.ShardInfo(tctx, id)
		if err == nil && s.GetLeaderNodeId() == target && s.GetReportedBy() == target {
			cancel()
			return nil
		}
		if err == nil {
			_, err = cli.TransferLeader(tctx, id, target)
		}
		cancel()
		if err == nil {
			last = errors.New("leader not yet reported")
		} else {
			last = err
		}
		if time.Now().After(deadline) {
			return last
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Name implements Cluster.
func (c *shaleCluster) Name() string {
	if c.name != "" {
		return c.name
	}
	return ShaleEngineName(c.sec)
}

// Pids are the nodes' process IDs (for the cells' CPU time).
func (c *shaleCluster) Pids() []int { return c.nodes.Pids() }

// Client implements Cluster: a client.Client with every node as an
// endpoint.
func (c *shaleCluster) Client(ctx context.Context) (KV, error) {
	cli, err := c.nodes.NewClient(ctx, c.log)
	if err != nil {
		return nil, err
	}
	return shaleKV{cli}, nil
}

// Stop implements Cluster.
func (c *shaleCluster) Stop() error { return c.nodes.Stop() }

// shaleKV is the KV of one client.Client.
type shaleKV struct{ c *shaleclient.Client }

// Put implements KV.
func (kv shaleKV) Put(ctx context.Context, key, value []byte) error {
	_, err := kv.c.Put(ctx, key, value)
	return err
}

// Get implements KV with the SDK's default, linearizable, read.
func (kv shaleKV) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	v, err := kv.c.Get(ctx, key)
	if errors.Is(err, shaleclient.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return v.Value, true, nil
}

// Scan is the SDK's Scan (linearizable pages) from start to the end of the
// key space with WithLimit(limit), counting the keys.
func (kv shaleKV) Scan(ctx context.Context, start []byte, limit int) (int, error) {
	it := kv.c.Scan(ctx, start, nil, shaleclient.WithLimit(limit))
	defer it.Close()
	n := 0
	for it.Next() {
		n++
	}
	return n, it.Err()
}

// Close implements KV.
func (kv shaleKV) Close() error { return kv.c.Close() }
