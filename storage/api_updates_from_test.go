package storage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// apiCollectFrom returns every batch UpdatesFrom(pos) yields and the
// iterator's final Position, checking on the way that the batches are
// numbered from pos.NextSeq() on in increasing order and that Position
// follows each batch returned.
func apiCollectFrom(t testing.TB, d *DB, pos UpdatesPosition) ([]*Batch, UpdatesPosition, error) {
	t.Helper()
	it, err := d.UpdatesFrom(pos)
	if err != nil {
		return nil, pos, err
	}
	var out []*Batch
	next := pos.NextSeq()
	for it.Next() {
		b := it.Batch()
		if b.SeqNum() < next {
			t.Errorf("UpdatesFrom(%+v): batch %d below the expected next seq %d", pos, b.SeqNum(), next)
		}
		next = b.SeqNum() + b.seqSpan()
		if p := it.Position(); p.NextSeq() != next || p.walNum == 0 {
			t.Errorf("UpdatesFrom(%+v): after batch %d Position is %+v, want next seq %d", pos, b.SeqNum(), p, next)
		}
		out = append(out, b)
	}
	err = it.Error()
	end := it.Position()
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	return out, end, err
}

// apiAfter returns the batches of log numbered at or after seq.
func apiAfter(log []apiLoggedBatch, seq SeqNum) []apiLoggedBatch {
	i := slices.IndexFunc(log, func(lb apiLoggedBatch) bool { return lb.seq >= seq })
	if i < 0 {
		return nil
	}
	return log[i:]
}

// apiCheckBatches checks that got equals want, batch by batch.
func apiCheckBatches(t testing.TB, what string, got []*Batch, want []apiLoggedBatch) {
	t.Helper()
	if len(got) != len(want) {
		first := func() string {
			if len(got) == 0 {
				return "none"
			}
			return fmt.Sprint(got[0].SeqNum())
		}
		t.Fatalf("%s: %d batches (first %s), want %d", what, len(got), first(), len(want))
	}
	for i := range got {
		if err := apiBatchesEqual(got[i], want[i]); err != nil {
			t.Fatalf("%s, batch %d: %v", what, i, err)
		}
	}
}

// apiTailerBatch returns a random batch for the tailer test: mostly
// apiRandomBatch (which has LogData records now and then), sometimes a
// LogData-only batch, sometimes one with values large enough to span WAL
// blocks.
func apiTailerBatch(rng *rand.Rand) *Batch {
	switch q := rng.IntN(100); {
	case q < 5:
		b := NewBatch()
		for n := 1 + rng.IntN(3); n > 0; n-- {
			b.LogData(fmt.Appendf(nil, "only-log-%d", rng.Uint64()))
		}
		return b
	case q < 10:
		b := apiRandomBatch(rng, 5000)
		v := make([]byte, 20<<10+rng.IntN(80<<10))
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		b.Set(fmt.Appendf(nil, "k%06d", rng.IntN(5000)), v)
		b.LogData(fmt.Appendf(nil, "big-%d", len(v)))
		return b
	default:
		return apiRandomBatch(rng, 5000)
	}
}

