package storage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// apiWriteLogged applies n random batches to d and returns them as logged.
func apiWriteLogged(t *testing.T, d *DB, rng *rand.Rand, n int) []apiLoggedBatch {
	t.Helper()
	var out []apiLoggedBatch
	for i := 0; i < n; i++ {
		b := apiRandomBatch(rng, 5000)
		if i == n-1 {
			b.Set([]byte("k-last"), []byte("x")) // the last batch consumes a seqnum
		}
		if err := d.Apply(b, NoSync); err != nil {
			t.Fatal(err)
		}
		out = append(out, apiLoggedBatch{seq: b.SeqNum(), count: b.Count(), repr: slices.Clone(b.Repr())})
	}
	return out
}

// apiCheckUpdates checks that UpdatesSince(from) yields exactly want.
func apiCheckUpdates(t *testing.T, d *DB, from SeqNum, want []apiLoggedBatch) {
	t.Helper()
	got, err := apiCollectUpdates(t, d, from)
	if err != nil {
		t.Fatalf("UpdatesSince(%d): %v", from, err)
	}
	if len(got) != len(want) {
		j := 0
		var missing []SeqNum
		for i := range want {
			if j < len(got) && got[j].SeqNum() == want[i].seq {
				j++
				continue
			}
			missing = append(missing, want[i].seq)
		}
		if len(missing) > 0 {
			t.Logf("missing seqs: %d..%d (%d batches)", missing[0], missing[len(missing)-1], len(missing))
		}
		first := func(bs []*Batch) SeqNum {
			if len(bs) == 0 {
				return 0
			}
			return bs[0].SeqNum()
		}
		t.Fatalf("UpdatesSince(%d): %d batches (first seq %d), want %d", from, len(got), first(got), len(want))
	}
	for i := range got {
		if err := apiBatchesEqual(got[i], want[i]); err != nil {
			t.Fatalf("UpdatesSince(%d), batch %d: %v", from, i, err)
		}
	}
}

// apiSuffixFrom returns the batches UpdatesSince(seq) must return: those
// whose records end at or after seq (a batch containing seq included), and
// LogData-only batches numbered at or after seq.
func apiSuffixFrom(log []apiLoggedBatch, seq SeqNum) []apiLoggedBatch {
	for i, lb := range log {
		end := lb.seq
		if lb.count > 0 {
			end = lb.seq + SeqNum(lb.count) - 1
		}
		if end >= seq {
			return log[i:]
		}
	}
	return nil
}

