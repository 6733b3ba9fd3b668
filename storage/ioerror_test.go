package storage

// I/O error tests: faults injected with errorfs (ENOSPC, EIO on writes,
// syncs, creates and renames of WALs, SSTs, the MANIFEST and CURRENT) must
// surface as errors, put the DB in the background-error state (every later
// write refused, reads of existing data still served), and never cost an
// acknowledged write: reopening the same files without faults, or the state
// a crash right after the fault would leave (vfs.MemFS.CrashClone), recovers
// the oracle's state after some prefix of the batches that includes every
// write acknowledged as durable.

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// ioeOpts are small options so that flushes and compactions are quick.
func ioeOpts(fs vfs.FS) *Options {
	o := faultTestBaseOpts(fs)
	for i := range o.Levels {
		o.Levels[i].TargetFileSize = 16 << 10
		o.Levels[i].BlockSize = 1 << 10
	}
	return o
}

// ioeHarness runs a DB on a crash-simulating MemFS behind a fault toggle and
// keeps the oracle's history.
type ioeHarness struct {
	t   *testing.T
	mem *vfs.MemFS
	tog *errorfs.Toggle
	d   *DB
	// history[i] is the oracle after the first i acknowledged batches.
	history []oracle
	// synced is the number of batches made durable: acknowledged with Sync
	// or followed by a successful Flush.
	synced int
	// failed is the oracle after the acknowledged batches plus the batch
	// whose Apply failed (nil if none did): a failed batch may or may not
	// survive.
	failed   oracle
	n        int // records written, for keys and values
	valueLen int // extra bytes per value
}

// newIOEHarness opens a DB whose operations matched by pred fail with err
// while the harness's toggle is on.
func newIOEHarness(t *testing.T, pred errorfs.Predicate, err error) *ioeHarness {
	h := &ioeHarness{t: t, mem: vfs.NewCrashableMem(), history: []oracle{{}}}
	h.tog = errorfs.NewToggle(errorfs.Filter(pred, errorfs.FromIndex(0, err)))
	d, err := Open("db", ioeOpts(errorfs.Wrap(h.mem, h.tog)))
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	return h
}

func (h *ioeHarness) model() oracle { return h.history[len(h.history)-1] }

// write applies a batch of n records (sets, a merge, a delete, and now and
// then a range delete) and records the outcome.
func (h *ioeHarness) write(n int, opts WriteOptions) error {
	b := NewBatch()
	for i := 0; i < n; i++ {
		h.n++
		k := []byte(fmt.Sprintf("key%05d", (h.n*7919)%3000))
		switch h.n % 10 {
		case 7:
			b.Merge(k, []byte(fmt.Sprintf("m%d", h.n)))
		case 8:
			b.Delete(k)
		case 9:
			if h.n%50 == 9 {
				b.DeleteRange(k, append(k, 'z'))
				break
			}
			fallthrough
		default:
			b.Set(k, []byte(fmt.Sprintf("value-%d-%s", h.n, strings.Repeat("x", h.n%100+h.valueLen))))
		}
	}
	err := h.d.Apply(b, opts)
	next := h.model().clone()
	next.apply(b)
	if err != nil {
		h.failed = next
		return err
	}
	h.history = append(h.history, next)
	if opts.Sync {
		h.synced = len(h.history) - 1
	}
	return nil
}

// mustWrite writes count batches that must succeed.
func (h *ioeHarness) mustWrite(count, n int, opts WriteOptions) {
	h.t.Helper()
	for i := 0; i < count; i++ {
		if err := h.write(n, opts); err != nil {
			h.t.Fatal(err)
		}
	}
}

func (h *ioeHarness) mustFlush() {
	h.t.Helper()
	if err := h.d.Flush(); err != nil {
		h.t.Fatal(err)
	}
	h.synced = len(h.history) - 1
}

