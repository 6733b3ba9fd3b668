package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/sstable"
)

// The test database (see buildDB): 200 keys set in one batch framed by two
// LogData records (seqs 1..200), a range deletion [key010, key020) (seq
// 201) and a deletion of key030 (seq 202), all flushed to an SST; then
// wal-only=w (seq 203), which stays in the WAL.
const (
	numKeys     = 200
	liveKeys    = numKeys - 10 - 1 + 1 // minus the range and the deletion, plus wal-only
	logDataHead = "txn-begin"
	logDataTail = "txn-end"
)

func key(i int) string { return fmt.Sprintf("key%03d", i) }

func value(i int) string { return fmt.Sprintf("value-%03d-", i) + strings.Repeat("x", 80) }

func quietOptions() *storage.Options {
	// The test databases keep their flushed WAL, as a shard engine does,
	// for updates-since.
	return &storage.Options{Logger: slog.New(slog.DiscardHandler), WALArchiveMaxBytes: 64 << 20}
}

// buildDB creates the test database through the storage API and returns
// its directory.
func buildDB(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := storage.Open(dir, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	b := storage.NewBatch()
	b.LogData([]byte(logDataHead))
	for i := range numKeys {
		b.Set([]byte(key(i)), []byte(value(i)))
	}
	b.LogData([]byte(logDataTail))
	if err := db.Apply(b, storage.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteRange([]byte(key(10)), []byte(key(20)), storage.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete([]byte(key(30)), storage.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("wal-only"), []byte("w"), storage.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// liveFiles returns the SSTs of the database in dir, through the API.
func liveFiles(t *testing.T, dir string) ([]storage.LiveFile, string) {
	t.Helper()
	db, err := storage.OpenReadOnly(dir, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	files, m, err := db.LiveFiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no live SST files")
	}
	return files, m
}

type result struct {
	stdout, stderr string
	code           int
}

// shalectl runs the root command in-process.
func shalectl(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return result{out.String(), errb.String(), code}
}

// ok runs shalectl and fails the test unless it succeeds.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	r := shalectl(t, args...)
	if r.code != 0 {
		t.Fatalf("shalectl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// fails runs shalectl, requires exit status 1 and returns stderr.
func fails(t *testing.T, args ...string) string {
	t.Helper()
	r := shalectl(t, args...)
	if r.code != 1 {
		t.Fatalf("shalectl %s: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	if r.stderr == "" {
		t.Fatalf("shalectl %s: failed without a message", strings.Join(args, " "))
	}
	return r.stderr
}

func contains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s: missing %q in:\n%s", what, w, got)
		}
	}
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestSSTDump(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	files, _ := liveFiles(t, dir)
	path := filepath.Join(dir, files[0].Name)

	out := ok(t, "debug", "sst-dump", path)
	contains(t, "sst-dump", out,
		"file: "+path,
		"properties:",
		"blocks (",
		"range tombstones (1):",
		"[key010, key020)#201",
		"key000#1,SET => value-000-xxx",
		"...(90 bytes)", // values are cut at 64 bytes by default
		"key030#202,DEL\n",
		"key199#200,SET",
		"checksums: OK",
	)
	if strings.Contains(out, "wal-only") {
		t.Errorf("sst-dump shows a key that is only in the WAL:\n%s", out)
	}
	for _, p := range []string{
		"num entries", "num deletions", "num merges", "num range deletions", "raw key size",
		"raw value size", "data size", "index size", "filter size", "num data blocks", "compression",
		"filter policy", "whole key filtering", "prefix extractor", "comparator", "smallest seq",
		"largest seq", "creation time", "format version",
	} {
		contains(t, "properties", out, "  "+p+":")
	}
	// The flush dropped the ten range-deleted keys and the value the
	// deletion of key030 shadows.
	if !regexp.MustCompile(`num entries:\s+190\n`).MatchString(out) {
		t.Errorf("want 190 entries (189 sets and a delete):\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^\s+data\s+0\s+\d+\s+(none|snappy|zstd)$`).MatchString(out) {
		t.Errorf("no data block at offset 0 in the layout:\n%s", out)
	}
	contains(t, "full values", ok(t, "debug", "sst-dump", path, "--show", "keys", "--full-values"), "key000#1,SET => "+value(0)+"\n")

	// Bounds and limit select keys; the rest of the file is still verified.
	out = ok(t, "debug", "sst-dump", path, "--show", "keys", "--start", key(50), "--end", key(100), "--limit", "3")
	var keyLines []string
	for _, l := range lines(out) {
		if strings.HasPrefix(l, "  key") {
			keyLines = append(keyLines, strings.Fields(l)[0])
		}
	}
	if want := []string{"key050#51,SET", "key051#52,SET", "key052#53,SET"}; fmt.Sprint(keyLines) != fmt.Sprint(want) {
		t.Errorf("keys = %v, want %v\n%s", keyLines, want, out)
	}
	contains(t, "bounded", out, "keys in [key050, key100):", "(3 keys shown)", "checksums: OK")
	if strings.Contains(out, "properties:") || strings.Contains(out, "blocks (") {
		t.Errorf("--show keys printed other sections:\n%s", out)
	}
	out = ok(t, "debug", "sst-dump", path, "--show", "keys", "--limit", "2", "--verify=false")
	contains(t, "no verify", out, "(2 keys shown)", "verified only where read")

	// Hex.
	out = ok(t, "debug", "sst-dump", path, "--show", "keys", "--hex", "--start", "0x"+fmt.Sprintf("%x", key(199)))
	contains(t, "hex", out, fmt.Sprintf("0x%x#200,SET => 0x%x", key(199), value(199)[:64]))

	// JSON.
	out = ok(t, "debug", "sst-dump", path, "-o", "json", "--limit", "5")
	var d sstDump
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("sst-dump -o json: %v\n%s", err, out)
	}
	if d.Properties == nil || d.Properties.NumEntries != 190 || d.Properties.NumDeletions != 1 ||
		d.Properties.NumRangeDeletions != 1 || d.Properties.Comparator != "shale.bytewise" ||
		d.Properties.SmallestSeq != 1 || d.Properties.LargestSeq != 202 {
		t.Errorf("properties: %+v", d.Properties)
	}
	var data uint64
	for _, b := range d.Layout.Blocks {
		if b.Kind == "data" {
			data++
		}
	}
	if data != d.Properties.NumDataBlocks || data < 2 {
		t.Errorf("layout has %d data blocks, properties %d (want several)", data, d.Properties.NumDataBlocks)
	}
	if len(d.Keys) != 5 || d.Keys[0].Key != key(0) || d.Keys[0].Seq != 1 || d.Keys[0].Kind != "SET" || !d.ChecksumsVerified {
		t.Errorf("keys: %+v", d.Keys)
	}
	if len(d.Tombstones) != 1 || d.Tombstones[0] != (sstTombstone{Start: key(10), End: key(20), Seq: 201}) {
		t.Errorf("tombstones: %+v", d.Tombstones)
	}
	if d.Size != int64(files[0].Size) {
		t.Errorf("size %d, LiveFiles says %d", d.Size, files[0].Size)
	}
}

func TestSSTDumpErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "000001.sst")
	contains(t, "missing file", fails(t, "debug", "sst-dump", missing), missing, "no such file")
	notSST := filepath.Join(dir, "garbage.sst")
	if err := os.WriteFile(notSST, bytes.Repeat([]byte("garbage!"), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	contains(t, "not an sst", fails(t, "debug", "sst-dump", notSST), "corruption in "+notSST, "bad magic number")
	contains(t, "bad section", fails(t, "debug", "sst-dump", notSST, "--show", "nope"), `unknown section "nope"`)
	contains(t, "no file", fails(t, "debug", "sst-dump"), "takes 1 argument(s), FILE; got 0", "--help")
}

// copyDB copies the files of a database directory (not its LOCK or
// archive) to a new directory.
func copyDB(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "LOCK" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// corruptDataBlock flips a byte in the middle of the last data block of the
// SST at path and returns the block's offset.
func corruptDataBlock(t *testing.T, path string) uint64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sstable.NewReader(bytes.NewReader(data), int64(len(data)), sstable.ReaderOptions{FileName: path})
	if err != nil {
		t.Fatal(err)
	}
	layout, err := r.Layout()
	if err != nil {
		t.Fatal(err)
	}
	var blk *sstable.BlockInfo
	for i := range layout.Blocks {
		if layout.Blocks[i].Kind == "data" {
			blk = &layout.Blocks[i]
		}
	}
	if blk == nil {
		t.Fatalf("%s has no data block", path)
	}
	data[blk.Offset+blk.Length/2] ^= 0x40
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return blk.Offset
}

func TestCorruption(t *testing.T) {
	t.Parallel()
	dir := copyDB(t, buildDB(t))
	files, _ := liveFiles(t, dir)
	path := filepath.Join(dir, files[0].Name)
	off := corruptDataBlock(t, path)
	where := fmt.Sprintf("corruption in %s at offset %d", path, off)

	for _, args := range [][]string{
		{"debug", "sst-dump", path},
		{"debug", "sst-dump", path, "--show", "properties"}, // still verifies the data blocks
		{"debug", "sst-dump", path, "-o", "json"},
	} {
		contains(t, strings.Join(args, " "), fails(t, args...), where, "data block: checksum mismatch")
	}
	// Printing stops at the damaged block, after the keys before it.
	r := shalectl(t, "debug", "sst-dump", path, "--show", "keys")
	if r.code != 1 || !strings.Contains(r.stdout, "key000#1,SET") || strings.Contains(r.stdout, "checksums: OK") {
		t.Errorf("sst-dump of a damaged file: exit %d\n%s", r.code, r.stdout)
	}
	// Metadata is intact: without verification, properties alone succeed.
	ok(t, "debug", "sst-dump", path, "--show", "properties", "--verify=false")

	// A scan of the database reads the block and names the file.
	contains(t, "scan", fails(t, "debug", "ldb", "--db", dir, "scan"), where, "checksum mismatch")
	contains(t, "get", fails(t, "debug", "ldb", "--db", dir, "get", key(199)), where)
}

func TestLDBGetScan(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	ldb := func(args ...string) []string { return append([]string{"debug", "ldb", "--db", dir}, args...) }
	before := dirState(t, dir)

	if got := ok(t, ldb("get", key(5))...); got != value(5)+"\n" {
		t.Errorf("get = %q", got)
	}
	if got := ok(t, ldb("get", "wal-only")...); got != "w\n" {
		t.Errorf("get of a WAL-only key = %q", got)
	}
	for _, k := range []string{"nope", key(15), key(30)} {
		contains(t, "get "+k, fails(t, ldb("get", k)...), "key "+k+": not found")
	}
	var kv kvJSON
	if err := json.Unmarshal([]byte(ok(t, ldb("get", key(7), "-o", "json")...)), &kv); err != nil || kv != (kvJSON{key(7), value(7)}) {
		t.Errorf("get -o json: %+v %v", kv, err)
	}
	if got := ok(t, ldb("--hex", "get", fmt.Sprintf("%x", key(7)))...); got != fmt.Sprintf("0x%x\n", value(7)) {
		t.Errorf("get --hex = %q", got)
	}

	all := lines(ok(t, ldb("scan")...))
	if len(all) != liveKeys || all[0] != key(0)+" => "+value(0) || all[len(all)-1] != "wal-only => w" {
		t.Errorf("scan: %d lines (want %d), first %q, last %q", len(all), liveKeys, all[0], all[len(all)-1])
	}
	for _, l := range all {
		if strings.HasPrefix(l, "key01") || strings.HasPrefix(l, key(30)) {
			t.Errorf("scan shows deleted key: %s", l)
		}
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--start", key(100), "--end", key(103), "--keys-only"}, []string{key(100), key(101), key(102)}},
		{[]string{"--start", key(8), "--limit", "3", "--keys-only"}, []string{key(8), key(9), key(20)}},
		{[]string{"--prefix", "key19", "--start", key(197), "--keys-only"}, []string{key(197), key(198), key(199)}},
		{[]string{"--reverse", "--limit", "3", "--keys-only"}, []string{"wal-only", key(199), key(198)}},
		{[]string{"--reverse", "--end", key(22), "--keys-only"}, append([]string{key(21), key(20)}, reversed(keys(0, 10))...)},
		{[]string{"--start", key(50), "--limit", "1"}, []string{key(50) + " => " + value(50)}},
		{[]string{"--start", "6b6579313939", "--hex", "--keys-only"}, []string{"0x6b6579313939", fmt.Sprintf("0x%x", "wal-only")}},
	} {
		got := lines(ok(t, ldb(append([]string{"scan"}, c.args...)...)...))
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("scan %v = %q, want %q", c.args, got, c.want)
		}
	}
	jl := lines(ok(t, ldb("scan", "--prefix", "key00", "--limit", "2", "-o", "json")...))
	if len(jl) != 2 {
		t.Fatalf("scan -o json: %q", jl)
	}
	for i, l := range jl {
		var kv kvJSON
		if err := json.Unmarshal([]byte(l), &kv); err != nil || kv != (kvJSON{key(i), value(i)}) {
			t.Errorf("scan -o json line %d: %q (%v)", i, l, err)
		}
	}

	// The read-only commands wrote nothing.
	ok(t, ldb("manifest")...)
	ok(t, ldb("metrics")...)
	ok(t, ldb("live-files")...)
	ok(t, ldb("updates-since", "1")...)
	if after := dirState(t, dir); after != before {
		t.Errorf("read-only commands changed the directory:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func keys(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, key(i))
	}
	return out
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[len(s)-1-i] = x
	}
	return out
}

// dirState describes the files under dir: names, sizes and times.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s\n", path, fi.Size(), fi.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestLDBWrites(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	ldb := func(args ...string) []string { return append([]string{"debug", "ldb", "--db", dir}, args...) }

	if got := ok(t, ldb("put", "hello", "world", "--sync")...); got != "OK\n" {
		t.Errorf("put: %q", got)
	}
	if got := ok(t, ldb("get", "hello")...); got != "world\n" {
		t.Errorf("get after put: %q", got)
	}
	ok(t, ldb("--hex", "put", "0x00ff", "0102")...)
	if got := ok(t, ldb("--hex", "get", "00FF")...); got != "0x0102\n" {
		t.Errorf("hex round trip: %q", got)
	}
	if got := ok(t, ldb("scan", "--end", "\x01")...); got != `"\x00\xff" => "\x01\x02"`+"\n" {
		t.Errorf("binary key and value in string mode: %q", got)
	}
	ok(t, ldb("delete", "hello")...)
	fails(t, ldb("get", "hello")...)
	ok(t, ldb("delete-range", key(0), key(100))...)
	if got := ok(t, ldb("scan", "--start", key(0), "--limit", "1", "--keys-only")...); got != key(100)+"\n" {
		t.Errorf("scan after delete-range: %q", got)
	}
	contains(t, "empty range", fails(t, ldb("delete-range", "b", "a")...), "start must be below end")
	contains(t, "bad hex", fails(t, ldb("--hex", "put", "zz", "00")...), `KEY: invalid hex "zz"`)

	// A new database only with --create-if-missing, and a failed attempt
	// leaves nothing behind.
	fresh := filepath.Join(t.TempDir(), "fresh")
	contains(t, "no db", fails(t, "debug", "ldb", "--db", fresh, "put", "a", "b"), "no database there", "--create-if-missing")
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("a failed put created %s (%v)", fresh, err)
	}
	ok(t, "debug", "ldb", "--db", fresh, "--create-if-missing", "put", "a", "b")
	if got := ok(t, "debug", "ldb", "--db", fresh, "get", "a"); got != "b\n" {
		t.Errorf("get from new database: %q", got)
	}
}

// TestLDBRunningNodeShard: ldb refuses to write a node's shard engine
// (which has no LOCK of its own) while the node holds its raft log engine,
// still reads it, and writes it once the node is gone.
func TestLDBRunningNodeShard(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	shardDir := filepath.Join(data, "shards", "7")
	if err := os.MkdirAll(filepath.Dir(shardDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(buildDB(t), shardDir); err != nil {
		t.Fatal(err)
	}
	node, err := storage.Open(filepath.Join(data, "raftlog"), quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	ldb := func(args ...string) []string { return append([]string{"debug", "ldb", "--db", shardDir}, args...) }
	contains(t, "write while the node runs", fails(t, ldb("put", "a", "b")...), "shard engine of a running node", "stop the node first")
	if got := ok(t, ldb("get", key(0))...); got != value(0)+"\n" {
		t.Errorf("read while the node runs: %q", got)
	}
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
	ok(t, ldb("put", "a", "b")...)
	if got := ok(t, ldb("get", "a")...); got != "b\n" {
		t.Errorf("get after put: %q", got)
	}
}

func TestLDBManifest(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	files, manifestName := liveFiles(t, dir)
	out := ok(t, "debug", "ldb", "--db", dir, "manifest")
	contains(t, "manifest", out,
		"manifest: "+filepath.Join(dir, manifestName),
		"edit 0 at offset 0 (",
		"comparator: shale.bytewise",
		"next-file: ",
		"last-seq: ",
		"version after ",
		"L0: 1 files",
		fmt.Sprintf("total: %d files", len(files)),
	)
	for _, f := range files {
		want := fmt.Sprintf("%s size=%d keys=[%s#", f.Name, f.Size, f.Smallest)
		contains(t, "manifest", out, "add L0 "+want, "    "+want)
	}
	// After a compaction the edits delete the L0 file and add its
	// replacement further down.
	ok(t, "debug", "ldb", "--db", dir, "compact")
	out = ok(t, "debug", "ldb", "--db", dir, "manifest")
	contains(t, "manifest after compact", out, "delete L0 ")
	// --path names a MANIFEST directly.
	_, manifestName = liveFiles(t, dir)
	out2 := ok(t, "debug", "ldb", "manifest", "--path", filepath.Join(dir, manifestName))
	if out2 != out {
		t.Errorf("manifest --path differs from manifest --db:\n%s\nvs\n%s", out2, out)
	}
}

// TestLDBManifestPrintsEveryField: an edit's clean-close record and history
// horizon are printed, so an operator reading a MANIFEST sees why a reopen
// insists on an intact WAL or keeps history.
func TestLDBManifestPrintsEveryField(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	printEdit(&b, &manifest.VersionEdit{
		LastSeqNum:        42,
		CleanCloseLogNum:  7,
		CleanCloseLogSize: 1234,
		HistoryHorizon:    40,
	}, output.Codec{})
	contains(t, "edit", b.String(), "last-seq: 42", "clean-close: 000007.log complete at 1234 bytes", "history-horizon: 40")
	// A clean close of the DB records one in the MANIFEST.
	dir := buildDB(t)
	contains(t, "manifest", ok(t, "debug", "ldb", "--db", dir, "manifest"), "clean-close: ")
}

func TestLDBCompact(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	ldb := func(args ...string) []string { return append([]string{"debug", "ldb", "--db", dir}, args...) }
	scanBefore := ok(t, ldb("scan")...)
	if got := ok(t, ldb("compact", "--start", key(0), "--end", "zzz")...); got != "OK\n" {
		t.Errorf("compact: %q", got)
	}
	if scanAfter := ok(t, ldb("scan")...); scanAfter != scanBefore {
		t.Errorf("compaction changed the contents")
	}
	var lf struct {
		Files []liveFileJSON `json:"files"`
	}
	if err := json.Unmarshal([]byte(ok(t, ldb("live-files", "-o", "json")...)), &lf); err != nil {
		t.Fatal(err)
	}
	for _, f := range lf.Files {
		if f.Level == 0 {
			t.Errorf("L0 file left after a full compaction: %+v", f)
		}
	}
	// The compaction dropped the deleted entries.
	files, _ := liveFiles(t, dir)
	out := ok(t, "debug", "sst-dump", filepath.Join(dir, files[len(files)-1].Name), "--show", "properties", "-o", "json")
	var d sstDump
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatal(err)
	}
	if d.Properties.NumEntries >= numKeys {
		t.Errorf("compacted file still has %d entries", d.Properties.NumEntries)
	}
}

func TestLDBCheckpoint(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	dest := filepath.Join(t.TempDir(), "ckpt")
	out := ok(t, "debug", "ldb", "--db", dir, "checkpoint", dest)
	contains(t, "checkpoint", out, "checkpoint "+dest+" at seq 203,", "CURRENT", "MANIFEST-")
	contains(t, "existing dest", fails(t, "debug", "ldb", "--db", dir, "checkpoint", dest), "already exists")

	// Same contents, through the tool and through the API.
	if a, b := ok(t, "debug", "ldb", "--db", dir, "scan"), ok(t, "debug", "ldb", "--db", dest, "scan"); a != b {
		t.Errorf("checkpoint scan differs:\n%s\nvs\n%s", a, b)
	}
	src, cp := dumpDB(t, dir), dumpDB(t, dest)
	if len(src) != liveKeys || fmt.Sprint(src) != fmt.Sprint(cp) {
		t.Errorf("checkpoint has %d keys, source %d (want %d), or they differ", len(cp), len(src), liveKeys)
	}
}

// dumpDB returns the key/value pairs of the database in dir, read with the
// storage API.
func dumpDB(t *testing.T, dir string) []string {
	t.Helper()
	db, err := storage.OpenReadOnly(dir, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for valid := it.First(); valid; valid = it.Next() {
		out = append(out, string(it.Key())+"="+string(it.Value()))
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestLDBUpdatesSince(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	ldb := func(args ...string) []string { return append([]string{"debug", "ldb", "--db", dir}, args...) }

	out := ok(t, ldb("updates-since", "1")...)
	contains(t, "updates-since", out,
		"batch seq=1 count=200 records=202\n  LOGDATA "+logDataHead+"\n  #1 SET key000 => "+value(0)+"\n",
		"  #200 SET key199 => "+value(199)+"\n  LOGDATA "+logDataTail+"\n",
		"batch seq=201 count=1 records=1\n  #201 RANGEDEL [key010, key020)\n",
		"batch seq=202 count=1 records=1\n  #202 DEL key030\n",
		"batch seq=203 count=1 records=1\n  #203 SET wal-only => w\n",
	)
	if n := strings.Count(out, "batch "); n != 4 {
		t.Errorf("%d batches, want 4:\n%s", n, out)
	}
	out = ok(t, ldb("updates-since", "202", "--limit", "1")...)
	if out != "batch seq=202 count=1 records=1\n  #202 DEL key030\n" {
		t.Errorf("updates-since 202 --limit 1:\n%s", out)
	}
	if out := ok(t, ldb("updates-since", "1000")...); out != "" {
		t.Errorf("updates-since past the end: %q", out)
	}

	jl := lines(ok(t, ldb("updates-since", "1", "-o", "json")...))
	if len(jl) != 4 {
		t.Fatalf("json: %d lines", len(jl))
	}
	var b updateBatch
	if err := json.Unmarshal([]byte(jl[0]), &b); err != nil {
		t.Fatal(err)
	}
	if b.Seq != 1 || b.Count != 200 || len(b.Records) != 202 {
		t.Fatalf("first batch: seq %d count %d records %d", b.Seq, b.Count, len(b.Records))
	}
	first, second, last := b.Records[0], b.Records[1], b.Records[201]
	if first.Kind != "LOGDATA" || first.Seq != nil || first.Data == nil || *first.Data != logDataHead {
		t.Errorf("first record: %+v", first)
	}
	if second.Kind != "SET" || second.Seq == nil || *second.Seq != 1 || second.Key != key(0) || *second.Value != value(0) {
		t.Errorf("second record: %+v", second)
	}
	if last.Kind != "LOGDATA" || *last.Data != logDataTail {
		t.Errorf("last record: %+v", last)
	}
	if err := json.Unmarshal([]byte(jl[1]), &b); err != nil || b.Records[0].Kind != "RANGEDEL" || *b.Records[0].End != key(20) {
		t.Errorf("range deletion batch: %s (%v)", jl[1], err)
	}
	contains(t, "bad seq", fails(t, ldb("updates-since", "x")...), `SEQ "x" is not a sequence number`)
}

func TestLDBMetricsAndLiveFiles(t *testing.T) {
	t.Parallel()
	dir := buildDB(t)
	files, manifestName := liveFiles(t, dir)

	out := ok(t, "debug", "ldb", "--db", dir, "metrics")
	contains(t, "metrics", out, "level  files", "\nL0         1 ", "base level L")

	out = ok(t, "debug", "ldb", "--db", dir, "live-files")
	contains(t, "live-files", out, "manifest: "+manifestName, "level  file", fmt.Sprintf("total: %d files", len(files)))
	for _, f := range files {
		if !regexp.MustCompile(fmt.Sprintf(`L%d\s+%s\s+%d\s+\[%d, %d\]\s+%s\s+%s\n`,
			f.Level, f.Name, f.Size, f.SmallestSeq, f.LargestSeq, f.Smallest, f.Largest)).MatchString(out) {
			t.Errorf("live-files lacks %+v:\n%s", f, out)
		}
	}
	var lf struct {
		Manifest string         `json:"manifest"`
		Files    []liveFileJSON `json:"files"`
	}
	if err := json.Unmarshal([]byte(ok(t, "debug", "ldb", "--db", dir, "live-files", "-o", "json")), &lf); err != nil {
		t.Fatal(err)
	}
	if lf.Manifest != manifestName || len(lf.Files) != len(files) || lf.Files[0].Name != files[0].Name ||
		lf.Files[0].Size != files[0].Size || lf.Files[0].Smallest != key(0) || lf.Files[0].LargestSeq != 202 {
		t.Errorf("live-files -o json: %+v", lf)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	empty := t.TempDir()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"debug", "ldb", "get", "k"}, []string{"--db DIR is required", "Run 'shalectl debug ldb get --help'"}},
		{[]string{"debug", "ldb", "--db", empty, "get", "k"}, []string{"open database read-only", "no database"}},
		{[]string{"debug", "ldb", "--db", empty, "bogus"}, []string{`unknown command "bogus" for "shalectl debug ldb"`}},
		{[]string{"debug", "ldb", "--db", empty, "get"}, []string{"takes 1 argument(s), KEY; got 0"}},
		{[]string{"debug", "ldb", "--db", empty, "metrics", "-o", "json"}, []string{"does not support -o json"}},
		{[]string{"debug", "ldb", "--db", empty, "scan", "-o", "yaml"}, []string{`unknown output format "yaml"`}},
		{[]string{"debug", "ldb", "--db", empty, "scan", "--nope"}, []string{"unknown flag: --nope", "--help"}},
		{[]string{"debug", "ldb", "--db", empty, "manifest"}, []string{"find current MANIFEST", "CURRENT"}},
		{[]string{"bogus"}, []string{`unknown command "bogus" for "shalectl"`}},
		{[]string{"kv", "scann"}, []string{`unknown command "scann" for "shalectl kv"`, "Did you mean this?\n\tscan\n"}},
		{[]string{"placment", "status"}, []string{"Did you mean this?\n\tplacement\n"}},
		{[]string{"shard", "mer", "k"}, []string{"Did you mean this?\n\tmerge\n"}},
	} {
		contains(t, strings.Join(c.args, " "), fails(t, c.args...), c.want...)
	}
	// Bare groups print their help.
	contains(t, "help", ok(t, "debug", "ldb"), "Available Commands:", "updates-since")
	if r := shalectl(t, "kv", "xyzzy"); strings.Contains(r.stderr, "Did you mean") {
		t.Errorf("a word near no command got a suggestion: %s", r.stderr)
	}
}

// TestCompletionScripts checks that the completion scripts docs/shalectl.md
// tells users to install are generated, and complete shalectl's commands.
func TestCompletionScripts(t *testing.T) {
	t.Parallel()
	for shell, want := range map[string]string{
		"bash": "__start_shalectl",
		"zsh":  "#compdef shalectl",
		"fish": "complete -c shalectl",
	} {
		contains(t, shell, ok(t, "completion", shell), want)
	}
	// The scripts ask shalectl itself for candidates (cobra's __complete).
	contains(t, "complete kv", ok(t, "__complete", "kv", "sc"), "scan")
}

// TestMain keeps the engine's default logger quiet in tests that open
// databases without options.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	os.Exit(m.Run())
}

// TestLDBOptions: ldb options prints the settings a database was made with,
// and a writing command opens it with them, so its record stays as it was;
// a corrupt OPTIONS file is reported, naming it.
func TestLDBOptions(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "db")
	opts := quietOptions()
	opts.MemTableSize = 3 << 20
	opts.L0CompactionTrigger = 3
	opts.Levels[0].Compression = storage.ZstdCompression
	db, err := storage.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := storage.ReadOptionsFile(nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	out := ok(t, "debug", "ldb", "--db", dir, "options")
	contains(t, "options", out, "# "+before.File, "memtable_size=3145728", "l0_compaction_trigger=3", "compression=zstd", "comparator=shale.bytewise", "checksum=crc32c:")

	ok(t, "debug", "ldb", "--db", dir, "put", "a", "b")
	after, err := storage.ReadOptionsFile(nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	if after.File != before.File || after.Text != before.Text {
		t.Errorf("a put through ldb changed the recorded options:\n%s\nwas\n%s", after.Text, before.Text)
	}

	path := filepath.Join(dir, before.File)
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(text), "memtable_size=3145728", "memtable_size=3145729", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	contains(t, "corrupt OPTIONS", fails(t, "debug", "ldb", "--db", dir, "options"), before.File, "checksum mismatch")
	contains(t, "get with a corrupt OPTIONS", fails(t, "debug", "ldb", "--db", dir, "get", "a"), before.File, "is corrupt")
}
