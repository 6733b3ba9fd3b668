package backup_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// cutCluster is a client whose backup streams call onChunk with every
// chunk they receive (before the backup sees it): the test cuts a backup
// there, mid-file.
type cutCluster struct {
	*client.Client
	onChunk func(node, shard uint64, c *shalev1.SnapshotChunk) error
}

func (c *cutCluster) BackupShard(ctx context.Context, nodeID, shardID uint64, skip []*shalev1.SnapshotFile) (shalev1.Admin_BackupShardClient, error) {
	s, err := c.Client.BackupShard(ctx, nodeID, shardID, skip)
	if err != nil {
		return nil, err
	}
	return &cutStream{Admin_BackupShardClient: s, node: nodeID, shard: shardID, on: c.onChunk}, nil
}

type cutStream struct {
	shalev1.Admin_BackupShardClient
	node, shard uint64
	on          func(node, shard uint64, c *shalev1.SnapshotChunk) error
}

func (s *cutStream) Recv() (*shalev1.SnapshotChunk, error) {
	c, err := s.Admin_BackupShardClient.Recv()
	if err == nil && c.GetHeader() == nil && s.on != nil {
		if herr := s.on(s.node, s.shard, c); herr != nil {
			return nil, herr
		}
	}
	return c, err
}

// putBig writes n values of size bytes under prefix on both sides of the
// split at "m", so that each user shard's checkpoint holds files of
// several chunks.
func putBig(t *testing.T, cl *client.Client, n, size int, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; i < n; i++ {
		for _, first := range []string{"a", "z"} {
			k := fmt.Sprintf("%s-%s-%05d", first, prefix, i)
			v := []byte(strings.Repeat(fmt.Sprintf("%s.%d;", k, i*7919), size/len(k)))
			if _, err := cl.Put(ctx, []byte(k), v); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkStoredFiles reads every file the location holds under its final
// name and checks it against the size and checksum its name records: a
// file cut short by a kill must never be found there. It returns the
// temporary files it saw (what killed writers left).
func checkStoredFiles(t *testing.T, dir string) (temps []string) {
	t.Helper()
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	err := filepath.WalkDir(filepath.Join(dir, "files"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasPrefix(d.Name(), ".tmp-") {
			temps = append(temps, p)
			return nil
		}
		// <name>.<size>.<crc32c, 8 hex digits>
		var size int64
		var crc uint32
		base := d.Name()
		dot := strings.LastIndexByte(base[:len(base)-9], '.')
		if _, err := fmt.Sscanf(base[dot+1:], "%d.%08x", &size, &crc); err != nil {
			return fmt.Errorf("stored file %s: %v", p, err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if int64(len(b)) != size || crc32.Checksum(b, castagnoli) != crc {
			return fmt.Errorf("stored file %s holds %d bytes with CRC %08x: half-written", p, len(b), crc32.Checksum(b, castagnoli))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return temps
}

// TestBackupKilledMidFile kills a backup's receiver (the process writing
// the location) and its sender (the node streaming a shard's checkpoint)
// in the middle of a file, and shows that a retry completes and that
// nothing half-written is ever taken for stored or restored.
//
// The receiver's kill cancels the backup after the file's first chunk is
// written and leaves, as a killed process would, copies of its temporary
// files and of the location's lock. The killed backup is incomplete: it
// cannot be verified or staged for a restore. A retry is refused while the
// lock names a running process or one on another host (its message names
// the lock); once the lock names a process of this host that is gone, the
// next writer takes it over and removes the temporary files, and the retry
// under the same ID completes. The sender's kill stops the node streaming a
// file mid-way: the backup copies that shard from another replica, and the
// backup verifies and can be staged for a restore.
//
// The parts go through the backup client here (ThroughClient), whose
// streams the test cuts; TestNodeWriteKilled kills the nodes that write
// their own parts.
func TestBackupKilledMidFile(t *testing.T) {
	c, cl := startCluster(t)
	putBig(t, cl, 150, 24<<10, "one") // ~3.6 MB per user shard
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	loc, err := backup.Open(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}

	// The receiver, killed mid-file.
	kctx, kill := context.WithCancel(ctx)
	var once sync.Once
	var leftTemps int
	var lock []byte
	cut := &cutCluster{Client: cl, onChunk: func(_, _ uint64, ch *shalev1.SnapshotChunk) error {
		if ch.GetOffset() == 0 {
			return nil
		}
		once.Do(func() {
			// A file's first chunk is in its temporary file: keep
			// copies of what a kill would leave, then die.
			_ = filepath.WalkDir(filepath.Join(dir, "files"), func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), ".tmp-") {
					if b, rerr := os.ReadFile(p); rerr == nil && len(b) > 0 {
						if os.WriteFile(filepath.Join(filepath.Dir(p), ".tmp-killed-"+fmt.Sprint(leftTemps)), b, 0o644) == nil {
							leftTemps++
						}
					}
				}
				return nil
			})
			lock, _ = os.ReadFile(filepath.Join(dir, "lock"))
			kill()
		})
		return nil
	}}
	if _, _, err := backup.Create(kctx, cut, loc, backup.CreateOptions{ID: "b1", ThroughClient: true}); err == nil {
		t.Fatal("a backup killed mid-file completed")
	}
	if leftTemps == 0 || len(lock) == 0 {
		t.Fatalf("the kill came at no half-written file (%d temporary files, lock %q)", leftTemps, lock)
	}
	if err := os.WriteFile(filepath.Join(dir, "lock"), lock, 0o644); err != nil {
		t.Fatal(err)
	}
	if temps := checkStoredFiles(t, dir); len(temps) != leftTemps {
		t.Fatalf("temporary files after the kill: %v, want the %d left", temps, leftTemps)
	}
	list, err := loc.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "b1" || list[0].State != backup.Incomplete {
		t.Fatalf("after the kill: %+v, %v (want b1 incomplete)", list, err)
	}
	if _, err := backup.Verify(ctx, loc, "b1", nil); err == nil {
		t.Fatal("the killed backup verified")
	}
	if _, err := backup.Prepare(ctx, loc, "b1", t.TempDir(), backup.PrepareOptions{NodeID: 1, Nodes: []uint64{1}}); err == nil {
		t.Fatal("the killed backup was staged for a restore")
	}
	// The retry: refused while the lock names a process that runs (this
	// one) or one on another host, whose death it cannot tell.
	if _, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "b2"}); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "lock")) {
		t.Fatalf("a backup while the killed one's lock is held: %v", err)
	}
	dead := deadPID(t)
	host, _ := os.Hostname()
	elsewhere := []byte(fmt.Sprintf(`{"op":"create b1","pid":%d,"host":"elsewhere-%s","since":"2026-01-01T00:00:00Z"}`, dead, host))
	if err := os.WriteFile(filepath.Join(dir, "lock"), elsewhere, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loc.Delete(ctx, "b1"); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "lock")) {
		t.Fatalf("a delete while another host's process holds the lock: %v", err)
	}
	if temps := checkStoredFiles(t, dir); len(temps) != leftTemps {
		t.Fatalf("temporary files while the lock is held: %v, want the %d left", temps, leftTemps)
	}
	// A lock whose process died on this host is taken over, and what the
	// dead process left is removed.
	died := []byte(fmt.Sprintf(`{"op":"create b1","pid":%d,"host":%q,"since":"2026-01-01T00:00:00Z"}`, dead, host))
	if err := os.WriteFile(filepath.Join(dir, "lock"), died, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loc.Delete(ctx, "b1"); err != nil {
		t.Fatalf("delete the killed backup, its process dead: %v", err)
	}
	// (The delete removed every stored file, and the directories it left
	// empty: look through the whole location.)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".tmp-") {
			t.Errorf("temporary file left after the next writer took the lock: %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "lock")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the lock after the delete: %v", err)
	}
	m, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "b1"})
	if err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if _, err := backup.Verify(ctx, loc, m.ID, nil); err != nil {
		t.Fatal(err)
	}
	checkStoredFiles(t, dir)

	// The sender, stopped mid-file: the shard comes from another replica.
	put(t, cl, 50, "two")
	var stopped, cutShard uint64
	var stopOnce sync.Once
	cut = &cutCluster{Client: cl, onChunk: func(node, shard uint64, ch *shalev1.SnapshotChunk) error {
		if ch.GetOffset() == 0 {
			return nil
		}
		stopOnce.Do(func() {
			stopped, cutShard = node, shard
			c.Stop(node)
		})
		if node == stopped {
			// What the stream delivers after its sender died is not
			// used: a killed node sends nothing more.
			return errors.New("the sending node was killed")
		}
		return nil
	}}
	m, _, err = backup.Create(ctx, cut, loc, backup.CreateOptions{ID: "b2", Parallel: 1, ThroughClient: true})
	if err != nil {
		t.Fatalf("a backup whose sender was killed mid-file: %v", err)
	}
	if stopped == 0 {
		t.Fatal("no sender was killed")
	}
	for _, p := range m.Shards {
		if p.ShardID == cutShard && p.NodeID == stopped {
			t.Fatalf("shard %d's part is from node %d, stopped while it sent it", p.ShardID, stopped)
		}
	}
	if _, err := backup.Verify(ctx, loc, m.ID, nil); err != nil {
		t.Fatal(err)
	}
	checkStoredFiles(t, dir)
	staged := filepath.Join(t.TempDir(), "data")
	if _, err := backup.Prepare(ctx, loc, m.ID, staged, backup.PrepareOptions{NodeID: 1, Nodes: []uint64{1}}); err != nil {
		t.Fatalf("stage the retried backup for a restore: %v", err)
	}
}

// deadPID returns the PID of a process of this host that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}