// ioeDump reads the whole DB with a forward scan, checking that a reverse
// scan and point gets agree.
func ioeDump(d *DB) (map[string]string, error) {
	it, err := d.NewIter(nil)
	if err != nil {
		return nil, err
	}
	got := map[string]string{}
	var keys []string
	for ok := it.First(); ok; ok = it.Next() {
		got[string(it.Key())] = string(it.Value())
		keys = append(keys, string(it.Key()))
	}
	n := len(keys)
	for ok := it.Last(); ok; ok = it.Prev() {
		n--
		if n < 0 || string(it.Key()) != keys[n] || string(it.Value()) != got[keys[n]] {
			_ = it.Close()
			return nil, fmt.Errorf("reverse scan disagrees with forward scan at %q", it.Key())
		}
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	if n != 0 {
		return nil, fmt.Errorf("reverse scan returned %d keys, forward %d", len(keys)-n, len(keys))
	}
	for _, k := range keys {
		v, err := d.Get([]byte(k))
		if err != nil || string(v) != got[k] {
			return nil, fmt.Errorf("Get(%s) = %q, %v; scan says %q", k, v, err, got[k])
		}
	}
	return got, nil
}

// ioeDiff describes how got differs from want.
func ioeDiff(got, want map[string]string) string {
	for k, w := range want {
		if g, ok := got[k]; !ok {
			return fmt.Sprintf("%s missing (want %.30q)", k, w)
		} else if g != w {
			return fmt.Sprintf("%s = %.30q, want %.30q", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			return fmt.Sprintf("%s = %.30q should not exist", k, g)
		}
	}
	return ""
}

// checkLive checks that the open DB serves exactly the acknowledged writes.
func (h *ioeHarness) checkLive() {
	h.t.Helper()
	got, err := ioeDump(h.d)
	if err != nil {
		h.t.Fatalf("reading after the fault: %v", err)
	}
	if m := ioeDiff(got, h.model()); m != "" {
		h.t.Fatalf("reading after the fault: %s", m)
	}
}

// checkRecovered opens the database in fs and checks that it holds the
// oracle's state after some prefix of at least min acknowledged batches (or
// after all of them plus the failed batch).
func (h *ioeHarness) checkRecovered(fs vfs.FS, min int, what string) {
	h.t.Helper()
	d, err := Open("db", ioeOpts(fs))
	if err != nil {
		h.t.Fatalf("%s: reopen: %v", what, err)
	}
	defer d.Close()
	got, err := ioeDump(d)
	if err != nil {
		h.t.Fatalf("%s: read: %v", what, err)
	}
	if h.failed != nil && maps.Equal(got, map[string]string(h.failed)) {
		return
	}
	for i := len(h.history) - 1; i >= min; i-- {
		if maps.Equal(got, map[string]string(h.history[i])) {
			return
		}
	}
	h.t.Fatalf("%s: recovered state is not the state after %d..%d acknowledged batches (vs all: %s)",
		what, min, len(h.history)-1, ioeDiff(got, h.model()))
}

// checkFailed runs the checks common to every fault: err is the fault
// (errors.Is cause), the DB is in the background-error state and refuses
// writes, reads still work, and both a crash right now and a clean close
// followed by a fault-free reopen keep at least the first min batches.
func (h *ioeHarness) checkFailed(err, cause error, minCrash, minReopen int) {
	h.t.Helper()
	if err == nil {
		h.t.Fatal("the fault did not surface as an error")
	}
	if !errors.Is(err, cause) {
		h.t.Fatalf("error %v does not match the injected %v", err, cause)
	}
	bg := h.d.Metrics().BackgroundError
	if bg == nil || !errors.Is(bg, cause) {
		h.t.Fatalf("background error is %v, want one wrapping %v", bg, cause)
	}
	crash := h.mem.CrashClone()
	h.tog.Disable()
	b := NewBatch()
	b.Set([]byte("after"), []byte("fault"))
	if err := h.d.Apply(b, Sync); err == nil {
		h.t.Fatal("write accepted after the background error")
	}
	if err := h.d.Flush(); err == nil {
		h.t.Fatal("flush accepted after the background error")
	}
	h.checkLive()
	_ = h.d.Close()
	h.checkRecovered(crash, minCrash, "crash after the fault")
	h.checkRecovered(h.mem, minReopen, "reopen after close")
}

// ioeFileOp matches operations op on files whose name contains part.
func ioeFileOp(part string, ops ...errorfs.Op) errorfs.Predicate {
	is := errorfs.Ops(ops...)
	return func(op errorfs.Op, path string) bool { return is(op, path) && strings.Contains(path, part) }
}

// ioeDirSync matches syncs of the database directory itself.
func ioeDirSync(op errorfs.Op, path string) bool { return op == errorfs.OpSync && path == "db" }

func TestIOErrorWAL(t *testing.T) {
	enospc := syscall.ENOSPC
	eio := syscall.EIO
	for _, c := range []struct {
		name  string
		pred  errorfs.Predicate
		err   error
		cause error
		sync  bool
	}{
		{"write-enospc-sync", ioeFileOp(".log", errorfs.OpWrite), errorfs.ErrENOSPC, enospc, true},
		{"write-enospc-nosync", ioeFileOp(".log", errorfs.OpWrite), errorfs.ErrENOSPC, enospc, false},
		{"write-eio-sync", ioeFileOp(".log", errorfs.OpWrite), errorfs.ErrEIO, eio, true},
		{"sync-eio", ioeFileOp(".log", errorfs.OpSync), errorfs.ErrEIO, eio, true},
		{"sync-enospc", ioeFileOp(".log", errorfs.OpSync), errorfs.ErrENOSPC, enospc, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newIOEHarness(t, c.pred, c.err)
			h.mustWrite(50, 3, Sync)
			h.mustFlush()
			h.mustWrite(50, 3, WriteOptions{Sync: c.sync})
			if c.sync {
				h.synced = len(h.history) - 1
			}
			h.tog.Enable()
			// A NoSync write may be acknowledged before the WAL write
			// fails in the background; the failure shows at a later write.
			var err error
			for i := 0; i < 1000 && err == nil; i++ {
				err = h.write(3, WriteOptions{Sync: c.sync})
				if err == nil && c.sync {
					t.Fatal("a synced write was acknowledged although its WAL I/O failed")
				}
			}
			if h.failed != nil {
				// The failed write must not be visible.
				h.checkLive()
			}
			h.checkFailed(err, c.cause, h.synced, h.synced)
		})
	}
}

func TestIOErrorFlush(t *testing.T) {
	for _, c := range []struct {
		name string
		pred errorfs.Predicate
	}{
		{"sst-create", ioeFileOp(".sst", errorfs.OpCreate)},
		{"sst-write", ioeFileOp(".sst", errorfs.OpWrite)},
		{"sst-sync", ioeFileOp(".sst", errorfs.OpSync)},
		{"dir-sync", ioeDirSync},
		{"manifest-write", ioeFileOp("MANIFEST", errorfs.OpWrite)},
		{"manifest-sync", ioeFileOp("MANIFEST", errorfs.OpSync)},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newIOEHarness(t, c.pred, errorfs.ErrEIO)
			h.mustWrite(100, 4, NoSync)
			h.mustFlush()
			h.mustWrite(100, 4, NoSync)
			h.tog.Enable()
			err := h.d.Flush()
			// Everything was acknowledged and the WAL is intact: a crash
			// keeps what the first flush made durable, a clean close keeps
			// everything.
			h.checkFailed(err, syscall.EIO, h.synced, len(h.history)-1)
		})
	}
}

