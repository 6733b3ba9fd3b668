package iters

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// TestMergingIterRandomized compares a MergingIter over a random partition
// of entries (slice children and a LevelIter, plus duplicated entries across
// children) with a SliceIter over all of them.
func TestMergingIterRandomized(t *testing.T) {
	forEachSeed(t, func(t *testing.T, rng *rand.Rand) {
		es, _, _ := genData(rng, true)
		nChildren := 1 + rng.IntN(5)
		parts := make([][]entry, nChildren)
		var levelEntries []entry
		useLevel := rng.IntN(2) == 0
		var all []entry // in merged order: internal key, then child index
		type tagged struct {
			e     entry
			child int
		}
		var tags []tagged
		for _, e := range es {
			c := rng.IntN(nChildren)
			if useLevel && rng.IntN(3) == 0 {
				c = nChildren // the level is the last child
			}
			tags = append(tags, tagged{e, c})
			// Occasionally duplicate the entry into another slice child.
			if c < nChildren && rng.IntN(15) == 0 {
				d := rng.IntN(nChildren)
				if d != c {
					dup := entry{e.key, []byte(fmt.Sprintf("%s@%d", e.value, d))}
					tags = append(tags, tagged{dup, d})
				}
			}
		}
		for _, tg := range tags {
			if tg.child == nChildren {
				levelEntries = append(levelEntries, tg.e)
			} else {
				parts[tg.child] = append(parts[tg.child], tg.e)
			}
		}
		// Expected order: internal key, then child index.
		for c := 0; c <= nChildren; c++ {
			for _, tg := range tags {
				if tg.child == c {
					all = append(all, tg.e)
				}
			}
		}
		sortEntries(all) // stable: equal keys keep child order

		var children []base.InternalIterator
		for _, p := range parts {
			sortEntries(p)
			children = append(children, sliceIterOf(p))
		}
		var openCount int
		if useLevel {
			children = append(children, openLevel(t, genLevel(rng, levelEntries), nil, nil, &openCount))
		}
		m := NewMergingIter(children...)
		compareInternalIters(t, rng, m, sliceIterOf(all), 300)
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if openCount != 0 {
			t.Fatalf("%d level files left open", openCount)
		}
	})
}

func TestMergingIterChildError(t *testing.T) {
	es := []entry{
		{base.MakeInternalKey([]byte("a"), 1, base.KindSet), []byte("1")},
		{base.MakeInternalKey([]byte("b"), 2, base.KindSet), []byte("2")},
		{base.MakeInternalKey([]byte("c"), 3, base.KindSet), []byte("3")},
	}
	for failAt := 1; failAt <= 3; failAt++ {
		bad := &trackingIter{InternalIterator: sliceIterOf(es[1:]), failAt: failAt}
		m := NewMergingIter(sliceIterOf(es[:1]), bad)
		n := 0
		for ok := m.First(); ok; ok = m.Next() {
			n++
		}
		if !errors.Is(m.Error(), errInjected) {
			t.Fatalf("failAt=%d: after %d entries error = %v, want injected", failAt, n, m.Error())
		}
		if m.First() || len(m.heap) > 0 {
			t.Fatalf("failAt=%d: error is not sticky", failAt)
		}
		if err := m.Close(); !errors.Is(err, errInjected) {
			t.Fatalf("Close = %v", err)
		}
	}
}

func TestMergingIterAllocs(t *testing.T) {
	children, _ := benchChildren(4, 1000)
	m := NewMergingIter(children...)
	allocs := testing.AllocsPerRun(10, func() {
		m.First()
		for i := 0; i < 100; i++ {
			m.Next()
		}
		for i := 0; i < 50; i++ {
			m.Prev()
		}
		for i := 0; i < 10; i++ {
			m.Next()
			m.Prev()
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per run, want 0", allocs)
	}
}

// benchChildren returns n children holding total entries interleaved
// round-robin by key.
func benchChildren(n, total int) ([]base.InternalIterator, [][]entry) {
	parts := make([][]entry, n)
	for i := 0; i < total; i++ {
		k := []byte(fmt.Sprintf("key%08d", i))
		parts[i%n] = append(parts[i%n], entry{base.MakeInternalKey(k, base.SeqNum(i+1), base.KindSet), k})
	}
	children := make([]base.InternalIterator, n)
	for i, p := range parts {
		children[i] = sliceIterOf(p)
	}
	return children, parts
}

func BenchmarkMergingIterNext(b *testing.B) {
	for _, n := range []int{4, 8} {
		b.Run(fmt.Sprintf("children=%d", n), func(b *testing.B) {
			children, _ := benchChildren(n, 100000)
			m := NewMergingIter(children...)
			b.ReportAllocs()
			b.ResetTimer()
			valid := false
			for i := 0; i < b.N; i++ {
				if !valid {
					valid = m.First()
					continue
				}
				valid = m.Next()
			}
		})
	}
}

func BenchmarkMergingIterPrev(b *testing.B) {
	for _, n := range []int{4, 8} {
		b.Run(fmt.Sprintf("children=%d", n), func(b *testing.B) {
			children, _ := benchChildren(n, 100000)
			m := NewMergingIter(children...)
			b.ReportAllocs()
			b.ResetTimer()
			valid := false
			for i := 0; i < b.N; i++ {
				if !valid {
					valid = m.Last()
					continue
				}
				valid = m.Prev()
			}
		})
	}
}

func BenchmarkDBIterNext(b *testing.B) {
	for _, n := range []int{4, 8} {
		b.Run(fmt.Sprintf("children=%d", n), func(b *testing.B) {
			children, _ := benchChildren(n, 100000)
			d := NewDBIter(NewMergingIter(children...), DBIterOptions{SeqNum: base.MaxSeqNum})
			b.ReportAllocs()
			b.ResetTimer()
			valid := false
			for i := 0; i < b.N; i++ {
				if !valid {
					valid = d.First()
					continue
				}
				valid = d.Next()
			}
		})
	}
}
