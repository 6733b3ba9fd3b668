package server_test

import (
	"testing"
	"time"

	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server"
)

// TestFoundingCampaignsAtOnce: a founding cluster's shards get their
// leaders without waiting out an election timeout. The timeout here is
// 10 s (500 ticks of 20 ms; Raft's randomized timeout is 10-20 s), and
// every shard has a leader well before it: the replica first in each shard's
// descriptor campaigns as soon as its node runs. Only that replica
// campaigns, so each shard is led by it after a single election (the
// term one past the bootstrap's, no election storm).
func TestFoundingCampaignsAtOnce(t *testing.T) {
	const ticks = 500
	tick := 20 * time.Millisecond
	start := time.Now()
	c := testcluster.Start(t, testcluster.Options{
		Splits:       [][]byte{[]byte("g"), []byte("p")},
		TickInterval: tick,
		Configure:    func(cfg *server.Config) { cfg.ElectionTicks = ticks },
	})
	took := time.Since(start)
	if timeout := ticks * tick; took >= timeout {
		t.Fatalf("every shard had a leader %v after the founding nodes' start, not before the election timeout %v", took, timeout)
	}
	shards := c.ShardIDs()
	if len(shards) != 4 {
		t.Fatalf("shards %v, want the system shard and 3 user shards", shards)
	}
	for _, id := range shards {
		var first uint64
		for _, nid := range c.NodeIDs() {
			if s := c.Node(nid).Shard(id); s != nil {
				first = s.Descriptor().GetReplicas()[0].GetNodeId()
			}
		}
		leader := c.Leader(id)
		if leader != first {
			t.Errorf("shard %d is led by node %d, not node %d, first in its descriptor", id, leader, first)
		}
		for _, nid := range c.NodeIDs() {
			r := c.Node(nid).Store().Replica(id)
			if r == nil {
				continue
			}
			// A follower may not have heard of the election yet.
			if st := r.Status(); st.Term > replication.InitialTerm+1 || st.Leader && st.Term != replication.InitialTerm+1 {
				t.Errorf("shard %d on node %d: term %d (leader %v), want %d (one election)", id, nid, st.Term, st.Leader, replication.InitialTerm+1)
			}
		}
	}
	t.Logf("leaders of %d shards %v after the founding nodes' start (election timeout %v)", len(shards), took, ticks*tick)
}
