package replication

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// openGate holds the open of node 3's on-demand replicas of shard 1 (the
// function Config.OpenReplica returns) until released; failFirst makes the
// first open fail instead.
type openGate struct {
	open      chan struct{}
	waiting   atomic.Int64 // opens waiting at the gate
	passed    atomic.Int64 // opens that went through
	failFirst bool
	failed    atomic.Int64
}

func (g *openGate) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// startOpenGatedCluster starts nodes 1-3 with node 3's opens of shard 1's
// replica going through gate (released for good at the test's end).
func startOpenGatedCluster(t *testing.T, failFirst bool) (*testCluster, *openGate) {
	t.Helper()
	g := &openGate{open: make(chan struct{}), failFirst: failFirst}
	c := newTestCluster(t, func(cfg *Config) {
		if cfg.NodeID != 3 {
			return
		}
		inner := cfg.OpenReplica
		cfg.OpenReplica = func(shardID uint64) (func() (StateMachine, error), error) {
			open, err := inner(shardID)
			if err != nil || shardID != 1 {
				return open, err
			}
			return func() (StateMachine, error) {
				if g.failFirst && g.failed.Add(1) == 1 {
					return nil, errors.New("injected open failure")
				}
				g.waiting.Add(1)
				<-g.open
				g.waiting.Add(-1)
				g.passed.Add(1)
				return open()
			}, nil
		}
	})
	t.Cleanup(g.release) // before the cluster's close
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	return c, g
}

// startHeldOpen starts a gated cluster (startOpenGatedCluster) with shard 1
// on nodes 1 and 2 holding writes keys, adds a learner of it on node 3 and
// returns once node 3's open of the learner's replica waits at the gate.
func startHeldOpen(t *testing.T, writes int) (*testCluster, *openGate) {
	t.Helper()
	c, gate := startOpenGatedCluster(t, false)
	c.bootstrap(1, 1, 2)
	for i := range writes {
		c.propose(1, fmt.Sprintf("k%02d", i), "v")
	}
	c.addLearner(1, 3, 1, 2)
	c.waitFor("node 3's open of shard 1 to block", 10*time.Second, func() bool { return gate.waiting.Load() > 0 })
	return c, gate
}

// addLearner adds a learner of shard on node through the shard's leader
// among among.
func (c *testCluster) addLearner(shard, node uint64, among ...uint64) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.get(c.leader(shard, among...)).store.Replica(shard).ChangeReplicas(ctx, []ReplicaChange{{Type: AddLearner, NodeID: node}}); err != nil {
		c.t.Fatalf("add a learner of shard %d on node %d: %v", shard, node, err)
	}
}

// heldFor returns how many messages node's Store keeps for the replica of
// shard it is opening (-1: none is being opened).
func (n *testNode) heldFor(shard uint64) int {
	n.store.mu.Lock()
	defer n.store.mu.Unlock()
	w := n.store.hosting[shard]
	if w == nil || w.replicaID == 0 {
		return -1
	}
	return int(w.heldCount.Load())
}

// TestReplicaOpenDoesNotStallOtherShards: while the open of a replica
// created on demand (a learner just added on node 3; a server creates a
// shard engine for it) is held, node 3 leads its other shard, which cannot
// commit without it (two voters), and that shard keeps committing and
// applying and holds no election; the messages for the replica being
// opened are kept, and once the open goes through the learner catches up.
// With the open on the node's Raft loop no replica of the node persists or
// answers meanwhile, and with it inside the claim that waits for the
// node's applies (Store.hostMu) no write of the shard node 3 leads is
// answered: either way the first write fails.
func TestReplicaOpenDoesNotStallOtherShards(t *testing.T) {
	c, gate := startOpenGatedCluster(t, false)
	c.bootstrap(1, 1, 2)
	c.bootstrap(2, 2, 3)
	c.propose(1, "a", "0")
	c.propose(2, "b", "0")
	if c.leader(2, 2, 3) != 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.get(2).store.Replica(2).TransferLeader(ctx, 3); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	c.waitFor("node 3 to lead shard 2", 10*time.Second, func() bool { return c.leader(2, 2, 3) == 3 })
	term2 := c.get(3).store.Replica(2).Status().Term

	c.addLearner(1, 3, 1, 2)
	c.waitFor("node 3's open of shard 1 to block", 10*time.Second, func() bool { return gate.waiting.Load() > 0 })

	// 20 election timeouts (10 ticks of 10 ms each) of writes to shard 2,
	// each of which node 3 must persist, and apply as the leader.
	n := c.writeFor(2, 3, "b", 20*10*10*time.Millisecond, "node 3's open of shard 1 is held")
	if gate.waiting.Load() == 0 || gate.passed.Load() != 0 {
		t.Fatalf("the open was not held throughout (waiting %d, passed %d)", gate.waiting.Load(), gate.passed.Load())
	}
	if r := c.get(3).store.Replica(1); r != nil {
		t.Fatal("node 3 hosts shard 1 before its open went through")
	}
	if st := c.get(3).store.Replica(2).Status(); st.Term != term2 || !st.Leader {
		t.Errorf("shard 2 held an election during the open: term %d → %d, leader %v", term2, st.Term, st.Leader)
	}
	held := c.get(3).heldFor(1)
	if held <= 0 {
		t.Errorf("node 3 kept %d messages for the replica it opens, want some", held)
	}
	t.Logf("%d writes to shard 2 while node 3's open of shard 1 was held; %d messages kept for it", n, held)

	gate.release()
	c.converged(1, 1, 2, 3)
	c.propose(1, "after", "x")
	c.propose(2, "after", "x")
	c.converged(1, 1, 2, 3)
	c.converged(2, 2, 3)
	if c.get(3).heldFor(1) != -1 {
		t.Error("node 3 still opens shard 1 after it joined")
	}
}

