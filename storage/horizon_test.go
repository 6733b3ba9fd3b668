package storage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// horizonOracle holds every write a DB took, to read any key at any
// sequence number the slow and obvious way.
type horizonOracle struct {
	points map[string][]horizonVersion // per key, oldest first
	ranges []horizonRange
}

type horizonVersion struct {
	seq   SeqNum
	value []byte // nil: a deletion
}

type horizonRange struct {
	start, end string
	seq        SeqNum
}

// get returns key's value at seq and whether it was live.
func (o *horizonOracle) get(key string, seq SeqNum) ([]byte, bool) {
	var v *horizonVersion
	for i := range o.points[key] {
		if o.points[key][i].seq <= seq {
			v = &o.points[key][i]
		}
	}
	for _, r := range o.ranges {
		if r.seq <= seq && r.start <= key && key < r.end && (v == nil || r.seq > v.seq) {
			return nil, false
		}
	}
	if v == nil || v.value == nil {
		return nil, false
	}
	return v.value, true
}

// TestHistoryHorizonModel writes random sets, deletes and range deletions
// to a DB keeping a history horizon, with small memtables, a small WAL
// archive (so the horizon moves as archived WALs are pruned), explicit
// flushes, full compactions and a reopen, and checks after every few
// hundred writes that GetAt at every sequence number from the horizon's
// reach (H-1) to the last one reads what the oracle of all versions says,
// that reads below it fail, and that the horizon only moves forward.
func TestHistoryHorizonModel(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { testHistoryHorizonModel(t, seed, horizonWindow{}) })
	}
}

// TestHistoryWindowModel is TestHistoryHorizonModel with the horizon
// bounded by a window (Options.HistoryWindow on a fake clock that moves
// 10 ms per write, or HistoryWindowBytes) instead of the WAL archive, which
// is large: the window moves the horizon, sampled every 25 writes and by
// the DB's own timer; after the writes, the clock passes the window on the
// idle DB and the horizon must reach one past the last write.
func TestHistoryWindowModel(t *testing.T) {
	for _, c := range []struct {
		name string
		seed uint64
		w    horizonWindow
	}{
		{"time2s", 1, horizonWindow{time: 2 * time.Second}},
		{"time500ms", 2, horizonWindow{time: 500 * time.Millisecond}},
		{"bytes64KiB", 3, horizonWindow{bytes: 64 << 10}},
		{"both", 4, horizonWindow{time: 3 * time.Second, bytes: 96 << 10}},
	} {
		t.Run(c.name, func(t *testing.T) { testHistoryHorizonModel(t, c.seed, c.w) })
	}
}

// horizonWindow configures testHistoryHorizonModel's history window; zero
// bounds the horizon by a small WAL archive alone.
type horizonWindow struct {
	time  time.Duration
	bytes int64
}

