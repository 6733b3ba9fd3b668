package iters

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// dbModel is the expected behaviour of a DBIter over the visible pairs vis:
// pos is -1 after running off the start, len(vis) after running off the end.
type dbModel struct {
	vis        []kv
	pos        int
	positioned bool
}

func (m *dbModel) valid() bool { return m.positioned && m.pos >= 0 && m.pos < len(m.vis) }

func (m *dbModel) seekGE(k string) bool {
	m.positioned = true
	m.pos = sort.Search(len(m.vis), func(i int) bool { return m.vis[i].k >= k })
	return m.valid()
}

func (m *dbModel) seekLT(k string) bool {
	m.positioned = true
	m.pos = sort.Search(len(m.vis), func(i int) bool { return m.vis[i].k >= k }) - 1
	return m.valid()
}

func (m *dbModel) first() bool { m.positioned, m.pos = true, 0; return m.valid() }

func (m *dbModel) last() bool { m.positioned, m.pos = true, len(m.vis)-1; return m.valid() }

func (m *dbModel) next() bool {
	if m.positioned && m.pos < len(m.vis) {
		m.pos++
	}
	return m.valid()
}

func (m *dbModel) prev() bool {
	if m.positioned && m.pos >= 0 {
		m.pos--
	}
	return m.valid()
}

// buildStack builds DBIter -> MergingIter -> (slice iterators + LevelIter)
// over es; openCount tracks open level files.
func buildStack(t *testing.T, rng *rand.Rand, es []entry, opts DBIterOptions, openCount *int) *DBIter {
	nChildren := 1 + rng.IntN(4)
	parts := make([][]entry, nChildren+1)
	for _, e := range es {
		c := rng.IntN(nChildren + 1)
		parts[c] = append(parts[c], e)
	}
	var children []base.InternalIterator
	for _, p := range parts[:nChildren] {
		children = append(children, sliceIterOf(p))
	}
	// The last part goes to a level, with the DBIter's bounds.
	children = append(children, openLevel(t, genLevel(rng, parts[nChildren]), opts.Lower, opts.Upper, openCount))
	rng.Shuffle(len(children), func(i, j int) { children[i], children[j] = children[j], children[i] })
	return NewDBIter(NewMergingIter(children...), opts)
}

