package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// applyGate blocks the apply of one shard on chosen nodes until opened.
type applyGate struct {
	mu     sync.Mutex
	closed map[uint64]bool // node → its applies of shard wait
	shard  uint64
	open   chan struct{}
	// waiting counts applies blocked at the gate.
	waiting atomic.Int64
}

func newApplyGate(shard uint64) *applyGate {
	return &applyGate{closed: map[uint64]bool{}, shard: shard, open: make(chan struct{})}
}

// hook is the Config.applyHook of node.
func (g *applyGate) hook(node uint64) func(uint64) {
	return func(shardID uint64) {
		g.mu.Lock()
		wait := shardID == g.shard && g.closed[node]
		g.mu.Unlock()
		if wait {
			g.waiting.Add(1)
			<-g.open
			g.waiting.Add(-1)
		}
	}
}

func (g *applyGate) close(nodes ...uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range nodes {
		g.closed[n] = true
	}
}

// release opens the gate for good (idempotent).
func (g *applyGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
	clear(g.closed)
}

// newGatedCluster starts nodes 1, 2 and 3 with gate's hook on their
// applies; more, if set, adjusts each node's Config further.
func newGatedCluster(t *testing.T, gate *applyGate, more func(*Config)) *testCluster {
	c := newTestCluster(t, func(cfg *Config) {
		cfg.applyHook = gate.hook(cfg.NodeID)
		if more != nil {
			more(cfg)
		}
	})
	t.Cleanup(gate.release) // runs before the cluster's close
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	return c
}

// TestBlockedApplyDoesNotStallOtherShards: while one shard's apply is
// stuck on every node, the node's other shard keeps committing and
// applying, and neither shard holds an election (the Raft loop keeps
// ticking and heartbeating both).
//
// The election timeout is 500 ms (50 ticks of 10 ms), not the default
// 100 ms: under -race on a loaded machine a node's loop or transport can
// fall silent for 100-200 ms with no apply blocked (a loaded run of the
// package saw shard 1's term go from 6 to 7 while shard 2 wrote on). A
// loop that stopped heartbeating a shard still shows: its followers
// campaign within 1 s (the longest randomized timeout), and its leader
// steps down under CheckQuorum, well inside the 3 s of writes (checked by
// dropping shard 1's messages in the simulated network).
func TestBlockedApplyDoesNotStallOtherShards(t *testing.T) {
	const electionTicks = 50
	gate := newApplyGate(1)
	c := newGatedCluster(t, gate, func(cfg *Config) { cfg.ElectionTicks = electionTicks })
	c.bootstrap(1, 1, 2, 3)
	c.bootstrap(2, 1, 2, 3)
	lead1, lead2 := c.leader(1), c.leader(2)
	c.propose(1, "a", "0")
	c.propose(2, "b", "0")
	term := func(shard, node uint64) uint64 { return c.get(node).store.Replica(shard).Status().Term }
	term1, term2 := term(1, lead1), term(2, lead2)

	gate.close(1, 2, 3)
	blocked := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.get(lead1).store.Replica(1).Propose(ctx, []byte("a=1"))
		blocked <- err
	}()
	c.waitFor("shard 1's apply to block", 5*time.Second, func() bool { return gate.waiting.Load() > 0 })

	// 6 election timeouts (3 of the longest randomized ones) of writes to
	// shard 2.
	n := c.writeFor(2, lead2, "b", 6*electionTicks*10*time.Millisecond, "shard 1's apply is blocked")
	select {
	case err := <-blocked:
		t.Fatalf("shard 1's write finished while its apply was blocked: %v", err)
	default:
	}
	if got := term(1, lead1); got != term1 || !c.get(lead1).store.Replica(1).IsLeader() {
		t.Errorf("shard 1 held an election while its apply was blocked: term %d → %d", term1, got)
	}
	if got := term(2, lead2); got != term2 || !c.get(lead2).store.Replica(2).IsLeader() {
		t.Errorf("shard 2 held an election while shard 1's apply was blocked: term %d → %d", term2, got)
	}
	t.Logf("%d writes to shard 2 while shard 1's apply was blocked", n)

	gate.release()
	if err := <-blocked; err != nil {
		t.Fatalf("shard 1's write after its apply resumed: %v", err)
	}
	c.converged(1, 1, 2, 3)
	c.converged(2, 1, 2, 3)
	if v, _ := c.get(3).sm(1).get("a"); v != "1" {
		t.Fatalf("shard 1 on node 3: a=%q, want 1", v)
	}
}

