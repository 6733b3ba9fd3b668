// Package testcluster runs Shale clusters for tests: in-process nodes on
// loopback gRPC (fast, with link filters to partition nodes), each with its
// own data directory so nodes can be stopped and restarted from disk.
package testcluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/internal/freeport"
	"github.com/shale-db/shale/server"
	"github.com/shale-db/shale/server/shard"
)

// Options configure a Cluster.
type Options struct {
	// Nodes is the number of founding nodes (default 3).
	Nodes int
	// Splits are the initial split keys.
	Splits [][]byte
	// TickInterval is the Raft tick (default 20ms, for fast elections).
	TickInterval time.Duration
	// TLS runs the nodes with TLS for clients and mutual TLS for peers,
	// with the certificates of Cluster.Certs (client certificates
	// verified when given; Configure may tighten it).
	TLS bool
	// Configure adjusts every node's configuration.
	Configure func(*server.Config)
}

// Cluster is a running test cluster.
type Cluster struct {
	t    testing.TB
	dir  string
	opts Options

	// certs are the TLS files (Options.TLS), nil without TLS.
	certs *Certs

	mu      sync.Mutex
	addrs   map[uint64]string
	nodes   map[uint64]*server.Node
	blocked map[[2]uint64]bool
}

// freeAddrs returns n distinct free loopback addresses (see freeport.Ports).
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	ports, err := freeport.Ports(n)
	if err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, n)
	for i, p := range ports {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return addrs
}

// Logger is the logger of test nodes: silent unless SHALE_TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("SHALE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Start starts a cluster and waits until every shard has a leader.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.TickInterval == 0 {
		opts.TickInterval = 20 * time.Millisecond
	}
	c := &Cluster{t: t, opts: opts, nodes: map[uint64]*server.Node{}, blocked: map[[2]uint64]bool{}}
	// Cleanups run last-registered first: the nodes must stop before the
	// directory they write to is removed, so the directory comes first.
	root := t.TempDir()
	t.Cleanup(c.StopAll)
	if opts.TLS {
		c.certs = newCerts(t, filepath.Join(root, "certs"))
		for id := uint64(1); id <= uint64(opts.Nodes); id++ {
			c.certs.IssueNode(t, c.certs.CA, id)
		}
	}
	// A port reserved by freeAddr can be taken by another process before
	// the node binds it: then start over on new ports, in a new directory.
	for attempt := 1; ; attempt++ {
		c.dir = filepath.Join(root, fmt.Sprintf("attempt%d", attempt))
		c.addrs = map[uint64]string{}
		for i, addr := range freeAddrs(t, opts.Nodes) {
			c.addrs[uint64(i+1)] = addr
		}
		var wg sync.WaitGroup
		errs := make(chan error, opts.Nodes)
		for id := uint64(1); id <= uint64(opts.Nodes); id++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.start(id, true); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		var failed error
		for err := range errs {
			failed = err
		}
		if failed == nil {
			break
		}
		c.StopAll()
		if attempt == 3 || !strings.Contains(failed.Error(), "address already in use") {
			t.Fatal(failed)
		}
	}
	c.WaitLeaders(30 * time.Second)
	return c
}

func (c *Cluster) config(id uint64, founding bool) server.Config {
	cfg := server.Config{
		DataDir:       filepath.Join(c.dir, fmt.Sprintf("node%d", id)),
		NodeID:        id,
		ListenAddr:    c.addrs[id],
		TickInterval:  c.opts.TickInterval,
		InitialSplits: c.opts.Splits,
		Logger:        Logger().With("node", id),
		LinkFilter:    c.linkUp,
		// The cheapest password hashes: logins under -race on a busy
		// machine would take seconds at the production cost.
		PasswordCost: 4,
	}
	if c.certs != nil {
		cfg.TLS = c.certs.ServerConfig(id)
	}
	if founding {
		cfg.InitialCluster = map[uint64]string{}
		for nid := uint64(1); nid <= uint64(c.opts.Nodes); nid++ {
			cfg.InitialCluster[nid] = c.addrs[nid]
		}
	}
	if c.opts.Configure != nil {
		c.opts.Configure(&cfg)
	}
	return cfg
}

func (c *Cluster) start(id uint64, founding bool) error {
	n, err := server.Start(context.Background(), c.config(id, founding))
	if err != nil {
		return fmt.Errorf("start node %d: %w", id, err)
	}
	c.mu.Lock()
	c.nodes[id] = n
	c.mu.Unlock()
	return nil
}

// Certs are the cluster's TLS files, nil without Options.TLS.
func (c *Cluster) Certs() *Certs { return c.certs }

// Dir is the directory holding the nodes' data directories (node1, node2,
// ...), removed when the test ends.
func (c *Cluster) Dir() string { return c.dir }

// Node returns a running node, or nil.
func (c *Cluster) Node(id uint64) *server.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// NodeIDs returns the running nodes' IDs, sorted.
func (c *Cluster) NodeIDs() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]uint64, 0, len(c.nodes))
	for id := range c.nodes {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// Endpoints returns the client addresses of every node (running or not).
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]uint64, 0, len(c.addrs))
	for id := range c.addrs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		out = append(out, c.addrs[id])
	}
	return out
}

// Stop stops a node (its data stays for Restart).
func (c *Cluster) Stop(id uint64) {
	c.mu.Lock()
	n := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if n != nil {
		n.Stop()
	}
}

// Restart starts a stopped node from its data directory.
func (c *Cluster) Restart(id uint64) {
	c.t.Helper()
	if err := c.start(id, false); err != nil {
		c.t.Fatal(err)
	}
}

