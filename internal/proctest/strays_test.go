//go:build unix

package proctest

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Replica GC on real processes (issue 19, gap 4): a node that was down while
// its replica was moved away, or while its shard was merged away, comes back
// with a replica its shard no longer has. The node removes it with its data,
// and afterwards no node reports a replica the shard directory does not
// place on it, so routing needs no filter for strays.

// strayDataBytes is written to the shard that leaves a stray behind, so that
// the freed space is more than an empty engine's files.
const strayDataBytes = 2 << 20

// TestStrayReplicaMovedWhileDownOnProcesses: a replica moved off a node
// while the node was down.
func TestStrayReplicaMovedWhileDownOnProcesses(t *testing.T) {
	bins := requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 4, splitKeys, "--merge-size-bytes", "-1")
	cli := readyClient(ctx, t, c, 4)
	writeShard(ctx, t, cli, "x/")
	shard := shardOf(ctx, t, cli, []byte("x/"))
	d := directoryEntry(ctx, t, cli, shard)
	var from, to uint64
	for _, id := range []uint64{1, 2, 3, 4} {
		switch {
		case !slices.Contains(nodesOf(d), id):
			to = id
		case from == 0:
			from = id
		}
	}
	if from == 0 || to == 0 {
		t.Fatalf("shard %d has replicas on %v: no node to move one to", shard, nodesOf(d))
	}
	dir := c.shardDir(from, shard)
	before := dirBytes(t, dir)
	if err := c.node(from).stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	until(ctx, t, "the move of the down node's replica", func() (bool, string) {
		_, err := cli.MoveReplica(ctx, shard, from, to, 10*time.Minute)
		return err == nil, fmt.Sprint(err)
	})
	until(ctx, t, "the directory placing the replica on the new node", func() (bool, string) {
		d := directoryEntry(ctx, t, cli, shard)
		ids := nodesOf(d)
		return slices.Contains(ids, to) && !slices.Contains(ids, from), fmt.Sprintf("replicas on %v", ids)
	})
	c.node(from).start(t, bins.server)
	c.waitStrayGone(ctx, t, from, shard, dir, before)
	c.checkNoStrays(ctx, t, cli)
	readShard(ctx, t, cli, "x/")
}

