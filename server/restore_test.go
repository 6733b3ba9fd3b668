package server_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/freeport"
	"github.com/shale-db/shale/internal/s3test"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// scanAll reads every user key with its value and revisions.
func scanAll(t *testing.T, cl *client.Client) map[string]client.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string]client.KeyValue{}
	it := cl.Scan(ctx, nil, nil)
	defer it.Close()
	for it.Next() {
		out[string(it.KV().Key)] = *it.KV()
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// userChecksums is every user shard's replica checksum by start key, once
// its replicas agree.
func userChecksums(t *testing.T, cl *client.Client) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shards, err := cl.ListShards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, s := range shards {
		d := s.GetDescriptor_()
		if d.GetSystem() {
			continue
		}
		for {
			sums, err := cl.ReplicaChecksums(ctx, d.GetShardId())
			agree := err == nil && len(sums) == len(d.GetReplicas())
			for _, s := range sums {
				agree = agree && s.GetAppliedIndex() == sums[0].GetAppliedIndex() && s.GetChecksum() == sums[0].GetChecksum()
			}
			if agree {
				out[string(d.GetStartKey())] = sums[0].GetChecksum()
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("shard %d's replicas do not agree: %v, %v", d.GetShardId(), sums, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

// TestRestoreFromBackup: a cluster founded from a backup holds exactly the
// backed-up data (every key, value and revision; every shard's checksum on
// every replica), nothing written after the backup, under a new cluster
// ID, and takes writes; from a directory and from an S3 bucket (on a
// versitygw server the test starts).
func TestRestoreFromBackup(t *testing.T) {
	s3test.EachLocation(t, func(t *testing.T, where, _ string) { testRestoreFromBackup(t, where) })
}

func testRestoreFromBackup(t *testing.T, where string) {
	a := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	acl := newClient(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < 200; i++ {
		for _, p := range []string{"a", "q"} {
			if _, err := acl.Put(ctx, []byte(fmt.Sprintf("%s%04d", p, i)), []byte(strings.Repeat("v", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < 200; i += 7 {
		if _, err := acl.Delete(ctx, []byte(fmt.Sprintf("q%04d", i))); err != nil {
			t.Fatal(err)
		}
	}
	want := scanAll(t, acl)
	sums := userChecksums(t, acl)
	loc, err := backup.Open(ctx, where, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup.Create(ctx, acl, loc, backup.CreateOptions{ID: "b1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := acl.Put(ctx, []byte("after"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	ast, err := acl.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}

	b := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.RestoreFrom, cfg.RestoreBackup = where, "b1"
	}})
	bcl := newClient(t, b)
	got := scanAll(t, bcl)
	if len(got) != len(want) {
		t.Fatalf("restored %d keys, backed up %d", len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok || string(g.Value) != string(w.Value) || g.ModRevision != w.ModRevision || g.CreateRevision != w.CreateRevision || g.Version != w.Version {
			t.Fatalf("key %s restored as %+v (present %v), backed up as %+v", k, g, ok, w)
		}
	}
	bsums := userChecksums(t, bcl)
	if len(bsums) != len(sums) {
		t.Fatalf("restored shards %v, backed up %v", bsums, sums)
	}
	for start, sum := range sums {
		if bsums[start] != sum {
			t.Fatalf("shard at %q: restored checksum %016x, backed up %016x", start, bsums[start], sum)
		}
	}
	bst, err := bcl.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bst.GetClusterId() == ast.GetClusterId() || bst.GetClusterId() == "" {
		t.Fatalf("the restored cluster's ID is %q (the backed-up one's %q)", bst.GetClusterId(), ast.GetClusterId())
	}
	// A watch on the restored cluster sees the next write (the change log
	// the checkpoint brought along does not confuse it). It starts at the
	// write's revision: one with no start revision may start after it
	// (chaos/README bug 31).
	res, err := bcl.Put(ctx, []byte("a0001"), []byte("new"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events := bcl.Watch(wctx, []byte("a"), []byte("b"), client.WithStartRevision(res.Revision))
	if res.Revision <= want["a0001"].ModRevision {
		t.Fatalf("a write after the restore got revision %d, not after the backed-up %d", res.Revision, want["a0001"].ModRevision)
	}
	if kv, err := bcl.Get(ctx, []byte("a0001")); err != nil || string(kv.Value) != "new" {
		t.Fatalf("read after write on the restored cluster: %v, %v", kv, err)
	}
	for seen := false; !seen; {
		select {
		case r, ok := <-events:
			if !ok || r.Err != nil {
				t.Fatalf("watch on the restored cluster ended: %v", r.Err)
			}
			for _, e := range r.Events {
				if string(e.KV.Key) != "a0001" || string(e.KV.Value) != "new" || e.KV.ModRevision != res.Revision {
					t.Fatalf("watch on the restored cluster: event %+v, want a0001=new at %d", e.KV, res.Revision)
				}
				seen = true
			}
		case <-time.After(10 * time.Second):
			t.Fatal("watch on the restored cluster: no event for the write")
		}
	}
	wcancel()

	// The same backup on a single node (the node count need not match).
	one := testcluster.Start(t, testcluster.Options{Nodes: 1, Configure: func(cfg *server.Config) {
		cfg.RestoreFrom, cfg.RestoreBackup = where, "b1"
	}})
	if got := scanAll(t, newClient(t, one)); len(got) != len(want) {
		t.Fatalf("restored %d keys on one node, backed up %d", len(got), len(want))
	}
}

// TestRestoreRefusesCorruptBackup: a node founding from a backup with a
// damaged file stops with an error naming the file, before it serves.
func TestRestoreRefusesCorruptBackup(t *testing.T) {
	a := testcluster.Start(t, testcluster.Options{})
	acl := newClient(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; i < 50; i++ {
		if _, err := acl.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	loc, err := backup.Open(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := backup.Create(ctx, acl, loc, backup.CreateOptions{ID: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	var victim backup.File
	for _, p := range m.Shards {
		for _, f := range p.Files {
			if !p.System && f.Size > victim.Size {
				victim = f
			}
		}
	}
	path := filepath.Join(loc.String(), filepath.FromSlash(victim.Path))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 1
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	err = startRestoring(t, loc, "b1", time.Time{})
	if err == nil {
		t.Fatal("a node founded a cluster from a corrupt backup")
	}
	if !errors.Is(err, backup.ErrCorrupt) || !strings.Contains(err.Error(), victim.Path) {
		t.Fatalf("error %v: want ErrCorrupt naming %s", err, victim.Path)
	}
}

// startRestoring starts a single founding node restoring backup id from
// loc as of asOf, and returns its error (stopping it if it started).
func startRestoring(t *testing.T, loc *backup.Location, id string, asOf time.Time) error {
	t.Helper()
	ports, err := freeport.Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := server.Start(ctx, server.Config{
		DataDir:        filepath.Join(t.TempDir(), "node1"),
		NodeID:         1,
		ListenAddr:     addr,
		InitialCluster: map[uint64]string{1: addr},
		RestoreFrom:    loc.String(),
		RestoreBackup:  id,
		RestoreAsOf:    asOf,
		Logger:         testcluster.Logger(),
	})
	if err == nil {
		n.Stop()
	}
	return err
}

// TestPointInTimeRestore: an incremental backup carries every shard's
// log since the full one; restoring it as of a time between two writes
// holds the first and not the second, on every shard; restoring it whole
// holds both; a time before a checkpoint or after the backup is refused;
// from a directory and from an S3 bucket.
func TestPointInTimeRestore(t *testing.T) {
	s3test.EachLocation(t, func(t *testing.T, where, _ string) { testPointInTimeRestore(t, where) })
}

func testPointInTimeRestore(t *testing.T, where string) {
	a := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	acl := newClient(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	put := func(k, v string) {
		t.Helper()
		if _, err := acl.Put(ctx, []byte(k), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	put("a-old", "1")
	put("z-old", "1")
	loc, err := backup.Open(ctx, where, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup.Create(ctx, acl, loc, backup.CreateOptions{ID: "full"}); err != nil {
		t.Fatal(err)
	}
	beforeFull := time.Now().Add(-time.Hour)
	put("a-before", "1")
	put("z-before", "1")
	if _, err := acl.Delete(ctx, []byte("z-old")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	asOf := time.Now()
	time.Sleep(100 * time.Millisecond)
	put("a-after", "1")
	put("z-after", "1")
	put("a-old", "2")
	m, st, err := backup.Create(ctx, acl, loc, backup.CreateOptions{ID: "inc", Base: "full"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Checkpoints != 0 || st.Logs != 3 || st.LogEntries < 6 {
		t.Fatalf("incremental backup: %+v, want every part extended by its log", st)
	}
	if _, err := backup.Verify(ctx, loc, "inc", nil); err != nil {
		t.Fatal(err)
	}

	b := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.RestoreFrom, cfg.RestoreBackup, cfg.RestoreAsOf = where, "inc", asOf
	}})
	got := scanAll(t, newClient(t, b))
	want := map[string]string{"a-old": "1", "a-before": "1", "z-before": "1"}
	if len(got) != len(want) {
		t.Fatalf("restored as of %s: %d keys %v, want %v", asOf, len(got), keysOf(got), want)
	}
	for k, v := range want {
		if string(got[k].Value) != v {
			t.Fatalf("restored as of %s: %s = %q, want %q (keys %v)", asOf, k, got[k].Value, v, keysOf(got))
		}
	}

	whole := testcluster.Start(t, testcluster.Options{Nodes: 1, Configure: func(cfg *server.Config) {
		cfg.RestoreFrom, cfg.RestoreBackup = where, "inc"
	}})
	got = scanAll(t, newClient(t, whole))
	if len(got) != 5 || string(got["a-old"].Value) != "2" || got["z-after"].Value == nil {
		t.Fatalf("restored whole: %v", keysOf(got))
	}

	if err := startRestoring(t, loc, "inc", beforeFull); err == nil || !strings.Contains(err.Error(), "restore from an earlier backup") {
		t.Fatalf("restore as of a time before the checkpoints: %v", err)
	}
	last := m.Shards[1].Until
	if err := startRestoring(t, loc, "inc", last.Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "only until") {
		t.Fatalf("restore as of a time after the backup: %v", err)
	}
}

func keysOf(m map[string]client.KeyValue) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+string(v.Value))
	}
	return out
}

// TestRestorePrepared: data directories prepared by backup.Prepare (what
// `shalectl restore` does), each for its founding node of a 3-node cluster
// with 2 replicas per shard, as of a time between two writes, hold only
// the parts of the shards their node hosts, and found a cluster holding
// the first write and not the second on every shard, with no restore flag
// given to the server; the nodes hard-link the staged files into place and
// leave them intact (the engines write new files, never into those); the
// staged copy is gone once the cluster is founded, and a node restarts
// from its data as usual. A data directory prepared for another placement
// and one whose preparation did not finish are refused, and the staged
// copy is kept. From a directory and from an S3 bucket.
func TestRestorePrepared(t *testing.T) {
	s3test.EachLocation(t, func(t *testing.T, where, _ string) { testRestorePrepared(t, where) })
}

func testRestorePrepared(t *testing.T, where string) {
	a := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	acl := newClient(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	put := func(k string) {
		t.Helper()
		if _, err := acl.Put(ctx, []byte(k), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	put("a-full")
	put("z-full")
	loc, err := backup.Open(ctx, where, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup.Create(ctx, acl, loc, backup.CreateOptions{ID: "full"}); err != nil {
		t.Fatal(err)
	}
	put("a-before")
	put("z-before")
	time.Sleep(100 * time.Millisecond)
	asOf := time.Now()
	time.Sleep(100 * time.Millisecond)
	put("a-after")
	put("z-after")
	m, _, err := backup.Create(ctx, acl, loc, backup.CreateOptions{ID: "inc", Base: "full"})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex // the nodes start at once
	prepared := map[uint64]backup.Prepared{}
	kept := map[string]string{} // staged files, hard-linked aside: name -> path
	keepDir := t.TempDir()
	b := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.ReplicationFactor = 2
		if _, err := os.Stat(cfg.DataDir); err == nil {
			return // a restart: the node has its data
		}
		var nodes []uint64
		for id := range cfg.InitialCluster {
			nodes = append(nodes, id)
		}
		res, err := backup.Prepare(ctx, loc, "inc", cfg.DataDir, backup.PrepareOptions{AsOf: asOf, NodeID: cfg.NodeID, Nodes: nodes, ReplicationFactor: 2})
		if err != nil {
			t.Errorf("prepare %s: %v", cfg.DataDir, err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		prepared[cfg.NodeID] = res.Prepared
		// Keep the staged files' inodes, to read them once the node has
		// founded on them.
		_ = filepath.WalkDir(filepath.Join(res.Prepared.Location, "files"), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(res.Prepared.Location, p)
				k := filepath.Join(keepDir, fmt.Sprintf("n%d-%s", cfg.NodeID, strings.ReplaceAll(rel, string(filepath.Separator), "-")))
				if err := os.Link(p, k); err != nil {
					t.Errorf("keep %s: %v", p, err)
				}
				kept[filepath.ToSlash(rel)] = k
			}
			return err
		})
	}})
	if t.Failed() {
		t.FailNow()
	}
	bcl := newClient(t, b)
	got := scanAll(t, bcl)
	if keys := keysOf(got); len(keys) != 4 || strings.Join(slices.Sorted(slices.Values(keys)), " ") != "a-before=v a-full=v z-before=v z-full=v" {
		t.Fatalf("restored as of a time between writes: %v", keysOf(got))
	}
	// Each node was given the parts of the shards it hosts, and no other.
	shards, err := bcl.ListShards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byStart := map[string]uint64{} // the backup's user shards by start key
	for _, p := range m.Shards {
		if !p.System {
			byStart[string(p.Start)] = p.ShardID
		}
	}
	want := map[uint64][]uint64{}
	for _, s := range shards {
		d := s.GetDescriptor_()
		if d.GetSystem() {
			continue
		}
		for _, r := range d.GetReplicas() {
			want[r.GetNodeId()] = append(want[r.GetNodeId()], byStart[string(d.GetStartKey())])
		}
	}
	if len(prepared) != 3 {
		t.Fatalf("%d data directories prepared, want 3", len(prepared))
	}
	for id, p := range prepared {
		if slices.Sort(want[id]); fmt.Sprint(p.Parts) != fmt.Sprint(want[id]) || len(p.Parts) == 0 || len(p.Parts) == len(byStart) && id != 2 {
			t.Errorf("node %d was prepared with the parts of the backup's shards %v, and hosts %v", id, p.Parts, want[id])
		}
		if _, err := os.Stat(p.Location); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the staged copy %s is still there after founding: %v", p.Location, err)
		}
	}
	// Write and flush on the restored cluster: the staged files the
	// engines were opened on are as they were staged.
	for i := range 200 {
		put2 := fmt.Sprintf("%c-new-%03d", "az"[i%2], i)
		if _, err := bcl.Put(ctx, []byte(put2), []byte(strings.Repeat("w", 1000))); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range b.NodeIDs() {
		for _, sid := range b.ShardIDs() {
			if s := b.Node(id).Shard(sid); s != nil {
				if _, err := s.Flush(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	var stored []backup.File
	for _, p := range m.Shards {
		stored = append(stored, p.Files...)
		for _, seg := range p.Log {
			stored = append(stored, seg.File)
		}
	}
	if len(kept) == 0 {
		t.Fatal("no staged file kept")
	}
	for _, f := range stored {
		k, ok := kept[f.Path]
		if !ok {
			continue
		}
		data, err := os.ReadFile(k)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(data)) != f.Size || crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)) != f.CRC32C {
			t.Fatalf("staged file %s (%s) changed after the node founded on it: %d bytes", f.Path, f.Name, len(data))
		}
	}
	b.Stop(2)
	b.Restart(2)
	if got := scanAll(t, newClient(t, b)); len(got) != 4+200 || string(got["a-full"].Value) != "v" {
		t.Fatalf("after a restart: %d keys, want 204", len(got))
	}

	// A preparation that did not finish: the server refuses to found a
	// cluster on it rather than found an empty one.
	half := filepath.Join(t.TempDir(), "half")
	if err := os.MkdirAll(filepath.Join(half, backup.PreparedDir, "files"), 0o755); err != nil {
		t.Fatal(err)
	}
	ports, err := freeport.Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	n, err := server.Start(ctx, server.Config{DataDir: half, NodeID: 1, ListenAddr: addr, InitialCluster: map[uint64]string{1: addr}, Logger: testcluster.Logger()})
	if err == nil {
		n.Stop()
		t.Fatal("a node founded a cluster on a half-prepared restore")
	}
	if !strings.Contains(err.Error(), "not fully prepared") {
		t.Fatalf("half-prepared restore: %v", err)
	}

	// Prepared for node 1 of three with 2 replicas (the first user shard
	// only), started as the single founding node (which hosts both):
	// refused, and the staged copy kept.
	other := filepath.Join(t.TempDir(), "other")
	if _, err := backup.Prepare(ctx, loc, "inc", other, backup.PrepareOptions{NodeID: 1, Nodes: []uint64{1, 2, 3}, ReplicationFactor: 2}); err != nil {
		t.Fatal(err)
	}
	n, err = server.Start(ctx, server.Config{DataDir: other, NodeID: 1, ListenAddr: addr, InitialCluster: map[uint64]string{1: addr}, Logger: testcluster.Logger()})
	if err == nil {
		n.Stop()
		t.Fatal("a node founded a cluster on a restore prepared for another placement")
	}
	if !strings.Contains(err.Error(), "was prepared for node 1 of the founding nodes [1 2 3] with 2 replicas per shard") || !strings.Contains(err.Error(), "--node-id 1") {
		t.Fatalf("a restore prepared for another placement: %v", err)
	}
	if _, ok, err := backup.ReadPrepared(other); !ok || err != nil {
		t.Fatalf("the staged copy after a refused start: %v, %v", ok, err)
	}
}

// TestBackupMetrics: the nodes count the backup parts they serve, the
// bytes they send and the time of their last success, by kind (full
// backups send checkpoints, incremental ones logs), and failures.
func TestBackupMetrics(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// sum adds up metric name over the nodes, for the series whose labels
	// include want's.
	sum := func(name string, want map[string]string) float64 {
		var s float64
		for _, id := range c.NodeIDs() {
			mfs, err := c.Node(id).Metrics().Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() != name {
					continue
				}
			series:
				for _, m := range mf.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					for k, v := range want {
						if labels[k] != v {
							continue series
						}
					}
					s += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
		return s
	}
	for i := range 50 {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	start := float64(time.Now().Unix())
	loc, err := backup.Open(ctx, t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "full"}); err != nil {
		t.Fatal(err)
	}
	checkpoint := map[string]string{"kind": "checkpoint"}
	parts := sum("shale_backup_parts_total", map[string]string{"kind": "checkpoint", "result": "ok"})
	if sent := sum("shale_backup_sent_bytes_total", checkpoint); parts < 3 || sent <= 0 { // the system shard and two user shards
		t.Errorf("after a full backup of 3 shards: %v checkpoints, %v bytes", parts, sent)
	}
	if last := sum("shale_backup_last_success_timestamp_seconds", checkpoint); last < start {
		t.Errorf("last success %v, before the backup began (%v)", last, start)
	}
	if _, err := cl.Put(ctx, []byte("k100"), []byte("after")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "incr", Base: "full"}); err != nil {
		t.Fatal(err)
	}
	logs := map[string]string{"kind": "log"}
	if n, sent := sum("shale_backup_parts_total", map[string]string{"kind": "log", "result": "ok"}), sum("shale_backup_sent_bytes_total", logs); n < 1 || sent <= 0 {
		t.Errorf("an incremental backup served %v log parts, %v bytes", n, sent)
	}
	if last := sum("shale_backup_last_success_timestamp_seconds", logs); last < start {
		t.Errorf("last log success %v, before the backup began (%v)", last, start)
	}
	// A part that fails: node 1 has no shard 999.
	failed := map[string]string{"kind": "checkpoint", "result": "error"}
	before := sum("shale_backup_parts_total", failed)
	cc, err := grpc.NewClient(c.Node(1).Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := shalev1.NewAdminClient(cc).BackupShard(ctx, &shalev1.BackupShardRequest{ShardId: 999})
	if err == nil {
		_, err = st.Recv()
	}
	if err == nil {
		t.Fatal("a backup of shard 999 did not fail")
	}
	if got := sum("shale_backup_parts_total", failed) - before; got != 1 {
		t.Errorf("%v failed parts counted, want 1", got)
	}
}
