package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
)

// leaders counts the shards node id leads.
func leaders(c *testcluster.Cluster, id uint64) (n int, shards []uint64) {
	for _, r := range c.Node(id).Store().Replicas() {
		if r.IsLeader() {
			n++
			shards = append(shards, r.ShardID())
		}
	}
	return n, shards
}

// TestDrainLeaders: a drained node leads no shard, through the Admin RPC
// sent to itself and forwarded from another node; it gets no leadership
// back from balancing while the drain holds, and the cluster serves
// writes throughout.
func TestDrainLeaders(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("b"), []byte("d"), []byte("f"), []byte("h"), []byte("k")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Gather leaderships on node 1 so the drain has work and balancing
	// would want to give some back.
	for _, sh := range c.ShardIDs() {
		if _, err := cl.TransferLeaderPinned(ctx, sh, 1, -1); err != nil {
			t.Fatalf("transfer shard %d to node 1: %v", sh, err)
		}
	}
	if n, _ := leaders(c, 1); n < 6 {
		t.Fatalf("node 1 leads %d shards before the drain, want all 7", n)
	}
	// Drain node 1, asking node 1 itself (node ID 0: the receiving node).
	cl1 := newClientAt(t, c.Node(1).Addr())
	res, err := cl1.DrainLeaders(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.NodeID != 1 || len(res.Remaining) != 0 || res.Transferred < 6 {
		t.Fatalf("drain of node 1: %+v", res)
	}
	if n, sh := leaders(c, 1); n != 0 {
		t.Fatalf("node 1 still leads %v after its drain", sh)
	}
	// Drain node 2 through node 3 (forwarded).
	cl3 := newClientAt(t, c.Node(3).Addr())
	res, err = cl3.DrainLeaders(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.NodeID != 2 || len(res.Remaining) != 0 {
		t.Fatalf("drain of node 2 through node 3: %+v", res)
	}
	// Node 2 may have handed leaderships to node 1 before it heard that
	// node 1 drains (heartbeats are once a second); node 1 hands them on.
	// Then balancing would move leaderships back to nodes 1 and 2 (node 3
	// leads everything); the drain keeps them away, and writes succeed.
	settle := time.Now().Add(10 * time.Second)
	for {
		n1, _ := leaders(c, 1)
		n2, _ := leaders(c, 2)
		if n1+n2 == 0 {
			break
		}
		if time.Now().After(settle) {
			t.Fatalf("drained nodes 1 and 2 still lead %d and %d shards", n1, n2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline := time.Now().Add(4 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if _, err := cl.Put(ctx, []byte{byte('a' + i%12)}, []byte("v")); err != nil {
			t.Fatal(err)
		}
		for _, id := range []uint64{1, 2} {
			if n, sh := leaders(c, id); n != 0 {
				t.Fatalf("drained node %d leads %v again", id, sh)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, _ := leaders(c, 3); n != len(c.ShardIDs()) {
		t.Fatalf("node 3 leads %d of %d shards", n, len(c.ShardIDs()))
	}
}

// newClientAt is a client whose first endpoint is addr.
func newClientAt(t *testing.T, addr string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := client.New(ctx, []string{addr}, client.WithDefaultTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestDrainOfEveryNodeEndsSoon: when every node drains at once (a whole
// cluster stopping), no leadership has anywhere to go; each drain gives up
// within seconds, not at its deadline, and keeps what it still leads.
func TestDrainOfEveryNodeEndsSoon(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("b"), []byte("d"), []byte("f"), []byte("h"), []byte("k")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.Put(ctx, []byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	type result struct {
		id        uint64
		took      time.Duration
		remaining []uint64
	}
	results := make(chan result, 3)
	start := time.Now()
	for _, id := range c.NodeIDs() {
		go func() {
			_, remaining := c.Node(id).DrainLeaders(ctx)
			results <- result{id, time.Since(start), remaining}
		}()
	}
	for range c.NodeIDs() {
		r := <-results
		t.Logf("node %d: drain returned after %v, still leading %v", r.id, r.took.Round(time.Millisecond), r.remaining)
		if r.took > 10*time.Second {
			t.Errorf("node %d: drain took %v with every node draining; want it to give up within seconds", r.id, r.took)
		}
	}
}
