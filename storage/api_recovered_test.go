package storage

import (
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
)

// apiLiveWALs returns the names of the WAL files in dir (not the archive).
func apiLiveWALs(t testing.TB, fs vfs.FS, dir string) []string {
	t.Helper()
	var out []string
	for name := range apiListFiles(t, fs, dir) {
		if ft, _, ok := manifest.ParseFilename(name); ok && ft == manifest.FileTypeLog && !strings.Contains(name, "/") {
			out = append(out, name)
		}
	}
	return out
}

// apiCheckpointWithWAL makes a DB in "src" with data in L0 and in its WAL,
// checkpoints it into "cp" and returns the data and the source's L0 file
// count.
func apiCheckpointWithWAL(t *testing.T, fs vfs.FS, opts *Options) (oracle, int) {
	t.Helper()
	src := apiMustOpen(t, "src", opts)
	want := oracle{}
	apiLoad(t, src, 0, 100, "sst", want)
	if err := src.Flush(); err != nil {
		t.Fatal(err)
	}
	apiWaitIdle(t, src)
	apiLoad(t, src, 50, 150, "wal", want) // in the memtable and the WAL only
	if _, err := src.Checkpoint("cp"); err != nil {
		t.Fatal(err)
	}
	l0 := src.Metrics().Levels[0].Files
	apiMustClose(t, src)
	if l0 == 0 {
		t.Fatal("the source has no L0 file")
	}
	return want, l0
}

// TestAPIKeepRecoveredMemTable: with KeepRecoveredMemTable, a DB opened from
// a checkpoint whose WAL holds data keeps that data in its memtable instead
// of flushing it to a new L0 file (so it has its source's levels and no
// flush or compaction runs at open), goes on taking writes into the same
// memtable, and loses nothing at a crash (the replayed WAL stays live until
// the memtable's flush, then goes); the kept memtable is sized to the WAL,
// not to MemTableSize. Without the option Open adds an L0 file.
func TestAPIKeepRecoveredMemTable(t *testing.T) {
	for _, keep := range []bool{false, true} {
		fs := vfs.NewCrashableMem()
		opts := apiSmallOptions(fs)
		opts.MemTableSize = 4 << 20 // the WAL's data fits one memtable
		opts.MemTableInitialSize = 64 << 10
		opts.WALArchiveMaxBytes = 0
		opts.KeepRecoveredMemTable = keep
		opts.L0CompactionTrigger = 4 // the recovery's L0 file must not start a compaction at open
		want, srcL0 := apiCheckpointWithWAL(t, fs, opts)

		d := apiMustOpen(t, "cp", opts)
		m := d.Metrics()
		if !keep {
			if m.Levels[0].Files != srcL0+1 || m.Flushes != 0 {
				t.Fatalf("without the option: %d L0 files (source %d), %d flushes; want the recovery's L0 file", m.Levels[0].Files, srcL0, m.Flushes)
			}
			apiMustClose(t, d)
			continue
		}
		if m.Levels[0].Files != srcL0 || m.Flushes != 0 || m.Compactions != 0 {
			t.Fatalf("kept: %d L0 files (source %d), %d flushes, %d compactions", m.Levels[0].Files, srcL0, m.Flushes, m.Compactions)
		}
		d.mu.Lock()
		capacity := d.mem.capacity
		d.mu.Unlock()
		if capacity >= opts.MemTableSize {
			t.Fatalf("kept memtable of %d bytes for a WAL of a few KiB, want it sized to the WAL", capacity)
		}
		// The checkpoint's WAL may hold writes its source had not synced:
		// it is synced before writes go to a new one.
		if m.WALSyncs == 0 {
			t.Fatalf("kept the replayed memtable without syncing its WAL (WALSyncs %d)", m.WALSyncs)
		}
		recovered := apiLiveWALs(t, fs, "cp")
		if len(recovered) != 2 {
			t.Fatalf("live WALs after a kept recovery: %v, want the replayed one and a new one", recovered)
		}
		apiCheckEqual(t, "after open", apiDump(t, d, nil), want)

		// Writes go on into the same memtable, the new ones to the new WAL.
		apiLoad(t, d, 120, 200, "after", want)
		b := NewBatch()
		b.Set([]byte("synced"), []byte("1"))
		if err := d.Apply(b, Sync); err != nil {
			t.Fatal(err)
		}
		want.apply(b)
		if n := d.Metrics().Levels[0].Files; n != srcL0 {
			t.Fatalf("%d L0 files after writes into the kept memtable, want %d", n, srcL0)
		}

		// A crash keeps the recovered data and the synced write.
		crashed := apiMustOpen(t, "cp", withFS(opts, fs.CrashClone()))
		apiCheckEqual(t, "after a crash", apiDump(t, crashed, nil), want)
		apiMustClose(t, crashed)

		// A clean reopen too, with nothing to sync (Close synced the last
		// WAL, the switch to it the one before); once flushed, the replayed
		// WAL is gone.
		apiMustClose(t, d)
		d = apiMustOpen(t, "cp", opts)
		if n := d.Metrics().WALSyncs; n != 0 {
			t.Fatalf("%d WAL syncs at a clean reopen, want none", n)
		}
		apiCheckEqual(t, "after a reopen", apiDump(t, d, nil), want)
		if err := d.Flush(); err != nil {
			t.Fatal(err)
		}
		apiWaitIdle(t, d)
		for _, name := range apiLiveWALs(t, fs, "cp") {
			for _, old := range recovered {
				if name == old {
					t.Fatalf("replayed WAL %s still live after the flush: %v", old, apiLiveWALs(t, fs, "cp"))
				}
			}
		}
		apiCheckEqual(t, "after the flush", apiDump(t, d, nil), want)
		apiMustClose(t, d)
	}
}