// RestartAt starts a stopped node from its data directory on a new address
// (its --listen and --advertise) and returns the address.
func (c *Cluster) RestartAt(id uint64) string {
	c.t.Helper()
	addr := freeAddrs(c.t, 1)[0]
	c.mu.Lock()
	c.addrs[id] = addr
	c.mu.Unlock()
	if err := c.start(id, false); err != nil {
		c.t.Fatal(err)
	}
	return addr
}

// AddNode starts a new node that joins the cluster through node 1's
// address and returns its ID.
func (c *Cluster) AddNode() uint64 {
	c.t.Helper()
	addr := freeAddrs(c.t, 1)[0]
	c.mu.Lock()
	var join string
	for _, n := range c.nodes {
		join = n.Addr()
		break
	}
	c.mu.Unlock()
	cfg := c.config(0, false)
	if c.certs != nil {
		// A joining node has no ID yet: its certificate files are
		// numbered from 1000.
		c.mu.Lock()
		key := uint64(1000 + len(c.addrs))
		c.mu.Unlock()
		c.certs.IssueNode(c.t, c.certs.CA, key)
		cfg.TLS = c.certs.ServerConfig(key)
	}
	cfg.NodeID = 0
	cfg.ListenAddr = addr
	cfg.Join = join
	cfg.DataDir = filepath.Join(c.dir, fmt.Sprintf("joined-%s", filepath.Base(addr)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := server.Start(ctx, cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.nodes[n.ID()] = n
	c.addrs[n.ID()] = addr
	c.mu.Unlock()
	return n.ID()
}

// StopAll stops every node.
func (c *Cluster) StopAll() {
	for _, id := range c.NodeIDs() {
		c.Stop(id)
	}
}

func (c *Cluster) linkUp(from, to uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.blocked[[2]uint64{from, to}]
}

// Partition cuts Raft traffic between the groups (clients still reach
// every node); nodes in no group keep talking to everyone.
func (c *Cluster) Partition(groups ...[]uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blocked = map[[2]uint64]bool{}
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					c.blocked[[2]uint64{a, b}] = true
				}
			}
		}
	}
}

// Isolate cuts node id off from every other node.
func (c *Cluster) Isolate(id uint64) {
	c.mu.Lock()
	var others []uint64
	for nid := range c.addrs {
		if nid != id {
			others = append(others, nid)
		}
	}
	c.mu.Unlock()
	c.Partition([]uint64{id}, others)
}

// Heal removes every partition.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blocked = map[[2]uint64]bool{}
}

// Leader returns the node leading shard id among the running nodes, or 0.
func (c *Cluster) Leader(shardID uint64) uint64 {
	for _, id := range c.NodeIDs() {
		n := c.Node(id)
		if n == nil {
			continue
		}
		if r := n.Store().Replica(shardID); r != nil && r.IsLeader() {
			return id
		}
	}
	return 0
}

// LeaderShard returns the state machine of shard id on the running node
// that leads it, or nil while none does (an election, a leadership
// transfer): a condition polled across such moments reads it so.
func (c *Cluster) LeaderShard(shardID uint64) *shard.Shard {
	n := c.Node(c.Leader(shardID))
	if n == nil {
		return nil
	}
	return n.Shard(shardID)
}

// MoveLeader makes node to the leader of shardID and fails the test if it
// does not lead within timeout. A transfer may lapse on a loaded machine
// (the target gets two election timeouts to take over), so the current
// leader is asked again until to leads.
func (c *Cluster) MoveLeader(shardID, to uint64, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		from := c.Leader(shardID)
		if from == to {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d does not lead shard %d after %v (led by node %d; last transfer: %v)", to, shardID, timeout, from, last)
		}
		n := c.Node(from)
		if from == 0 || n == nil || n.Store().Replica(shardID) == nil {
			time.Sleep(10 * time.Millisecond) // no leader now
			continue
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		last = n.Store().Replica(shardID).TransferLeader(ctx, to)
		cancel()
		if last != nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// ShardIDs returns the shards hosted on any running node, sorted.
func (c *Cluster) ShardIDs() []uint64 {
	seen := map[uint64]bool{}
	for _, id := range c.NodeIDs() {
		if n := c.Node(id); n != nil {
			for _, r := range n.Store().Replicas() {
				seen[r.ShardID()] = true
			}
		}
	}
	out := make([]uint64, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// WaitLeaders waits until every shard has a leader and every running node
// has loaded the auth state (until then a node refuses client calls with
// Unavailable).
func (c *Cluster) WaitLeaders(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, s := range c.ShardIDs() {
			if c.Leader(s) == 0 {
				ok = false
			}
		}
		for _, id := range c.NodeIDs() {
			if n := c.Node(id); n != nil && !n.AuthLoaded() {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("shards without a leader after %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exampleTB lets Start run outside a test (in runnable examples): failures
// panic, cleanups run at stop.
type exampleTB struct {
	testing.TB // nil: only the methods below are used
	dir        string
	cleanups   []func()
}

func (e *exampleTB) Helper()                   {}
func (e *exampleTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e *exampleTB) Cleanup(f func())          { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) TempDir() string {
	d, err := os.MkdirTemp(e.dir, "")
	if err != nil {
		panic(err)
	}
	return d
}

// StartForExample starts a cluster outside a test, for runnable examples;
// stop releases it and deletes its data. It panics if the cluster cannot
// start.
func StartForExample(opts Options) (c *Cluster, stop func()) {
	dir, err := os.MkdirTemp("", "shale-example-")
	if err != nil {
		panic(err)
	}
	tb := &exampleTB{dir: dir}
	c = Start(tb, opts)
	return c, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
		_ = os.RemoveAll(dir)
	}
}
