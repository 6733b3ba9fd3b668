package backup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/s3test"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

func startCluster(t *testing.T) (*testcluster.Cluster, *client.Client) {
	t.Helper()
	return startClusterWith(t, nil)
}

// startClusterWith is startCluster with every node's configuration
// adjusted by configure (when not nil).
func startClusterWith(t *testing.T, configure func(*server.Config)) (*testcluster.Cluster, *client.Client) {
	t.Helper()
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}, Configure: configure})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.New(ctx, c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return c, cl
}

func put(t *testing.T, cl *client.Client, n int, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; i < n; i++ {
		for _, first := range []string{"a", "z"} {
			k := fmt.Sprintf("%s-%s-%05d", first, prefix, i)
			if _, err := cl.Put(ctx, []byte(k), []byte(strings.Repeat(k, 20))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestCreateVerifyDelete: a backup covers the key space with one part per
// shard (the system shard too), every file verifies, a second backup
// stores only what changed, a corrupt or missing file is found by Verify,
// and deleting a backup removes only the files no other backup uses; in a
// directory and in an S3 bucket.
func TestCreateVerifyDelete(t *testing.T) {
	s3test.EachLocation(t, testCreateVerifyDelete)
}

// testCreateVerifyDelete runs on the location where, whose objects are
// files in raw.
func testCreateVerifyDelete(t *testing.T, where, raw string) {
	_, cl := startCluster(t)
	put(t, cl, 200, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	loc, err := backup.Open(ctx, where, true)
	if err != nil {
		t.Fatal(err)
	}
	var progress []backup.Progress
	m1, st1, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "first", Progress: func(p backup.Progress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(m1.Shards) != 3 || !m1.Shards[0].System {
		t.Fatalf("parts %+v, want the system shard and two user shards", m1.Shards)
	}
	if string(m1.Shards[1].Start) != "" || string(m1.Shards[1].End) != "m" || string(m1.Shards[2].Start) != "m" || len(m1.Shards[2].End) != 0 {
		t.Fatalf("user parts [%q,%q) [%q,%q), want [\"\",m) [m,\"\")", m1.Shards[1].Start, m1.Shards[1].End, m1.Shards[2].Start, m1.Shards[2].End)
	}
	for _, p := range m1.Shards {
		// (The system shard's entries are dated by a logical clock only.)
		if p.AppliedIndex == 0 || (!p.System && p.Date.WallNanos == 0) || len(p.Files) == 0 || p.NodeID == 0 {
			t.Fatalf("part %+v lacks its position, date, node or files", p)
		}
	}
	if st1.FilesCopied == 0 || st1.FilesSkipped != 0 || len(progress) != 3 || progress[2].ShardsDone != 3 || st1.NodeWritten != 3 {
		t.Fatalf("first backup: stats %+v, progress %+v", st1, progress)
	}
	rep, err := backup.Verify(ctx, loc, "first", nil)
	if err != nil || rep.Files != st1.FilesCopied || rep.Bytes != st1.BytesCopied {
		t.Fatalf("verify: %+v, %v (copied %+v)", rep, err, st1)
	}

	// Only the shard [m, "") changes: the other two parts' files are
	// already stored.
	ctx2, cancel2 := context.WithTimeout(ctx, time.Minute)
	for i := 0; i < 100; i++ {
		if _, err := cl.Put(ctx2, []byte(fmt.Sprintf("z-two-%05d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	cancel2()
	m2, st2, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "second"})
	if err != nil {
		t.Fatal(err)
	}
	// Shared files are skipped. (Not "fewer bytes than the first": the
	// engines compact on their own schedule, and in a loaded CI run the
	// second backup copied 6 files, 77 KB, against the first's 60 KB.)
	if st2.FilesSkipped == 0 || st2.BytesSkipped == 0 || st2.NodeWritten != st2.Checkpoints {
		t.Fatalf("second backup copied %+v: nothing was shared with the first (%+v)", st2, st1)
	}
	t.Logf("first backup: %+v; second: %+v", st1, st2)
	if _, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "second"}); err == nil || !strings.Contains(err.Error(), "already holds a backup second") {
		t.Fatalf("a second backup with one ID: %v", err)
	}
	list, err := loc.List(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "first" || list[1].ID != "second" || list[1].State != backup.Complete {
		t.Fatalf("list: %+v, %v", list, err)
	}

	// Corrupt the biggest file of the second backup; remove another.
	var big, other backup.File
	for _, p := range m2.Shards {
		for _, f := range p.Files {
			if f.Size > big.Size {
				big = f
			}
		}
	}
	for _, p := range m2.Shards {
		for _, f := range p.Files {
			if f.Path != big.Path && f.Size > 0 {
				other = f
			}
		}
	}
	path := filepath.Join(raw, filepath.FromSlash(big.Path))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	saved, err := os.ReadFile(filepath.Join(raw, filepath.FromSlash(other.Path)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(raw, filepath.FromSlash(other.Path))); err != nil {
		t.Fatal(err)
	}
	rep, err = backup.Verify(ctx, loc, "second", nil)
	if !errors.Is(err, backup.ErrCorrupt) || len(rep.Problems) != 2 {
		t.Fatalf("verify of a corrupt backup: %v, problems %q", err, rep.Problems)
	}
	if !strings.Contains(strings.Join(rep.Problems, "\n"), big.Path+"): checksum") || !strings.Contains(strings.Join(rep.Problems, "\n"), other.Path+"): missing") {
		t.Fatalf("problems %q do not name %s (checksum) and %s (missing)", rep.Problems, big.Path, other.Path)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(raw, filepath.FromSlash(other.Path)), saved, 0o644); err != nil {
		t.Fatal(err)
	}

	// Delete the first: the files only it used go, the second still
	// verifies.
	res, err := loc.Delete(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	if res.FilesRemoved == 0 {
		t.Fatalf("deleting the first backup removed no file (%+v)", res)
	}
	if _, err := backup.Verify(ctx, loc, "second", nil); err != nil {
		t.Fatalf("the second backup after deleting the first: %v", err)
	}
	if _, err := loc.Describe(ctx, "first"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("describe a deleted backup: %v", err)
	}
	res, err = loc.Delete(ctx, "second")
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	_ = filepath.WalkDir(filepath.Join(raw, "files"), func(_ string, d fs.DirEntry, _ error) error {
		if d != nil && !d.IsDir() {
			left++
		}
		return nil
	})
	if left != 0 {
		t.Fatalf("%d files left after deleting every backup (%+v)", left, res)
	}
}

// TestIncompleteAndLocked: a backup directory without a manifest is
// listed as incomplete and cannot be described or verified; a location
// another process holds is refused with where its lock is.
func TestIncompleteAndLocked(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	loc, err := backup.Open(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "backups", "half"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "backups", "half", "started.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	list, err := loc.List(ctx)
	if err != nil || len(list) != 1 || list[0].State != backup.Incomplete {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if _, err := backup.Verify(context.Background(), loc, "half", nil); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("verify of an incomplete backup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "backups", "half", "manifest.json"), []byte(`{"body":{"format":1,"id":"half"},"crc32c":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loc.Describe(ctx, "half"); !errors.Is(err, backup.ErrCorrupt) {
		t.Fatalf("describe of a corrupt manifest: %v", err)
	}
	if _, err := loc.Delete(ctx, "half"); err != nil {
		t.Fatalf("delete of a corrupt backup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lock"), []byte(`{"op":"create x","pid":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "backups", "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "backups", "other", "started.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loc.Delete(ctx, "other"); err == nil || !strings.Contains(err.Error(), "locked by \"create x\"") || !strings.Contains(err.Error(), filepath.Join(dir, "lock")) {
		t.Fatalf("delete in a locked location: %v", err)
	}
	if _, err := backup.Open(ctx, filepath.Join(dir, "nope"), false); err == nil {
		t.Fatal("opened a location that does not exist")
	}
}

// TestCreateWithANodeDown: with one node stopped, every shard's part comes
// from a replica that answers.
func TestCreateWithANodeDown(t *testing.T) {
	c, cl := startCluster(t)
	put(t, cl, 50, "one")
	c.Stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	loc, err := backup.Open(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Shards {
		if p.NodeID == 2 {
			t.Fatalf("shard %d copied from the stopped node", p.ShardID)
		}
	}
	if _, err := backup.Verify(ctx, loc, m.ID, nil); err != nil {
		t.Fatal(err)
	}
}

// TestIncrementalAfterSplit: an incremental backup extends the parts whose
// range is unchanged with their logs and copies new checkpoints of the
// shards a split changed; the result still covers the key space once.
func TestIncrementalAfterSplit(t *testing.T) {
	_, cl := startCluster(t)
	put(t, cl, 50, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	loc, err := backup.Open(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "full"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cl.SplitShard(ctx, []byte("q")); err != nil {
		t.Fatal(err)
	}
	put(t, cl, 20, "two")
	m, st, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "inc", Base: "full"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Logs != 2 || st.Checkpoints != 2 {
		t.Fatalf("incremental after a split: %+v, want 2 parts extended (system, [\"\", m)) and 2 new checkpoints", st)
	}
	var bounds []string
	for _, p := range m.Shards[1:] {
		bounds = append(bounds, fmt.Sprintf("[%s,%s)", p.Start, p.End))
	}
	if strings.Join(bounds, " ") != "[,m) [m,q) [q,)" {
		t.Fatalf("parts %v", bounds)
	}
	if len(m.Shards[1].Log) != 1 || m.Shards[1].Log[0].FromIndex != m.Shards[1].AppliedIndex+1 {
		t.Fatalf("the unchanged shard's part: %+v", m.Shards[1])
	}
	if _, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "bad", Base: "nope"}); err == nil || !strings.Contains(err.Error(), "no backup nope") {
		t.Fatalf("an incremental on a missing base: %v", err)
	}
	if list, err := loc.List(ctx); err != nil || len(list) != 2 {
		t.Fatalf("after a refused incremental: %+v, %v (want the two backups only)", list, err)
	}
}

// TestCreateWhileANodeStops: a node stopped in the middle of a backup (after
// its first part) does not fail it: the remaining parts come from replicas
// that answer, and the backup verifies.
func TestCreateWhileANodeStops(t *testing.T) {
	c, cl := startCluster(t)
	put(t, cl, 50, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	loc, err := backup.Open(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	m, _, err := backup.Create(ctx, cl, loc, backup.CreateOptions{ID: "b", Progress: func(p backup.Progress) {
		if !stopped { // once the first part is in
			stopped = true
			c.Stop(1)
		}
	}})
	if err != nil {
		t.Fatalf("a backup with a node stopped half-way: %v", err)
	}
	if len(m.Shards) != 3 {
		t.Fatalf("%d parts", len(m.Shards))
	}
	if _, err := backup.Verify(ctx, loc, "b", nil); err != nil {
		t.Fatal(err)
	}
}

// TestCopyAndPrepare: Copy moves a backup between locations (a directory
// to an S3 bucket) and it verifies there; a damaged file fails the copy
// with ErrCorrupt and leaves no complete backup; Prepare stages a backup
// in an empty data directory only, refuses a point in time the backup
// does not hold, and ReadPrepared reads back what it staged.
func TestCopyAndPrepare(t *testing.T) {
	_, cl := startCluster(t)
	put(t, cl, 50, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srcDir := t.TempDir()
	src, err := backup.Open(ctx, srcDir, false)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := backup.Create(ctx, cl, src, backup.CreateOptions{ID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	srv := s3test.Start(t)
	dst, err := backup.Open(ctx, srv.Bucket(t, "copies", "x"), false)
	if err != nil {
		t.Fatal(err)
	}
	var last backup.VerifyProgress
	if _, err := backup.Copy(ctx, src, "b", dst, func(p backup.VerifyProgress) { last = p }); err != nil {
		t.Fatal(err)
	}
	rep, err := backup.Verify(ctx, dst, "b", nil)
	if err != nil || rep.Files != last.Files || last.FilesDone != last.Files || rep.Bytes != last.BytesDone {
		t.Fatalf("verify the copy: %+v, %v (progress %+v)", rep, err, last)
	}

	// Damage a file of the source: a copy to a new place fails and leaves
	// the backup incomplete there.
	victim := m.Shards[len(m.Shards)-1].Files[0]
	path := filepath.Join(srcDir, filepath.FromSlash(victim.Path))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	dst2, err := backup.Open(ctx, srv.Bucket(t, "copies", "y"), false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Copy(ctx, src, "b", dst2, nil); !errors.Is(err, backup.ErrCorrupt) || !strings.Contains(err.Error(), victim.Path) {
		t.Fatalf("copy of a damaged backup: %v", err)
	}
	if list, err := dst2.List(ctx); err != nil || len(list) != 1 || list[0].State != backup.Incomplete {
		t.Fatalf("after a failed copy: %+v, %v", list, err)
	}
	if _, err := srv.Client(t).StatObject(ctx, "copies", "y/"+victim.Path, minio.StatObjectOptions{}); err == nil {
		t.Fatalf("the damaged file %s was stored", victim.Path)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// Prepare, from the S3 copy, node 3's data directory for a cluster of
	// nodes 1-3 with 2 replicas per shard: node 3 hosts the second user
	// shard (the first is on nodes 1 and 2), and only its part is staged,
	// with the manifest.
	data := filepath.Join(t.TempDir(), "node3")
	opts := backup.PrepareOptions{NodeID: 3, Nodes: []uint64{2, 3, 1}, ReplicationFactor: 2}
	late := opts
	late.AsOf = m.Shards[1].Until.Add(time.Hour)
	if _, err := backup.Prepare(ctx, dst, "b", data, late); err == nil || !strings.Contains(err.Error(), "only until") {
		t.Fatalf("prepare as of a time after the backup: %v", err)
	}
	stranger := opts
	stranger.NodeID = 4
	if _, err := backup.Prepare(ctx, dst, "b", data, stranger); err == nil || !strings.Contains(err.Error(), "node 4 is not one of the founding nodes [1 2 3]") {
		t.Fatalf("prepare for a node not in the cluster: %v", err)
	}
	if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused prepare left %s: %v", data, err)
	}
	res, err := backup.Prepare(ctx, dst, "b", data, opts)
	if err != nil {
		t.Fatal(err)
	}
	hosted := m.PartsHostedBy(3, opts.Nodes, 2)
	if len(m.Shards) != 3 || len(hosted) != 1 || hosted[0].ShardID != m.Shards[2].ShardID {
		t.Fatalf("node 3 of 3 with 2 replicas hosts %v of %d parts, want the last", hosted, len(m.Shards))
	}
	if both := m.PartsHostedBy(2, opts.Nodes, 2); len(both) != 2 {
		t.Fatalf("node 2 of 3 with 2 replicas hosts %d parts, want both user parts", len(both))
	}
	p, ok, err := backup.ReadPrepared(data)
	if err != nil || !ok || p.Backup != "b" || p.From != dst.String() || !p.AsOf.IsZero() ||
		p.NodeID != 3 || fmt.Sprint(p.Nodes) != "[1 2 3]" || p.ReplicationFactor != 2 || fmt.Sprint(p.Parts) != fmt.Sprint([]uint64{hosted[0].ShardID}) {
		t.Fatalf("read the prepared restore: %+v, %v, %v", p, ok, err)
	}
	if !p.Holds(hosted[0]) || p.Holds(&m.Shards[1]) || p.Holds(&m.Shards[0]) {
		t.Fatalf("the prepared restore %+v holds the wrong parts", p)
	}
	want := map[string]bool{}
	for _, f := range append(append([]backup.File(nil), hosted[0].Files...), logFiles(hosted[0])...) {
		want[filepath.Join(p.Location, filepath.FromSlash(f.Path))] = true
	}
	got := map[string]bool{}
	if err := filepath.WalkDir(filepath.Join(p.Location, "files"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			got[path] = true
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || res.Staged.Files != len(want) || res.Reused.Files != 0 || res.Staged.Bytes != int64(hosted[0].Bytes()) {
		t.Fatalf("staged %v (%+v, reused %+v), want the hosted part's files %v", got, res.Staged, res.Reused, want)
	}
	staged, err := backup.Open(ctx, p.Location, false)
	if err != nil {
		t.Fatal(err)
	}
	if sm, err := staged.Describe(ctx, "b"); err != nil || len(sm.Shards) != len(m.Shards) {
		t.Fatalf("the staged manifest: %v, %v", sm, err)
	}
	if _, err := backup.Prepare(ctx, dst, "b", data, opts); err == nil || !strings.Contains(err.Error(), "already holds a prepared restore of backup b") {
		t.Fatalf("prepare in a prepared data directory: %v", err)
	}
	used := t.TempDir()
	if err := os.WriteFile(filepath.Join(used, "NODE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Prepare(ctx, dst, "b", used, opts); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("prepare in a used data directory: %v", err)
	}
}

func logFiles(p *backup.Part) []backup.File {
	var out []backup.File
	for _, s := range p.Log {
		out = append(out, s.File)
	}
	return out
}

// TestPrepareCutShortAndCorrupt: a Prepare cancelled mid-copy (as a kill
// would leave it, with a temporary file and the lock of a dead process)
// leaves only whole, checked files under their final names and no record
// a server would act on; run again, it keeps them and copies the rest. A
// damaged file of the backup fails a Prepare with ErrCorrupt naming it,
// and nothing of it is stored; once the file is sound again, a Prepare
// finishes.
func TestPrepareCutShortAndCorrupt(t *testing.T) {
	_, cl := startCluster(t)
	putBig(t, cl, 60, 24<<10, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srcDir := t.TempDir()
	src, err := backup.Open(ctx, srcDir, false)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := backup.Create(ctx, cl, src, backup.CreateOptions{ID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := []uint64{1, 2, 3}
	var files int
	for _, p := range m.PartsHostedBy(1, nodes, 3) {
		files += len(p.Files) + len(p.Log)
	}
	if files < 3 {
		t.Fatalf("the hosted parts hold %d files; the test needs a few", files)
	}

	// Cut short after the first file.
	data := filepath.Join(t.TempDir(), "node1")
	stage := filepath.Join(data, backup.PreparedDir)
	cctx, cut := context.WithCancel(ctx)
	var lock []byte
	_, err = backup.Prepare(cctx, src, "b", data, backup.PrepareOptions{NodeID: 1, Nodes: nodes, Parallel: 1, Progress: func(p backup.VerifyProgress) {
		if p.FilesDone == 1 {
			lock, _ = os.ReadFile(filepath.Join(stage, "lock"))
			cut()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a prepare cut short: %v", err)
	}
	if _, ok, err := backup.ReadPrepared(data); ok || err == nil || !strings.Contains(err.Error(), "not fully prepared") {
		t.Fatalf("the record of a prepare cut short: %v, %v", ok, err)
	}
	// What a kill leaves besides: the lock of a process that is gone, and
	// a temporary file.
	host, _ := os.Hostname()
	if len(lock) == 0 {
		t.Fatal("no lock while the prepare ran")
	}
	if err := os.WriteFile(filepath.Join(stage, "lock"), []byte(fmt.Sprintf(`{"op":"copy b","pid":%d,"host":%q,"since":"2026-01-01T00:00:00Z"}`, deadPID(t), host)), 0o644); err != nil {
		t.Fatal(err)
	}
	temp := filepath.Join(stage, "files", ".tmp-killed")
	if err := os.WriteFile(temp, []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if temps := checkStoredFiles(t, stage); len(temps) != 1 {
		t.Fatalf("temporary files after the cut: %v", temps)
	}
	res, err := backup.Prepare(ctx, src, "b", data, backup.PrepareOptions{NodeID: 1, Nodes: nodes})
	if err != nil {
		t.Fatalf("the prepare run again: %v", err)
	}
	if res.Reused.Files != 1 || res.Staged.Files != files {
		t.Fatalf("the prepare run again reused %+v of %+v, want the 1 file of the cut one", res.Reused, res.Staged)
	}
	if temps := checkStoredFiles(t, stage); len(temps) != 0 {
		t.Fatalf("temporary files after the prepare finished: %v", temps)
	}
	if _, ok, err := backup.ReadPrepared(data); !ok || err != nil {
		t.Fatalf("the finished prepare's record: %v, %v", ok, err)
	}

	// A damaged file: refused, not stored.
	var victim backup.File
	for _, p := range m.PartsHostedBy(1, nodes, 3) {
		for _, f := range p.Files {
			if f.Size > victim.Size {
				victim = f
			}
		}
	}
	path := filepath.Join(srcDir, filepath.FromSlash(victim.Path))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	data2 := filepath.Join(t.TempDir(), "node1")
	if _, err := backup.Prepare(ctx, src, "b", data2, backup.PrepareOptions{NodeID: 1, Nodes: nodes}); !errors.Is(err, backup.ErrCorrupt) || !strings.Contains(err.Error(), victim.Path) {
		t.Fatalf("prepare from a damaged backup: %v, want ErrCorrupt naming %s", err, victim.Path)
	}
	stage2 := filepath.Join(data2, backup.PreparedDir)
	if _, err := os.Stat(filepath.Join(stage2, filepath.FromSlash(victim.Path))); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the damaged file was stored: %v", err)
	}
	if temps := checkStoredFiles(t, stage2); len(temps) != 0 {
		t.Fatalf("temporary files after a failed prepare: %v", temps)
	}
	if _, ok, _ := backup.ReadPrepared(data2); ok {
		t.Fatal("a failed prepare left a record of a prepared restore")
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Prepare(ctx, src, "b", data2, backup.PrepareOptions{NodeID: 1, Nodes: nodes}); err != nil {
		t.Fatalf("prepare once the file is sound: %v", err)
	}
}

// TestLaggingFollowerNotCopied: a follower cut off from its leader misses
// the writes acknowledged since; asked for the shard's log, it must not
// answer with what it has (a backup would then lack acknowledged writes),
// but catch up first, or fail so that the backup asks another replica.
func TestLaggingFollowerNotCopied(t *testing.T) {
	// The follower gives up catching up after the request timeout.
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}, Configure: func(cfg *server.Config) { cfg.RequestTimeout = 2 * time.Second }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := client.New(ctx, c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	put(t, cl, 10, "one")
	shards, _ := cl.Routing()
	var shardID uint64
	for _, s := range shards {
		if d := s.GetDescriptor_(); !d.GetSystem() && len(d.GetStartKey()) == 0 {
			shardID = d.GetShardId()
		}
	}
	leader := c.Leader(shardID)
	var follower uint64
	for _, id := range c.NodeIDs() {
		if id != leader && c.Node(id).Store().Replica(shardID) != nil {
			follower = id
		}
	}
	if shardID == 0 || leader == 0 || follower == 0 {
		t.Fatalf("shard %d, leader %d, follower %d", shardID, leader, follower)
	}
	after := c.Node(follower).Store().Replica(shardID).Status().Applied
	c.Isolate(follower)
	put(t, cl, 10, "two") // "a-two-*" is in the shard: acknowledged without the follower
	want := c.Node(leader).Store().Replica(shardID).Status().Applied
	if got := c.Node(follower).Store().Replica(shardID).Status().Applied; got >= want {
		t.Fatalf("the isolated follower applied %d, the leader %d: it does not lag", got, want)
	}
	stream, err := cl.BackupShardLog(ctx, follower, shardID, after)
	var last uint64
	for err == nil {
		var e *shalev1.BackupLogEntry
		if e, err = stream.Recv(); err == nil {
			last = e.GetIndex()
		}
	}
	if errors.Is(err, io.EOF) {
		t.Fatalf("the lagging follower sent its log up to entry %d, the leader has applied %d", last, want)
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("the lagging follower's log: %v, want Unavailable", err)
	}
	// Healed, it catches up (a request may still find it behind, under
	// load: Unavailable again) and then sends everything.
	c.Heal()
	for deadline := time.Now().Add(30 * time.Second); ; {
		stream, err = cl.BackupShardLog(ctx, follower, shardID, after)
		for err == nil {
			var e *shalev1.BackupLogEntry
			if e, err = stream.Recv(); err == nil {
				last = e.GetIndex()
			}
		}
		if status.Code(err) == codes.Unavailable && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		break
	}
	if !errors.Is(err, io.EOF) || last < want {
		t.Fatalf("after healing, the follower's log ends at %d (the leader applied %d before): %v", last, want, err)
	}
}

// countingCluster counts the BackupShard streams open at once; each stream's
// first Recv waits a moment, so that copies that can overlap do.
type countingCluster struct {
	*client.Client
	mu        sync.Mutex
	open, max int
}

func (c *countingCluster) BackupShard(ctx context.Context, nodeID, shardID uint64, skip []*shalev1.SnapshotFile) (shalev1.Admin_BackupShardClient, error) {
	s, err := c.Client.BackupShard(ctx, nodeID, shardID, skip)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.open++
	c.max = max(c.max, c.open)
	c.mu.Unlock()
	return &countedStream{Admin_BackupShardClient: s, c: c}, nil
}

type countedStream struct {
	shalev1.Admin_BackupShardClient
	c            *countingCluster
	first, ended bool
}

func (s *countedStream) Recv() (*shalev1.SnapshotChunk, error) {
	if !s.first {
		s.first = true
		time.Sleep(200 * time.Millisecond)
	}
	ch, err := s.Admin_BackupShardClient.Recv()
	if err != nil && !s.ended {
		s.ended = true
		s.c.mu.Lock()
		s.c.open--
		s.c.mu.Unlock()
	}
	return ch, err
}

// TestCreateCopiesShardsInParallel: Create copies up to Parallel shards'
// parts at once (each from its own stream), one at a time with Parallel 1,
// and the backups are the same.
func TestCreateCopiesShardsInParallel(t *testing.T) {
	_, cl := startCluster(t)
	put(t, cl, 50, "one")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var sums []string
	for _, parallel := range []int{1, 4} {
		loc, err := backup.Open(ctx, t.TempDir(), false)
		if err != nil {
			t.Fatal(err)
		}
		cc := &countingCluster{Client: cl}
		m, st, err := backup.Create(ctx, cc, loc, backup.CreateOptions{ID: "b", Parallel: parallel, ThroughClient: true})
		if err != nil {
			t.Fatal(err)
		}
		want := min(parallel, len(m.Shards))
		if cc.max != want || cc.open != 0 {
			t.Fatalf("Parallel %d: %d streams at most (want %d), %d left open", parallel, cc.max, want, cc.open)
		}
		if st.Checkpoints != len(m.Shards) || st.FilesCopied == 0 {
			t.Fatalf("Parallel %d: stats %+v for %d parts", parallel, st, len(m.Shards))
		}
		if _, err := backup.Verify(ctx, loc, "b", nil); err != nil {
			t.Fatal(err)
		}
		var sum strings.Builder
		for _, p := range m.Shards {
			fmt.Fprintf(&sum, "%d:%q-%q;", p.ShardID, p.Start, p.End)
		}
		sums = append(sums, sum.String())
	}
	if sums[0] != sums[1] {
		t.Fatalf("the parts differ:\n%s\n%s", sums[0], sums[1])
	}
}
