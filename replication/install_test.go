package replication

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// restoreGate holds the Restore of the state machines wrapped with it
// until released.
type restoreGate struct {
	open    chan struct{}
	waiting atomic.Int64 // Restores waiting at the gate
	passed  atomic.Int64 // Restores that went through
}

func newRestoreGate() *restoreGate { return &restoreGate{open: make(chan struct{})} }

// startGatedCluster starts nodes 1-3 with shard 1 on all of them, its
// Restores held at the returned gate (opened for good at the test's end,
// before the cluster closes).
func startGatedCluster(t *testing.T) (*testCluster, *restoreGate) {
	t.Helper()
	gate := newRestoreGate()
	// Its tests make a node catch up by snapshot: no log tail is kept for
	// the node they cut off.
	c := newTestCluster(t, func(cfg *Config) { cfg.LogKeepForDownNodes = -1 })
	t.Cleanup(gate.release) // runs before the cluster's close
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.bootstrapGated(1, gate, 1, 2, 3)
	return c, gate
}

// release opens the gate for good (idempotent).
func (g *restoreGate) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// gatedSM is a memSM whose Restore waits at a gate first.
type gatedSM struct {
	*memSM
	gate *restoreGate
}

func (g gatedSM) Restore(dir string) error {
	g.gate.waiting.Add(1)
	<-g.gate.open
	g.gate.waiting.Add(-1)
	g.gate.passed.Add(1)
	return g.memSM.Restore(dir)
}

// bootstrapGated is bootstrap, with every node's state machine of the
// shard wrapped in gate.
func (c *testCluster) bootstrapGated(shardID uint64, gate *restoreGate, nodes ...uint64) {
	c.t.Helper()
	c.bootstrapWith(shardID, func(sm *memSM) StateMachine { return gatedSM{sm, gate} }, nodes...)
}

// stopDuringRestore stops node while its Restore waits at gate: the
// node's loop ends first, then the gate opens and the worker's Restore
// goes through, and the node is restarted (its log reset never written).
func (c *testCluster) stopDuringRestore(node uint64, gate *restoreGate) *testNode {
	c.t.Helper()
	s := c.get(node).store
	stopped := make(chan struct{})
	go func() {
		c.stopNode(node)
		close(stopped)
	}()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		c.t.Fatalf("node %d's loop did not stop", node)
	}
	gate.release()
	<-stopped
	return c.startNode(node)
}

// lagBehind makes node fall behind shard's log truncation (isolated while
// the others write), so that it catches up by snapshot once healed.
func (c *testCluster) lagBehind(shard, node uint64, others ...uint64) {
	c.t.Helper()
	c.net.Isolate(node)
	lead := c.leader(shard, others...)
	for i := 0; i < 600; i++ {
		c.propose(shard, fmt.Sprintf("k%04d", i), fmt.Sprint(i))
	}
	c.waitFor("log truncation", 10*time.Second, func() bool {
		return c.get(lead).store.Replica(shard).log.TruncatedIndex() > c.get(node).sm(shard).AppliedState().Index
	})
}

// TestSnapshotInstallDoesNotStallOtherShards: while one shard's snapshot
// install is held in its state machine's Restore on a node, the node's
// other shard, which cannot commit without that node (two voters), keeps
// committing and holds no election. With the install inside the node's
// Raft cycle (before this change), no replica of the node persists or
// answers until the Restore returns: shard 2 gets no leader both nodes
// know of, and the test fails before its first write.
func TestSnapshotInstallDoesNotStallOtherShards(t *testing.T) {
	c, gate := startGatedCluster(t)
	c.bootstrap(2, 2, 3)
	c.propose(1, "a", "0")
	c.propose(2, "b", "0")

	c.lagBehind(1, 3, 1, 2)
	c.net.Heal()
	c.waitFor("node 3's restore of shard 1 to block", 10*time.Second, func() bool { return gate.waiting.Load() > 0 })
	lead2 := c.leader(2, 2, 3)
	term2 := c.get(lead2).store.Replica(2).Status().Term

	// 20 election timeouts (10 ticks of 10 ms each) of writes to shard 2,
	// each of which node 3 must persist and acknowledge.
	n := c.writeFor(2, lead2, "b", 20*10*10*time.Millisecond, "node 3's install of shard 1 is held")
	if gate.waiting.Load() == 0 || gate.passed.Load() != 0 {
		t.Fatalf("the install was not held throughout (waiting %d, passed %d)", gate.waiting.Load(), gate.passed.Load())
	}
	if st := c.get(lead2).store.Replica(2).Status(); st.Term != term2 || !st.Leader {
		t.Errorf("shard 2 held an election during the install: term %d → %d, leader %v", term2, st.Term, st.Leader)
	}
	// Node 3 learns that the last write committed with the leader's next
	// message to it, so it applies it within a heartbeat, not at once.
	c.waitFor("node 3 to apply shard 2's last write", 5*time.Second, func() bool {
		v, _ := c.get(3).sm(2).get("b")
		return v == fmt.Sprint(n-1)
	})
	t.Logf("%d writes to shard 2 while node 3's install of shard 1 was held", n)

	gate.release()
	c.converged(1, 1, 2, 3)
	if got := c.get(3).sm(1).restores; got == 0 {
		t.Fatal("node 3 caught up without installing the snapshot")
	}
	c.propose(1, "after", "x")
	c.propose(2, "after", "x")
	c.converged(1, 1, 2, 3)
	c.converged(2, 2, 3)
}

