package storage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// windowTestDB opens a DB keeping a history horizon bounded by window on
// the returned fake clock (nanoseconds, starting at 0).
func windowTestDB(t *testing.T, window time.Duration, windowBytes int64) (*DB, *Options, *atomic.Int64) {
	t.Helper()
	clock := new(atomic.Int64)
	opts := apiSmallOptions(vfs.NewMem())
	opts.HistoryHorizon = true
	opts.HistoryWindow, opts.HistoryWindowBytes = window, windowBytes
	opts.now = func() time.Time { return time.Unix(0, clock.Load()) }
	return apiMustOpen(t, "db", opts), opts, clock
}

// sampleHistory takes a history-window sample as the DB's timer does.
func sampleHistory(d *DB) {
	d.mu.Lock()
	d.sampleHistoryLocked()
	d.mu.Unlock()
}

// waitReclaims waits until no reclaim of deleted spans runs.
func waitReclaims(d *DB) {
	d.mu.Lock()
	for d.reclaimRunning {
		d.cond.Wait()
	}
	d.mu.Unlock()
}

// sstBytes returns the size of every SST in d's current version.
func sstBytes(d *DB) uint64 {
	m := d.Metrics()
	var n uint64
	for _, l := range m.Levels {
		n += l.Bytes
	}
	return n
}

// writeRandomValues sets keys k0000.. (n of them) to incompressible values
// of size bytes, round times over.
func writeRandomValues(t *testing.T, d *DB, rng *rand.Rand, n, size, rounds int, each func(i int)) {
	t.Helper()
	v := make([]byte, size)
	for r := range rounds {
		for i := range n {
			for j := range v {
				v[j] = byte(rng.Uint32())
			}
			if err := d.Set(fmt.Appendf(nil, "k%015d", i), v, NoSync); err != nil {
				t.Fatal(err)
			}
			if each != nil {
				each(r*n + i)
			}
		}
	}
}

// TestHistoryWindowOptions: a negative window, or a window without
// HistoryHorizon, does not open.
func TestHistoryWindowOptions(t *testing.T) {
	for _, c := range []struct {
		name   string
		set    func(o *Options)
		phrase string
	}{
		{"negative time", func(o *Options) { o.HistoryHorizon, o.HistoryWindow = true, -time.Second }, "must not be negative"},
		{"negative bytes", func(o *Options) { o.HistoryHorizon, o.HistoryWindowBytes = true, -1 }, "must not be negative"},
		{"no horizon", func(o *Options) { o.HistoryWindow = time.Minute }, "set HistoryHorizon"},
	} {
		opts := apiSmallOptions(vfs.NewMem())
		c.set(opts)
		if d, err := Open("db", opts); err == nil || !strings.Contains(err.Error(), c.phrase) {
			if err == nil {
				apiMustClose(t, d)
			}
			t.Errorf("%s: Open: %v, want an error saying %q", c.name, err, c.phrase)
		}
	}
}

