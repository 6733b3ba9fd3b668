package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// apiSnapshotDir returns the contents of every file under dir.
func apiSnapshotDir(t testing.TB, fs vfs.FS, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for name := range apiListFiles(t, fs, dir) {
		out[name] = apiReadAll(t, fs, fs.Join(dir, name))
	}
	return out
}

// TestAPIOpenReadOnly: a read-only DB sees data that is only in the WAL,
// refuses every write with ErrReadOnly and leaves the directory byte for
// byte as it was.
func TestAPIOpenReadOnly(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	d := apiMustOpen(t, "db", opts)
	want := oracle{}
	apiLoad(t, d, 0, 3000, "sst", want) // several flushes
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	b := NewBatch()
	b.Set([]byte("wal-only"), []byte("1"))
	b.DeleteRange([]byte(apiKey(100)), []byte(apiKey(200)))
	b.Merge([]byte(apiKey(5)), []byte("m"))
	b.Merge([]byte("merge-only"), []byte("x"))
	b.Delete([]byte(apiKey(7)))
	if err := d.Apply(b, Sync); err != nil {
		t.Fatal(err)
	}
	want.apply(b)
	apiMustClose(t, d)

	before := apiSnapshotDir(t, fs, "db")
	ro, err := OpenReadOnly("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	apiCheckEqual(t, "read-only", apiDump(t, ro, nil), want)
	if v, err := ro.Get([]byte("wal-only")); err != nil || string(v) != "1" {
		t.Errorf("get wal-only: %q %v", v, err)
	}
	if v, err := ro.Get([]byte(apiKey(5))); err != nil || string(v) != "sst5,m" {
		t.Errorf("get merged key: %q %v", v, err)
	}
	// Every write path is refused.
	wb := NewBatch()
	wb.Set([]byte("x"), []byte("y"))
	apiWriteSST(t, fs, "ext.sst", apiSet("e", "1"))
	for name, err := range map[string]error{
		"Apply":        ro.Apply(wb, NoSync),
		"Set":          ro.Set([]byte("x"), []byte("y"), Sync),
		"Delete":       ro.Delete([]byte(apiKey(1)), NoSync),
		"DeleteRange":  ro.DeleteRange([]byte("a"), []byte("b"), NoSync),
		"Merge":        ro.Merge([]byte("a"), []byte("b"), NoSync),
		"Flush":        ro.Flush(),
		"CompactRange": ro.CompactRange(nil, nil),
		"IngestSST":    ro.IngestSST([]string{"ext.sst"}),
	} {
		if !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s on a read-only DB: %v, want ErrReadOnly", name, err)
		}
	}
	// A snapshot and an iterator work.
	snap := ro.NewSnapshot()
	apiCheckEqual(t, "read-only snapshot", apiDump(t, ro, snap), want)
	snap.Close()
	// It holds no lock: a read-write open may proceed meanwhile (and is
	// closed before anything could be written by it).
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	after := apiSnapshotDir(t, fs, "db")
	if len(after) != len(before) {
		t.Fatalf("read-only open changed the file list: before %v, after %v", apiKeys(before), apiKeys(after))
	}
	for name, data := range before {
		if !bytes.Equal(after[name], data) {
			t.Errorf("read-only open changed %s", name)
		}
	}
	// The read-write DB still has everything.
	d = apiMustOpen(t, "db", opts)
	apiCheckEqual(t, "reopened read-write", apiDump(t, d, nil), want)
	apiMustClose(t, d)

	// No database: read-only open fails and creates nothing.
	if _, err := OpenReadOnly("nodb", opts); err == nil {
		t.Fatal("OpenReadOnly of a missing database succeeded")
	}
	if apiFileExists(fs, "nodb") {
		t.Error("OpenReadOnly of a missing database created its directory")
	}
}

func apiKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestAPIOpenExistence: ErrorIfExists and ErrorIfNotExists, and a failed
// open releases the directory lock.
func TestAPIOpenExistence(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)

	o := *opts
	o.ErrorIfNotExists = true
	if _, err := Open("db", &o); err == nil || !strings.Contains(err.Error(), "no database") {
		t.Fatalf("ErrorIfNotExists on a missing DB: %v", err)
	}
	o = *opts
	o.ErrorIfExists = true
	d, err := Open("db", &o) // creates it
	if err != nil {
		t.Fatalf("ErrorIfExists on a new DB: %v", err)
	}
	if err := d.Set([]byte("k"), []byte("v"), Sync); err != nil {
		t.Fatal(err)
	}
	apiMustClose(t, d)
	if _, err := Open("db", &o); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("ErrorIfExists on an existing DB: %v", err)
	}
	o = *opts
	o.ErrorIfNotExists = true
	d, err = Open("db", &o) // the failed open above released the lock
	if err != nil {
		t.Fatalf("ErrorIfNotExists on an existing DB: %v", err)
	}
	if v, err := d.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("get: %q %v", v, err)
	}
	apiMustClose(t, d)
}

