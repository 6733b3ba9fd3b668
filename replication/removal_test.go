package replication

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestReplicaRemovalDoesNotStallOtherShards: while the deletion of a
// removed replica's data (the ReplicaRemoved hook, which deletes a whole
// shard engine on a server) is held on a node, the node's other shard,
// which cannot commit without that node (two voters), keeps committing and
// holds no election. With the deletion on the node's Raft loop, no
// replica of the node persists or answers until it returns.
func TestReplicaRemovalDoesNotStallOtherShards(t *testing.T) {
	open := make(chan struct{})
	var waiting atomic.Int64
	c := newTestCluster(t, func(cfg *Config) {
		if cfg.NodeID != 3 {
			return
		}
		removed := cfg.ReplicaRemoved
		cfg.ReplicaRemoved = func(shardID uint64) {
			if shardID == 1 {
				waiting.Add(1)
				<-open
				waiting.Add(-1)
			}
			removed(shardID)
		}
	})
	t.Cleanup(func() {
		select {
		case <-open:
		default:
			close(open)
		}
	})
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.bootstrap(1, 1, 2, 3)
	c.bootstrap(2, 2, 3)
	c.propose(1, "a", "0")
	c.propose(2, "b", "0")
	lead1 := c.leader(1)
	if lead1 == 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.get(3).store.Replica(1).TransferLeader(ctx, 1); err != nil {
			t.Fatal(err)
		}
		cancel()
		lead1 = c.leader(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.get(lead1).store.Replica(1).ChangeReplicas(ctx, []ReplicaChange{{Type: RemoveReplica, ReplicaID: 3}}); err != nil {
		t.Fatalf("remove node 3's replica of shard 1: %v", err)
	}
	c.waitFor("node 3's deletion of shard 1 to block", 10*time.Second, func() bool { return waiting.Load() > 0 })
	lead2 := c.leader(2, 2, 3)
	term2 := c.get(lead2).store.Replica(2).Status().Term

	n := c.writeFor(2, lead2, "b", 20*10*10*time.Millisecond, "node 3's deletion of shard 1's data is held")
	if waiting.Load() == 0 {
		t.Fatal("the deletion was not held throughout")
	}
	if st := c.get(lead2).store.Replica(2).Status(); st.Term != term2 || !st.Leader {
		t.Errorf("shard 2 held an election during the deletion: term %d → %d, leader %v", term2, st.Term, st.Leader)
	}
	t.Logf("%d writes to shard 2 while node 3's deletion of shard 1 was held", n)

	close(open)
	c.waitFor("node 3's deletion of shard 1 to end", 10*time.Second, func() bool { return c.get(3).sm(1) == nil })
	c.propose(1, "after", "x")
	c.converged(1, 1, 2)
	c.converged(2, 2, 3)
}
