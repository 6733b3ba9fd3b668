package replication

import (
	"path/filepath"
	"testing"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// TestCampaignNewKeepsElectionWhoseVotesAreSlow: a split's new shard
// campaigns again every tick while its votes may be dropped (the other
// replicas do not host the shard yet), but not once it is a candidate past
// its pre-vote: there the votes are on their way, and a new campaign
// throws them away. With votes slower than a tick (a loaded node, as in
// the one-shard benchmark, where the new shard went through terms 6, 7 and
// 8 in 0.7 s), campaigning each tick never let an election finish; now the
// first election wins, one term up, in about two round trips.
func TestCampaignNewKeepsElectionWhoseVotesAreSlow(t *testing.T) {
	const tick, rtt = 10 * time.Millisecond, 80 * time.Millisecond
	c := newTestCluster(t, func(cfg *Config) {
		cfg.TickInterval = tick
		cfg.ElectionTicks = 100 // Raft's own election timer stays out of it (1-2 s)
	})
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.net.SetDelay(rtt/2, rtt/2)
	c.bootstrap(7, 1, 2, 3)
	n := c.get(1)
	r := n.store.Replica(7)
	term := r.Status().Term
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.store.campaignNew(r, 0)
	}()
	c.waitFor("a leader of shard 7", 5*time.Second, func() bool { return r.Status().LeaderNodeID != 0 })
	took := time.Since(start)
	<-done
	st := r.Status()
	t.Logf("leader node %d at term %d (from %d) after %v", st.LeaderNodeID, st.Term, term, took)
	if st.LeaderNodeID != 1 || st.Term != term+1 {
		t.Fatalf("leader node %d at term %d; want node 1 elected at term %d, by its first election", st.LeaderNodeID, st.Term, term+1)
	}
	if bound := 5 * rtt; took > bound {
		t.Fatalf("the election took %v; want at most %v (two round trips of %v)", took, bound, rtt)
	}
}

// TestCampaignNewReachesReplicasHostedLater: the replica named to lead a
// split's new shard campaigns as soon as it hosts the shard, while the
// other replicas are still applying the split and host none yet. Their
// nodes hold its vote requests and deliver them when the shard's replica
// joins, so the shard has a leader as soon as a quorum hosts it, not a
// tick later when the candidate stands again (a second with this test's
// ticks; before, with 100-ms ticks, 100 ms of every load split's requests
// waited for it).
func TestCampaignNewReachesReplicasHostedLater(t *testing.T) {
	const tick, later = time.Second, 50 * time.Millisecond
	c := newTestCluster(t, func(cfg *Config) {
		cfg.TickInterval = tick
		cfg.ElectionTicks = 10
	})
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	desc := &shalev1.ShardDescriptor{ShardId: 7, Epoch: 1, NextReplicaId: 4}
	for i := uint64(1); i <= 3; i++ {
		desc.Replicas = append(desc.Replicas, &shalev1.ReplicaDescriptor{NodeId: i, ReplicaId: i})
	}
	host := func(id uint64) *Replica {
		n := c.get(id)
		sm, err := newMemSM(filepath.Join(n.dir, "shard7"), BootstrapState(desc))
		if err != nil {
			t.Fatal(err)
		}
		r, err := n.store.AddReplica(sm)
		if err != nil {
			t.Fatal(err)
		}
		n.mu.Lock()
		n.sms[7] = sm
		n.mu.Unlock()
		return r
	}
	n1 := c.get(1)
	r := host(1)
	term := r.Status().Term
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		n1.store.campaignNew(r, 0)
	}()
	time.Sleep(later)
	host(2)
	host(3)
	c.waitFor("a leader of shard 7", 10*time.Second, func() bool { return r.Status().LeaderNodeID != 0 })
	took := time.Since(start)
	<-done
	st := r.Status()
	t.Logf("leader node %d at term %d (from %d) %v after node 1 stood, %v after the others hosted the shard", st.LeaderNodeID, st.Term, term, took, took-later)
	if st.LeaderNodeID != 1 || st.Term != term+1 {
		t.Fatalf("leader node %d at term %d; want node 1 elected at term %d, by its first election", st.LeaderNodeID, st.Term, term+1)
	}
	if bound := tick / 2; took > bound {
		t.Fatalf("the election took %v; want well under the %v tick after which node 1 would stand again", took, tick)
	}
}