// TestAPIOpenLocked: a second Open of a directory that is open fails with a
// lock error (in-memory and OS filesystems); after Close it succeeds.
func TestAPIOpenLocked(t *testing.T) {
	for _, tc := range []struct {
		name string
		fs   vfs.FS
		dir  string
	}{
		{"mem", vfs.NewMem(), "db"},
		{"os", vfs.Default, filepath.Join(t.TempDir(), "db")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := apiSmallOptions(tc.fs)
			d := apiMustOpen(t, tc.dir, opts)
			if err := d.Set([]byte("k"), []byte("v"), NoSync); err != nil {
				t.Fatal(err)
			}
			d2, err := Open(tc.dir, opts)
			if err == nil {
				d2.Close()
				t.Fatal("second Open of an open directory succeeded")
			}
			if !errors.Is(err, vfs.ErrLocked) {
				t.Fatalf("second Open: %v, want an error matching vfs.ErrLocked", err)
			}
			if !strings.Contains(err.Error(), "LOCK") {
				t.Errorf("lock error does not name the lock file: %v", err)
			}
			// The first DB is unaffected.
			if err := d.Set([]byte("k2"), []byte("v2"), NoSync); err != nil {
				t.Fatalf("write after a refused second open: %v", err)
			}
			apiMustClose(t, d)
			d = apiMustOpen(t, tc.dir, opts)
			if v, err := d.Get([]byte("k2")); err != nil || string(v) != "v2" {
				t.Fatalf("get after reopen: %q %v", v, err)
			}
			apiMustClose(t, d)
		})
	}
}

// TestAPISkipLockFile: with SkipLockFile no LOCK file is made, a second Open
// of the directory with the same Shared is still refused, and Close releases
// the directory.
func TestAPISkipLockFile(t *testing.T) {
	fs := vfs.NewMem()
	shared := NewShared(nil)
	defer shared.Close()
	opts := apiSmallOptions(fs)
	opts.Shared, opts.SkipLockFile = shared, true
	d := apiMustOpen(t, "db", opts)
	if apiFileExists(fs, "db/LOCK") {
		t.Fatal("SkipLockFile made a LOCK file")
	}
	d2, err := Open("db/", opts)
	if err == nil {
		d2.Close()
		t.Fatal("second Open of an open directory succeeded")
	}
	if !errors.Is(err, vfs.ErrLocked) || !strings.Contains(err.Error(), "db") {
		t.Fatalf("second Open: %v, want an error naming db and matching vfs.ErrLocked", err)
	}
	// Another directory with the same Shared opens.
	other := apiMustOpen(t, "other", opts)
	apiMustClose(t, other)
	if err := d.Set([]byte("k"), []byte("v"), NoSync); err != nil {
		t.Fatal(err)
	}
	apiMustClose(t, d)
	d = apiMustOpen(t, "db", opts)
	if v, err := d.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("get after reopen: %q %v", v, err)
	}
	apiMustClose(t, d)
}

// TestAPIOpenDescriptors: an open DB keeps one file descriptor in its
// directory, the WAL's, through flushes and compactions (the MANIFEST is
// opened per edit; SSTs live in the shared table cache and are counted
// there); LOCK adds a second unless SkipLockFile.
func TestAPIOpenDescriptors(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	shared := NewShared(&SharedOptions{TableCacheFiles: 1})
	defer shared.Close()
	for _, skipLock := range []bool{false, true} {
		t.Run(fmt.Sprintf("SkipLockFile=%v", skipLock), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			opts := apiSmallOptions(vfs.Default)
			opts.Shared, opts.SkipLockFile = shared, skipLock
			d := apiMustOpen(t, dir, opts)
			defer apiMustClose(t, d)
			for round := 0; round < 4; round++ {
				for i := 0; i < 500; i++ {
					k := fmt.Sprintf("key-%03d-%d", i, round)
					if err := d.Set([]byte(k), bytes.Repeat([]byte("v"), 100), NoSync); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.CompactRange(nil, nil); err != nil {
				t.Fatal(err)
			}
			shared.tables.evictDB(d.cacheID) // SSTs are the table cache's, not the DB's
			open := openFilesUnder(t, dir)
			want := 2
			if skipLock {
				want = 1
			}
			if len(open) != want {
				t.Fatalf("descriptors open in the DB directory: %v, want %d", open, want)
			}
		})
	}
}

// openFilesUnder lists the files under dir this process has open.
func openFilesUnder(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, dir+string(filepath.Separator)) {
			out = append(out, filepath.Base(target))
		}
	}
	return out
}