// TestAPIUpdatesSinceAcrossRotationAndArchive: with a small memtable the WAL
// rotates many times and the old WALs move to the archive; UpdatesSince
// serves every batch from the archived and live files, from any start,
// also after a reopen.
func TestAPIUpdatesSinceAcrossRotationAndArchive(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	d := apiMustOpen(t, "db", opts)
	defer func() { _ = d.Close() }()

	// Fresh DB: nothing, and UpdatesSince(0) works.
	apiCheckUpdates(t, d, 0, nil)

	rng := rand.New(rand.NewPCG(3, 4))
	log := apiWriteLogged(t, d, rng, 3000)
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	wals, err := d.WALFiles()
	if err != nil {
		t.Fatal(err)
	}
	var archived, live int
	var oldestLiveFirst SeqNum
	for _, w := range wals {
		if w.Archived {
			archived++
			if !strings.Contains(w.Path, archiveDirName) {
				t.Errorf("archived WAL path %s is not under %s", w.Path, archiveDirName)
			}
			continue
		}
		live++
		if oldestLiveFirst == 0 {
			if s, ok, err := d.firstSeqOf(w); err != nil {
				t.Fatal(err)
			} else if ok {
				oldestLiveFirst = s
			}
		}
	}
	if archived < 3 {
		t.Fatalf("only %d archived WALs (%d live): rotation/archiving not exercised", archived, live)
	}
	if oldestLiveFirst != 0 && oldestLiveFirst <= log[0].seq {
		t.Fatalf("the oldest live WAL starts at %d: the first batches do not come from the archive", oldestLiveFirst)
	}
	t.Logf("%d archived, %d live WALs, %d batches, last seq %d", archived, live, len(log), log[len(log)-1].seq)

	lastSeq := log[len(log)-1].seq + SeqNum(log[len(log)-1].count) - 1
	apiCheckUpdates(t, d, 0, log)
	apiCheckUpdates(t, d, 1, log)
	for _, i := range []int{1, 17, 999, 1500, 2998, 2999} {
		apiCheckUpdates(t, d, log[i].seq, apiSuffixFrom(log, log[i].seq))
	}
	// A start inside a multi-record batch returns that batch first.
	for i, lb := range log {
		if lb.count >= 3 && i > 100 {
			apiCheckUpdates(t, d, lb.seq+1, log[i:])
			break
		}
	}
	apiCheckUpdates(t, d, lastSeq+1, nil)
	apiCheckUpdates(t, d, lastSeq+1000, nil)

	// The iterator ends at what was visible when it was created.
	it, err := d.UpdatesSince(lastSeq)
	if err != nil {
		t.Fatal(err)
	}
	more := apiWriteLogged(t, d, rng, 10)
	n := 0
	for it.Next() {
		n++
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	it.Close()
	if n != 1 {
		t.Fatalf("iterator created at seq %d yielded %d batches, want 1", lastSeq, n)
	}
	log = append(log, more...)

	// After a reopen, the pre-restart WALs (replayed, flushed and then
	// archived) still serve updates.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = apiMustOpen(t, "db", opts)
	apiCheckUpdates(t, d, 1, log)
	more = apiWriteLogged(t, d, rng, 200)
	log = append(log, more...)
	apiCheckUpdates(t, d, 1, log)
	apiCheckUpdates(t, d, more[0].seq, more)
}

// TestAPIUpdatesUnavailable: once the WAL holding a sequence number is gone
// (archive pruned by size or age, or archiving disabled), UpdatesSince fails
// with an error matching ErrUpdatesUnavailable whose Earliest is the first
// sequence number still served.
func TestAPIUpdatesUnavailable(t *testing.T) {
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
			fs := vfs.NewMem()
			opts := apiSmallOptions(fs)
			tc.mod(opts)
			d := apiMustOpen(t, "db", opts)
			defer d.Close()
			rng := rand.New(rand.NewPCG(5, 6))
			var log []apiLoggedBatch
			for round := 0; round < 4; round++ {
				log = append(log, apiWriteLogged(t, d, rng, 800)...)
				if err := d.Flush(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * time.Millisecond) // lets the TTL expire
			}
			more := apiWriteLogged(t, d, rng, 50) // in the live WAL
			log = append(log, more...)

			_, err := apiCollectUpdates(t, d, 1)
			if !errors.Is(err, ErrUpdatesUnavailable) {
				t.Fatalf("UpdatesSince(1): %v, want ErrUpdatesUnavailable", err)
			}
			var ue *UpdatesUnavailableError
			if !errors.As(err, &ue) {
				t.Fatalf("error %T is not an *UpdatesUnavailableError", err)
			}
			if ue.Requested != 1 {
				t.Errorf("Requested = %d, want 1", ue.Requested)
			}
			if ue.Earliest <= 1 || ue.Earliest > more[0].seq {
				t.Fatalf("Earliest = %d, want in (1, %d]", ue.Earliest, more[0].seq)
			}
			if !strings.Contains(err.Error(), fmt.Sprint(ue.Earliest)) {
				t.Errorf("message %q does not name the earliest seq %d", err, ue.Earliest)
			}
			// Earliest is a batch boundary and is served, completely.
			idx := slices.IndexFunc(log, func(lb apiLoggedBatch) bool { return lb.seq == ue.Earliest })
			if idx < 0 {
				t.Fatalf("Earliest %d is not the first seq of a batch", ue.Earliest)
			}
			apiCheckUpdates(t, d, ue.Earliest, log[idx:])
			if _, err := apiCollectUpdates(t, d, ue.Earliest-1); !errors.Is(err, ErrUpdatesUnavailable) {
				t.Fatalf("UpdatesSince(Earliest-1 = %d): %v, want ErrUpdatesUnavailable", ue.Earliest-1, err)
			}
			if wals, _ := d.WALFiles(); tc.name == "archive-disabled" {
				for _, w := range wals {
					if w.Archived {
						t.Errorf("archived WAL %s with archiving disabled", w.Name)
					}
				}
			}
			// Flush everything: with archiving disabled no WAL holds data.
			if err := d.Flush(); err != nil {
				t.Fatal(err)
			}
			lb := log[len(log)-1]
			last := lb.seq + SeqNum(lb.count) - 1
			_, err = apiCollectUpdates(t, d, last)
			switch tc.name {
			case "archive-disabled":
				if !errors.As(err, &ue) || ue.Earliest != 0 {
					t.Fatalf("all WALs gone: UpdatesSince(%d) = %v, want unavailable with Earliest 0", last, err)
				}
			case "archive-max-bytes":
				if err != nil {
					t.Fatalf("UpdatesSince(%d) after flush: %v", last, err)
				}
			}
			apiCheckUpdates(t, d, last+1, nil)
		})
	}
}

