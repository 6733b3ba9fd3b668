package rangedel

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/shale-db/shale/storage/internal/base"
)

// alphabet returns every string over "abc" of length 0..3, sorted.
func alphabet() [][]byte {
	keys := [][]byte{{}}
	for l := 1; l <= 3; l++ {
		var gen func(prefix []byte)
		gen = func(prefix []byte) {
			if len(prefix) == l {
				keys = append(keys, slices.Clone(prefix))
				return
			}
			for _, c := range []byte("abc") {
				gen(append(prefix, c))
			}
		}
		gen(nil)
	}
	slices.SortFunc(keys, bytes.Compare)
	return keys
}

// naiveMax is the reference: scan every raw tombstone.
func naiveMax(ts []Tombstone, key []byte, snap base.SeqNum) base.SeqNum {
	var m base.SeqNum
	for _, t := range ts {
		if bytes.Compare(t.Start, key) <= 0 && bytes.Compare(key, t.End) < 0 && t.Seq <= snap && t.Seq > m {
			m = t.Seq
		}
	}
	return m
}

func randTombstones(rng *rand.Rand, keys [][]byte) []Tombstone {
	ts := make([]Tombstone, rng.IntN(12))
	for i := range ts {
		a, b := keys[rng.IntN(len(keys))], keys[rng.IntN(len(keys))]
		if rng.IntN(6) != 0 && bytes.Compare(a, b) > 0 {
			a, b = b, a // mostly valid, sometimes inverted or empty
		}
		ts[i] = Tombstone{Start: a, End: b, Seq: base.SeqNum(1 + rng.IntN(10))}
	}
	return ts
}

func checkSpans(t *testing.T, spans []Span) {
	t.Helper()
	for i, s := range spans {
		if bytes.Compare(s.Start, s.End) >= 0 || len(s.Seqs) == 0 {
			t.Fatalf("span %d empty: %v", i, s)
		}
		for j := 1; j < len(s.Seqs); j++ {
			if s.Seqs[j-1] <= s.Seqs[j] {
				t.Fatalf("span %d seqs not strictly descending: %v", i, s.Seqs)
			}
		}
		if i > 0 {
			p := spans[i-1]
			if bytes.Compare(p.End, s.Start) > 0 {
				t.Fatalf("spans %d and %d overlap", i-1, i)
			}
			if bytes.Equal(p.End, s.Start) && slices.Equal(p.Seqs, s.Seqs) {
				t.Fatalf("adjacent spans %d and %d with equal seqs not merged", i-1, i)
			}
		}
	}
}