func TestIOErrorCompaction(t *testing.T) {
	for _, c := range []struct {
		name string
		pred errorfs.Predicate
	}{
		{"sst-create", ioeFileOp(".sst", errorfs.OpCreate)},
		{"sst-write", ioeFileOp(".sst", errorfs.OpWrite)},
		{"sst-sync", ioeFileOp(".sst", errorfs.OpSync)},
		{"manifest-sync", ioeFileOp("MANIFEST", errorfs.OpSync)},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newIOEHarness(t, c.pred, errorfs.ErrENOSPC)
			for i := 0; i < 3; i++ {
				h.mustWrite(60, 4, NoSync)
				h.mustFlush()
			}
			if l0 := h.d.Metrics().Levels[0].Files; l0 < 3 {
				t.Fatalf("want at least 3 L0 files, have %d", l0)
			}
			h.tog.Enable()
			err := h.d.CompactRange(nil, nil)
			h.checkFailed(err, syscall.ENOSPC, h.synced, h.synced)
		})
	}
}

// TestIOErrorManifestRotation fails the switch of CURRENT to a new MANIFEST,
// both during a flush (with every edit rotating the MANIFEST) and during the
// rotation recovery does at open.
func TestIOErrorManifestRotation(t *testing.T) {
	saved := maxManifestSize
	maxManifestSize = 1
	defer func() { maxManifestSize = saved }()
	for _, c := range []struct {
		name string
		pred errorfs.Predicate
	}{
		{"current-rename", ioeFileOp("CURRENT", errorfs.OpRename)},
		{"current-temp-write", ioeFileOp(".dbtmp", errorfs.OpWrite)},
		{"new-manifest-create", ioeFileOp("MANIFEST", errorfs.OpCreate)},
		{"dir-sync", ioeDirSync},
	} {
		t.Run("flush/"+c.name, func(t *testing.T) {
			h := newIOEHarness(t, c.pred, errorfs.ErrEIO)
			h.mustWrite(80, 4, NoSync)
			h.mustFlush()
			h.mustWrite(80, 4, NoSync)
			h.tog.Enable()
			err := h.d.Flush()
			h.checkFailed(err, syscall.EIO, h.synced, len(h.history)-1)
		})
		t.Run("open/"+c.name, func(t *testing.T) {
			h := newIOEHarness(t, c.pred, errorfs.ErrEIO)
			h.mustWrite(80, 4, Sync)
			if err := h.d.Close(); err != nil {
				t.Fatal(err)
			}
			h.tog.Enable()
			d, err := Open("db", ioeOpts(errorfs.Wrap(h.mem, h.tog)))
			if err == nil {
				d.Close()
				t.Fatal("open succeeded although its MANIFEST rotation failed")
			}
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("open: %v, want the injected EIO", err)
			}
			crash := h.mem.CrashClone()
			h.checkRecovered(crash, len(h.history)-1, "crash after the failed open")
			h.checkRecovered(h.mem, len(h.history)-1, "reopen after the failed open")
		})
	}
}