func TestDBIterRandomized(t *testing.T) {
	forEachSeed(t, func(t *testing.T, rng *rand.Rand) {
		es, tombs, maxSeq := genData(rng, true)
		snap := base.SeqNum(rng.IntN(int(maxSeq) + 2))
		if rng.IntN(5) == 0 {
			snap = base.MaxSeqNum
		}
		lower, upper := randBounds(rng)
		opts := DBIterOptions{SeqNum: snap, Lower: lower, Upper: upper, Merger: concatMerger{}}
		if len(tombs) > 0 {
			opts.RangeDels = naiveCovering(tombs)
		}
		vis := oracle(es, tombs, snap, lower, upper)
		var openCount int

		// Full forward and reverse scans.
		d := buildStack(t, rng, es, opts, &openCount)
		var fwd, rev []kv
		for ok := d.First(); ok; ok = d.Next() {
			fwd = append(fwd, kv{string(d.Key()), string(d.Value())})
		}
		if err := d.Error(); err != nil {
			t.Fatal(err)
		}
		for ok := d.Last(); ok; ok = d.Prev() {
			rev = append(rev, kv{string(d.Key()), string(d.Value())})
		}
		if err := d.Error(); err != nil {
			t.Fatal(err)
		}
		slices.Reverse(rev)
		if !slices.Equal(fwd, vis) {
			t.Fatalf("snap=%d bounds=[%q,%q) forward:\n got %v\nwant %v\nentries %v\ntombs %v", snap, lower, upper, fwd, vis, es, tombs)
		}
		if !slices.Equal(rev, vis) {
			t.Fatalf("snap=%d bounds=[%q,%q) reverse:\n got %v\nwant %v\nentries %v\ntombs %v", snap, lower, upper, rev, vis, es, tombs)
		}

		// Random operations with direction switches.
		// The reverse scan left the iterator exhausted at the start.
		m := &dbModel{vis: vis, pos: -1, positioned: true}
		var trace []string
		for i := 0; i < 200; i++ {
			var op string
			var g, w bool
			switch r := rng.IntN(12); {
			case r == 0:
				op = "First"
				g, w = d.First(), m.first()
			case r == 1:
				op = "Last"
				g, w = d.Last(), m.last()
			case r == 2:
				k := randSeekKey(rng)
				op = fmt.Sprintf("SeekGE(%q)", k)
				g, w = d.SeekGE(k), m.seekGE(clampLower(string(k), lower))
			case r == 3:
				k := randSeekKey(rng)
				op = fmt.Sprintf("SeekLT(%q)", k)
				g, w = d.SeekLT(k), m.seekLT(string(k))
			case r < 8:
				op = "Next"
				g, w = d.Next(), m.next()
			default:
				op = "Prev"
				g, w = d.Prev(), m.prev()
			}
			trace = append(trace, op)
			if err := d.Error(); err != nil {
				t.Fatalf("ops %v: %v", trace, err)
			}
			if g != w || g != d.Valid() {
				t.Fatalf("snap=%d bounds=[%q,%q) ops %v: got %v (valid %v), want %v\nvis %v\nentries %v\ntombs %v",
					snap, lower, upper, trace, g, d.Valid(), w, vis, es, tombs)
			}
			if g {
				want := m.vis[m.pos]
				if string(d.Key()) != want.k || string(d.Value()) != want.v {
					t.Fatalf("snap=%d bounds=[%q,%q) ops %v: got %q=%q, want %q=%q\nvis %v\nentries %v\ntombs %v",
						snap, lower, upper, trace, d.Key(), d.Value(), want.k, want.v, vis, es, tombs)
				}
			} else if d.Key() != nil || d.Value() != nil {
				t.Fatalf("ops %v: Key/Value non-nil while invalid", trace)
			}
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if openCount != 0 {
			t.Fatalf("%d level files left open", openCount)
		}
	})
}

func clampLower(k string, lower []byte) string {
	if lower != nil && k < string(lower) {
		return string(lower)
	}
	return k
}

// TestDBIterErrorPropagation injects a failure into one child and checks
// that iteration stops with the error after a correct prefix.
func TestDBIterErrorPropagation(t *testing.T) {
	forEachSeed(t, func(t *testing.T, rng *rand.Rand) {
		es, tombs, maxSeq := genData(rng, false)
		snap := base.SeqNum(rng.IntN(int(maxSeq) + 2))
		opts := DBIterOptions{SeqNum: snap, Merger: concatMerger{}, RangeDels: naiveCovering(tombs)}
		vis := oracle(es, tombs, snap, nil, nil)
		parts := make([][]entry, 3)
		for _, e := range es {
			c := rng.IntN(3)
			parts[c] = append(parts[c], e)
		}
		bad := &trackingIter{InternalIterator: sliceIterOf(parts[2]), failAt: 1 + rng.IntN(40)}
		d := NewDBIter(NewMergingIter(sliceIterOf(parts[0]), sliceIterOf(parts[1]), bad), opts)
		reverse := rng.IntN(2) == 0
		var got []kv
		ok := d.First()
		if reverse {
			ok = d.Last()
		}
		for ; ok; ok = stepDir(d, reverse) {
			got = append(got, kv{string(d.Key()), string(d.Value())})
		}
		want := slices.Clone(vis)
		if reverse {
			slices.Reverse(want)
		}
		err := d.Error()
		switch {
		case err == nil:
			if !slices.Equal(got, want) {
				t.Fatalf("no error but got %v, want %v", got, want)
			}
		case !errors.Is(err, errInjected):
			t.Fatalf("error = %v, want injected", err)
		default:
			if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
				t.Fatalf("before the error got %v, want a prefix of %v", got, want)
			}
			if d.Valid() || d.First() || d.Next() || d.SeekLT([]byte("z")) || d.Key() != nil {
				t.Fatal("error is not sticky")
			}
		}
		if cerr := d.Close(); !errors.Is(cerr, err) {
			t.Fatalf("Close = %v, want %v", cerr, err)
		}
	})
}