func TestRandomizedAgainstNaive(t *testing.T) {
	keys := alphabet()
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 3))
		ts := randTombstones(rng, keys)
		orig := slices.Clone(ts)
		spans := Fragment(ts)
		if !slices.EqualFunc(ts, orig, func(a, b Tombstone) bool {
			return bytes.Equal(a.Start, b.Start) && bytes.Equal(a.End, b.End) && a.Seq == b.Seq
		}) {
			t.Fatal("Fragment modified its input")
		}
		checkSpans(t, spans)
		l := NewList(ts)
		checkSpans(t, l.Spans())
		if l.Empty() != (len(spans) == 0) {
			t.Fatal("Empty mismatch")
		}

		// Exact seq sets per key: Fragment must preserve them.
		for _, k := range keys {
			var want []base.SeqNum
			for _, tb := range ts {
				if bytes.Compare(tb.Start, k) <= 0 && bytes.Compare(k, tb.End) < 0 {
					want = append(want, tb.Seq)
				}
			}
			slices.SortFunc(want, cmpSeqDesc)
			want = slices.Compact(want)
			var got []base.SeqNum
			for _, s := range spans {
				if bytes.Compare(s.Start, k) <= 0 && bytes.Compare(k, s.End) < 0 {
					if got != nil {
						t.Fatalf("seed %d: key %q in two spans", seed, k)
					}
					got = s.Seqs
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d: key %q seqs %v, want %v (input %v)", seed, k, got, want, ts)
			}
		}

		// Point queries, with List and with cursors walking forward,
		// backward and randomly.
		order := func(kind int) [][]byte {
			switch kind {
			case 0:
				return keys
			case 1:
				r := slices.Clone(keys)
				slices.Reverse(r)
				return r
			}
			r := slices.Clone(keys)
			rng.Shuffle(len(r), func(i, j int) { r[i], r[j] = r[j], r[i] })
			return r
		}
		for kind := range 3 {
			c := l.NewCursor()
			for _, k := range order(kind) {
				for snap := base.SeqNum(0); snap <= 11; snap++ {
					want := naiveMax(ts, k, snap)
					if got := l.MaxCoveringSeq(k, snap); got != want {
						t.Fatalf("seed %d: MaxCoveringSeq(%q, %d) = %d, want %d", seed, k, snap, got, want)
					}
					if got := c.MaxCoveringSeq(k, snap); got != want {
						t.Fatalf("seed %d order %d: cursor MaxCoveringSeq(%q, %d) = %d, want %d", seed, kind, k, snap, got, want)
					}
					keySeq := base.SeqNum(rng.IntN(12))
					if got, want := l.Covers(k, keySeq, snap), want > keySeq; got != want {
						t.Fatalf("seed %d: Covers(%q, %d, %d) = %v", seed, k, keySeq, snap, got)
					}
					if got, want := c.Covers(k, keySeq, snap), want > keySeq; got != want {
						t.Fatalf("seed %d: cursor Covers(%q, %d, %d) = %v", seed, k, keySeq, snap, got)
					}
				}
			}
		}

		// Clip: inside the bounds coverage is unchanged, outside it is gone.
		for range 5 {
			var lower, upper []byte
			if rng.IntN(3) != 0 {
				lower = keys[rng.IntN(len(keys))]
			}
			if rng.IntN(3) != 0 {
				upper = keys[rng.IntN(len(keys))]
			}
			clipped := l.Clip(lower, upper)
			checkClipped(t, clipped, lower, upper)
			for _, k := range keys {
				in := (lower == nil || bytes.Compare(k, lower) >= 0) && (upper == nil || bytes.Compare(k, upper) < 0)
				for snap := base.SeqNum(0); snap <= 11; snap++ {
					want := base.SeqNum(0)
					if in {
						want = naiveMax(ts, k, snap)
					}
					if got := naiveMax(clipped, k, snap); got != want {
						t.Fatalf("seed %d: Clip(%q, %q) covers %q at %d with %d, want %d\n%v", seed, lower, upper, k, snap, got, want, clipped)
					}
				}
			}

			// With snapshot stripes: every open snapshot (and the latest
			// state) must still see the same coverage.
			snaps := []base.SeqNum{base.SeqNum(rng.IntN(11)), base.SeqNum(rng.IntN(11))}
			elided := l.ClipVisible(lower, upper, SnapshotVisibility(snaps))
			checkClipped(t, elided, lower, upper)
			if len(elided) > len(clipped) {
				t.Fatal("visibility filter added tombstones")
			}
			for _, k := range keys {
				for _, snap := range append(snaps, base.MaxSeqNum) {
					if got, want := naiveMax(elided, k, snap), naiveMax(clipped, k, snap); got != want {
						t.Fatalf("seed %d: snapshot %d sees %d at %q after elision, want %d", seed, snap, got, k, want)
					}
				}
			}
		}
	}
}

func checkClipped(t *testing.T, ts []Tombstone, lower, upper []byte) {
	t.Helper()
	for i, tb := range ts {
		if bytes.Compare(tb.Start, tb.End) >= 0 {
			t.Fatalf("empty clipped tombstone %v", tb)
		}
		if (lower != nil && bytes.Compare(tb.Start, lower) < 0) || (upper != nil && bytes.Compare(tb.End, upper) > 0) {
			t.Fatalf("tombstone %v outside [%q, %q)", tb, lower, upper)
		}
		if i == 0 {
			continue
		}
		p := ts[i-1]
		same := bytes.Equal(p.Start, tb.Start) && bytes.Equal(p.End, tb.End)
		if same && p.Seq <= tb.Seq {
			t.Fatalf("seqs not descending: %v then %v", p, tb)
		}
		if !same && bytes.Compare(p.End, tb.Start) > 0 {
			t.Fatalf("clipped tombstones overlap: %v then %v", p, tb)
		}
	}
}

func TestSnapshotVisibility(t *testing.T) {
	vis := SnapshotVisibility([]base.SeqNum{20, 7})
	// Stripes: [0,7], (7,20], (20,∞).
	got := vis([]base.SeqNum{30, 25, 20, 15, 8, 7, 3, 1})
	if want := []base.SeqNum{30, 20, 7}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := SnapshotVisibility(nil)([]base.SeqNum{5, 4}); !slices.Equal(got, []base.SeqNum{5}) {
		t.Fatalf("no snapshots: %v", got)
	}
}