// TestAPIUpdatesFromTailer: a writer applies random batches (LogData ones,
// ones spanning WAL blocks) and now and then forces a WAL rotation, while a
// tailer, woken after every write, continues with
// UpdatesFrom(it.Position()), sometimes abandoning an iterator half-read.
// The tailer sees every batch exactly once, in sequence order, as written.
func TestAPIUpdatesFromTailer(t *testing.T) {
	opts := apiSmallOptions(vfs.NewMem())
	d := apiMustOpen(t, "db", opts)
	defer func() { _ = d.Close() }()

	const n = 1500
	var (
		mu  sync.Mutex
		log []apiLoggedBatch
	)
	wake := make(chan struct{}, 1)
	writerDone := make(chan struct{})
	var writerErr, tailerErr error
	var got []*Batch
	walsSeen := map[uint64]bool{}
	var rounds, partial int
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // writer
		defer wg.Done()
		defer close(writerDone)
		rng := rand.New(rand.NewPCG(21, 22))
		for i := 0; i < n; i++ {
			b := apiTailerBatch(rng)
			if err := d.Apply(b, NoSync); err != nil {
				writerErr = fmt.Errorf("apply %d: %w", i, err)
				return
			}
			mu.Lock()
			log = append(log, apiLoggedBatch{seq: b.SeqNum(), count: b.Count(), repr: slices.Clone(b.Repr())})
			mu.Unlock()
			select {
			case wake <- struct{}{}:
			default:
			}
			if rng.IntN(4) == 0 {
				time.Sleep(50 * time.Microsecond) // lets the tailer interleave
			}
			if rng.IntN(150) == 0 {
				if err := d.Flush(); err != nil { // rotates the WAL
					writerErr = fmt.Errorf("flush after %d: %w", i, err)
					return
				}
			}
		}
	}()
	go func() { // tailer
		defer wg.Done()
		rng := rand.New(rand.NewPCG(23, 24))
		var pos UpdatesPosition
		next := SeqNum(1)
		finished := false
		for {
			select {
			case <-wake:
			case <-writerDone:
				finished = true // everything written is visible now
			}
			it, err := d.UpdatesFrom(pos)
			if err != nil {
				tailerErr = fmt.Errorf("UpdatesFrom(%+v): %w", pos, err)
				return
			}
			rounds++
			stopAfter := -1
			if !finished && rng.IntN(8) == 0 {
				stopAfter = rng.IntN(3) // abandon the iterator early
			}
			k := 0
			for k != stopAfter && it.Next() {
				b := it.Batch()
				if b.SeqNum() < next {
					tailerErr = fmt.Errorf("batch %d after batches up to %d (duplicate or out of order)", b.SeqNum(), next-1)
					_ = it.Close()
					return
				}
				next = b.SeqNum() + b.seqSpan()
				got = append(got, b)
				k++
			}
			if k == stopAfter {
				partial++
			}
			if err := it.Error(); err != nil {
				tailerErr = fmt.Errorf("iterating from %+v: %w", pos, err)
				_ = it.Close()
				return
			}
			pos = it.Position()
			walsSeen[pos.walNum] = true
			if pos.NextSeq() != next && k > 0 {
				tailerErr = fmt.Errorf("Position().NextSeq() = %d after batches up to %d", pos.NextSeq(), next-1)
			}
			if err := it.Close(); err != nil {
				tailerErr = fmt.Errorf("close: %w", err)
				return
			}
			if tailerErr != nil {
				return
			}
			if finished && k == 0 {
				return
			}
		}
	}()
	wg.Wait()
	if writerErr != nil {
		t.Fatal(writerErr)
	}
	if tailerErr != nil {
		t.Fatal(tailerErr)
	}
	apiCheckBatches(t, "tailer", got, log)
	if len(walsSeen) < 4 {
		t.Fatalf("the tailer's positions were in only %d WAL files: rotation not exercised", len(walsSeen))
	}
	t.Logf("%d batches in %d rounds (%d abandoned early) over %d WAL files", len(got), rounds, partial, len(walsSeen))
}