// TestAPIMemTableRamp: the first memtable has MemTableInitialSize (by
// default MemTableSize/16, at least 1 MiB, at most MemTableSize) and each
// rotation doubles the next one up to MemTableSize.
func TestAPIMemTableRamp(t *testing.T) {
	for _, tc := range []struct {
		size, initial uint64
		want          []uint64
	}{
		{1 << 20, 64 << 10, []uint64{64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 1 << 20}},
		{64 << 20, 0, []uint64{4 << 20, 8 << 20, 16 << 20}},
		{4 << 20, 0, []uint64{1 << 20, 2 << 20, 4 << 20, 4 << 20}},
		{256 << 10, 0, []uint64{256 << 10, 256 << 10}},
		{256 << 10, 1 << 20, []uint64{256 << 10}},
	} {
		opts := apiSmallOptions(vfs.NewMem())
		opts.MemTableSize, opts.MemTableInitialSize = tc.size, tc.initial
		d := apiMustOpen(t, "db", opts)
		var got []uint64
		for i := range tc.want {
			d.mu.Lock()
			got = append(got, d.mem.capacity)
			d.mu.Unlock()
			if i < len(tc.want)-1 {
				if err := d.Set([]byte("k"), []byte("v"), NoSync); err != nil {
					t.Fatal(err)
				}
				if err := d.Flush(); err != nil {
					t.Fatal(err)
				}
			}
		}
		apiMustClose(t, d)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("MemTableSize %d, MemTableInitialSize %d: capacities %v, want %v", tc.size, tc.initial, got, tc.want)
		}
	}
}

// TestAPIOptionsValidation: invalid options fail Open with an error naming
// each problem, before anything is created.
func TestAPIOptionsValidation(t *testing.T) {
	fs := vfs.NewMem()
	cases := []struct {
		mod  func(o *Options)
		want []string
	}{
		{func(o *Options) { o.MemTableSize = 1000 }, []string{"MemTableSize", "64 KiB"}},
		{func(o *Options) { o.MemTableSize = 8 << 30 }, []string{"MemTableSize", "4 GiB"}},
		{func(o *Options) { o.MaxMemTables = 1 }, []string{"MaxMemTables"}},
		{func(o *Options) { o.L0CompactionTrigger, o.L0SlowdownTrigger = 10, 5 }, []string{"L0 triggers", "10", "5"}},
		{func(o *Options) { o.L0StopTrigger = 8 }, []string{"L0 triggers"}}, // slowdown 8 == stop 8
		{func(o *Options) { o.LevelMultiplier = 1.5 }, []string{"LevelMultiplier"}},
		{func(o *Options) { o.Levels[2].BlockSize = -1 }, []string{"Levels[2]", "block size"}},
		{func(o *Options) { o.MemTableSize, o.MaxMemTables = 10, 1 }, []string{"MemTableSize", "MaxMemTables"}},
		{func(o *Options) { o.SkipLockFile = true }, []string{"SkipLockFile", "Shared"}},
		{func(o *Options) { o.MemTableInitialSize = 1000 }, []string{"MemTableInitialSize", "64 KiB"}},
	}
	for i, tc := range cases {
		opts := apiSmallOptions(fs)
		tc.mod(opts)
		dir := fmt.Sprintf("db%d", i)
		_, err := Open(dir, opts)
		if err == nil {
			t.Errorf("case %d: Open succeeded, want errors %v", i, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), "invalid options") {
			t.Errorf("case %d: %v does not say the options are invalid", i, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("case %d: error %q does not mention %q", i, err, w)
			}
		}
		if apiFileExists(fs, dir) {
			t.Errorf("case %d: Open with invalid options created %s", i, dir)
		}
	}
	// The caller's Options are not modified by Open's defaulting.
	opts := &Options{FS: fs, Logger: apiQuietLogger}
	d := apiMustOpen(t, "defaults", opts)
	apiMustClose(t, d)
	if opts.MemTableSize != 0 || opts.MaxMemTables != 0 || opts.Shared != nil {
		t.Errorf("Open modified the caller's options: %+v", opts)
	}
}

// TestAPIClosedDB: every call on a closed DB fails with ErrClosed.
func TestAPIClosedDB(t *testing.T) {
	fs := vfs.NewMem()
	d := apiMustOpen(t, "db", apiSmallOptions(fs))
	if err := d.Set([]byte("a"), []byte("1"), NoSync); err != nil {
		t.Fatal(err)
	}
	apiMustClose(t, d)
	if err := d.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	if err := d.Set([]byte("a"), []byte("1"), NoSync); !errors.Is(err, ErrClosed) {
		t.Errorf("Set after Close: %v", err)
	}
	if err := d.Flush(); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close: %v", err)
	}
	if _, err := d.Checkpoint("ckpt"); !errors.Is(err, ErrClosed) {
		t.Errorf("Checkpoint after Close: %v", err)
	}
	if _, _, err := d.LiveFiles(); !errors.Is(err, ErrClosed) {
		t.Errorf("LiveFiles after Close: %v", err)
	}
	if err := d.DisableFileDeletions(); !errors.Is(err, ErrClosed) {
		t.Errorf("DisableFileDeletions after Close: %v", err)
	}
}