func TestNilAndEmpty(t *testing.T) {
	var l *List
	if !l.Empty() || l.Spans() != nil || l.Covers([]byte("a"), 0, 10) || l.MaxCoveringSeq(nil, 10) != 0 || l.Clip(nil, nil) != nil {
		t.Fatal("nil list not empty")
	}
	c := l.NewCursor()
	if c.Covers([]byte("a"), 0, 10) {
		t.Fatal("nil list cursor covers")
	}
	var zc Cursor
	if zc.MaxCoveringSeq([]byte("a"), 10) != 0 {
		t.Fatal("zero cursor covers")
	}
	l = NewList([]Tombstone{{Start: []byte("b"), End: []byte("a"), Seq: 3}, {Start: []byte("x"), End: []byte("x"), Seq: 4}})
	if !l.Empty() {
		t.Fatal("list of empty tombstones not empty")
	}
	if Fragment(nil) != nil {
		t.Fatal("Fragment(nil) not nil")
	}
}

func TestListOwnsKeys(t *testing.T) {
	start, end := []byte("b"), []byte("d")
	l := NewList([]Tombstone{{Start: start, End: end, Seq: 5}})
	start[0], end[0] = 'y', 'z'
	if !l.Covers([]byte("c"), 1, 10) || l.Covers([]byte("y"), 1, 10) {
		t.Fatal("List aliases its input keys")
	}
}

func parseTombstones(t *testing.T, input string) []Tombstone {
	var ts []Tombstone
	for _, f := range strings.Fields(input) {
		rng, seq, ok := strings.Cut(f, "#")
		start, end, ok2 := strings.Cut(rng, "-")
		n, err := strconv.ParseUint(seq, 10, 64)
		if !ok || !ok2 || err != nil {
			t.Fatalf("bad tombstone %q (want start-end#seq)", f)
		}
		ts = append(ts, Tombstone{Start: []byte(start), End: []byte(end), Seq: base.SeqNum(n)})
	}
	return ts
}

func fmtSeqs(seqs []base.SeqNum) string {
	s := make([]string, len(seqs))
	for i, q := range seqs {
		s[i] = strconv.FormatUint(uint64(q), 10)
	}
	return strings.Join(s, ",")
}

// TestDataDriven runs testdata/* scripts. Commands:
//
//	build            input: tombstones "start-end#seq"; prints the fragments
//	covers key=k snap=s            prints MaxCoveringSeq
//	clip [lower=k] [upper=k] [snaps=a,b]  prints the clipped tombstones
func TestDataDriven(t *testing.T) {
	var l *List
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			arg := func(name string) (string, bool) {
				for _, a := range d.CmdArgs {
					if a.Key == name && len(a.Vals) > 0 {
						return strings.Join(a.Vals, ","), true
					}
				}
				return "", false
			}
			var b strings.Builder
			switch d.Cmd {
			case "build":
				l = NewList(parseTombstones(t, d.Input))
				for _, s := range l.Spans() {
					fmt.Fprintf(&b, "%s-%s: %s\n", s.Start, s.End, fmtSeqs(s.Seqs))
				}
			case "covers":
				k, _ := arg("key")
				snap, _ := arg("snap")
				n, err := strconv.ParseUint(snap, 10, 64)
				if err != nil {
					return err.Error()
				}
				fmt.Fprintf(&b, "%d\n", l.MaxCoveringSeq([]byte(k), base.SeqNum(n)))
			case "clip":
				var lower, upper []byte
				if v, ok := arg("lower"); ok {
					lower = []byte(v)
				}
				if v, ok := arg("upper"); ok {
					upper = []byte(v)
				}
				var vis Visibility
				if v, ok := arg("snaps"); ok {
					var snaps []base.SeqNum
					for _, s := range strings.Split(v, ",") {
						n, err := strconv.ParseUint(s, 10, 64)
						if err != nil {
							return err.Error()
						}
						snaps = append(snaps, base.SeqNum(n))
					}
					vis = SnapshotVisibility(snaps)
				}
				for _, tb := range l.ClipVisible(lower, upper, vis) {
					fmt.Fprintf(&b, "%s-%s#%d\n", tb.Start, tb.End, tb.Seq)
				}
			default:
				return "unknown command " + d.Cmd
			}
			if b.Len() == 0 {
				return "<empty>\n"
			}
			return b.String()
		})
	})
}

func BenchmarkCursorSequential(b *testing.B) {
	var ts []Tombstone
	for i := range 1000 {
		ts = append(ts, Tombstone{Start: fmt.Appendf(nil, "%06d", i*10), End: fmt.Appendf(nil, "%06d", i*10+5), Seq: base.SeqNum(i)})
	}
	l := NewList(ts)
	keys := make([][]byte, 10000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%06d", i)
	}
	b.Run("cursor", func(b *testing.B) {
		c := l.NewCursor()
		for i := 0; i < b.N; i++ {
			c.Covers(keys[i%len(keys)], 0, base.MaxSeqNum)
		}
	})
	b.Run("list", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			l.Covers(keys[i%len(keys)], 0, base.MaxSeqNum)
		}
	})
}