// TestHistoryWindowIdleTimer: on a DB nobody writes, the DB's own sampling
// timer moves the horizon to one past the last write once the window has
// passed, and reopening starts no lower (the MANIFEST records the horizon,
// while the WAL still holds every write).
func TestHistoryWindowIdleTimer(t *testing.T) {
	d, opts, clock := windowTestDB(t, time.Second, 0)
	for i := range 10 {
		if err := d.Set(fmt.Appendf(nil, "k%d", i), []byte("v"), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if h := d.HistoryHorizon(); h != 1 {
		t.Fatalf("horizon %d before any time passed, want 1", h)
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.HistoryHorizon() != d.LastSeq()+1 {
		if time.Now().After(deadline) {
			t.Fatalf("horizon %d after 10 s, last seqnum %d", d.HistoryHorizon(), d.LastSeq())
		}
		clock.Add(int64(500 * time.Millisecond))
		time.Sleep(100 * time.Millisecond)
	}
	h := d.HistoryHorizon()
	if _, err := d.GetAt([]byte("k3"), h-2); !errors.Is(err, ErrHistoryUnavailable) {
		t.Fatalf("GetAt below the horizon: %v", err)
	}
	apiMustClose(t, d)
	d = apiMustOpen(t, "db", opts)
	defer apiMustClose(t, d)
	if got := d.HistoryHorizon(); got < h {
		t.Fatalf("horizon after reopen %d, before %d", got, h)
	}
}

// historyTickOnce runs what the DB's timer does at a tick and returns
// how long the timer then waits, or -1 when it is not armed, and whether a
// write would wake it. It stops the DB's own timer first, so that the
// test's ticks are the only ones.
func historyTickOnce(d *DB) (time.Duration, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.historyTimer.Stop()
	wait, armed := d.historyTickLocked()
	if !armed {
		wait = -1
	}
	return wait, d.historyWake
}

// TestHistoryWindowTimerRestsWhenIdle: while a DB is written to its
// window's timer samples every historySampleEvery; once a tick finds no
// write it waits exactly until the next kept sample passes the window, and
// once no sample can move the horizon any more it is not armed at all,
// until a write wakes it. With a bytes window only, an idle DB's timer
// rests at once. (A process hosts thousands of DBs, most of them idle.)
func TestHistoryWindowTimerRestsWhenIdle(t *testing.T) {
	d, _, clock := windowTestDB(t, 10*time.Second, 0)
	defer apiMustClose(t, d)
	d.mu.Lock()
	d.historyTimer.Stop() // the test's ticks are the only ones
	d.mu.Unlock()
	set := func(k string) {
		t.Helper()
		if err := d.Set([]byte(k), []byte("v"), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	set("a")
	if wait, wake := historyTickOnce(d); wait != historySampleEvery || wake {
		t.Fatalf("tick after a write: wait %s, wake %v; want %s, false", wait, wake, historySampleEvery)
	}
	clock.Store(int64(time.Second))
	set("b")
	if wait, _ := historyTickOnce(d); wait != historySampleEvery {
		t.Fatalf("tick after a second write: wait %s", wait)
	}
	// No write since: the samples of open (t=0), of "a" (t=0) and of "b"
	// (t=1s) pass the 10-s window at 10 and 11 s.
	clock.Store(int64(2 * time.Second))
	if wait, wake := historyTickOnce(d); wait != 8*time.Second || !wake {
		t.Fatalf("idle tick at 2s: wait %s, wake %v; want 8s (the t=0 samples pass at 10s), true", wait, wake)
	}
	clock.Store(int64(10 * time.Second))
	if wait, _ := historyTickOnce(d); wait != time.Second {
		t.Fatalf("idle tick at 10s: wait %s, want 1s (the t=1s sample passes at 11s)", wait)
	}
	clock.Store(int64(11 * time.Second))
	if wait, wake := historyTickOnce(d); wait != -1 || !wake {
		t.Fatalf("idle tick at 11s: wait %s, wake %v; want not armed, woken by a write", wait, wake)
	}
	if h, last := d.HistoryHorizon(), d.LastSeq(); h != last+1 {
		t.Fatalf("horizon %d once every sample passed, last seqnum %d", h, last)
	}
	// A write wakes the resting timer: the commit rearms it.
	d.mu.Lock()
	d.historyWake = true
	d.mu.Unlock()
	set("c")
	d.mu.Lock()
	wake := d.historyWake
	d.mu.Unlock()
	if wake {
		t.Fatal("a write left the resting timer unwoken")
	}

	// A bytes window alone: no write, no wait.
	db, _, _ := windowTestDB(t, 0, 1<<20)
	defer apiMustClose(t, db)
	db.mu.Lock()
	db.historyTimer.Stop()
	db.mu.Unlock()
	if err := db.Set([]byte("a"), []byte("v"), NoSync); err != nil {
		t.Fatal(err)
	}
	historyTickOnce(db)
	if wait, wake := historyTickOnce(db); wait != -1 || !wake {
		t.Fatalf("bytes window, idle tick: wait %s, wake %v; want not armed", wait, wake)
	}
}

// TestHistoryWindowSamplesBounded: a long window keeps at most
// maxHistorySamples samples, and the horizon they give never passes the
// exact one (the first write after now-window) and lags it by little.
func TestHistoryWindowSamplesBounded(t *testing.T) {
	const window = 100 * time.Second
	d, _, clock := windowTestDB(t, window, 0)
	defer apiMustClose(t, d)
	for i := range 1000 {
		// Write i lands at i s, with sequence number i+1.
		clock.Store(int64(i) * int64(time.Second))
		if err := d.Set(fmt.Appendf(nil, "k%d", i), []byte("v"), NoSync); err != nil {
			t.Fatal(err)
		}
		clock.Store(int64(i)*int64(time.Second) + int64(time.Second/2))
		sampleHistory(d)
		d.mu.Lock()
		n := len(d.historySamples)
		d.mu.Unlock()
		if n > maxHistorySamples {
			t.Fatalf("%d samples kept", n)
		}
		// The first write after now-window is write i-99 (at i-99 s).
		exact := SeqNum(max(i-99, 0) + 1)
		h := d.HistoryHorizon()
		if h > exact || (i > 200 && h+10 < exact) {
			t.Fatalf("after write %d: horizon %d, exact %d", i, h, exact)
		}
	}
}

// TestHistoryWindowReclaimsDeleteRange: a DeleteRange applied while the
// window is on keeps the deleted data (reads before it see it) until the
// horizon passes it; then the DB drops the range's files and compacts it
// by itself, and the SST bytes come back.
func TestHistoryWindowReclaimsDeleteRange(t *testing.T) {
	d, _, clock := windowTestDB(t, 10*time.Second, 0)
	defer apiMustClose(t, d)
	rng := rand.New(rand.NewPCG(5, 5))
	writeRandomValues(t, d, rng, 2000, 256, 1, nil)
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	full := sstBytes(d)
	sampleHistory(d) // t=0: everything so far
	if err := d.DeleteRange([]byte("k"), []byte("l"), NoSync); err != nil {
		t.Fatal(err)
	}
	deletedAt := d.LastSeq()
	if m := d.Metrics(); m.HorizonReclaimsPending != 1 {
		t.Fatalf("%d reclaims pending after a DeleteRange, want 1", m.HorizonReclaimsPending)
	}
	clock.Store(int64(time.Second))
	sampleHistory(d) // t=1s: after the deletion
	for _, at := range []time.Duration{6 * time.Second, 10 * time.Second} {
		clock.Store(int64(at))
		sampleHistory(d)
		waitReclaims(d)
		if err := d.CompactRange(nil, nil); err != nil {
			t.Fatal(err)
		}
		if got := sstBytes(d); got < full*9/10 {
			t.Fatalf("at %s (horizon %d, deletion at %d): %d SST bytes of %d, want them kept", at, d.HistoryHorizon(), deletedAt, got, full)
		}
		if v, err := d.GetAt([]byte("k000000000001234"), deletedAt-1); err != nil || len(v) != 256 {
			t.Fatalf("GetAt before the deletion at %s: %d bytes, %v", at, len(v), err)
		}
	}
	clock.Store(int64(11 * time.Second))
	sampleHistory(d)
	if h := d.HistoryHorizon(); h <= deletedAt {
		t.Fatalf("horizon %d after the window, deletion at %d", h, deletedAt)
	}
	waitReclaims(d)
	m := d.Metrics()
	if got := sstBytes(d); got > full/20 {
		t.Fatalf("after the window: %d SST bytes of %d, want them reclaimed", got, full)
	}
	if m.HorizonReclaimsPending != 0 || m.HorizonReclaims != 1 {
		t.Fatalf("reclaims: %d pending, %d run; want 0 and 1", m.HorizonReclaimsPending, m.HorizonReclaims)
	}
	t.Logf("2000 keys x 256 B, all deleted by one DeleteRange: %d SST bytes kept within the window, %d after it", full, sstBytes(d))
}

// TestHistoryWindowCompactAfterHorizon: point deletions whose span the
// caller hands to CompactAfterHorizon get their space back once the
// horizon passes them, with no other write or compaction; without a
// horizon the compaction runs at once.
func TestHistoryWindowCompactAfterHorizon(t *testing.T) {
	d, _, clock := windowTestDB(t, 10*time.Second, 0)
	defer apiMustClose(t, d)
	rng := rand.New(rand.NewPCG(6, 6))
	writeRandomValues(t, d, rng, 2000, 256, 1, nil)
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	full := sstBytes(d)
	for i := range 1000 {
		if err := d.Delete(fmt.Appendf(nil, "k%015d", i), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	last := d.LastSeq()
	if err := d.CompactAfterHorizon([]byte("k000000000000000"), []byte("k000000000001000"), last); err != nil {
		t.Fatal(err)
	}
	sampleHistory(d) // t=0, after the deletions
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	kept := sstBytes(d)
	if kept < full*9/10 {
		t.Fatalf("within the window: %d SST bytes of %d, want the deleted versions kept", kept, full)
	}
	clock.Store(int64(10 * time.Second))
	sampleHistory(d)
	waitReclaims(d)
	got := sstBytes(d)
	if got > full*6/10 {
		t.Fatalf("after the window: %d SST bytes of %d, want about half", got, full)
	}
	if m := d.Metrics(); m.HorizonReclaims != 1 || m.HorizonReclaimsPending != 0 {
		t.Fatalf("reclaims: %d run, %d pending", m.HorizonReclaims, m.HorizonReclaimsPending)
	}
	t.Logf("2000 keys x 256 B, 1000 deleted: %d SST bytes before, %d within the window, %d after", full, kept, got)

	// Without a horizon: at once.
	opts := apiSmallOptions(vfs.NewMem())
	d2 := apiMustOpen(t, "db2", opts)
	defer apiMustClose(t, d2)
	writeRandomValues(t, d2, rng, 200, 256, 2, nil)
	if err := d2.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d2.CompactAfterHorizon(nil, nil, d2.LastSeq()); err != nil {
		t.Fatal(err)
	}
	waitReclaims(d2)
	if m := d2.Metrics(); m.HorizonReclaims != 1 || m.Levels[0].Files != 0 {
		t.Fatalf("without a horizon: %d reclaims run, %d L0 files", m.HorizonReclaims, m.Levels[0].Files)
	}
}

// TestHistoryWindowSpace measures the SST bytes a history window keeps:
// 500 keys of 16 bytes with 256-byte values written 20 times (each round of
// 500 writes takes 1 s of fake time, sampled every 50 writes), then a full
// compaction. go test -run TestHistoryWindowSpace -v ./storage/ prints the
// table (BENCHMARKS.md, "The history window").
func TestHistoryWindowSpace(t *testing.T) {
	type row struct {
		name        string
		horizon     bool
		window      time.Duration
		windowBytes int64
	}
	rows := []row{
		{"no horizon", false, 0, 0},
		{"horizon, WAL archive 256 MiB, no window", true, 0, 0},
		{"window 1 s", true, time.Second, 0},
		{"window 512 KiB", true, 0, 512 << 10},
		{"window 256 MiB", true, 0, 256 << 20},
	}
	sizes := map[string]uint64{}
	for _, r := range rows {
		clock := new(atomic.Int64)
		opts := apiSmallOptions(vfs.NewMem())
		opts.HistoryHorizon, opts.HistoryWindow, opts.HistoryWindowBytes = r.horizon, r.window, r.windowBytes
		opts.now = func() time.Time { return time.Unix(0, clock.Load()) }
		d := apiMustOpen(t, "db", opts)
		rng := rand.New(rand.NewPCG(8, 8))
		writeRandomValues(t, d, rng, 500, 256, 20, func(i int) {
			clock.Add(int64(time.Second / 500))
			if i%50 == 49 {
				sampleHistory(d)
			}
		})
		if err := d.CompactRange(nil, nil); err != nil {
			t.Fatal(err)
		}
		sizes[r.name] = sstBytes(d)
		t.Logf("%-42s %9d SST bytes (horizon %d of %d)", r.name, sizes[r.name], d.HistoryHorizon(), d.LastSeq())
		if r.window > 0 {
			sampleHistory(d)
			clock.Add(int64(r.window))
			sampleHistory(d)
			if err := d.CompactRange(nil, nil); err != nil {
				t.Fatal(err)
			}
			sizes[r.name+", idle"] = sstBytes(d)
			t.Logf("%-42s %9d SST bytes (horizon %d of %d)", r.name+", then idle 1 s", sizes[r.name+", idle"], d.HistoryHorizon(), d.LastSeq())
		}
		apiMustClose(t, d)
	}
	off, all := sizes["no horizon"], sizes["horizon, WAL archive 256 MiB, no window"]
	if !(off < sizes["window 1 s"] && sizes["window 1 s"] < all/4 && sizes["window 512 KiB"] < all/2 &&
		sizes["window 256 MiB"] == all && sizes["window 1 s, idle"] <= off*11/10) {
		t.Fatalf("sizes out of order: %v", sizes)
	}
}

// TestHistoryWindowCrash: after a crash (no clean close) the reopened DB's
// horizon is at least the one its last flush or compaction ran with (the
// MANIFEST recorded it), though its WALs alone would allow older reads,
// and every read it then allows at or above H-1 matches the oracle: the
// versions those flushes and compactions dropped are never read. It fails
// when recovery starts from the WALs' horizon instead.
func TestHistoryWindowCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	clock := new(atomic.Int64)
	opts := apiSmallOptions(fs)
	opts.HistoryHorizon, opts.HistoryWindow = true, time.Second
	opts.now = func() time.Time { return time.Unix(0, clock.Load()) }
	d := apiMustOpen(t, "db", opts)
	o := &horizonOracle{points: map[string][]horizonVersion{}}
	write := func(i int) {
		k := fmt.Sprintf("k%d", i%10)
		v := fmt.Appendf(nil, "%s@%d:%0200d", k, i, i)
		if err := d.Set([]byte(k), v, Sync); err != nil {
			t.Fatal(err)
		}
		o.points[k] = append(o.points[k], horizonVersion{d.LastSeq(), v})
		clock.Add(int64(time.Second / 100))
		if i%10 == 9 {
			sampleHistory(d)
		}
	}
	for i := range 1000 {
		write(i)
	}
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	compacted := d.HistoryHorizon()
	for i := 1000; i < 1500; i++ {
		write(i) // the horizon moves on, unrecorded until an edit
	}
	crashed := apiMustOpen(t, "db", withFS(opts, fs.CrashClone()))
	defer apiMustClose(t, crashed)
	h := crashed.HistoryHorizon()
	if h < compacted || compacted < 800 {
		t.Fatalf("horizon %d after the crash, the compaction ran at %d", h, compacted)
	}
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		for s := h - 1; s <= crashed.LastSeq(); s++ {
			got, err := crashed.GetAt([]byte(k), s)
			want, ok := o.get(k, s)
			if ok != (err == nil) || string(got) != string(want) {
				t.Fatalf("GetAt(%s, %d) after the crash, horizon %d: %.12q (%v), want %.12q", k, s, h, got, err, want)
			}
		}
	}
	apiMustClose(t, d)
}

// TestHistoryWindowReclaimsSurviveReopen: reclaims still waiting for the
// horizon survive a crash and a clean close. A CompactAfterHorizon
// request is in the MANIFEST when the call returns; a DeleteRange's is
// found again in the WAL when no edit recorded it before the crash. After
// the reopen the horizon passes them one window later, and the space comes
// back with no call but the DB's own.
func TestHistoryWindowReclaimsSurviveReopen(t *testing.T) {
	for _, crash := range []bool{true, false} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			clock := new(atomic.Int64)
			opts := apiSmallOptions(fs)
			opts.HistoryHorizon, opts.HistoryWindow = true, 10*time.Second
			opts.now = func() time.Time { return time.Unix(0, clock.Load()) }
			d := apiMustOpen(t, "db", opts)
			rng := rand.New(rand.NewPCG(7, 7))
			writeRandomValues(t, d, rng, 2000, 256, 1, nil)
			if err := d.CompactRange(nil, nil); err != nil {
				t.Fatal(err)
			}
			full := sstBytes(d)
			sampleHistory(d)
			for i := range 1000 {
				if err := d.Delete(fmt.Appendf(nil, "k%015d", i), NoSync); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.CompactAfterHorizon([]byte("k000000000000000"), []byte("k000000000001000"), d.LastSeq()); err != nil {
				t.Fatal(err)
			}
			if err := d.DeleteRange([]byte("k000000000001500"), []byte("l"), Sync); err != nil {
				t.Fatal(err)
			}
			if m := d.Metrics(); m.HorizonReclaimsPending != 2 {
				t.Fatalf("%d reclaims pending, want 2", m.HorizonReclaimsPending)
			}
			ropts := opts
			if crash {
				ropts = withFS(opts, fs.CrashClone())
			}
			apiMustClose(t, d)
			r := apiMustOpen(t, "db", ropts)
			if m := r.Metrics(); m.HorizonReclaimsPending != 2 || m.HorizonReclaims != 0 {
				t.Fatalf("after the reopen: %d reclaims pending, %d run; want 2 and 0", m.HorizonReclaimsPending, m.HorizonReclaims)
			}
			// The reopened DB's window counts from its open (t=0 of the
			// fake clock): its first sample passes at 10 s.
			clock.Add(int64(10 * time.Second))
			sampleHistory(r)
			waitReclaims(r)
			if got := sstBytes(r); got > full*4/10 {
				t.Fatalf("after the window: %d SST bytes of %d, want about a quarter", got, full)
			}
			if m := r.Metrics(); m.HorizonReclaimsPending != 0 {
				t.Fatalf("%d reclaims still pending", m.HorizonReclaimsPending)
			}
			// Done reclaims are gone from the MANIFEST too.
			apiMustClose(t, r)
			r = apiMustOpen(t, "db", ropts)
			defer apiMustClose(t, r)
			if m := r.Metrics(); m.HorizonReclaimsPending != 0 {
				t.Fatalf("after a second reopen: %d reclaims pending, want 0", m.HorizonReclaimsPending)
			}
		})
	}
}