// TestIOErrorNoDeletionAfterFailedEdit: a MANIFEST edit whose sync failed
// may still reach the disk. The files it names must not be deleted as
// obsolete afterwards (here when an iterator pinning an older version is
// closed), or a reopen finds an edit naming a missing SST and has already
// dropped the WAL the SST replaced.
func TestIOErrorNoDeletionAfterFailedEdit(t *testing.T) {
	h := newIOEHarness(t, ioeFileOp("MANIFEST", errorfs.OpSync), errorfs.ErrEIO)
	h.mustWrite(50, 4, NoSync)
	it, err := h.d.NewIter(nil) // pins the current version
	if err != nil {
		t.Fatal(err)
	}
	h.mustFlush()
	h.mustWrite(50, 4, NoSync)
	h.tog.Enable()
	err = h.d.Flush()
	if err == nil {
		t.Fatal("flush succeeded although its MANIFEST sync failed")
	}
	h.tog.Disable()
	_ = it.Close() // drops the last reference to the older version
	h.checkLive()
	_ = h.d.Close()
	h.checkRecovered(h.mem, len(h.history)-1, "reopen after close")
}

// TestIOErrorRandom runs a seeded workload with faults injected at random
// into a small fraction of write operations. After the first error surfaces
// it checks that writes are refused and reads still agree with the
// acknowledged writes, that a crash at that moment keeps every batch
// acknowledged as durable, and that a clean close and fault-free reopen
// does too; both recover the state after a prefix of the batches.
func TestIOErrorRandom(t *testing.T) {
	seeds := 24
	if testing.Short() {
		seeds = 6
	}
	fired := 0
	for seed := 1; seed <= seeds; seed++ {
		if ioeRandomRun(t, uint64(seed)) {
			fired++
		}
		if t.Failed() {
			t.Logf("replay: go test ./storage -run 'TestIOErrorRandom$' (seed %d)", seed)
			return
		}
	}
	t.Logf("%d of %d runs hit a fault", fired, seeds)
	if fired < seeds/2 {
		t.Errorf("only %d of %d runs hit a fault; raise the probability", fired, seeds)
	}
}