// TestCrashBetweenPersistAndApply: a follower that made entries durable in
// its Raft log but never applied them (its apply stuck, then the process
// gone) keeps them in its log (truncation follows the applied index, not
// the committed one), and after a restart applies exactly the unapplied
// tail: each entry once, in order (memSM refuses a gap or a repeat).
func TestCrashBetweenPersistAndApply(t *testing.T) {
	gate := newApplyGate(1)
	c := newGatedCluster(t, gate, nil)
	c.bootstrap(1, 1, 2, 3)
	lead := c.leader(1)
	if lead == 3 {
		if err := c.get(3).store.Replica(1).TransferLeader(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		lead = c.leader(1)
	}
	c.propose(1, "k-before", "0")
	c.converged(1, 1, 2, 3)
	before := c.get(3).sm(1).AppliedState().Index

	gate.close(3)
	// More than LogTruncateEntries (200), so that the other nodes truncate.
	for i := range 300 {
		c.propose(1, fmt.Sprintf("k%03d", i), fmt.Sprint(i))
	}
	commit := c.get(lead).store.Replica(1).Status().Commit
	r3 := c.get(3).store.Replica(1)
	c.waitFor("node 3 to persist the entries", 10*time.Second, func() bool {
		st := r3.Status()
		return st.LastIndex >= commit && st.Commit >= commit
	})
	if got := c.get(3).sm(1).AppliedState().Index; got > before+1 {
		t.Fatalf("node 3 applied up to %d with its apply blocked (before: %d)", got, before)
	}
	if st := r3.Status(); st.Applied > before+1 {
		t.Fatalf("node 3 reports applied %d with its apply blocked", st.Applied)
	}
	// The process dies before applying: the blocked apply fails, and
	// nothing of it reaches the state machine.
	sm3 := c.get(3).sm(1)
	sm3.mu.Lock()
	sm3.applyErr = errors.New("the process is gone")
	sm3.mu.Unlock()
	gate.release()
	c.waitFor("node 3's replica to stop", 5*time.Second, func() bool { return r3.Status().Stopped != "" })
	if got := sm3.AppliedState().Index; got > before+1 {
		t.Fatalf("node 3 applied up to %d after the crash", got)
	}
	c.stopNode(3)

	c.startNode(3)
	c.propose(1, "k-after", "1")
	c.converged(1, 1, 2, 3)
	if v, _ := c.get(3).sm(1).get("k299"); v != "299" {
		t.Fatalf("node 3 after restart: k299=%q", v)
	}
}

// TestConcurrentProposalsShareOneAppend: proposals queued while the loop is
// busy are handed to Raft together on its next cycle: one append to the
// log, covered by one synced write (not one per proposal), and each gets
// its own result.
func TestConcurrentProposalsShareOneAppend(t *testing.T) {
	var mu sync.Mutex
	regs := map[uint64]*prometheus.Registry{}
	c := newTestCluster(t, func(cfg *Config) {
		reg := prometheus.NewRegistry()
		mu.Lock()
		regs[cfg.NodeID] = reg
		mu.Unlock()
		cfg.Metrics = NewMetrics(reg)
	})
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.bootstrap(1, 1, 2, 3)
	lead := c.leader(1)
	c.propose(1, "warm", "up")
	r := c.get(lead).store.Replica(1)
	syncs := func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		mfs, err := regs[lead].Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "shale_raft_log_sync_seconds" {
				return mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
		t.Fatal("no log sync metric")
		return 0
	}

	// Hold the leader's loop while 64 proposals queue up.
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = r.runOnLoop(context.Background(), func() error { close(started); <-release; return nil })
	}()
	<-started
	before := syncs()
	const n = 64
	errs := make(chan error, n)
	results := make(chan any, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := r.Propose(ctx, []byte(fmt.Sprintf("k%02d=%d", i, i)))
			errs <- err
			results <- res
		}()
	}
	c.waitFor("64 queued proposals", 5*time.Second, func() bool { return r.inflight.Load() == n })
	close(release)
	seen := map[any]bool{}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		seen[<-results] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct results for %d proposals", len(seen), n)
	}
	if d := syncs() - before; d > 2 {
		t.Fatalf("%d synced log writes for %d proposals queued together, want at most 2", d, n)
	}
	c.converged(1, 1, 2, 3)
}