// TestCrashDuringReplicaOpen: a node stopped while the open of a replica
// created on demand is held (the loop ends first, then the open goes
// through and the Store closes the state machine it never hosted) comes
// back without the replica, whose creation never became durable (the
// uninitialized engine is discarded, as a server does), is sent to again,
// creates the replica anew and catches up.
func TestCrashDuringReplicaOpen(t *testing.T) {
	c, gate := startHeldOpen(t, 50)

	s := c.get(3).store
	stopped := make(chan struct{})
	go func() {
		c.stopNode(3)
		close(stopped)
	}()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		t.Fatal("node 3's loop did not stop")
	}
	gate.release()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("node 3 did not stop once the open went through")
	}
	if id, ok, err := s.readUint(replicaIDPrefix, 1); err == nil && ok {
		t.Fatalf("node 3 recorded replica %d of shard 1, whose open it never finished", id)
	}

	n := c.startNode(3)
	c.converged(1, 1, 2, 3)
	c.propose(1, "after", "x")
	c.converged(1, 1, 2, 3)
	if r := n.store.Replica(1); r == nil || r.Status().Stopped != "" {
		t.Fatalf("node 3's replica of shard 1 after the restart: %v", r)
	}
}

// TestFailedReplicaOpenIsRetried: when the open of a replica created on
// demand fails, the messages kept for it are dropped, and the leader's
// next ones open it again: the replica is created and catches up.
func TestFailedReplicaOpenIsRetried(t *testing.T) {
	c, gate := startOpenGatedCluster(t, true)
	gate.release()
	c.bootstrap(1, 1, 2)
	c.propose(1, "a", "0")
	c.addLearner(1, 3, 1, 2)
	c.converged(1, 1, 2, 3)
	if gate.failed.Load() < 2 || gate.passed.Load() != 1 {
		t.Fatalf("opens: %d tried, %d went through; want the first to fail and the second to go through", gate.failed.Load(), gate.passed.Load())
	}
	c.propose(1, "after", "x")
	c.converged(1, 1, 2, 3)
}

// TestSnapshotKeptForReplicaBeingOpened: a snapshot that arrives for a
// shard whose replica is being opened on demand is kept, not refused, and
// once the open goes through it is installed and its sender answered.
func TestSnapshotKeptForReplicaBeingOpened(t *testing.T) {
	c, gate := startHeldOpen(t, 20)

	// The shard's leader sends node 3's replica a snapshot, as Raft would.
	lead := c.leader(1, 1, 2)
	r := c.get(lead).store.Replica(1)
	s3 := c.get(3).store
	s3.mu.Lock()
	to := s3.hosting[1].replicaID
	s3.mu.Unlock()
	dir := filepath.Join(c.dir, "snap-to-3")
	st, err := r.StateMachine().Checkpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(r.ReplicaID()), To: proto.Uint64(to),
		Term: proto.Uint64(r.Status().Term), Snapshot: snapshotOf(st)}
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	header := &shalev1.SnapshotHeader{ClusterId: "test", ShardId: 1, FromNodeId: lead, ToNodeId: 3, RaftMessage: data, Descriptor_: st.Descriptor}
	answer := make(chan error, 1)
	go func() { answer <- s3.HandleSnapshot(context.Background(), header, dir) }()

	select {
	case err := <-answer:
		t.Fatalf("the snapshot was answered while the replica's open was held: %v", err)
	case <-time.After(20 * 10 * time.Millisecond):
	}
	gate.release()
	select {
	case err := <-answer:
		if err != nil {
			t.Fatalf("the snapshot kept for the replica: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot kept for the replica was not answered")
	}
	if c.get(3).sm(1).restores == 0 {
		t.Fatal("node 3's replica did not install the snapshot")
	}
	c.propose(1, "after", "x")
	c.converged(1, 1, 2, 3)
}