func testHistoryHorizonModel(t *testing.T, seed uint64, w horizonWindow) {
	rng := rand.New(rand.NewPCG(seed, 7))
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	opts.HistoryHorizon = true
	opts.WALArchiveMaxBytes = 96 << 10
	windowed := w.time > 0 || w.bytes > 0
	var clock atomic.Int64 // fake nanoseconds
	if windowed {
		opts.WALArchiveMaxBytes = 256 << 20
		opts.HistoryWindow, opts.HistoryWindowBytes = w.time, w.bytes
		opts.now = func() time.Time { return time.Unix(0, clock.Load()) }
	}
	d := apiMustOpen(t, "db", opts)
	defer func() { apiMustClose(t, d) }()
	sample := func() {
		d.mu.Lock()
		d.sampleHistoryLocked()
		d.mu.Unlock()
	}

	o := &horizonOracle{points: map[string][]horizonVersion{}}
	const nKeys = 40
	key := func(i int) string { return fmt.Sprintf("k%03d", i) }
	var lastH SeqNum
	var checks, compactions, verified int
	check := func() {
		t.Helper()
		h := d.HistoryHorizon()
		if h < lastH {
			t.Fatalf("horizon moved back from %d to %d", lastH, h)
		}
		lastH = h
		last := d.LastSeq()
		from := max(h, 1) - 1
		for i := range nKeys {
			k := key(i)
			for s := from; s <= last; s++ {
				got, err := d.GetAt([]byte(k), s)
				want, ok := o.get(k, s)
				switch {
				case errors.Is(err, ErrHistoryUnavailable) && d.HistoryHorizon() > s+1:
					// Background flushes pruned the archive meanwhile.
					continue
				case err != nil && !errors.Is(err, ErrNotFound):
					t.Fatalf("GetAt(%s, %d) with horizon %d: %v", k, s, h, err)
				case ok != (err == nil) || string(got) != string(want):
					t.Fatalf("GetAt(%s, %d) with horizon %d, last %d: got %q (%v), want %q (live %v)", k, s, h, last, got, err, want, ok)
				}
				verified++
			}
			if from > 0 {
				if _, err := d.GetAt([]byte(k), from-1); !errors.Is(err, ErrHistoryUnavailable) {
					t.Fatalf("GetAt(%s, %d) below the horizon %d: %v, want ErrHistoryUnavailable", k, from-1, h, err)
				}
			}
		}
		// Every batch from the horizon on is still in the WAL.
		it, err := d.UpdatesSince(max(h, 1))
		if err == nil {
			_ = it.Close()
		} else {
			// A WAL deleted meanwhile moves the horizon in the same hold of
			// d.mu: wait for it.
			d.mu.Lock()
			moved := d.HistoryHorizon() > h
			d.mu.Unlock()
			if !errors.Is(err, ErrUpdatesUnavailable) || !moved {
				t.Fatalf("UpdatesSince(horizon %d): %v", h, err)
			}
		}
		checks++
	}

	const n = 3000
	for i := range n {
		b := d.NewBatch()
		switch r := rng.IntN(100); {
		case r < 70:
			k := key(rng.IntN(nKeys))
			v := fmt.Appendf(nil, "%s@%d:%s", k, i, make([]byte, 100+rng.IntN(400)))
			b.Set([]byte(k), v)
			if err := d.Apply(b, NoSync); err != nil {
				t.Fatal(err)
			}
			o.points[k] = append(o.points[k], horizonVersion{b.SeqNum(), v})
		case r < 93:
			k := key(rng.IntN(nKeys))
			b.Delete([]byte(k))
			if err := d.Apply(b, NoSync); err != nil {
				t.Fatal(err)
			}
			o.points[k] = append(o.points[k], horizonVersion{seq: b.SeqNum()})
		default:
			lo := rng.IntN(nKeys)
			hi := lo + 1 + rng.IntN(6)
			b.DeleteRange([]byte(key(lo)), []byte(key(hi)))
			if err := d.Apply(b, NoSync); err != nil {
				t.Fatal(err)
			}
			o.ranges = append(o.ranges, horizonRange{key(lo), key(hi), b.SeqNum()})
		}
		if windowed {
			clock.Add(int64(10 * time.Millisecond))
			if i%25 == 0 {
				sample()
			}
		}
		switch r := rng.IntN(1000); {
		case r < 10:
			if err := d.Flush(); err != nil {
				t.Fatal(err)
			}
		case r < 14:
			if err := d.CompactRange(nil, nil); err != nil {
				t.Fatal(err)
			}
			compactions++
		}
		if i == n/2 {
			apiMustClose(t, d)
			d = apiMustOpen(t, "db", opts)
			if h := d.HistoryHorizon(); h < lastH {
				t.Fatalf("horizon after reopen %d, before %d", h, lastH)
			}
		}
		if i%200 == 199 {
			check()
		}
	}
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	check()
	if windowed {
		// Idle: once the window has passed the first sample after the last
		// write (the DB's timer takes one within a second), nothing before
		// it is kept.
		sample()
		if w.time > 0 {
			clock.Add(int64(w.time))
		}
		sample()
		if w.time > 0 && d.HistoryHorizon() != d.LastSeq()+1 {
			t.Fatalf("horizon %d on a DB idle for the window, last seqnum %d", d.HistoryHorizon(), d.LastSeq())
		}
		if err := d.CompactRange(nil, nil); err != nil {
			t.Fatal(err)
		}
		check()
		// A reopen starts no lower, though its WALs reach back further.
		apiMustClose(t, d)
		d = apiMustOpen(t, "db", opts)
		if h := d.HistoryHorizon(); h < lastH {
			t.Fatalf("horizon after the last reopen %d, before %d", h, lastH)
		}
		check()
	}
	// The horizon must have moved far enough for compactions to have met
	// versions on both sides of it, or the test proves little.
	if lastH < n/4 || compactions == 0 {
		t.Fatalf("horizon %d after %d writes and %d full compactions: the WAL archive was not pruned", lastH, n, compactions)
	}
	if verified < 100*nKeys {
		t.Fatalf("only %d reads verified", verified)
	}
	t.Logf("%d checks, %d reads verified, final horizon %d of %d", checks, verified, lastH, d.LastSeq())
}