// TestAPIUpdatesFromPosition checks Position at the edges: the zero
// position, an iterator that read a batch committed after it was created
// (the position stays before that batch), one abandoned half-way, one that
// returned nothing, and one that read past the end of a WAL into a newer,
// empty one (the position moves to the newer file).
func TestAPIUpdatesFromPosition(t *testing.T) {
	d := apiMustOpen(t, "db", apiSmallOptions(vfs.NewMem()))
	defer func() { _ = d.Close() }()
	rng := rand.New(rand.NewPCG(31, 32))

	var zero UpdatesPosition
	if zero.NextSeq() != 1 {
		t.Fatalf("zero position: NextSeq %d, want 1", zero.NextSeq())
	}
	got, pos, err := apiCollectFrom(t, d, zero)
	if err != nil || len(got) != 0 || pos.NextSeq() != 1 {
		t.Fatalf("empty DB: UpdatesFrom(zero) = %d batches, end %+v, %v", len(got), pos, err)
	}

	log := apiWriteLogged(t, d, rng, 10)
	// UpdatesFrom(zero) is UpdatesSince(1).
	got, _, err = apiCollectFrom(t, d, zero)
	if err != nil {
		t.Fatal(err)
	}
	apiCheckBatches(t, "UpdatesFrom(zero)", got, log)

	// Batches committed after the iterator was created are read (they are
	// in the same WAL) but not returned, and not passed by the position.
	it, err := d.UpdatesSince(1)
	if err != nil {
		t.Fatal(err)
	}
	more := apiWriteLogged(t, d, rng, 5)
	n := 0
	for it.Next() {
		n++
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	if n != len(log) {
		t.Fatalf("iterator returned %d batches, want %d", n, len(log))
	}
	if it.Next() {
		t.Fatal("Next true after it returned false")
	}
	pos = it.Position()
	_ = it.Close()
	if p := it.Position(); p != pos {
		t.Fatalf("Position changed by Close: %+v then %+v", pos, p)
	}
	lb := log[len(log)-1]
	if want := lb.seq + SeqNum(max(lb.count, 1)); pos.NextSeq() != want {
		t.Fatalf("Position().NextSeq() = %d, want %d", pos.NextSeq(), want)
	}
	got, end, err := apiCollectFrom(t, d, pos)
	if err != nil {
		t.Fatal(err)
	}
	apiCheckBatches(t, "after the limit", got, more)
	log = append(log, more...)

	// Nothing new: the iterator returns nothing and keeps the position.
	got, again, err := apiCollectFrom(t, d, end)
	if err != nil || len(got) != 0 || again != end {
		t.Fatalf("up to date: %d batches, position %+v (was %+v), %v", len(got), again, end, err)
	}

	// Abandoned after three batches: the rest follows.
	it, err = d.UpdatesSince(1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if !it.Next() {
			t.Fatalf("Next %d: false (%v)", i, it.Error())
		}
	}
	pos = it.Position()
	_ = it.Close()
	got, _, err = apiCollectFrom(t, d, pos)
	if err != nil {
		t.Fatal(err)
	}
	apiCheckBatches(t, "after 3 batches", got, log[3:])

	// Past the end of a WAL into a newer, empty one: a batch written with
	// DisableWAL makes UpdatesFrom read the WALs though they have nothing
	// to return.
	if err := d.Flush(); err != nil { // end is now at the end of an old WAL
		t.Fatal(err)
	}
	unlogged := NewBatch()
	unlogged.Set([]byte("k-unlogged"), []byte("v"))
	if err := d.Apply(unlogged, WriteOptions{DisableWAL: true}); err != nil {
		t.Fatal(err)
	}
	got, moved, err := apiCollectFrom(t, d, end)
	if err != nil || len(got) != 0 {
		t.Fatalf("after an unlogged batch: %d batches, %v", len(got), err)
	}
	wals, err := d.WALFiles()
	if err != nil {
		t.Fatal(err)
	}
	newest := wals[len(wals)-1].Num
	if moved.walNum != newest || moved.offset != 0 || moved.NextSeq() != end.NextSeq() {
		t.Fatalf("position %+v after reading past the end of WAL %d, want the start of WAL %d, next seq %d",
			moved, end.walNum, newest, end.NextSeq())
	}
	more = apiWriteLogged(t, d, rng, 4)
	got, _, err = apiCollectFrom(t, d, moved)
	if err != nil {
		t.Fatal(err)
	}
	apiCheckBatches(t, "after the unlogged batch", got, more)
}

// TestAPIUpdatesFromReadsOnlyTheRest: continuing from a position in a large
// WAL opens only that WAL and reads only the blocks after the position,
// where UpdatesSince opens every WAL and rereads the file from its start.
func TestAPIUpdatesFromReadsOnlyTheRest(t *testing.T) {
	var counting atomic.Bool
	var opens, reads atomic.Int64
	inj := errorfs.InjectorFunc(func(op errorfs.Op, path string) error {
		if !counting.Load() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		switch op {
		case errorfs.OpOpen:
			opens.Add(1)
		case errorfs.OpRead:
			reads.Add(1)
		}
		return nil
	})
	opts := apiSmallOptions(errorfs.Wrap(vfs.NewMem(), inj))
	opts.MemTableSize = 16 << 20 // one WAL for all the writes below
	opts.MemTableInitialSize = 16 << 20
	d := apiMustOpen(t, "db", opts)
	defer func() { _ = d.Close() }()
	rng := rand.New(rand.NewPCG(41, 42))
	apiWriteLogged(t, d, rng, 200)
	if err := d.Flush(); err != nil { // an archived WAL before the live one
		t.Fatal(err)
	}
	apiWriteLogged(t, d, rng, 4000) // about 1 MB
	_, pos, err := apiCollectFrom(t, d, UpdatesPosition{})
	if err != nil {
		t.Fatal(err)
	}
	wals, err := d.WALFiles()
	if err != nil {
		t.Fatal(err)
	}
	if w := wals[len(wals)-1]; len(wals) < 2 || w.Num != pos.walNum || pos.offset < 512<<10 {
		t.Fatalf("position %+v is not near the end of a large live WAL (WALs: %+v)", pos, wals)
	}
	more := apiWriteLogged(t, d, rng, 3)

	measure := func(f func()) (int64, int64) {
		opens.Store(0)
		reads.Store(0)
		counting.Store(true)
		f()
		counting.Store(false)
		return opens.Load(), reads.Load()
	}
	var got []*Batch
	o, r := measure(func() {
		got, _, err = apiCollectFrom(t, d, pos)
	})
	if err != nil {
		t.Fatal(err)
	}
	apiCheckBatches(t, "continuation", got, more)
	if o != 1 || r > 4 {
		t.Fatalf("continuing from a position: %d WAL opens and %d reads, want 1 open and a read or two", o, r)
	}
	o2, r2 := measure(func() {
		got, err = apiCollectUpdates(t, d, pos.NextSeq())
	})
	if err != nil {
		t.Fatal(err)
	}
	apiCheckBatches(t, "UpdatesSince", got, more)
	if r2 < 20*r {
		t.Fatalf("UpdatesSince made %d reads, the continuation %d: the test does not show the difference", r2, r)
	}
	t.Logf("continuation: %d opens, %d reads; UpdatesSince: %d opens, %d reads", o, r, o2, r2)
}

// TestAPIUpdatesFromDeletedWAL: once the WAL a position is in has been
// deleted (archive pruned by size or age, or archiving disabled), UpdatesFrom
// fails like UpdatesSince(pos.NextSeq()): with an *UpdatesUnavailableError
// matching ErrUpdatesUnavailable.
func TestAPIUpdatesFromDeletedWAL(t *testing.T) {
	cases := []struct {
		name string
		mod  func(o *Options)
	}{
		{"archive-max-bytes", func(o *Options) { o.WALArchiveMaxBytes = 100 << 10 }},
		{"archive-disabled", func(o *Options) { o.WALArchiveMaxBytes = -1 }},
		{"archive-ttl", func(o *Options) { o.WALArchiveTTL = time.Millisecond }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := apiSmallOptions(vfs.NewMem())
			tc.mod(opts)
			d := apiMustOpen(t, "db", opts)
			defer func() { _ = d.Close() }()
			rng := rand.New(rand.NewPCG(51, 52))
			log := apiWriteLogged(t, d, rng, 40)
			// A position in the middle of the live WAL; it works now.
			it, err := d.UpdatesSince(1)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 20; i++ {
				if !it.Next() {
					t.Fatalf("Next %d: false (%v)", i, it.Error())
				}
			}
			pos := it.Position()
			_ = it.Close()
			got, _, err := apiCollectFrom(t, d, pos)
			if err != nil {
				t.Fatal(err)
			}
			apiCheckBatches(t, "before the WAL is deleted", got, log[20:])

			for round := 0; round < 4; round++ {
				apiWriteLogged(t, d, rng, 800)
				if err := d.Flush(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * time.Millisecond) // lets the TTL expire
			}
			apiWriteLogged(t, d, rng, 50)
			wals, err := d.WALFiles()
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range wals {
				if w.Num == pos.walNum {
					t.Fatalf("WAL %s of the position still exists", w.Name)
				}
			}
			_, _, err = apiCollectFrom(t, d, pos)
			if !errors.Is(err, ErrUpdatesUnavailable) {
				t.Fatalf("UpdatesFrom a deleted WAL: %v, want ErrUpdatesUnavailable", err)
			}
			var ue *UpdatesUnavailableError
			if !errors.As(err, &ue) {
				t.Fatalf("error %T is not an *UpdatesUnavailableError", err)
			}
			if ue.Requested != pos.NextSeq() || ue.Earliest <= pos.NextSeq() {
				t.Fatalf("Requested %d, Earliest %d; want %d and later", ue.Requested, ue.Earliest, pos.NextSeq())
			}
		})
	}
}