func stepDir(d *DBIter, reverse bool) bool {
	if reverse {
		return d.Prev()
	}
	return d.Next()
}

func TestDBIterMergeErrors(t *testing.T) {
	es := []entry{
		{base.MakeInternalKey([]byte("a"), 1, base.KindSet), []byte("x")},
		{base.MakeInternalKey([]byte("b"), 3, base.KindMerge), []byte("m3")},
		{base.MakeInternalKey([]byte("b"), 2, base.KindSet), []byte("s2")},
	}
	for _, tc := range []struct {
		name   string
		merger base.Merger
		want   error
	}{
		{"no-merger", nil, ErrNoMerger},
		{"failing", failingMerger{}, errMergeFailed},
	} {
		for _, reverse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/reverse=%v", tc.name, reverse), func(t *testing.T) {
				d := NewDBIter(sliceIterOf(es), DBIterOptions{SeqNum: 10, Merger: tc.merger})
				var keys []string
				ok := d.First()
				if reverse {
					ok = d.Last()
				}
				for ; ok; ok = stepDir(d, reverse) {
					keys = append(keys, string(d.Key()))
				}
				if !errors.Is(d.Error(), tc.want) {
					t.Fatalf("error = %v, want %v", d.Error(), tc.want)
				}
				if !strings.Contains(d.Error().Error(), "b") {
					t.Fatalf("error %q does not name the key", d.Error())
				}
				if !reverse && !slices.Equal(keys, []string{"a"}) || reverse && len(keys) != 0 {
					t.Fatalf("keys before the error: %v", keys)
				}
				_ = d.Close()
			})
		}
	}
	// A snapshot below the merge does not need a merger.
	d := NewDBIter(sliceIterOf(es), DBIterOptions{SeqNum: 2})
	var keys []string
	for ok := d.Last(); ok; ok = d.Prev() {
		keys = append(keys, string(d.Key())+"="+string(d.Value()))
	}
	if d.Error() != nil || !slices.Equal(keys, []string{"b=s2", "a=x"}) {
		t.Fatalf("keys %v err %v", keys, d.Error())
	}
}

func TestDBIterUnknownKind(t *testing.T) {
	es := []entry{
		{base.MakeInternalKey([]byte("a"), 1, base.KindSet), []byte("x")},
		{base.MakeInternalKey([]byte("b"), 2, base.KindLogData), []byte("?")},
	}
	for _, reverse := range []bool{false, true} {
		d := NewDBIter(sliceIterOf(es), DBIterOptions{SeqNum: 10})
		ok := d.First()
		if reverse {
			ok = d.Last()
		}
		for ; ok; ok = stepDir(d, reverse) {
		}
		if !errors.Is(d.Error(), base.ErrCorruption) {
			t.Fatalf("reverse=%v: error = %v, want corruption", reverse, d.Error())
		}
	}
	if d := NewDBIter(nil, DBIterOptions{}); d.First() || d.Error() == nil || d.Close() == nil {
		t.Fatal("want an error for a nil internal iterator")
	}
}

func TestDBIterAllocs(t *testing.T) {
	children, _ := benchChildren(4, 1000)
	// Add older versions so that version skipping is exercised.
	older, _ := benchChildren(2, 1000)
	d := NewDBIter(NewMergingIter(append(children, older...)...), DBIterOptions{SeqNum: base.MaxSeqNum})
	k500 := []byte("key00000500")
	allocs := testing.AllocsPerRun(10, func() {
		d.First()
		for i := 0; i < 100; i++ {
			d.Next()
		}
		for i := 0; i < 50; i++ {
			d.Prev()
		}
		for i := 0; i < 10; i++ {
			d.Next()
			d.Prev()
		}
		d.SeekGE(k500)
		d.Prev()
		d.SeekLT(k500)
		d.Next()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per run, want 0", allocs)
	}
	if s := d.Stats(); s.Nexts == 0 || s.Prevs == 0 || s.Seeks == 0 {
		t.Fatalf("stats not counted: %+v", s)
	}
}
