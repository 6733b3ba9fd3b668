package replication

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

func TestDecodePacked(t *testing.T) {
	enc := []byte{entryVersionPacked}
	enc = appendPackedCommand(enc, 0, 7, []byte("a=1"))
	enc = appendPackedCommand(enc, 7, 300, nil)
	enc = appendPackedCommand(enc, 300, 1<<40, []byte("c=3"))
	enc = appendPackedCommand(enc, 1<<40, 5, nil) // IDs need not increase
	cmds, err := decodePacked(enc)
	if err != nil {
		t.Fatal(err)
	}
	want := []packedCommand{{7, []byte("a=1")}, {300, []byte{}}, {1 << 40, []byte("c=3")}, {5, []byte{}}}
	if len(cmds) != len(want) {
		t.Fatalf("%d commands, want %d", len(cmds), len(want))
	}
	for i, c := range cmds {
		if c.id != want[i].id || !bytes.Equal(c.payload, want[i].payload) {
			t.Fatalf("command %d: %d %q, want %d %q", i, c.id, c.payload, want[i].id, want[i].payload)
		}
	}
	one := appendPackedCommand([]byte{entryVersionPacked}, 0, 7, []byte("a=1"))
	for name, data := range map[string][]byte{
		"empty":                 {},
		"version 1":             encodeEntry(7, []byte("a=1")),
		"no commands":           {entryVersionPacked},
		"one command":           one,
		"payload past the end":  enc[:len(enc)-3],
		"length past the end":   append(bytes.Clone(one), 8, 200),
		"overlong uvarint ID":   append(append(bytes.Clone(one), 0x87, 0x00, 0), one[1:]...),
		"truncated uvarint":     append(bytes.Clone(one), 0x80),
		"overlong payload size": append(append(bytes.Clone(one), 1, 0x80, 0x00), one[1:]...),
	} {
		if _, err := decodePacked(data); err == nil {
			t.Errorf("%s: decoded %x", name, data)
		}
	}
}

// queueProposals holds r's loop until n proposals from n goroutines are
// queued on r, lets them through, and returns their results in the order
// of their values.
func queueProposals(t *testing.T, c *testCluster, r *Replica, n int, prefix string) []any {
	t.Helper()
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = r.runOnLoop(context.Background(), func() error { close(started); <-release; return nil })
	}()
	<-started
	results := make([]any, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := r.Propose(ctx, []byte(fmt.Sprintf("%s%03d=%d", prefix, i, i)))
			results[i] = res
			errs <- err
		}()
	}
	c.waitFor("queued proposals", 5*time.Second, func() bool { return r.inflight.Load() == int64(n) })
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return results
}

// entriesOf counts the distinct entries of results (memSM's [2]uint64 of
// index and part) and checks that no two are the same command.
func entriesOf(t *testing.T, results []any) int {
	t.Helper()
	seen, entries := map[[2]uint64]bool{}, map[uint64]bool{}
	for _, res := range results {
		place, ok := res.([2]uint64)
		if !ok || seen[place] {
			t.Fatalf("result %v (%T) twice or of the wrong type", res, res)
		}
		seen[place] = true
		entries[place[0]] = true
	}
	return len(entries)
}

func packedParts(n *testNode) int {
	sm := n.sm(1)
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.packedParts
}

// TestQueuedProposalsPackIntoOneEntry: proposals queued on a leader while
// its loop is busy become one Raft entry, which every replica applies as
// one command per proposal, each proposer getting its own command's
// result.
func TestQueuedProposalsPackIntoOneEntry(t *testing.T) {
	c := newThreeNodeCluster(t, nil)
	c.propose(1, "warm", "up")
	lead := c.leader(1)
	r := c.get(lead).store.Replica(1)
	c.waitFor("the followers' features", 5*time.Second, func() bool { return r.store.packingAllowed(r) })
	before, _ := r.log.LastIndex()
	const n = 64
	results := queueProposals(t, c, r, n, "k")
	if e := entriesOf(t, results); e != 1 {
		t.Fatalf("%d proposals queued together took %d entries, want 1", n, e)
	}
	if last, _ := r.log.LastIndex(); last != before+1 {
		t.Fatalf("the log grew from %d to %d for one packed entry", before, last)
	}
	c.converged(1, 1, 2, 3)
	for id := uint64(1); id <= 3; id++ {
		if p := packedParts(c.get(id)); p != n {
			t.Fatalf("node %d applied %d commands of packed entries, want %d", id, p, n)
		}
		if v, ok := c.get(id).sm(1).get("k063"); !ok || v != "63" {
			t.Fatalf("node %d: k063 = %q, %v", id, v, ok)
		}
	}
	// A lone proposal is an entry of its own, as before.
	if _, err := r.Propose(context.Background(), []byte("lone=1")); err != nil {
		t.Fatal(err)
	}
	if p := packedParts(c.get(lead)); p != n {
		t.Fatalf("a lone proposal was packed (%d packed commands)", p)
	}
}