// TestSnapshotInFlightKeepsTheLogAfterIt: while a follower installs a
// snapshot (held at its Restore), the leader takes more writes than
// LogTruncateEntries; it keeps the log after the snapshot's index, so the
// follower continues from the log once installed: one snapshot, not one
// more for every truncation that passed it during the install.
func TestSnapshotInFlightKeepsTheLogAfterIt(t *testing.T) {
	c, gate := startGatedCluster(t)
	c.propose(1, "a", "0")
	c.lagBehind(1, 3, 1, 2)
	c.net.Heal()
	c.waitFor("node 3's restore to block", 10*time.Second, func() bool { return gate.waiting.Load() > 0 })
	lead := c.leader(1, 1, 2)
	first := c.get(lead).store.Replica(1).log.TruncatedIndex()
	for i := 0; i < 600; i++ {
		c.propose(1, fmt.Sprintf("m%04d", i), "x")
	}
	other := 3 - lead // of nodes 1 and 2
	c.waitFor("the other follower's truncation", 10*time.Second, func() bool {
		return c.get(other).store.Replica(1).log.TruncatedIndex() > first+200
	})
	gate.release()
	c.converged(1, 1, 2, 3)
	if n := c.net.Snapshots(); n != 1 {
		t.Fatalf("node 3 was sent %d snapshots, want 1", n)
	}
}

// TestCrashDuringSnapshotInstall: a node stopped while its Restore is held
// (the loop ends first, then the worker finishes the Restore; the log
// reset is never written) comes back with its state machine at the
// snapshot and its log realigned to it, and follows the shard again.
func TestCrashDuringSnapshotInstall(t *testing.T) {
	c, gate := startGatedCluster(t)
	c.propose(1, "a", "0")
	c.lagBehind(1, 3, 1, 2)
	before := c.get(3).sm(1).AppliedState().Index
	c.net.Heal()
	c.waitFor("node 3's restore to block", 10*time.Second, func() bool { return gate.waiting.Load() > 0 })

	n := c.stopDuringRestore(3, gate)
	r := n.store.Replica(1)
	applied := n.sm(1).AppliedState()
	if applied.Index <= before {
		t.Fatalf("node 3 restarted without the snapshot's state (applied %d, %d before the snapshot)", applied.Index, before)
	}
	if term, err := r.log.Term(applied.Index); err != nil || term != applied.Term {
		t.Fatalf("node 3's log disagrees with its state machine at %d: term %d (%v), want %d", applied.Index, term, err, applied.Term)
	}
	c.propose(1, "after", "x")
	c.converged(1, 1, 2, 3)
}

// TestCrashDuringInstallOverDivergentLog: the snapshot lands on a replica
// whose log runs past the snapshot's index with entries of an old leader
// that never committed (it was cut off, with its last proposals appended
// only locally). The node stops after the state machine restored the
// snapshot and before the log reset was written: on restart the log is
// realigned to the snapshot, not kept with its commit index moved up over
// the conflicting entries (which halts the replica when its leader's
// entries contradict a committed one), and the replica follows again.
func TestCrashDuringInstallOverDivergentLog(t *testing.T) {
	c, gate := startGatedCluster(t)
	c.propose(1, "a", "0")
	old := c.leader(1)
	var others []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != old {
			others = append(others, id)
		}
	}

	// The cut-off leader appends 1,000 entries it can never commit.
	c.net.Isolate(old)
	or := c.get(old).store.Replica(1)
	var wg sync.WaitGroup
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, _ = or.ProposeAlone(ctx, []byte(fmt.Sprintf("lost%04d=x", i))) // an entry each
		}()
	}
	wg.Wait()
	oldLast, _ := or.log.LastIndex()

	lead := c.leader(1, others...)
	for i := 0; i < 300; i++ {
		c.propose(1, fmt.Sprintf("k%04d", i), fmt.Sprint(i))
	}
	c.waitFor("log truncation", 10*time.Second, func() bool {
		return c.get(lead).store.Replica(1).log.TruncatedIndex() > c.get(old).sm(1).AppliedState().Index
	})
	if last, _ := c.get(lead).store.Replica(1).log.LastIndex(); last >= oldLast {
		t.Fatalf("setup: the old leader's log ends at %d, not past the new leader's %d", oldLast, last)
	}
	c.net.Heal()
	c.waitFor("the old leader's restore to block", 10*time.Second, func() bool { return gate.waiting.Load() > 0 })

	n := c.stopDuringRestore(old, gate)
	applied := n.sm(1).AppliedState()
	if applied.Index > oldLast {
		t.Fatalf("setup: the snapshot (index %d) is past the old leader's log (%d)", applied.Index, oldLast)
	}
	if term, err := n.store.Replica(1).log.Term(applied.Index); err != nil || term != applied.Term {
		t.Fatalf("the restarted log disagrees with the state machine at %d: term %d (%v), want %d", applied.Index, term, err, applied.Term)
	}
	c.propose(1, "after", "x")
	c.converged(1, 1, 2, 3)
	if _, ok := n.sm(1).get("lost0000"); ok {
		t.Fatal("an entry that never committed was applied")
	}
}
