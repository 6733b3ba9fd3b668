package server_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// openRecorder is an errorfs.Injector that fails nothing and records the
// paths the node's engines open, per node.
type openRecorder struct {
	mu     sync.Mutex
	opened map[uint64][]string
}

// node returns the injector of node id.
func (r *openRecorder) node(id uint64) errorfs.Injector {
	return injectorFunc(func(op errorfs.Op, path string) error {
		switch op {
		case errorfs.OpOpen, errorfs.OpOpenAppend, errorfs.OpOpenDir, errorfs.OpList:
			r.mu.Lock()
			r.opened[id] = append(r.opened[id], path)
			r.mu.Unlock()
		}
		return nil
	})
}

func (r *openRecorder) paths(id uint64) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.opened[id])
}

type injectorFunc func(errorfs.Op, string) error

func (f injectorFunc) MaybeError(op errorfs.Op, path string) error { return f(op, path) }

// TestSnapshotKilledMidStream moves a replica onto a node, and cuts its
// snapshot twice while it streams: once by stopping the receiving node, once
// by stopping the sending leader. A killed process would leave its
// half-received directory and its outgoing checkpoint on disk: the test puts
// copies of both there, as found mid-stream, before the nodes restart. The
// move must still complete (the leader, or the next one, sends a new
// snapshot), the restarted nodes must remove what the cut transfers left,
// the receiving node's engines must never open a file of a cut transfer
// (every engine file open goes through the node's vfs, recorded here), and
// the new replica must hold the same data as the others.
func TestSnapshotKilledMidStream(t *testing.T) {
	rec := &openRecorder{opened: map[uint64][]string{}}
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Configure: func(cfg *server.Config) {
		// Slow, steady snapshots: each takes seconds, so they can be cut.
		cfg.SnapshotRateBytes = 1 << 20
		cfg.SnapshotRateAlways = true
		cfg.FS = errorfs.Wrap(vfs.Default, rec.node(cfg.NodeID))
	}})
	a := adminOf(t, c)
	cl := newClient(t, c)
	ctx := context.Background()

	// 4 MiB of random values in the user shard: a snapshot of about 4 s
	// at 1 MiB/s.
	val := make([]byte, 4096)
	for i := range 1024 {
		_, _ = rand.Read(val)
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("key-%05d", i)), val); err != nil {
			t.Fatal(err)
		}
	}
	// Once the placement is balanced: the user shard, a node without a
	// replica of it, and a follower to move away from.
	var shard, from, to uint64
	waitFor(t, 60*time.Second, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil || !st.GetBalanced() {
			return false, fmt.Sprintf("placement %v %v", st, err)
		}
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, d := range dir {
			if d.GetSystem() {
				continue
			}
			shard = d.GetShardId()
			on := map[uint64]bool{}
			for _, rd := range d.GetReplicas() {
				on[rd.GetNodeId()] = true
			}
			leader := c.Leader(shard)
			from, to = 0, 0
			for _, id := range c.NodeIDs() {
				switch {
				case !on[id]:
					to = id
				case id != leader && from == 0:
					from = id
				}
			}
			if len(on) != 3 || leader == 0 || from == 0 || to == 0 {
				return false, fmt.Sprintf("shard %d: %v, leader %d", shard, d.GetReplicas(), leader)
			}
			_, err := a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: shard, FromNodeId: from, ToNodeId: to})
			return err == nil, fmt.Sprintf("move shard %d from node %d to node %d: %v", shard, from, to, err)
		}
		return false, "no user shard"
	})

	staging := func(id uint64, sub string) string {
		return filepath.Join(c.Dir(), fmt.Sprintf("node%d", id), "snapshots", sub)
	}
	// inFlight waits until node to receives a snapshot of shard other than
	// those in seen and has written at least 256 KiB of it, and returns
	// its directory.
	inFlight := func(seen []string) string {
		t.Helper()
		var dir string
		waitFor(t, 60*time.Second, func() (bool, string) {
			matches, _ := filepath.Glob(filepath.Join(staging(to, "in"), fmt.Sprintf("snap-%d-*", shard)))
			for _, m := range matches {
				if !slices.Contains(seen, m) && dirSize(m) >= 256<<10 {
					dir = m
					return true, ""
				}
			}
			return false, fmt.Sprintf("receiving %v", matches)
		})
		return dir
	}
	// leave copies dir as a killed process would leave it, under a name of
	// its own, and returns the copy.
	leave := func(dir, name string) string {
		t.Helper()
		left := filepath.Join(filepath.Dir(dir), name)
		if err := os.CopyFS(left, os.DirFS(dir)); err != nil {
			t.Fatalf("copy %s mid-stream: %v", dir, err)
		}
		return left
	}

	// 1. Cut at the receiver.
	first := inFlight(nil)
	leftIn := leave(first, filepath.Base(first)+"-killed")
	c.Stop(to)
	c.Restart(to)
	if _, err := os.Stat(leftIn); !os.IsNotExist(err) {
		t.Fatalf("the restarted receiver kept %s: %v", leftIn, err)
	}

	// 2. Cut at the sender, on the next attempt.
	second := inFlight([]string{first})
	sender := c.Leader(shard)
	out, _ := filepath.Glob(filepath.Join(staging(sender, "out"), fmt.Sprintf("shard-%d-to-*", shard)))
	if len(out) == 0 {
		t.Fatalf("node %d, the leader, sends no checkpoint of shard %d", sender, shard)
	}
	leftOut := leave(out[0], filepath.Base(out[0])+"-killed")
	c.Stop(sender)
	time.Sleep(time.Second)
	c.Restart(sender)
	if _, err := os.Stat(leftOut); !os.IsNotExist(err) {
		t.Fatalf("the restarted sender kept %s: %v", leftOut, err)
	}

	took := waitFor(t, 2*time.Minute, func() (bool, string) { return movedTo(t, c, shard, from, to) })
	t.Logf("shard %d moved from node %d to node %d %v after the second cut", shard, from, to, took)

	// The receiving node's engines never opened a cut transfer's file.
	for _, p := range rec.paths(to) {
		for _, cut := range []string{first, second, leftIn} {
			if p == cut || strings.HasPrefix(p, cut+string(filepath.Separator)) {
				t.Fatalf("node %d opened %s, of a cut snapshot transfer", to, p)
			}
		}
	}
	// Its replica holds what the others hold.
	waitFor(t, 30*time.Second, func() (bool, string) {
		sums, err := cl.ReplicaChecksums(ctx, shard)
		if err != nil || len(sums) != 3 {
			return false, fmt.Sprintf("%v %v", sums, err)
		}
		nodes := map[uint64]bool{}
		for _, s := range sums {
			nodes[s.GetNodeId()] = true
			if s.GetAppliedIndex() != sums[0].GetAppliedIndex() || s.GetChecksum() != sums[0].GetChecksum() {
				return false, fmt.Sprintf("replicas differ: %v", sums)
			}
		}
		return nodes[to], fmt.Sprintf("checksums from nodes %v", nodes)
	})
	for i := range 1024 {
		if kv, err := cl.Get(ctx, []byte(fmt.Sprintf("key-%05d", i))); err != nil || kv == nil {
			t.Fatalf("key-%05d: %v %v", i, kv, err)
		}
	}
}

// dirSize is the size of the files under dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
