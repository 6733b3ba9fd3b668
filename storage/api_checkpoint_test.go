package storage

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// TestAPICheckpointConsistentWithUpdates: a checkpoint taken while writes
// continue opens (read-only and read-write) as exactly the batches at or
// below info.SeqNum; UpdatesSince(info.SeqNum+1) on the source replays
// exactly the later batches, LogData included, in order; applying them to
// the checkpoint makes it equal to the source. CheckpointAndSnapshot's
// snapshot reads exactly what its checkpoint holds, while the source keeps
// writing and compacting.
func TestAPICheckpointConsistentWithUpdates(t *testing.T) {
	t.Run("mem", func(t *testing.T) {
		apiCheckpointScenario(t, vfs.NewMem(), "db", "ckpt", 1, false, false)
	})
	t.Run("os-hardlinks", func(t *testing.T) {
		dir := t.TempDir()
		apiCheckpointScenario(t, vfs.Default, filepath.Join(dir, "db"), filepath.Join(dir, "ckpt"), 2, false, false)
	})
	t.Run("with-snapshot", func(t *testing.T) {
		dir := t.TempDir()
		apiCheckpointScenario(t, vfs.Default, filepath.Join(dir, "db"), filepath.Join(dir, "ckpt"), 3, true, false)
	})
	// CheckpointToSend: the WALs are linked, and the directory read as a
	// sender reads it (a linked WAL up to its length, while the source
	// writes on) is the checkpoint.
	t.Run("to-send", func(t *testing.T) {
		dir := t.TempDir()
		apiCheckpointScenario(t, vfs.Default, filepath.Join(dir, "db"), filepath.Join(dir, "ckpt"), 4, true, true)
	})
	t.Run("to-send-mem", func(t *testing.T) {
		apiCheckpointScenario(t, vfs.NewMem(), "db", "ckpt", 5, true, true)
	})
}

