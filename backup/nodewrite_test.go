package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// writeCluster is a client whose Admin.BackupShardTo calls go through
// call (which calls the real RPC, or not).
type writeCluster struct {
	*client.Client
	call func(ctx context.Context, node uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error)
}

func (c *writeCluster) BackupShardTo(ctx context.Context, node uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error) {
	return c.call(ctx, node, req)
}

// TestNodeWriteFallsBack: a node that does not implement BackupShardTo
// (Unimplemented), or that reaches another location under the location's
// name (FailedPrecondition from the node's check of the backup's start
// marker), has its parts streamed through Create, and the backup is whole;
// ThroughClient never asks the nodes to write.
func TestNodeWriteFallsBack(t *testing.T) {
	_, cl := startCluster(t)
	put(t, cl, 50, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other := t.TempDir() // what node 1 takes for the location
	var calls atomic.Int32
	cases := []struct {
		name string
		opts backup.CreateOptions
		call func(ctx context.Context, node uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error)
		// nodeWritten says whether some parts may be written by nodes.
		nodeWritten bool
	}{
		{"unimplemented", backup.CreateOptions{}, func(context.Context, uint64, *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error) {
			calls.Add(1)
			return nil, status.Error(codes.Unimplemented, "unknown method BackupShardTo for service shale.v1.Admin")
		}, false},
		{"other location on node 1", backup.CreateOptions{}, func(ctx context.Context, node uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error) {
			calls.Add(1)
			if node == 1 {
				req.Location = other
			}
			return cl.BackupShardTo(ctx, node, req)
		}, true},
		{"through the client", backup.CreateOptions{ThroughClient: true}, func(context.Context, uint64, *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error) {
			t.Error("BackupShardTo called with ThroughClient")
			return nil, errors.New("not to be called")
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls.Store(0)
			loc, err := backup.Open(ctx, t.TempDir(), false)
			if err != nil {
				t.Fatal(err)
			}
			tc.opts.ID = "b"
			m, st, err := backup.Create(ctx, &writeCluster{Client: cl, call: tc.call}, loc, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if st.Checkpoints != len(m.Shards) || (!tc.nodeWritten && st.NodeWritten != 0) || (tc.nodeWritten && st.NodeWritten == 0) {
				t.Fatalf("stats %+v for %d parts", st, len(m.Shards))
			}
			if tc.name == "unimplemented" && int(calls.Load()) > 3 {
				t.Fatalf("%d calls to nodes that said Unimplemented: each node is asked once", calls.Load())
			}
			for _, p := range m.Shards {
				if tc.nodeWritten && p.NodeID == 1 && st.NodeWritten == len(m.Shards) {
					t.Fatalf("node 1 wrote shard %d's part into another location", p.ShardID)
				}
			}
			if _, err := backup.Verify(ctx, loc, "b", nil); err != nil {
				t.Fatal(err)
			}
		})
	}
	if ents, err := os.ReadDir(other); err != nil || len(ents) != 0 {
		t.Fatalf("node 1 wrote into the other location: %v, %v", ents, err)
	}
}

// TestNodeWriteKilled kills a backup while nodes write their parts into
// the location: first the backup's client (its context ends while a node
// writes a file: the backup stays incomplete, no manifest, and nothing
// half-written is under a stored name), then, in the retry, the node
// writing a part, whose shard then comes from another replica.
func TestNodeWriteKilled(t *testing.T) {
	// Nodes write their parts at 16 MiB/s, so that every file takes long
	// enough for the watch below to see it being written.
	c, cl := startClusterWith(t, func(cfg *server.Config) {
		cfg.SnapshotRateBytes, cfg.SnapshotRateAlways = 16<<20, true
	})
	putBig(t, cl, 150, 24<<10, "one") // ~3.6 MB per user shard
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	loc, err := backup.Open(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	// whileWriting calls fn once a node is writing a file of the location
	// (its temporary file is there), in a goroutine; stop ends the watch.
	whileWriting := func(fn func()) (stop func()) {
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					if strings.HasPrefix(e.Name(), ".tmp-") {
						fn()
						return
					}
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
		return func() { close(done); wg.Wait() }
	}

	// The client dies (its context ends) mid-file.
	kctx, kill := context.WithCancel(ctx)
	var killed atomic.Bool
	stop := whileWriting(func() { killed.Store(true); kill() })
	_, _, err = backup.Create(kctx, cl, loc, backup.CreateOptions{ID: "b1", Parallel: 1})
	stop()
	if !killed.Load() {
		t.Fatal("every part was written before the watch saw a file being written")
	}
	if err == nil {
		t.Fatal("a backup killed mid-file completed")
	}
	list, err := loc.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "b1" || list[0].State != backup.Incomplete {
		t.Fatalf("after the kill: %+v, %v (want b1 incomplete)", list, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "backups", "b1", "manifest.json")); !os.IsNotExist(err) {
		t.Fatalf("the killed backup's manifest: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o755); err != nil { // (when the kill came before any file was stored)
		t.Fatal(err)
	}
	checkStoredFiles(t, dir)
	if _, err := loc.Delete(ctx, "b1"); err != nil {
		t.Fatal(err)
	}

	// A node dies while it writes a part: the part comes from another
	// replica, and the backup completes.
	var stopped, inFlight atomic.Uint64 // the node stopped; the node of the call in flight
	var mu sync.Mutex
	failed := map[uint64]uint64{} // shard -> node whose write failed
	stop = whileWriting(func() {
		// The node writing: the one with a call in flight (Parallel 1).
		stopped.Store(inFlight.Load())
		c.Stop(stopped.Load())
	})
	wc := &writeCluster{Client: cl, call: func(ctx context.Context, node uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error) {
		inFlight.Store(node)
		resp, err := cl.BackupShardTo(ctx, node, req)
		if err != nil {
			mu.Lock()
			failed[req.GetShardId()] = node
			mu.Unlock()
		}
		return resp, err
	}}
	m, st, err := backup.Create(ctx, wc, loc, backup.CreateOptions{ID: "b2", Parallel: 1})
	stop()
	if err != nil {
		t.Fatalf("a backup whose writing node was killed: %v", err)
	}
	if stopped.Load() == 0 {
		t.Fatal("every part was written before the watch saw a file being written")
	}
	if st.NodeWritten == 0 {
		t.Fatalf("no part written by a node: %+v", st)
	}
	for _, p := range m.Shards {
		if n, ok := failed[p.ShardID]; ok && p.NodeID == n {
			t.Fatalf("shard %d's part is from node %d, whose write failed", p.ShardID, n)
		}
	}
	t.Logf("node %d stopped; failed writes (shard: node) %v; stats %+v", stopped.Load(), failed, st)
	if _, err := backup.Verify(ctx, loc, m.ID, nil); err != nil {
		t.Fatal(err)
	}
	checkStoredFiles(t, dir)
	if _, err := backup.Prepare(ctx, loc, m.ID, filepath.Join(t.TempDir(), "data"), backup.PrepareOptions{NodeID: 1, Nodes: []uint64{1}}); err != nil {
		t.Fatalf("stage the retried backup for a restore: %v", err)
	}
}

// TestNodeWriteError: a node that cannot write a file into the location
// fails the backup with an error that says which node, shard and file, and
// why; no manifest is written.
func TestNodeWriteError(t *testing.T) {
	_, cl := startCluster(t)
	put(t, cl, 50, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	loc, err := backup.Open(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	// Every shard's directory of stored files is a regular file: no node
	// can create a file in it.
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o755); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 10; id++ {
		if err := os.WriteFile(filepath.Join(dir, "files", fmt.Sprintf("shard-%d", id)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var calls atomic.Int32
	wc := &writeCluster{Client: cl, call: func(ctx context.Context, node uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error) {
		calls.Add(1)
		return cl.BackupShardTo(ctx, node, req)
	}}
	_, _, err = backup.Create(ctx, wc, loc, backup.CreateOptions{ID: "b"})
	if err == nil {
		t.Fatal("a backup whose nodes cannot write completed")
	}
	msg := err.Error()
	t.Logf("the error: %v", err)
	for _, want := range []string{"incomplete, no manifest written", "node ", "shard ", "not a directory"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("the error does not say %q: %v", want, err)
		}
	}
	if calls.Load() == 0 {
		t.Fatal("no node was asked to write")
	}
	list, err := loc.List(ctx)
	if err != nil || len(list) != 1 || list[0].State != backup.Incomplete {
		t.Fatalf("after the failed backup: %+v, %v (want b incomplete)", list, err)
	}
}