// TestAPIUpdatesFromAcrossReopen: positions taken before a Close and Open
// (at the zero position, inside old WALs, inside the last WAL, at the very
// end) continue after the reopen with exactly the batches after them, or,
// once their WAL is gone, fail with ErrUpdatesUnavailable: never a
// duplicate or a gap. A tailer keeps going across two reopens.
func TestAPIUpdatesFromAcrossReopen(t *testing.T) {
	cases := []struct {
		name string
		mod  func(o *Options)
	}{
		{"archive", func(o *Options) {}},
		{"archive-disabled", func(o *Options) { o.WALArchiveMaxBytes = -1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := apiSmallOptions(vfs.NewMem())
			tc.mod(opts)
			d := apiMustOpen(t, "db", opts)
			defer func() { _ = d.Close() }()
			rng := rand.New(rand.NewPCG(61, 62))
			// With the archive, the log spans many WALs; without, UpdatesSince(1)
			// must still be served, so it fits in the live WAL.
			n := 1200
			if tc.name == "archive-disabled" {
				n = 120
			}
			log := apiWriteLogged(t, d, rng, n)

			// Positions after k batches, for various k; the last after all.
			ks := []int{0, 1, n / 5, n / 2, n - 30, n - 1, n}
			positions := map[int]UpdatesPosition{0: {}}
			it, err := d.UpdatesFrom(UpdatesPosition{})
			if err != nil {
				t.Fatal(err)
			}
			for k := 1; it.Next(); k++ {
				if slices.Contains(ks, k) {
					positions[k] = it.Position()
				}
			}
			if err := it.Error(); err != nil {
				t.Fatal(err)
			}
			_ = it.Close()
			if len(positions) != len(ks) {
				t.Fatalf("took %d positions, want %d", len(positions), len(ks))
			}
			tail := positions[len(log)]

			for reopen := 0; reopen < 2; reopen++ {
				if err := d.Close(); err != nil {
					t.Fatal(err)
				}
				d = apiMustOpen(t, "db", opts)
				more := apiWriteLogged(t, d, rng, 100)
				log = append(log, more...)

				// The tailer continues.
				got, end, err := apiCollectFrom(t, d, tail)
				if err != nil {
					t.Fatalf("reopen %d: tailer at %+v: %v", reopen, tail, err)
				}
				apiCheckBatches(t, fmt.Sprintf("reopen %d: tailer", reopen), got, more)
				tail = end

				unavailable := 0
				for _, k := range ks {
					pos := positions[k]
					got, _, err := apiCollectFrom(t, d, pos)
					if err != nil {
						if !errors.Is(err, ErrUpdatesUnavailable) {
							t.Fatalf("reopen %d, position after %d batches: %v", reopen, k, err)
						}
						if tc.name == "archive" {
							t.Fatalf("reopen %d, position after %d batches: %v with the archive on", reopen, k, err)
						}
						unavailable++
						continue
					}
					apiCheckBatches(t, fmt.Sprintf("reopen %d, position after %d batches", reopen, k), got, apiAfter(log, pos.NextSeq()))
				}
				// Without the archive, the WALs before the reopen are gone.
				if tc.name == "archive-disabled" && unavailable < len(ks)-1 {
					t.Fatalf("reopen %d: %d of %d old positions unavailable with archiving disabled", reopen, unavailable, len(ks))
				}
			}
		})
	}
}