// ioeRandomRun runs one seed and reports whether a fault surfaced.
func ioeRandomRun(t *testing.T, seed uint64) bool {
	rng := rand.New(rand.NewPCG(seed, 0x10e))
	causes := []error{errorfs.ErrENOSPC, errorfs.ErrEIO}
	cause := causes[seed%2]
	var wrapOpts []errorfs.Option
	if seed%3 == 0 {
		wrapOpts = append(wrapOpts, errorfs.WithShortWrites(int64(seed)))
	}
	h := &ioeHarness{t: t, mem: vfs.NewCrashableMem(), history: []oracle{{}}}
	h.tog = errorfs.NewToggle(errorfs.Random(int64(seed), 0.004, cause, errorfs.WriteOps()))
	opts := ioeOpts(errorfs.Wrap(h.mem, h.tog, wrapOpts...))
	opts.L0CompactionTrigger = 2
	opts.LBaseMaxBytes = 64 << 10
	d, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	h.tog.Enable()
	what := fmt.Sprintf("seed %d", seed)
	var opErr error
	for i := 0; i < 600 && opErr == nil; i++ {
		switch p := rng.IntN(100); {
		case p < 85:
			sync := rng.IntN(4) == 0
			opErr = h.write(1+rng.IntN(8), WriteOptions{Sync: sync})
		case p < 95:
			if opErr = h.d.Flush(); opErr == nil {
				h.synced = len(h.history) - 1
			}
		default:
			opErr = h.d.CompactRange(nil, nil)
		}
	}
	if opErr == nil {
		// No fault surfaced in the foreground; a background one may have.
		h.tog.Disable()
		_ = h.d.Close()
		h.checkRecovered(h.mem, h.synced, what+": reopen without fault")
		return false
	}
	if !errorfs.IsInjected(opErr) {
		t.Fatalf("%s: error %v is not the injected fault", what, opErr)
	}
	if h.d.Metrics().BackgroundError == nil {
		t.Fatalf("%s: %v surfaced but the DB is not in the background-error state", what, opErr)
	}
	var crash *vfs.MemFS
	if seed%2 == 0 {
		crash = h.mem.CrashClone()
	} else {
		// Unsynced writes partly on disk as well.
		crash = h.mem.CrashClone(vfs.WithRandomTail(rand.New(rand.NewPCG(seed, 3))))
	}
	h.tog.Disable()
	failed := h.failed
	if err := h.write(1, Sync); err == nil {
		t.Fatalf("%s: write accepted after the background error", what)
	}
	h.failed = failed // a refused write never reaches the WAL
	h.checkLive()
	_ = h.d.Close()
	h.checkRecovered(crash, h.synced, what+": crash at the fault")
	h.checkRecovered(h.mem, h.synced, what+": reopen after close")
	return true
}

