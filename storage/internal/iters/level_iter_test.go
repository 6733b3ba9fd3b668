package iters

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// TestLevelIterRandomized compares a LevelIter with random bounds over a
// random split of entries into files with a SliceIter over the entries
// within the bounds, checking lazy opening along the way.
func TestLevelIterRandomized(t *testing.T) {
	forEachSeed(t, func(t *testing.T, rng *rand.Rand) {
		es, _, _ := genData(rng, true)
		lv := genLevel(rng, es)
		lower, upper := randBounds(rng)
		var openCount int
		l := openLevel(t, lv, lower, upper, &openCount)
		compareInternalIters(t, rng, l, sliceIterOf(filterBounds(es, lower, upper)), 300)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if openCount != 0 {
			t.Fatalf("%d files left open", openCount)
		}
	})
}

func TestLevelIterErrors(t *testing.T) {
	k := func(s string, seq base.SeqNum) base.InternalKey {
		return base.MakeInternalKey([]byte(s), seq, base.KindSet)
	}
	files := []FileBounds{{k("a", 2), k("b", 1)}, {k("c", 4), k("d", 3)}}
	entries := [][]entry{
		{{k("a", 2), []byte("a")}, {k("b", 1), []byte("b")}},
		{{k("c", 4), []byte("c")}, {k("d", 3), []byte("d")}},
	}

	t.Run("open", func(t *testing.T) {
		openErr := errors.New("no such file")
		l := NewLevelIter(files, func(i int, _, _ []byte) (base.InternalIterator, error) {
			if i == 1 {
				return nil, openErr
			}
			return sliceIterOf(entries[i]), nil
		}, nil, nil)
		n := 0
		for ok := l.First(); ok; ok = l.Next() {
			n++
		}
		if n != 2 || !errors.Is(l.Error(), openErr) {
			t.Fatalf("n=%d err=%v", n, l.Error())
		}
		if l.Last() {
			t.Fatal("error is not sticky")
		}
		if err := l.Close(); !errors.Is(err, openErr) {
			t.Fatalf("Close = %v", err)
		}
	})

	t.Run("file", func(t *testing.T) {
		var opened int
		l := NewLevelIter(files, func(i int, _, _ []byte) (base.InternalIterator, error) {
			opened++
			return &trackingIter{InternalIterator: sliceIterOf(entries[i]), failAt: 2}, nil
		}, nil, nil)
		if !l.Last() || l.Prev() || !errors.Is(l.Error(), errInjected) {
			t.Fatalf("err=%v", l.Error())
		}
		_ = l.Close()
	})

	t.Run("nil-iterator", func(t *testing.T) {
		l := NewLevelIter(files, func(int, []byte, []byte) (base.InternalIterator, error) { return nil, nil }, nil, nil)
		if l.SeekGE([]byte("a")) || l.Error() == nil {
			t.Fatal("want an error for a nil file iterator")
		}
		_ = l.Close()
	})

	t.Run("out-of-order", func(t *testing.T) {
		l := NewLevelIter([]FileBounds{files[1], files[0]}, func(i int, _, _ []byte) (base.InternalIterator, error) {
			t.Fatal("opened a file of an invalid level")
			return nil, nil
		}, nil, nil)
		if l.First() || l.Error() == nil {
			t.Fatal("want an error for misordered files")
		}
		_ = l.Close()
	})

	t.Run("nil-open", func(t *testing.T) {
		l := NewLevelIter(files, nil, nil, nil)
		if l.First() || l.Error() == nil {
			t.Fatal("want an error for a nil open function")
		}
	})
}