// TestAPIUpdatesFromAfterLostTail: a tailer that read writes which a crash
// then lost (they were never synced) holds a position past the end of its
// WAL. Once the recovered DB has reused those sequence numbers, UpdatesFrom
// reports ErrUpdatesUnavailable rather than skip the new batches.
func TestAPIUpdatesFromAfterLostTail(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := apiSmallOptions(fs)
	opts.MemTableSize = 4 << 20 // no rotation: nothing but Sync syncs the WAL
	d := apiMustOpen(t, "db", opts)
	defer func() { _ = d.Close() }()
	rng := rand.New(rand.NewPCG(71, 72))
	durable := apiWriteLogged(t, d, rng, 50)
	synced := NewBatch()
	synced.Set([]byte("k-synced"), []byte("v"))
	if err := d.Apply(synced, Sync); err != nil { // makes the above durable
		t.Fatal(err)
	}
	durable = append(durable, apiLoggedBatch{seq: synced.SeqNum(), count: synced.Count(), repr: slices.Clone(synced.Repr())})
	apiWriteLogged(t, d, rng, 50) // NoSync: lost in the crash
	_, pos, err := apiCollectFrom(t, d, UpdatesPosition{})
	if err != nil {
		t.Fatal(err)
	}

	opts2 := apiSmallOptions(fs.CrashClone())
	opts2.MemTableSize = opts.MemTableSize
	d2 := apiMustOpen(t, "db", opts2)
	defer func() { _ = d2.Close() }()
	got, _, err := apiCollectFrom(t, d2, UpdatesPosition{})
	if err != nil {
		t.Fatal(err)
	}
	apiCheckBatches(t, "after the crash", got, durable)

	// Until the sequence numbers are reused there is nothing to return.
	if got, _, err := apiCollectFrom(t, d2, pos); err != nil || len(got) != 0 {
		t.Fatalf("before reuse: %d batches, %v", len(got), err)
	}
	apiWriteLogged(t, d2, rng, 80)
	_, _, err = apiCollectFrom(t, d2, pos)
	if !errors.Is(err, ErrUpdatesUnavailable) {
		t.Fatalf("position past the recovered end of its WAL: %v, want ErrUpdatesUnavailable", err)
	}
}