// TestHaltFailsQueuedProposalsAsStopped: proposals still queued when their
// replica halts fail with ErrStopped (they never reached the log; callers
// go to another replica), not with the halt's bare cause. Found by the
// chaos harness: a node whose disk filled answered such requests Internal,
// and the client gave up instead of trying another replica.
func TestHaltFailsQueuedProposalsAsStopped(t *testing.T) {
	c := newThreeNodeCluster(t, nil)
	lead := c.leader(1)
	r := c.get(lead).store.Replica(1)
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = r.runOnLoop(context.Background(), func() error {
			close(started)
			<-release
			r.fatal(errors.New("the state machine is corrupt"))
			return nil
		})
	}()
	<-started
	errs := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := r.Propose(ctx, []byte("k=v"))
		errs <- err
	}()
	c.waitFor("the proposal to queue", 5*time.Second, func() bool { return r.inflight.Load() == 1 })
	close(release)
	if err := <-errs; !errors.Is(err, ErrStopped) {
		t.Fatalf("a proposal queued when its replica halted: %v, want ErrStopped", err)
	}
}

// TestReadWaitingForApplyWakesTheLoop: an apply worker's report wakes the
// Raft loop only when something waits for it (Store.report). A read whose
// ReadIndex round is confirmed but whose shard has not applied up to it
// yet waits for the apply's report; it must be answered as soon as the
// apply ends, not at the loop's next tick (one second here).
func TestReadWaitingForApplyWakesTheLoop(t *testing.T) {
	const tick = time.Second
	var (
		hold       atomic.Pointer[chan struct{}]
		holdNode   atomic.Uint64
		holdingNow atomic.Int64
	)
	c := newTestCluster(t, func(cfg *Config) {
		cfg.TickInterval = tick
		cfg.ElectionTicks = 3
		cfg.HeartbeatTicks = 1
		node := cfg.NodeID
		cfg.applyHook = func(shardID uint64) {
			if ch := hold.Load(); ch != nil && shardID == 1 && node == holdNode.Load() {
				holdingNow.Add(1)
				<-*ch
				holdingNow.Add(-1)
			}
		}
	})
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.bootstrap(1, 1, 2, 3)
	c.propose(1, "warm", "up")
	lead := c.leader(1)
	holdNode.Store(lead)
	r := c.get(lead).store.Replica(1)
	for round := range 3 {
		ch := make(chan struct{})
		hold.Store(&ch)
		proposed := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := r.Propose(ctx, []byte(fmt.Sprintf("k%d=v", round)))
			proposed <- err
		}()
		c.waitFor("the leader's apply held", 5*time.Second, func() bool { return holdingNow.Load() == 1 })
		read := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			read <- r.ReadIndex(ctx)
		}()
		// The ReadIndex round takes a heartbeat's round trip; then the read
		// waits for the held apply.
		time.Sleep(200 * time.Millisecond)
		select {
		case err := <-read:
			t.Fatalf("round %d: the read returned (%v) before the write it must see was applied", round, err)
		default:
		}
		opened := time.Now()
		hold.Store(nil)
		close(ch)
		if err := <-read; err != nil {
			t.Fatalf("round %d: read: %v", round, err)
		}
		if took := time.Since(opened); took > tick/4 {
			t.Errorf("round %d: the read was answered %v after the apply it waited for was let go; want well under the %v tick", round, took, tick)
		}
		if err := <-proposed; err != nil {
			t.Fatalf("round %d: propose: %v", round, err)
		}
	}
}