// TestStrayReplicaMergedWhileDownOnProcesses: a replica of a shard merged
// away while its node was down.
func TestStrayReplicaMergedWhileDownOnProcesses(t *testing.T) {
	bins := requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 3, splitKeys, "--merge-size-bytes", "-1")
	cli := readyClient(ctx, t, c, 3)
	writeShard(ctx, t, cli, "x/")
	right := shardOf(ctx, t, cli, []byte("x/"))
	const down = 3
	dir := c.shardDir(down, right)
	before := dirBytes(t, dir)
	if err := c.node(down).stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	until(ctx, t, "the merge", func() (bool, string) {
		_, removed, err := cli.MergeShards(ctx, []byte("a")) // the shard left of splitKeys
		return err == nil && removed == right, fmt.Sprintf("removed %d: %v", removed, err)
	})
	c.node(down).start(t, bins.server)
	c.waitStrayGone(ctx, t, down, right, dir, before)
	c.checkNoStrays(ctx, t, cli)
	// The node's replica of the merged shard holds the right half too.
	until(ctx, t, "the merged shard on the restarted node", func() (bool, string) {
		resp, err := shalev1.NewAdminClient(c.conn(c.node(down).addr)).NodeInfo(ctx, &shalev1.NodeInfoRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, s := range resp.GetShards() {
			d := s.GetDescriptor_()
			if !d.GetSystem() && len(d.GetStartKey()) == 0 && len(d.GetEndKey()) == 0 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("node %d reports %v", down, resp.GetShards())
	})
	readShard(ctx, t, cli, "x/")
}

func readyClient(ctx context.Context, t *testing.T, c *procCluster, n int) *client.Client {
	t.Helper()
	cli, err := client.New(ctx, c.endpoints(), client.WithLogger(testLogger()))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	waitReady(ctx, t, cli, n)
	return cli
}

// strayKeys is how many 4 KiB values writeShard writes.
const strayKeys = strayDataBytes / 4096

func writeShard(ctx context.Context, t *testing.T, cli *client.Client, prefix string) {
	t.Helper()
	for i := range strayKeys {
		k := fmt.Sprintf("%s%05d", prefix, i)
		if _, err := cli.Put(ctx, []byte(k), bytes.Repeat([]byte{byte(i)}, 4096)); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
}

func readShard(ctx context.Context, t *testing.T, cli *client.Client, prefix string) {
	t.Helper()
	for i := range strayKeys {
		k := fmt.Sprintf("%s%05d", prefix, i)
		kv, err := cli.Get(ctx, []byte(k))
		if err != nil || !bytes.Equal(kv.Value, bytes.Repeat([]byte{byte(i)}, 4096)) {
			t.Fatalf("get %s after the stray went: %v", k, err)
		}
	}
}

func directoryEntry(ctx context.Context, t *testing.T, cli *client.Client, shard uint64) *shalev1.ShardDescriptor {
	t.Helper()
	var found *shalev1.ShardDescriptor
	until(ctx, t, fmt.Sprintf("shard %d in the directory", shard), func() (bool, string) {
		dir, err := cli.ShardDirectory(ctx)
		for _, d := range dir {
			if d.GetShardId() == shard {
				found = d
				return true, ""
			}
		}
		return false, fmt.Sprintf("directory %v (%v)", dir, err)
	})
	return found
}

// until polls cond every 200 ms until it holds, failing the test with its
// last explanation when ctx ends.
func until(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	for {
		ok, last := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not reached; last: %s", what, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// nodesOf is the nodes holding a replica of d, in any role.
func nodesOf(d *shalev1.ShardDescriptor) []uint64 {
	var ids []uint64
	for _, r := range d.GetReplicas() {
		ids = append(ids, r.GetNodeId())
	}
	return ids
}

// shardDir is where node id keeps shard's engine.
func (c *procCluster) shardDir(id, shard uint64) string {
	args := c.node(id).args
	i := slices.Index(args, "--data-dir")
	if i < 0 || i+1 == len(args) {
		c.t.Fatalf("node %d was started without --data-dir", id)
	}
	return filepath.Join(args[i+1], "shards", strconv.FormatUint(shard, 10))
}

// dirBytes is the size of the files under dir; the test fails if dir holds
// less than strayDataBytes (the stray would then prove nothing).
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := e.Info(); err == nil && !e.IsDir() {
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("size of %s: %v", dir, err)
	}
	if n < strayDataBytes {
		t.Fatalf("%s holds %d bytes, fewer than the %d written", dir, n, strayDataBytes)
	}
	return n
}

// waitStrayGone waits until node id no longer reports shard and its engine
// directory (before bytes) is gone from disk.
func (c *procCluster) waitStrayGone(ctx context.Context, t *testing.T, id, shard uint64, dir string, before int64) {
	t.Helper()
	until(ctx, t, fmt.Sprintf("node %d removing its stray replica of shard %d", id, shard), func() (bool, string) {
		s, err := c.shardOn(ctx, id, shard)
		if err != nil || s != nil {
			return false, fmt.Sprintf("node %d reports %v (%v)", id, s, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return false, fmt.Sprintf("%s still on disk (%v)", dir, err)
		}
		return true, ""
	})
	t.Logf("node %d removed its stray replica of shard %d: %d bytes freed", id, shard, before)
}

// checkNoStrays checks what each node itself reports (NodeInfo, no filter)
// against the shard directory: every replica a node hosts is one the
// directory places on that node.
func (c *procCluster) checkNoStrays(ctx context.Context, t *testing.T, cli *client.Client) {
	t.Helper()
	until(ctx, t, "every reported replica in the directory", func() (bool, string) {
		dir, err := cli.ShardDirectory(ctx)
		if err != nil {
			return false, err.Error()
		}
		placed := map[uint64][]uint64{}
		for _, d := range dir {
			placed[d.GetShardId()] = nodesOf(d)
		}
		for _, p := range c.nodes {
			resp, err := shalev1.NewAdminClient(c.conn(p.addr)).NodeInfo(ctx, &shalev1.NodeInfoRequest{})
			if err != nil {
				return false, fmt.Sprintf("node %d: %v", p.id, err)
			}
			for _, s := range resp.GetShards() {
				id := s.GetDescriptor_().GetShardId()
				if !slices.Contains(placed[id], p.id) {
					return false, fmt.Sprintf("node %d hosts shard %d, which the directory places on %v", p.id, id, placed[id])
				}
			}
		}
		return true, ""
	})
}