// TestIOErrorReads fails reads of SSTs at random: a read may fail, but it
// never returns a wrong value or reports an existing key missing, and the
// DB stays writable (read errors are not background errors).
func TestIOErrorReads(t *testing.T) {
	h := newIOEHarness(t, ioeFileOp(".sst", errorfs.OpRead, errorfs.OpOpen), errorfs.ErrEIO)
	for i := 0; i < 4; i++ {
		h.mustWrite(100, 4, NoSync)
		h.mustFlush()
	}
	if err := h.d.Close(); err != nil { // a cold cache for the reads below
		t.Fatal(err)
	}
	inj := errorfs.Random(1, 0.3, errorfs.ErrEIO, ioeFileOp(".sst", errorfs.OpRead, errorfs.OpOpen))
	d, err := Open("db", ioeOpts(errorfs.Wrap(h.mem, inj)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	want := h.model()
	var failed, served int
	for i := 0; i < 3000; i++ {
		k := fmt.Sprintf("key%05d", i)
		v, err := d.Get([]byte(k))
		w, ok := want[k]
		switch {
		case err != nil && !errors.Is(err, ErrNotFound):
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("Get(%s): %v, want the injected EIO", k, err)
			}
			failed++
		case err != nil && ok:
			t.Fatalf("Get(%s): not found, want %q", k, w)
		case err == nil && (!ok || string(v) != w):
			t.Fatalf("Get(%s) = %q, want %q (exists %v)", k, v, w, ok)
		default:
			served++
		}
	}
	for j := 0; j < 20; j++ {
		it, err := d.NewIter(nil)
		if err != nil {
			failed++
			continue
		}
		n := 0
		for ok := it.First(); ok; ok = it.Next() {
			k := string(it.Key())
			if string(it.Value()) != want[k] {
				t.Fatalf("scan: %s = %.20q, want %.20q", k, it.Value(), want[k])
			}
			n++
		}
		if err := it.Close(); err != nil {
			failed++
		} else if n != len(want) {
			t.Fatalf("scan returned %d keys without error, want %d", n, len(want))
		}
	}
	if failed == 0 || served == 0 {
		t.Fatalf("%d reads failed and %d were served; want both", failed, served)
	}
	if bg := d.Metrics().BackgroundError; bg != nil {
		t.Fatalf("read errors set the background error: %v", bg)
	}
}

// TestIOErrorRecoveryRead fails a read of the WAL during recovery, after
// its first block: Open must fail rather than take the unread rest of the
// log for a torn tail and drop acknowledged writes.
func TestIOErrorRecoveryRead(t *testing.T) {
	h := newIOEHarness(t, ioeFileOp(".log", errorfs.OpRead), errorfs.ErrEIO)
	h.valueLen = 400
	h.mustWrite(28, 4, Sync)
	if m := h.d.Metrics(); m.WALBytes < 34<<10 || m.MemTables != 1 {
		t.Fatalf("the WAL holds %d bytes; want more than one 32 KiB block", h.d.Metrics().WALBytes)
	}
	crash := h.mem.CrashClone()
	_ = h.d.Close()
	inj := errorfs.Filter(ioeFileOp(".log", errorfs.OpRead), errorfs.FromIndex(1, errorfs.ErrEIO))
	d, err := Open("db", ioeOpts(errorfs.Wrap(crash, inj)))
	if err == nil {
		got, _ := ioeDump(d)
		d.Close()
		t.Fatalf("open succeeded although reading the WAL failed (%d of %d keys): %s", len(got), len(h.model()), ioeDiff(got, h.model()))
	}
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("open: %v, want the injected EIO", err)
	}
	h.checkRecovered(crash, len(h.history)-1, "reopen without the fault")
}