// TestAPIKeepRecoveredMemTableTornTail: a WAL whose tail is torn (a crash
// during an append) is not kept behind a new one, where the next recovery
// would find it damaged before the last log: Open flushes what it replayed,
// and the DB reopens after more writes and a crash.
func TestAPIKeepRecoveredMemTableTornTail(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := apiSmallOptions(fs)
	opts.MemTableSize = 1 << 20
	opts.WALArchiveMaxBytes = 0
	opts.KeepRecoveredMemTable = true
	opts.L0CompactionTrigger = 4 // the recovery's L0 file must not start a compaction at open
	want, srcL0 := apiCheckpointWithWAL(t, fs, opts)
	wals := apiLiveWALs(t, fs, "cp")
	if len(wals) != 1 {
		t.Fatalf("checkpoint WALs %v", wals)
	}
	// A torn record: a chunk header promising more bytes than follow.
	f, err := fs.OpenAppend(fs.Join("cp", wals[0]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{1, 2, 3, 4, 0xff, 0x7f, 1, 'x'}); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	d := apiMustOpen(t, "cp", opts)
	if n := d.Metrics().Levels[0].Files; n != srcL0+1 {
		t.Fatalf("%d L0 files after opening a torn WAL, want the recovery's flush (%d)", n, srcL0+1)
	}
	apiCheckEqual(t, "after open", apiDump(t, d, nil), want)
	b := NewBatch()
	b.Set([]byte("synced"), []byte("1"))
	if err := d.Apply(b, Sync); err != nil {
		t.Fatal(err)
	}
	want.apply(b)
	crashed := apiMustOpen(t, "cp", withFS(opts, fs.CrashClone()))
	apiCheckEqual(t, "after a crash", apiDump(t, crashed, nil), want)
	apiMustClose(t, crashed)
	apiMustClose(t, d)
}

// withFS returns a copy of opts on fs.
func withFS(opts *Options, fs vfs.FS) *Options {
	o := *opts
	o.FS = fs
	return &o
}
