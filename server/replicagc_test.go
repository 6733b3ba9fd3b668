package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// waitStrayGone waits until node id hosts no replica of shard and its data
// directory is gone.
func waitStrayGone(t *testing.T, c *testcluster.Cluster, id, shard uint64) {
	t.Helper()
	dir := filepath.Join(c.Dir(), fmt.Sprintf("node%d", id), "shards", strconv.FormatUint(shard, 10))
	waitFor(t, 60*time.Second, func() (bool, string) {
		if c.Node(id).Store().Replica(shard) != nil {
			return false, fmt.Sprintf("node %d still hosts a replica of shard %d", id, shard)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return false, fmt.Sprintf("%s still exists (%v)", dir, err)
		}
		return true, ""
	})
}

// TestStrayReplicaMovedWhileDown: a replica moved off a node while the node
// was down is removed, with its data, once the node is back (replica GC).
func TestStrayReplicaMovedWhileDown(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	c.AddNode()
	cl := newClient(t, c)
	a := adminOf(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := cl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	shard := shardOf(t, c, []byte("k"))
	waitFor(t, 30*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		for _, d := range dir {
			if d.GetShardId() == shard {
				return true, ""
			}
		}
		return false, fmt.Sprintf("shard %d not in the directory %v (%v)", shard, dir, err)
	})
	var from uint64
	for _, id := range []uint64{3, 2, 1} {
		if c.Node(id).Store().Replica(shard) != nil && c.Leader(shard) != id {
			from = id
			break
		}
	}
	c.Stop(from)
	a = adminOf(t, c) // through a running node
	// The new node is live for placement once its heartbeats arrive.
	waitFor(t, 30*time.Second, func() (bool, string) {
		_, err := a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: shard, FromNodeId: from, ToNodeId: 4, PinSeconds: 600})
		return err == nil, fmt.Sprint(err)
	})
	waitFor(t, 60*time.Second, func() (bool, string) { return movedTo(t, c, shard, from, 4) })
	c.Restart(from)
	waitStrayGone(t, c, from, shard)
	if kv, err := cl.Get(ctx, []byte("k")); err != nil || string(kv.Value) != "v" {
		t.Fatalf("read after the stray went: %v, %v", kv, err)
	}
}

// TestStrayReplicaMergedWhileDown: a node down while its shard was merged
// away comes back with a replica that never saw the merge; it is removed,
// with its data, and the merged shard serves on that node too.
func TestStrayReplicaMergedWhileDown(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, k := range []string{"a", "x"} {
		if _, err := cl.Put(ctx, []byte(k), []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
	}
	left, right := twoUserShards(t, c)
	var down uint64
	for _, id := range []uint64{3, 2, 1} {
		if c.Leader(left.GetShardId()) != id && c.Leader(right.GetShardId()) != id && c.Leader(1) != id {
			down = id
			break
		}
	}
	if down == 0 {
		down = 3
	}
	c.Stop(down)
	mergeRetrying(t, adminOf(t, c), &shalev1.MergeShardsRequest{Key: []byte("a"), ShardId: left.GetShardId()})
	c.Restart(down)
	waitStrayGone(t, c, down, right.GetShardId())
	// The merged shard's replica on the node has both halves.
	waitFor(t, 30*time.Second, func() (bool, string) {
		sm := c.Node(down).Shard(left.GetShardId())
		if sm == nil {
			return false, "no replica of the merged shard"
		}
		st := sm.AppliedState()
		return len(st.Descriptor.GetEndKey()) == 0, fmt.Sprintf("descriptor %v", st.Descriptor)
	})
}

// TestMergedShardLeavesTheDirectory: a merged-away shard that comes back
// into the shard directory (a late report of its old descriptor, or a merge
// whose merging node stopped before removing it) is removed again by the
// next report of the shard that absorbed it, here made by a new leader.
func TestMergedShardLeavesTheDirectory(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	a := adminOf(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	left, right := twoUserShards(t, c)
	mergeRetrying(t, a, &shalev1.MergeShardsRequest{Key: []byte("a"), ShardId: left.GetShardId()})
	listed := func() (bool, error) {
		dir, err := directory(t, c)
		for _, d := range dir {
			if d.GetShardId() == right.GetShardId() {
				return true, err
			}
		}
		return false, err
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		on, err := listed()
		return !on && err == nil, fmt.Sprintf("shard %d still listed after its merge (%v)", right.GetShardId(), err)
	})
	// Bring it back as a removal lost with its merging node would have left
	// it: listed, with no replica anywhere. (A late report of the same
	// descriptor cannot: its put_shard is deduplicated; a frozen or
	// retired descriptor is not recorded.)
	stale := proto.Clone(right).(*shalev1.ShardDescriptor)
	stale.Epoch++
	if _, err := a.ReportShards(ctx, &shalev1.ReportShardsRequest{Descriptors: []*shalev1.ShardDescriptor{stale}}); err != nil {
		t.Fatal(err)
	}
	if on, err := listed(); !on || err != nil {
		t.Fatalf("the stale report did not bring shard %d back (%v): nothing to clean up", right.GetShardId(), err)
	}
	// A new leader of the merged shard reports it, and the shards it
	// absorbed as removed.
	from := c.Leader(left.GetShardId())
	to := from%3 + 1
	c.MoveLeader(left.GetShardId(), to, 30*time.Second)
	waitFor(t, 30*time.Second, func() (bool, string) {
		on, err := listed()
		return !on && err == nil, fmt.Sprintf("shard %d still listed (%v)", right.GetShardId(), err)
	})
}