// apiCheckpointScenario runs the scenario of
// TestAPICheckpointConsistentWithUpdates with Checkpoint, or with
// CheckpointAndSnapshot (withSnapshot), or with CheckpointToSend
// (withSnapshot and send).
func apiCheckpointScenario(t *testing.T, fs vfs.FS, dbDir, ckptDir string, seed uint64, withSnapshot, send bool) {
	opts := apiSmallOptions(fs)
	d := apiMustOpen(t, dbDir, opts)
	defer func() {
		if d != nil {
			_ = d.Close()
		}
	}()
	rng := rand.New(rand.NewPCG(seed, 77))
	const space = 3000

	// log holds every applied batch in commit order: until the writer
	// goroutine starts only this goroutine writes, then only the writer.
	var log []apiLoggedBatch
	apply := func(rng *rand.Rand) error {
		b := apiRandomBatch(rng, space)
		if err := d.Apply(b, NoSync); err != nil {
			return err
		}
		log = append(log, apiLoggedBatch{seq: b.SeqNum(), count: b.Count(), repr: slices.Clone(b.Repr())})
		return nil
	}
	// Phase 1: data that reaches SSTs (several flushes and compactions),
	// then data left only in the WAL.
	for i := 0; i < 2500; i++ {
		if err := apply(rng); err != nil {
			t.Fatal(err)
		}
		if i == 1200 {
			if err := d.CompactRange(nil, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		if err := apply(rng); err != nil {
			t.Fatal(err)
		}
	}
	if m := d.Metrics(); m.Flushes == 0 || m.Levels[6].Files == 0 {
		t.Fatalf("setup did not produce SSTs: %s", m)
	}

	// Phase 2: a writer keeps writing while the checkpoint is taken.
	var stop atomic.Bool
	var writerErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		wrng := rand.New(rand.NewPCG(seed, 78))
		for after := 0; after < 200; {
			if stop.Load() {
				after++
			}
			if err := apply(wrng); err != nil {
				writerErr = err
				return
			}
		}
		// End with a batch that consumes a sequence number, so that the
		// last batch is visible to UpdatesSince (see
		// TestAPIUpdatesTrailingLogDataOnlyBatch).
		b := NewBatch()
		b.Set([]byte("k-final"), []byte("final"))
		if err := d.Apply(b, NoSync); err != nil {
			writerErr = err
			return
		}
		log = append(log, apiLoggedBatch{seq: b.SeqNum(), count: b.Count(), repr: slices.Clone(b.Repr())})
	}()
	time.Sleep(20 * time.Millisecond)
	var info *CheckpointInfo
	var snap *Snapshot
	var err error
	switch {
	case send:
		info, snap, err = d.CheckpointToSend(ckptDir)
	case withSnapshot:
		info, snap, err = d.CheckpointAndSnapshot(ckptDir)
	default:
		info, err = d.Checkpoint(ckptDir)
	}
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if writerErr != nil {
		t.Fatalf("writer: %v", writerErr)
	}
	// A second checkpoint into the same directory must be refused.
	if _, err := d.Checkpoint(ckptDir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("checkpoint into an existing directory: %v", err)
	}

	// Expected checkpoint contents: every batch at or below the cut.
	expected := oracle{}
	var later []apiLoggedBatch
	for i, lb := range log {
		if i > 0 && lb.seq < log[i-1].seq+SeqNum(log[i-1].count) {
			t.Fatalf("batch %d: seq %d overlaps the previous batch (seq %d, %d records)", i, lb.seq, log[i-1].seq, log[i-1].count)
		}
		end := lb.seq + SeqNum(lb.count) - 1
		switch {
		case lb.count > 0 && end <= info.SeqNum:
			b := NewBatch()
			if err := b.SetRepr(lb.repr); err != nil {
				t.Fatal(err)
			}
			expected.apply(b)
		case lb.count > 0 && lb.seq <= info.SeqNum:
			t.Fatalf("checkpoint cut %d falls inside batch [%d, %d]", info.SeqNum, lb.seq, end)
		case lb.count == 0 && lb.seq <= info.SeqNum:
			// A LogData-only batch committed before the cut: no state.
		default:
			later = append(later, lb)
		}
	}
	if len(later) < 100 {
		t.Fatalf("only %d batches after the cut; the writer did not overlap the checkpoint", len(later))
	}
	t.Logf("checkpoint at seq %d, %d files; %d batches before, %d after", info.SeqNum, len(info.Files), len(log)-len(later), len(later))

	// The checkpoint directory holds exactly info.Files, and the SSTs are
	// hard links on a filesystem that supports them.
	onDisk := apiListFiles(t, fs, ckptDir)
	var diskNames []string
	for n := range onDisk {
		diskNames = append(diskNames, n)
	}
	sort.Strings(diskNames)
	files := slices.Clone(info.Files)
	sort.Strings(files)
	if !slices.Equal(diskNames, files) {
		t.Fatalf("checkpoint dir holds %v, info.Files %v", diskNames, files)
	}
	var ssts int
	for _, n := range info.Files {
		if !strings.HasSuffix(n, ".sst") {
			continue
		}
		ssts++
		if fs == vfs.Default {
			a, err1 := os.Stat(filepath.Join(dbDir, n))
			b, err2 := os.Stat(filepath.Join(ckptDir, n))
			if err1 != nil || err2 != nil {
				// The source may have compacted the file away meanwhile;
				// then the checkpoint's link is the only name left.
				if err2 != nil {
					t.Fatalf("stat checkpoint sst %s: %v", n, err2)
				}
				continue
			}
			if !os.SameFile(a, b) {
				t.Errorf("checkpoint sst %s is a copy, not a hard link", n)
			}
		}
	}
	if ssts == 0 {
		t.Fatalf("checkpoint holds no SSTs: %v", info.Files)
	}
	if send {
		// Unsynced writes reach the file when the background flusher
		// runs: make every acknowledged one visible before reading sizes.
		if err := d.SyncWAL(); err != nil {
			t.Fatal(err)
		}
		ckptDir = apiReadAsSent(t, fs, dbDir, ckptDir, info)
	} else if info.Lengths != nil {
		t.Fatalf("Lengths %v from a checkpoint that copies its WALs", info.Lengths)
	}

	// Keep compacting the source: the checkpoint must not depend on its
	// files staying.
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	if snap != nil {
		if snap.SeqNum() != info.SeqNum {
			t.Fatalf("snapshot at %d, checkpoint at %d", snap.SeqNum(), info.SeqNum)
		}
		apiCheckEqual(t, "the checkpoint's snapshot", apiDump(t, d, snap), expected)
		if err := snap.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Read-only open of the checkpoint.
	ckOpts := apiSmallOptions(fs)
	ro, err := OpenReadOnly(ckptDir, ckOpts)
	if err != nil {
		t.Fatalf("open checkpoint read-only: %v", err)
	}
	apiCheckEqual(t, "read-only checkpoint", apiDump(t, ro, nil), expected)
	if got := ro.Metrics().LastSeq; got != info.SeqNum {
		t.Errorf("read-only checkpoint LastSeq %d, want %d", got, info.SeqNum)
	}
	apiMustClose(t, ro)

	// Read-write open of the checkpoint.
	ck := apiMustOpen(t, ckptDir, ckOpts)
	defer ck.Close()
	apiCheckEqual(t, "checkpoint", apiDump(t, ck, nil), expected)
	if got := ck.Metrics().LastSeq; got != info.SeqNum {
		t.Errorf("checkpoint LastSeq %d, want %d", got, info.SeqNum)
	}

	// UpdatesSince on the source replays exactly the later batches.
	got, err := apiCollectUpdates(t, d, info.SeqNum+1)
	if err != nil {
		t.Fatalf("updates since %d: %v", info.SeqNum+1, err)
	}
	if len(got) != len(later) {
		t.Fatalf("UpdatesSince(%d) returned %d batches, want %d", info.SeqNum+1, len(got), len(later))
	}
	var logData int
	for i := range got {
		if err := apiBatchesEqual(got[i], later[i]); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
		r := got[i].Reader()
		for {
			kind, _, _, ok := r.Next()
			if !ok {
				break
			}
			if kind == KindLogData {
				logData++
			}
		}
	}
	if logData == 0 {
		t.Fatalf("no LogData records among the %d later batches", len(later))
	}

	// Replaying them on the checkpoint reproduces the source, with the same
	// sequence numbers.
	for i, b := range got {
		nb := NewBatch()
		if err := nb.SetRepr(b.Repr()); err != nil {
			t.Fatal(err)
		}
		if err := ck.Apply(nb, NoSync); err != nil {
			t.Fatalf("replay %d: %v", i, err)
		}
		if nb.SeqNum() != b.SeqNum() {
			t.Fatalf("replayed batch %d got seq %d on the checkpoint, %d on the source", i, nb.SeqNum(), b.SeqNum())
		}
	}
	want := apiDump(t, d, nil)
	apiCheckEqual(t, "checkpoint after replay vs source", apiDump(t, ck, nil), want)
	if len(want) == 0 {
		t.Fatal("source is empty")
	}
	if err := ck.Close(); err != nil {
		t.Fatal(err)
	}
	// And the result survives a reopen of the checkpoint.
	ck2 := apiMustOpen(t, ckptDir, ckOpts)
	apiCheckEqual(t, "checkpoint reopened", apiDump(t, ck2, nil), want)
	apiMustClose(t, ck2)
	err = d.Close()
	d = nil
	if err != nil {
		t.Fatal(err)
	}
}

// TestAPIFileDeletionsDisabled: while deletions are disabled the files
// LiveFiles and WALFiles named stay on disk across flushes and compactions;
// enabling them removes the obsolete ones. Calls nest.
func TestAPIFileDeletionsDisabled(t *testing.T) {
	for _, archive := range []int64{-1, 0, 1 << 30} {
		t.Run(fmt.Sprintf("archive=%d", archive), func(t *testing.T) {
			fs := vfs.NewMem()
			opts := apiSmallOptions(fs)
			opts.WALArchiveMaxBytes = archive
			d := apiMustOpen(t, "db", opts)
			defer d.Close()

			if err := d.EnableFileDeletions(); err == nil {
				t.Fatal("EnableFileDeletions without DisableFileDeletions succeeded")
			}
			write := func(from, to int, tag string) {
				for i := from; i < to; i++ {
					if err := d.Set(fmt.Appendf(nil, "k%06d", i%4000), fmt.Appendf(nil, "%s-%d-%s", tag, i, strings.Repeat("v", 60)), NoSync); err != nil {
						t.Fatal(err)
					}
				}
			}
			write(0, 8000, "a")
			if err := d.Flush(); err != nil {
				t.Fatal(err)
			}
			write(8000, 9000, "b") // some data only in the WAL

			if err := d.DisableFileDeletions(); err != nil {
				t.Fatal(err)
			}
			if err := d.DisableFileDeletions(); err != nil { // nested
				t.Fatal(err)
			}
			live, manifestName, err := d.LiveFiles()
			if err != nil {
				t.Fatal(err)
			}
			wals, err := d.WALFiles()
			if err != nil {
				t.Fatal(err)
			}
			if len(live) == 0 || len(wals) == 0 {
				t.Fatalf("live files %d, wal files %d", len(live), len(wals))
			}
			var liveWALs []WALFile
			for _, w := range wals {
				if !w.Archived {
					liveWALs = append(liveWALs, w)
				}
			}
			if len(liveWALs) == 0 {
				t.Fatalf("no live WAL among %v", wals)
			}
			check := func(when string) {
				t.Helper()
				for _, f := range live {
					fi, err := fs.Stat(fs.Join("db", f.Name))
					if err != nil {
						t.Fatalf("%s: live file %s (L%d) gone: %v", when, f.Name, f.Level, err)
					}
					if uint64(fi.Size()) != f.Size {
						t.Fatalf("%s: %s size %d, LiveFiles said %d", when, f.Name, fi.Size(), f.Size)
					}
				}
				for _, w := range liveWALs {
					fi, err := fs.Stat(w.Path)
					if err != nil {
						t.Fatalf("%s: WAL %s gone (moved or deleted): %v", when, w.Path, err)
					}
					if fi.Size() < w.Size {
						t.Fatalf("%s: WAL %s shrank from %d to %d", when, w.Name, w.Size, fi.Size())
					}
				}
				if !apiFileExists(fs, fs.Join("db", manifestName)) {
					t.Fatalf("%s: manifest %s gone", when, manifestName)
				}
			}
			check("after disable")
			for round := 0; round < 3; round++ {
				write(9000+round*3000, 12000+round*3000, fmt.Sprint("c", round))
				if err := d.Flush(); err != nil {
					t.Fatal(err)
				}
				if err := d.CompactRange(nil, nil); err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprint("after flush+compaction ", round))
			}
			newLive, _, err := d.LiveFiles()
			if err != nil {
				t.Fatal(err)
			}
			stillLive := map[string]bool{}
			for _, f := range newLive {
				stillLive[f.Name] = true
			}
			var obsolete []string
			for _, f := range live {
				if !stillLive[f.Name] {
					obsolete = append(obsolete, f.Name)
				}
			}
			if len(obsolete) == 0 {
				t.Fatal("compactions left every original SST live; the test proves nothing")
			}
			// One Enable undoes one of the two Disables: still protected.
			if err := d.EnableFileDeletions(); err != nil {
				t.Fatal(err)
			}
			write(30000, 32000, "d")
			if err := d.Flush(); err != nil {
				t.Fatal(err)
			}
			check("after first enable")
			if err := d.EnableFileDeletions(); err != nil {
				t.Fatal(err)
			}
			for _, n := range obsolete {
				if apiFileExists(fs, fs.Join("db", n)) {
					t.Errorf("obsolete SST %s still on disk after EnableFileDeletions", n)
				}
			}
			for _, w := range liveWALs {
				if apiFileExists(fs, w.Path) {
					t.Errorf("obsolete WAL %s still in the DB directory after EnableFileDeletions", w.Path)
				}
				archived := apiFileExists(fs, fs.Join("db", archiveDirName, w.Name))
				if archived != (archive > 0) {
					t.Errorf("WAL %s archived=%v with WALArchiveMaxBytes=%d", w.Name, archived, archive)
				}
			}
			if apiFileExists(fs, fs.Join("db", manifestName)) {
				if _, cur, _ := d.LiveFiles(); cur != manifestName {
					t.Errorf("old manifest %s still on disk (current %s)", manifestName, cur)
				}
			}
			// The live set is all on disk, and nothing else of type SST
			// once background work has finished.
			apiWaitIdle(t, d)
			newLive, _, _ = d.LiveFiles()
			liveNames := map[string]bool{}
			for _, f := range newLive {
				liveNames[f.Name] = true
				if !apiFileExists(fs, fs.Join("db", f.Name)) {
					t.Errorf("live %s missing", f.Name)
				}
			}
			names, _ := fs.List("db")
			for _, n := range names {
				if strings.HasSuffix(n, ".sst") && !liveNames[n] {
					t.Errorf("stray SST %s after EnableFileDeletions", n)
				}
			}
			if err := d.EnableFileDeletions(); err == nil {
				t.Fatal("unbalanced EnableFileDeletions succeeded")
			}
			// Data intact.
			v, err := d.Get([]byte("k000100"))
			if err != nil || !strings.HasPrefix(string(v), "d-") && !strings.HasPrefix(string(v), "c2-") {
				t.Fatalf("get after all: %q %v", v, err)
			}
		})
	}
}

// TestAPICheckpointWithUnloggedWrites: writes made with DisableWAL are only
// in memtables, so Checkpoint flushes them; the checkpoint must still hold
// every write at or below info.SeqNum, including DisableWAL writes made
// while that flush runs.
//
// The bug this reproduced: Checkpoint flushed unlogged writes before taking
// its cut, so DisableWAL batches committed in between were at or below
// info.SeqNum but in neither the copied WAL nor an SST. The flush now runs
// under the cut's commit barrier.
func TestAPICheckpointWithUnloggedWrites(t *testing.T) {
	mem := vfs.NewMem()
	gate := &apiGate{}
	opts := apiSmallOptions(errorfs.Wrap(mem, gate))
	d := apiMustOpen(t, "db", opts)
	defer d.Close()
	unlogged := WriteOptions{DisableWAL: true}
	var mu sync.Mutex
	var batches []*Batch // every acknowledged batch, with its sequence number
	write := func(key string) {
		b := NewBatch()
		b.Set([]byte(key), []byte("v"))
		if err := d.Apply(b, unlogged); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		batches = append(batches, b)
		mu.Unlock()
	}
	for i := 0; i < 10; i++ {
		write(fmt.Sprint("before", i))
	}
	// When Checkpoint's flush creates its SST, start a writer committing
	// more DisableWAL batches concurrently (in its own goroutine: the flush
	// must not wait for it). Whatever the checkpoint's cut, it must hold
	// exactly the batches at or below its sequence number.
	var once sync.Once
	var wg sync.WaitGroup
	gate.set(func(op errorfs.Op, path string) {
		if op == errorfs.OpCreate && strings.HasPrefix(path, "db/") && strings.HasSuffix(path, ".sst") {
			once.Do(func() {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 10; i++ {
						write(fmt.Sprint("during", i))
					}
				}()
			})
		}
	})
	info, err := d.Checkpoint("ckpt")
	wg.Wait()
	gate.set(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := oracle{}
	for _, b := range batches {
		if b.SeqNum() <= info.SeqNum {
			want.apply(b)
		}
	}
	if len(want) < 10 {
		t.Fatalf("checkpoint at seq %d expects %d keys; the writes before it are missing from the log", info.SeqNum, len(want))
	}
	ro, err := OpenReadOnly("ckpt", apiSmallOptions(mem))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	apiCheckEqual(t, fmt.Sprintf("checkpoint at seq %d", info.SeqNum), apiDump(t, ro, nil), want)
}

// apiReadAsSent checks that CheckpointToSend linked the checkpoint's WALs
// (the live one longer than its length, since the writer went on, unless
// the source's WAL rotated right at the cut), copies the directory as a
// sender reads it (a linked WAL up to its length) into a new directory and
// returns that. dbDir is the source's directory.
func apiReadAsSent(t *testing.T, fs vfs.FS, dbDir, dir string, info *CheckpointInfo) string {
	t.Helper()
	if len(info.Lengths) == 0 {
		t.Fatalf("no WAL linked: %v", info.Files)
	}
	longer := 0
	out := dir + ".sent"
	if err := fs.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range info.Files {
		n, linked := info.Lengths[name]
		if !linked {
			n = -1
		} else if fi, err := fs.Stat(fs.Join(dir, name)); err != nil {
			t.Fatal(err)
		} else if fi.Size() > n {
			longer++
		}
		if err := copyFile(fs, fs.Join(dir, name), fs.Join(out, name), n); err != nil {
			t.Fatal(err)
		}
	}
	if longer == 0 {
		// The writes after the cut went to a newer WAL only if the live
		// one rotated before the first of them (its 64 KiB memtable full
		// right at the cut: rare, but CI's fresh clone of 5772dc4 met
		// this failure once, before the SyncWAL above existed).
		var newest uint64
		for name := range info.Lengths {
			if _, num, ok := manifest.ParseFilename(name); ok {
				newest = max(newest, uint64(num))
			}
		}
		names, err := fs.List(dbDir)
		if err != nil {
			t.Fatal(err)
		}
		rotated := false
		for _, name := range names {
			if ft, num, ok := manifest.ParseFilename(name); ok && ft == manifest.FileTypeLog && uint64(num) > newest {
				rotated = true
			}
		}
		if !rotated {
			t.Fatalf("no linked WAL grew past its length %v and the source wrote no newer WAL: the writer should have appended to the live one", info.Lengths)
		}
		t.Logf("no linked WAL grew past its length %v: the source's WAL rotated at the cut", info.Lengths)
	}
	return out
}