// TestConcurrentSnapshotConsistency runs writers (batches with sets,
// deletes, range deletes and merges, each in its own key space), readers
// (snapshots and iterators, forward and backward, point gets) and loops of
// Flush and CompactRange at once. Every batch also records its writer's
// step number, so a consistent view shows each writer's state after exactly
// one of its steps: no newer than what had started when the view was taken,
// no older than what had been acknowledged, and identical for every read of
// the same view. Run it with -race.
func TestConcurrentSnapshotConsistency(t *testing.T) {
	const writers, readers, keysPerWriter = 3, 3, 300
	steps := 3000
	if testing.Short() {
		steps = 500
	}
	mem := vfs.NewMem()
	opts := ioeOpts(mem)
	opts.L0CompactionTrigger = 2
	opts.LBaseMaxBytes = 64 << 10
	d, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}

	type writerState struct {
		history []oracle // history[s]: the writer's keys after step s
		started atomic.Int64
		acked   atomic.Int64
	}
	ws := make([]*writerState, writers)
	for i := range ws {
		ws[i] = &writerState{history: make([]oracle, steps+1)}
		ws[i].history[0] = oracle{}
	}
	key := func(w, k int) []byte { return []byte(fmt.Sprintf("w%d-k%03d", w, k)) }

	var wg sync.WaitGroup
	var writersLeft atomic.Int32
	writersLeft.Store(writers)
	errc := make(chan error, 64)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer writersLeft.Add(-1)
			st := ws[w]
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for s := 1; s <= steps; s++ {
				b := NewBatch()
				b.Set([]byte(fmt.Sprintf("w%d-step", w)), []byte(fmt.Sprint(s)))
				for j := rng.IntN(4); j >= 0; j-- {
					k := rng.IntN(keysPerWriter)
					b.Set(key(w, k), []byte(fmt.Sprintf("%d.%d.%s", s, k, strings.Repeat("v", rng.IntN(300)))))
				}
				if rng.IntN(8) == 0 {
					b.Delete(key(w, rng.IntN(keysPerWriter)))
				}
				if rng.IntN(12) == 0 {
					a := rng.IntN(keysPerWriter - 1)
					b.DeleteRange(key(w, a), key(w, a+1+rng.IntN(10)))
				}
				switch {
				case s%50 == 0:
					b.Set([]byte(fmt.Sprintf("w%d-m", w)), []byte(fmt.Sprintf("reset%d", s)))
				case rng.IntN(4) == 0:
					b.Merge([]byte(fmt.Sprintf("w%d-m", w)), []byte(fmt.Sprint(s)))
				}
				next := st.history[s-1].clone()
				next.apply(b)
				st.history[s] = next
				st.started.Store(int64(s))
				if err := d.Apply(b, WriteOptions{Sync: rng.IntN(10) == 0}); err != nil {
					report(fmt.Errorf("writer %d step %d: %w", w, s, err))
					return
				}
				st.acked.Store(int64(s))
			}
		}()
	}

	// check verifies one view, read as the key/value pairs kvs (sorted),
	// taken after acked and before started were sampled.
	check := func(what string, kvs [][2]string, acked, started []int64) error {
		byWriter := make([]map[string]string, writers)
		for i := range byWriter {
			byWriter[i] = map[string]string{}
		}
		for i, kv := range kvs {
			if i > 0 && kvs[i-1][0] >= kv[0] {
				return fmt.Errorf("%s: keys out of order: %q then %q", what, kvs[i-1][0], kv[0])
			}
			var w int
			if _, err := fmt.Sscanf(kv[0], "w%d-", &w); err != nil || w < 0 || w >= writers {
				return fmt.Errorf("%s: unexpected key %q", what, kv[0])
			}
			byWriter[w][kv[0]] = kv[1]
		}
		for w, got := range byWriter {
			s := 0
			if v, ok := got[fmt.Sprintf("w%d-step", w)]; ok {
				fmt.Sscan(v, &s)
			}
			if int64(s) < acked[w] || int64(s) > started[w] {
				return fmt.Errorf("%s: writer %d at step %d, outside [acked %d, started %d]", what, w, s, acked[w], started[w])
			}
			if m := ioeDiff(got, ws[w].history[s]); m != "" {
				return fmt.Errorf("%s: writer %d at step %d: %s", what, w, s, m)
			}
		}
		return nil
	}
	sample := func(f func(st *writerState) int64) []int64 {
		out := make([]int64, writers)
		for i, st := range ws {
			out[i] = f(st)
		}
		return out
	}
	scan := func(it *Iterator, forward bool) ([][2]string, error) {
		var kvs [][2]string
		ok := it.First()
		if !forward {
			ok = it.Last()
		}
		for ok {
			kvs = append(kvs, [2]string{string(it.Key()), string(it.Value())})
			if forward {
				ok = it.Next()
			} else {
				ok = it.Prev()
			}
		}
		if !forward {
			slices.Reverse(kvs)
		}
		return kvs, it.Error()
	}

	var views atomic.Int64
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for n := 0; writersLeft.Load() > 0; n++ {
				views.Add(1)
				acked := sample(func(st *writerState) int64 { return st.acked.Load() })
				var snap *Snapshot
				var it *Iterator
				var err error
				useSnap := rng.IntN(2) == 0
				if useSnap {
					snap = d.NewSnapshot()
					it, err = snap.NewIter(nil)
				} else {
					it, err = d.NewIter(nil)
				}
				if err != nil {
					report(err)
					return
				}
				started := sample(func(st *writerState) int64 { return st.started.Load() })
				what := fmt.Sprintf("reader %d view %d (snapshot %v)", r, n, useSnap)
				first, err := scan(it, rng.IntN(2) == 0)
				if err == nil {
					err = check(what, first, acked, started)
				}
				if err == nil {
					// The same view again, the other way (and repositioned
					// with a seek): identical.
					again, err2 := scan(it, rng.IntN(2) == 0)
					if err = err2; err == nil && !slices.Equal(again, first) {
						err = fmt.Errorf("%s: second scan of the same view differs", what)
					}
				}
				if err == nil && len(first) > 0 {
					p := first[rng.IntN(len(first))]
					if !it.SeekGE([]byte(p[0])) || string(it.Key()) != p[0] || string(it.Value()) != p[1] {
						err = fmt.Errorf("%s: SeekGE(%s) disagrees with the scan", what, p[0])
					}
				}
				if cerr := it.Close(); err == nil {
					err = cerr
				}
				if err == nil && snap != nil {
					// Point reads through the snapshot, after more writes.
					for j := 0; j < 20 && err == nil; j++ {
						k := fmt.Sprintf("w%d-k%03d", rng.IntN(writers), rng.IntN(keysPerWriter))
						idx, found := slices.BinarySearchFunc(first, k, func(kv [2]string, k string) int { return strings.Compare(kv[0], k) })
						v, gerr := snap.Get([]byte(k))
						switch {
						case found && (gerr != nil || string(v) != first[idx][1]):
							err = fmt.Errorf("%s: snapshot Get(%s) = %.20q, %v; scan had %.20q", what, k, v, gerr, first[idx][1])
						case !found && !errors.Is(gerr, ErrNotFound):
							err = fmt.Errorf("%s: snapshot Get(%s) = %.20q, %v; scan had no such key", what, k, v, gerr)
						}
					}
				}
				if snap != nil {
					_ = snap.Close()
				}
				if err != nil {
					report(err)
					return
				}
			}
		}()
	}

	// Background churn: flushes and manual compactions in loops.
	wg.Add(2)
	go func() {
		defer wg.Done()
		for writersLeft.Load() > 0 {
			if err := d.Flush(); err != nil {
				report(fmt.Errorf("flush: %w", err))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(5, 5))
		for writersLeft.Load() > 0 {
			var lo, hi []byte
			if rng.IntN(2) == 0 {
				w := rng.IntN(writers)
				lo, hi = key(w, rng.IntN(keysPerWriter)), []byte(fmt.Sprintf("w%d-z", w))
			}
			if err := d.CompactRange(lo, hi); err != nil {
				report(fmt.Errorf("compact range: %w", err))
				return
			}
		}
	}()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if t.Failed() {
		_ = d.Close()
		return
	}
	m := d.Metrics()
	t.Logf("%d views checked; flushes %d, compactions %d, files per level %v", views.Load(), m.Flushes, m.Compactions, levelFiles(m))
	if m.Flushes == 0 || m.Compactions == 0 {
		t.Errorf("the run flushed %d and compacted %d times; it must do both", m.Flushes, m.Compactions)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Everything survives a reopen.
	d, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := ioeDump(d)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, st := range ws {
		maps.Copy(want, st.history[steps])
	}
	if m := ioeDiff(got, want); m != "" {
		t.Fatalf("after reopen: %s", m)
	}
}