// TestAPIUpdatesTrailingLogDataOnlyBatch: a batch holding only LogData,
// when it is the last thing written, is still served by UpdatesSince (it
// was acknowledged by Apply), and it survives a reopen without its
// sequence position being reused.
func TestAPIUpdatesTrailingLogDataOnlyBatch(t *testing.T) {
	opts := apiSmallOptions(vfs.NewMem())
	d := apiMustOpen(t, "db", opts)
	defer func() { _ = d.Close() }()
	if err := d.Set([]byte("a"), []byte("1"), NoSync); err != nil {
		t.Fatal(err)
	}
	b := NewBatch()
	b.LogData([]byte("epoch-2"))
	if err := d.Apply(b, Sync); err != nil {
		t.Fatal(err)
	}
	got, err := apiCollectUpdates(t, d, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("UpdatesSince(1) returned %d batches, want 2 (the Set and the LogData-only batch)", len(got))
	}
	logSeq := got[1].SeqNum()
	if logSeq < got[0].SeqNum()+1 || logSeq != b.SeqNum() {
		t.Fatalf("LogData-only batch seq %d (Apply said %d), Set at %d", logSeq, b.SeqNum(), got[0].SeqNum())
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = apiMustOpen(t, "db", opts)
	if err := d.Set([]byte("b"), []byte("2"), NoSync); err != nil {
		t.Fatal(err)
	}
	got, err = apiCollectUpdates(t, d, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("after reopen UpdatesSince(1) returned %d batches, want 3", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i].SeqNum() <= got[i-1].SeqNum() {
			t.Fatalf("batch %d seq %d not after batch %d seq %d", i, got[i].SeqNum(), i-1, got[i-1].SeqNum())
		}
	}
}

// TestAPIUpdatesSinceRacesWithArchiving: UpdatesSince lists the WAL files
// while a flush may move a WAL from the DB directory to the archive. A WAL
// moved between the two directory listings must not be missed.
//
// The injector pauses UpdatesSince between its listings of the two
// directories, and the test archives a WAL meanwhile
// (by flushing): the deterministic form of a race that a replication
// tailer hits whenever it reads while the DB flushes.
func TestAPIUpdatesSinceRacesWithArchiving(t *testing.T) {
	mem := vfs.NewMem()
	var (
		mu     sync.Mutex
		armed  bool
		lists  int
		paused = make(chan struct{})
		resume = make(chan struct{})
	)
	// Once armed, the second directory listing (whichever directory
	// WALFiles lists second) waits until the test has archived a WAL.
	inj := errorfs.InjectorFunc(func(op errorfs.Op, path string) error {
		if op != errorfs.OpList {
			return nil
		}
		mu.Lock()
		if !armed {
			mu.Unlock()
			return nil
		}
		lists++
		if lists == 2 {
			armed = false
			mu.Unlock()
			close(paused)
			<-resume
			return nil
		}
		mu.Unlock()
		return nil
	})
	opts := apiSmallOptions(errorfs.Wrap(mem, inj))
	d := apiMustOpen(t, "db", opts)
	defer d.Close()

	rng := rand.New(rand.NewPCG(9, 9))
	apiWriteLogged(t, d, rng, 600)
	if err := d.Flush(); err != nil { // creates the archive directory
		t.Fatal(err)
	}
	later := apiWriteLogged(t, d, rng, 20) // only in the live WAL
	apiWaitIdle(t, d)

	mu.Lock()
	armed = true
	mu.Unlock()
	type result struct {
		got []*Batch
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := apiCollectUpdates(t, d, later[0].seq)
		done <- result{got, err}
	}()
	select {
	case <-paused:
	case r := <-done:
		t.Fatalf("UpdatesSince did not list two directories (err %v)", r.err)
	}
	// UpdatesSince has listed one directory; now the live WAL holding
	// later[0] is flushed and archived before it lists the other.
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	close(resume)
	r := <-done
	if r.err != nil {
		t.Fatalf("UpdatesSince(%d) racing with archiving: %v", later[0].seq, r.err)
	}
	if len(r.got) != len(later) {
		t.Fatalf("UpdatesSince(%d) racing with archiving returned %d batches, want %d", later[0].seq, len(r.got), len(later))
	}
	for i := range r.got {
		if err := apiBatchesEqual(r.got[i], later[i]); err != nil {
			t.Fatal(err)
		}
	}
}