// TestNoPackingUntilEveryNodeReadsThem: a leader packs nothing while a
// node hosting one of the shard's replicas has not advertised that it
// reads packed entries (a node of an older version, here one with
// DisablePackedEntries), and packs once that node runs a version that
// does.
func TestNoPackingUntilEveryNodeReadsThem(t *testing.T) {
	c, r, upgrade := clusterWithOldNode3(t, func(cfg *Config, old bool) { cfg.DisablePackedEntries = old })
	time.Sleep(100 * time.Millisecond) // batches from every node arrived
	const n = 32
	if e := entriesOf(t, queueProposals(t, c, r, n, "a")); e != n {
		t.Fatalf("with node 3 not reading packed entries, %d proposals took %d entries, want %d", n, e, n)
	}
	c.converged(1, 1, 2, 3)
	for id := uint64(1); id <= 3; id++ {
		if p := packedParts(c.get(id)); p != 0 {
			t.Fatalf("node %d applied %d commands of packed entries", id, p)
		}
	}

	upgrade()
	c.waitFor("node 3's features", 5*time.Second, func() bool { return r.store.packingAllowed(r) })
	if e := entriesOf(t, queueProposals(t, c, r, n, "b")); e != 1 {
		t.Fatalf("with every node reading packed entries, %d proposals took %d entries, want 1", n, e)
	}
	c.converged(1, 1, 2, 3)
}

// clusterWithOldNode3 starts a 3-node cluster hosting shard 1, whose node
// 3 is configured as a node of an older version (configure(cfg, true)) and
// the others as this one (configure(cfg, false)). It returns the cluster,
// the shard's leader replica (never node 3's) once a proposal applied, and
// a function that restarts node 3 as this version.
func clusterWithOldNode3(t *testing.T, configure func(cfg *Config, old bool)) (*testCluster, *Replica, func()) {
	t.Helper()
	old := map[uint64]bool{3: true}
	c := newTestCluster(t, func(cfg *Config) { configure(cfg, old[cfg.NodeID]) })
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.bootstrap(1, 1, 2, 3)
	c.propose(1, "warm", "up")
	lead := c.leader(1)
	if lead == 3 {
		// Node 3 is restarted to upgrade it: its replica must not lead.
		if err := c.get(3).store.Replica(1).TransferLeader(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		lead = c.leader(1)
	}
	upgrade := func() {
		old[3] = false
		c.stopNode(3)
		c.startNode(3)
	}
	return c, c.get(lead).store.Replica(1), upgrade
}

// TestNodesReadStateMachineFeatures: a node advertises its state
// machine's features (Config.StateMachineFeatures) with the Raft layer's,
// and a leader's NodesRead is true for a feature only once every other
// node of the shard advertised it.
func TestNodesReadStateMachineFeatures(t *testing.T) {
	c, r, upgrade := clusterWithOldNode3(t, func(cfg *Config, old bool) {
		if !old {
			cfg.StateMachineFeatures = FeatureCompactCommands
		}
	})
	c.waitFor("every node's features", 5*time.Second, func() bool { return r.NodesRead(FeaturePackedEntries) })
	if r.NodesRead(FeatureCompactCommands) || r.NodesRead(FeatureCompactCommands|FeaturePackedEntries) {
		t.Fatal("node 3 reads compact commands, though it never advertised them")
	}
	upgrade()
	c.waitFor("node 3's features", 5*time.Second, func() bool { return r.NodesRead(FeatureCompactCommands | FeaturePackedEntries) })
}

// TestFeaturesOnNodeHeartbeats: the empty batches that only tell a node's
// liveness (heartbeatNodes; here every group is quiesced, so they are all
// that flows) advertise the sender's features too, so that a leader's
// NodesRead does not turn false between the groups' traffic. Before, they
// advertised none: a leader stopped packing, and its node proposed the
// long form of commands, after every such heartbeat.
func TestFeaturesOnNodeHeartbeats(t *testing.T) {
	c := newTestCluster(t, nil)
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.bootstrap(1, 1, 2, 3)
	c.propose(1, "a", "1")
	r := c.get(c.leader(1)).store.Replica(1)
	c.waitFor("the group to quiesce", 10*time.Second, func() bool { return r.Status().Quiesced })
	// Only node heartbeats flow now, one per heartbeat interval (before
	// the fix, this failed within about 30 intervals).
	interval := r.store.cfg.TickInterval * time.Duration(r.store.cfg.HeartbeatTicks)
	for end := time.Now().Add(50 * interval); time.Now().Before(end); time.Sleep(interval / 8) {
		if !r.NodesRead(FeaturePackedEntries) {
			t.Fatalf("the leader's peers stopped reading packed entries while quiesced (their features: %v)", *r.store.peerFeatures.Load())
		}
	}
}
