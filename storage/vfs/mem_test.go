package vfs_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

func syncDir(t testing.TB, fs vfs.FS, dir string) {
	t.Helper()
	d, err := fs.OpenDir(dir)
	mustOK(t, err)
	mustOK(t, d.Sync())
	mustOK(t, d.Close())
}

// createUnsynced creates name holding data, neither of them synced.
func createUnsynced(t testing.TB, fs vfs.FS, name, data string) vfs.File {
	t.Helper()
	f, err := fs.Create(name)
	mustOK(t, err)
	_, err = f.Write([]byte(data))
	mustOK(t, err)
	return f
}

func exists(t testing.TB, fs vfs.FS, name string) bool {
	t.Helper()
	_, err := fs.Stat(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func TestMemPathCleaning(t *testing.T) {
	fs := vfs.NewMem()
	mustOK(t, fs.MkdirAll("a/b/", 0o755))
	writeFile(t, fs, "./a/b/f", "x")
	for _, p := range []string{"a/b/f", "/a/b/f", "a//b/./f", "a/b/../b/f", "../a/b/f"} {
		if got := readFile(t, fs, p); got != "x" {
			t.Fatalf("%s: %q", p, got)
		}
	}
	for _, p := range []string{"a/b", "a/b/", "./a/b", "/a/b/"} {
		names, err := fs.List(p)
		mustOK(t, err)
		if len(names) != 1 || names[0] != "f" {
			t.Fatalf("List(%q) = %v", p, names)
		}
	}
	fi, err := fs.Stat("a/b/")
	mustOK(t, err)
	if fi.Name() != "b" || !fi.IsDir() {
		t.Fatalf("Stat: %q dir=%v", fi.Name(), fi.IsDir())
	}
	names, err := fs.List("/")
	mustOK(t, err)
	if len(names) != 1 || names[0] != "a" {
		t.Fatalf("List(/) = %v", names)
	}
	if _, err := fs.Create("/"); err == nil {
		t.Fatal("Create of the root succeeded")
	}
}

func TestMemRenameEdgeCases(t *testing.T) {
	fs := vfs.NewMem()
	mustOK(t, fs.MkdirAll("d/sub", 0o755))
	writeFile(t, fs, "f", "x")
	if err := fs.Rename("d", "d/sub/x"); err == nil {
		t.Fatal("moved a directory into itself")
	}
	if err := fs.Rename("f", "d"); err == nil {
		t.Fatal("renamed a file over a directory")
	}
	mustOK(t, fs.Rename("f", "f"))
	mustOK(t, fs.Link("f", "g"))
	mustOK(t, fs.Rename("f", "g")) // same inode: no-op
	if !exists(t, fs, "f") || !exists(t, fs, "g") {
		t.Fatal("rename between links of one inode changed the tree")
	}
	mustOK(t, fs.Rename("d", "e"))
	if readFile(t, fs, "g") != "x" || !exists(t, fs, "e/sub") {
		t.Fatal("directory rename lost contents")
	}
}

func TestCrashCloneDropsUnsyncedData(t *testing.T) {
	fs := vfs.NewCrashableMem()
	mustOK(t, fs.MkdirAll("db", 0o755))
	syncDir(t, fs, "/")
	f := createUnsynced(t, fs, "db/000001.log", "synced;")
	syncDir(t, fs, "db")
	mustOK(t, f.Sync())
	_, err := f.Write([]byte("unsynced"))
	mustOK(t, err)

	c := fs.CrashClone()
	if got := readFile(t, c, "db/000001.log"); got != "synced;" {
		t.Fatalf("after crash: %q", got)
	}
	// The original is untouched and the clone is independent of it.
	if got := readFile(t, fs, "db/000001.log"); got != "synced;unsynced" {
		t.Fatalf("original: %q", got)
	}
	_, err = f.Write([]byte("more"))
	mustOK(t, err)
	mustOK(t, f.Sync())
	writeFile(t, c, "db/000001.log", "rewritten in clone")
	if got := readFile(t, c, "db/000001.log"); got != "rewritten in clone" {
		t.Fatalf("clone: %q", got)
	}
	if got := readFile(t, fs, "db/000001.log"); got != "synced;unsyncedmore" {
		t.Fatalf("original after clone write: %q", got)
	}
}

func TestCrashCloneAppendKeepsSyncedPrefix(t *testing.T) {
	fs := vfs.NewCrashableMem()
	mustOK(t, fs.MkdirAll("db", 0o755))
	syncDir(t, fs, "/")
	writeFile(t, fs, "db/MANIFEST-000001", "edit1;")
	syncDir(t, fs, "db")
	f, err := fs.OpenAppend("db/MANIFEST-000001")
	mustOK(t, err)
	_, err = f.Write([]byte("edit2;"))
	mustOK(t, err)
	if got := readFile(t, fs.CrashClone(), "db/MANIFEST-000001"); got != "edit1;" {
		t.Fatalf("unsynced append survived a crash: %q", got)
	}
	mustOK(t, f.Sync())
	mustOK(t, f.Close())
	if got := readFile(t, fs.CrashClone(), "db/MANIFEST-000001"); got != "edit1;edit2;" {
		t.Fatalf("synced append lost in a crash: %q", got)
	}
}

func TestCrashCloneCreateNeedsDirSync(t *testing.T) {
	fs := vfs.NewCrashableMem()
	mustOK(t, fs.MkdirAll("db", 0o755))

	// The directory itself is not durable until the root is synced.
	writeFile(t, fs, "db/a", "a")
	syncDir(t, fs, "db")
	if exists(t, fs.CrashClone(), "db") {
		t.Fatal("db survived without syncing its parent")
	}
	syncDir(t, fs, "/")
	c := fs.CrashClone()
	if got := readFile(t, c, "db/a"); got != "a" {
		t.Fatalf("db/a: %q", got)
	}

	// A synced file whose entry is not synced does not survive.
	writeFile(t, fs, "db/b", "b")
	if exists(t, fs.CrashClone(), "db/b") {
		t.Fatal("db/b survived without a directory sync")
	}
	// An entry synced before its data survives, empty.
	f := createUnsynced(t, fs, "db/c", "c")
	defer f.Close()
	syncDir(t, fs, "db")
	c = fs.CrashClone()
	if !exists(t, c, "db/b") {
		t.Fatal("db/b lost after directory sync")
	}
	if got := readFile(t, c, "db/c"); got != "" {
		t.Fatalf("db/c: %q, want empty", got)
	}
}

func TestCrashCloneRemoveNeedsDirSync(t *testing.T) {
	fs := vfs.NewCrashableMem()
	writeFile(t, fs, "f", "data")
	syncDir(t, fs, "/")
	mustOK(t, fs.Remove("f"))
	if got := readFile(t, fs.CrashClone(), "f"); got != "data" {
		t.Fatalf("removed file after crash: %q", got)
	}
	syncDir(t, fs, "/")
	if exists(t, fs.CrashClone(), "f") {
		t.Fatal("removal not durable after directory sync")
	}
}

func TestCrashCloneRename(t *testing.T) {
	fs := vfs.NewCrashableMem()
	writeFile(t, fs, "CURRENT", "MANIFEST-1")
	syncDir(t, fs, "/")
	writeFile(t, fs, "CURRENT.tmp", "MANIFEST-2")
	mustOK(t, fs.Rename("CURRENT.tmp", "CURRENT"))

	c := fs.CrashClone()
	if got := readFile(t, c, "CURRENT"); got != "MANIFEST-1" {
		t.Fatalf("CURRENT before dir sync: %q", got)
	}
	if exists(t, c, "CURRENT.tmp") {
		t.Fatal("CURRENT.tmp durable without dir sync")
	}

	syncDir(t, fs, "/")
	c = fs.CrashClone()
	if got := readFile(t, c, "CURRENT"); got != "MANIFEST-2" {
		t.Fatalf("CURRENT after dir sync: %q", got)
	}
	if exists(t, c, "CURRENT.tmp") {
		t.Fatal("CURRENT.tmp still present after rename was synced")
	}
}

func TestCrashCloneTruncateNeedsFileSync(t *testing.T) {
	fs := vfs.NewCrashableMem()
	writeFile(t, fs, "f", "old contents")
	syncDir(t, fs, "/")
	f := createUnsynced(t, fs, "f", "new")
	defer f.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	if got := readFile(t, fs.CrashClone(vfs.WithRandomTail(rng)), "f"); got != "old contents" {
		t.Fatalf("truncated, unsynced file after crash: %q", got)
	}
	mustOK(t, f.Sync())
	if got := readFile(t, fs.CrashClone(), "f"); got != "new" {
		t.Fatalf("after sync: %q", got)
	}
}

func TestCrashCloneHardLinks(t *testing.T) {
	fs := vfs.NewCrashableMem()
	mustOK(t, fs.MkdirAll("db", 0o755))
	mustOK(t, fs.MkdirAll("checkpoint", 0o755))
	syncDir(t, fs, "/")
	writeFile(t, fs, "db/000005.sst", "table")
	syncDir(t, fs, "db")
	mustOK(t, fs.Link("db/000005.sst", "checkpoint/000005.sst"))

	c := fs.CrashClone()
	if exists(t, c, "checkpoint/000005.sst") {
		t.Fatal("link durable without syncing its directory")
	}
	syncDir(t, fs, "checkpoint")
	mustOK(t, fs.Remove("db/000005.sst")) // not synced: the db entry stays
	c = fs.CrashClone()
	if readFile(t, c, "db/000005.sst") != "table" || readFile(t, c, "checkpoint/000005.sst") != "table" {
		t.Fatal("linked file lost")
	}
	// The two names still share one inode in the clone.
	f, err := c.Create("db/000005.sst") // truncates the shared inode
	mustOK(t, err)
	_, err = f.Write([]byte("T"))
	mustOK(t, err)
	mustOK(t, f.Close())
	if got := readFile(t, c, "checkpoint/000005.sst"); got != "T" {
		t.Fatalf("links not shared in clone: %q", got)
	}
}

func TestCrashCloneRandomTail(t *testing.T) {
	fs := vfs.NewCrashableMem()
	f := createUnsynced(t, fs, "000001.log", "synced")
	syncDir(t, fs, "/")
	mustOK(t, f.Sync())
	_, err := f.Write([]byte("0123456789"))
	mustOK(t, err)
	full := "synced0123456789"

	seen := map[int]bool{}
	for seed := uint64(0); seed < 200; seed++ {
		c := fs.CrashClone(vfs.WithRandomTail(rand.New(rand.NewPCG(seed, 0))))
		got := readFile(t, c, "000001.log")
		if !strings.HasPrefix(full, got) || len(got) < len("synced") {
			t.Fatalf("seed %d: %q is not a prefix of %q covering the synced part", seed, got, full)
		}
		seen[len(got)] = true
		again := readFile(t, fs.CrashClone(vfs.WithRandomTail(rand.New(rand.NewPCG(seed, 0)))), "000001.log")
		if again != got {
			t.Fatalf("seed %d not reproducible: %q vs %q", seed, got, again)
		}
	}
	if !seen[len("synced")] || !seen[len(full)] || len(seen) < 8 {
		t.Fatalf("tail lengths poorly spread: %v", seen)
	}
}

func TestCrashCloneStaleDirectoryCycle(t *testing.T) {
	fs := vfs.NewCrashableMem()
	mustOK(t, fs.MkdirAll("a/b", 0o755))
	syncDir(t, fs, "a") // a's durable entries: {b}
	mustOK(t, fs.Rename("a/b", "b"))
	mustOK(t, fs.Rename("a", "b/a"))
	syncDir(t, fs, "b") // b's durable entries: {a}
	syncDir(t, fs, "/") // root's durable entries: {b}
	c := fs.CrashClone()
	if !exists(t, c, "b/a") {
		t.Fatal("b/a missing")
	}
}

func TestCrashCloneOnPlainMemPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	vfs.NewMem().CrashClone()
}

// TestCrashCloneIsAtomic syncs file a then file b, over and over, while
// taking crash clones; no clone may show b's sync without a's.
func TestCrashCloneIsAtomic(t *testing.T) {
	fs := vfs.NewCrashableMem()
	a := createUnsynced(t, fs, "a", "")
	b := createUnsynced(t, fs, "b", "")
	syncDir(t, fs, "/")
	const rounds = 300
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var rec [8]byte
		for i := uint64(1); i <= rounds; i++ {
			binary.LittleEndian.PutUint64(rec[:], i)
			for _, f := range []vfs.File{a, b} {
				if _, err := f.Write(rec[:]); err != nil {
					t.Error(err)
					return
				}
				if err := f.Sync(); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	for i := 0; i < 100; i++ {
		c := fs.CrashClone()
		la, lb := len(readFile(t, c, "a")), len(readFile(t, c, "b"))
		if lb > la || la-lb > 8 {
			t.Fatalf("inconsistent clone: a has %d bytes, b %d", la, lb)
		}
	}
	wg.Wait()
}

// TestMemConcurrentReadersAndWriter appends through one handle while
// readers use ReadAt on the same handle and on separate ones, and other
// goroutines change the tree; run with -race.
func TestMemConcurrentReadersAndWriter(t *testing.T) {
	fs := vfs.NewCrashableMem()
	w, err := fs.Create("wal")
	mustOK(t, err)
	const records, recLen = 2000, 16
	record := func(i int) []byte {
		return bytes.Repeat([]byte{byte(i)}, recLen)
	}
	check := func(f vfs.File) {
		buf := make([]byte, recLen)
		for {
			fi, err := f.Stat()
			if err != nil {
				t.Error(err)
				return
			}
			n := int(fi.Size()) / recLen
			for i := max(0, n-3); i < n; i++ {
				if _, err := f.ReadAt(buf, int64(i*recLen)); err != nil && err != io.EOF {
					t.Error(err)
					return
				}
				if !bytes.Equal(buf, record(i)) {
					t.Errorf("record %d corrupt: %x", i, buf)
					return
				}
			}
			if n == records {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(2)
		go func() { defer wg.Done(); check(w) }()
		go func() {
			defer wg.Done()
			r, err := fs.Open("wal")
			if err != nil {
				t.Error(err)
				return
			}
			defer r.Close()
			check(r)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			name := fs.Join("dir", string(rune('a'+i%26)))
			if err := fs.MkdirAll("dir", 0o755); err != nil {
				t.Error(err)
			}
			if f, err := fs.Create(name); err == nil {
				f.Close()
			}
			fs.List("dir")
			if d, err := fs.OpenDir("dir"); err == nil {
				d.Sync()
				d.Close()
			}
			fs.Remove(name)
			fs.CrashClone()
		}
	}()
	for i := 0; i < records; i++ {
		if _, err := w.Write(record(i)); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			mustOK(t, w.Sync())
		}
	}
	wg.Wait()
	mustOK(t, w.Close())
}