// TestHistoryHorizonOff checks that a DB without the option keeps no
// horizon and refuses GetAt.
func TestHistoryHorizonOff(t *testing.T) {
	d := apiMustOpen(t, "db", apiSmallOptions(vfs.NewMem()))
	defer apiMustClose(t, d)
	if err := d.Set([]byte("a"), []byte("1"), NoSync); err != nil {
		t.Fatal(err)
	}
	if h := d.HistoryHorizon(); h != 0 {
		t.Fatalf("HistoryHorizon = %d without the option", h)
	}
	if _, err := d.GetAt([]byte("a"), d.LastSeq()); !errors.Is(err, ErrHistoryUnavailable) {
		t.Fatalf("GetAt without the option: %v, want ErrHistoryUnavailable", err)
	}
}

// TestHistoryHorizonDeleteFilesInRange checks that DeleteFilesInRange
// removes nothing that a read within the horizon can still see.
func TestHistoryHorizonDeleteFilesInRange(t *testing.T) {
	opts := apiSmallOptions(vfs.NewMem())
	opts.HistoryHorizon = true
	d := apiMustOpen(t, "db", opts)
	defer apiMustClose(t, d)
	for i := range 100 {
		if err := d.Set(fmt.Appendf(nil, "k%03d", i), []byte("v"), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	before := d.LastSeq()
	b := d.NewBatch()
	b.DeleteRange([]byte("k"), []byte("l"))
	if err := d.Apply(b, NoSync); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.DeleteFilesInRange([]byte("k"), []byte("l"), b.SeqNum()); !errors.Is(err, ErrOlderSnapshot) {
		t.Fatalf("DeleteFilesInRange within the horizon (%d): %v, want ErrOlderSnapshot", d.HistoryHorizon(), err)
	}
	if v, err := d.GetAt([]byte("k050"), before); err != nil || string(v) != "v" {
		t.Fatalf("GetAt before the range deletion: %q, %v", v, err)
	}
	// Giving up the history before the deletion lets the DB drop the
	// files (the DeleteRange scheduled it, and the refusal asked for the
	// same reclaim, which is kept once), and reads before it fail.
	if m := d.Metrics(); m.HorizonReclaimsPending != 1 || m.Levels[0].Files == 0 {
		t.Fatalf("before advancing: %d reclaims pending, %d L0 files", m.HorizonReclaimsPending, m.Levels[0].Files)
	}
	d.AdvanceHistoryHorizon(d.LastSeq() + 1)
	if h := d.HistoryHorizon(); h != d.LastSeq()+1 {
		t.Fatalf("horizon %d after AdvanceHistoryHorizon(%d)", h, d.LastSeq()+1)
	}
	waitReclaims(d)
	if n := sstBytes(d); n != 0 {
		t.Fatalf("%d SST bytes left after the horizon passed the range deletion", n)
	}
	if n, _, err := d.DeleteFilesInRange([]byte("k"), []byte("l"), b.SeqNum()); err != nil || n != 0 {
		t.Fatalf("DeleteFilesInRange after the DB dropped the files: %d files, %v", n, err)
	}
	if _, err := d.GetAt([]byte("k050"), before); !errors.Is(err, ErrHistoryUnavailable) {
		t.Fatalf("GetAt before an advanced horizon: %v, want ErrHistoryUnavailable", err)
	}
	d.AdvanceHistoryHorizon(1) // never back
	if h := d.HistoryHorizon(); h != d.LastSeq()+1 {
		t.Fatalf("horizon moved back to %d", h)
	}
}
