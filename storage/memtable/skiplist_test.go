package memtable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

type entry struct {
	key   base.InternalKey
	value []byte
}

// model is the reference implementation: a sorted slice.
type model struct{ entries []entry }

func (m *model) add(e entry) error {
	i, found := slices.BinarySearchFunc(m.entries, e.key, func(a entry, k base.InternalKey) int {
		return base.CompareInternal(a.key, k)
	})
	if found {
		return ErrRecordExists
	}
	m.entries = slices.Insert(m.entries, i, e)
	return nil
}

// modelIter mirrors Iterator over the in-bounds entries of a model.
type modelIter struct {
	es  []entry
	pos int // -1 when unpositioned
}

func newModelIter(m *model, lower, upper []byte) *modelIter {
	var es []entry
	for _, e := range m.entries {
		if lower != nil && bytes.Compare(e.key.UserKey, lower) < 0 {
			continue
		}
		if upper != nil && bytes.Compare(e.key.UserKey, upper) >= 0 {
			continue
		}
		es = append(es, e)
	}
	return &modelIter{es: es, pos: -1}
}

func (m *modelIter) set(i int) bool {
	if i < 0 || i >= len(m.es) {
		m.pos = -1
		return false
	}
	m.pos = i
	return true
}

func (m *modelIter) seekGE(k []byte) bool {
	for i, e := range m.es {
		if bytes.Compare(e.key.UserKey, k) >= 0 {
			return m.set(i)
		}
	}
	return m.set(-1)
}

func (m *modelIter) seekGEInternal(k base.InternalKey) bool {
	for i, e := range m.es {
		if base.CompareInternal(e.key, k) >= 0 {
			return m.set(i)
		}
	}
	return m.set(-1)
}

func (m *modelIter) seekLT(k []byte) bool {
	for i := len(m.es) - 1; i >= 0; i-- {
		if bytes.Compare(m.es[i].key.UserKey, k) < 0 {
			return m.set(i)
		}
	}
	return m.set(-1)
}

func (m *modelIter) next() bool {
	if m.pos < 0 {
		return false
	}
	return m.set(m.pos + 1)
}

func (m *modelIter) prev() bool {
	if m.pos < 0 {
		return false
	}
	return m.set(m.pos - 1)
}

func randUserKey(rng *rand.Rand) []byte {
	// Small alphabet and lengths 0..3 so keys collide and prefixes matter.
	n := rng.IntN(4)
	k := make([]byte, n)
	for i := range k {
		k[i] = "abcd"[rng.IntN(4)]
	}
	return k
}

func randBound(rng *rand.Rand) []byte {
	if rng.IntN(3) == 0 {
		return nil
	}
	return randUserKey(rng)
}

var kinds = []base.Kind{base.KindSet, base.KindDelete, base.KindMerge, base.KindRangeDelete}

func checkSame(t *testing.T, step string, ok bool, it *Iterator, mok bool, m *modelIter) {
	t.Helper()
	if ok != mok {
		t.Fatalf("%s: got ok=%v, model ok=%v (model key %v)", step, ok, mok, func() any {
			if mok {
				return m.es[m.pos].key
			}
			return nil
		}())
	}
	if !ok {
		if it.Key().UserKey != nil || it.Value() != nil {
			t.Fatalf("%s: unpositioned iterator returned a key or value", step)
		}
		return
	}
	want := m.es[m.pos]
	if got := it.Key(); base.CompareInternal(got, want.key) != 0 {
		t.Fatalf("%s: key %v, want %v", step, got, want.key)
	}
	if !bytes.Equal(it.Value(), want.value) {
		t.Fatalf("%s: value %q, want %q", step, it.Value(), want.value)
	}
}

func TestSkiplistModel(t *testing.T) {
	for seed := range uint64(30) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			s := NewSkiplist(1 << 20)
			if seed%2 == 1 {
				// Odd seeds run on a recycled arena full of old nodes, keys
				// and values: nothing of them may show through.
				dirty := rand.New(rand.NewPCG(seed, 7))
				for s.Add(base.MakeInternalKey(randUserKey(dirty), base.SeqNum(dirty.IntN(1000)), base.KindSet), make([]byte, dirty.IntN(64))) != ErrArenaFull {
				}
				s = s.Recycle()
				if !s.Empty() || s.Count() != 0 || s.ArenaSize() < 1<<20 {
					t.Fatalf("recycled skiplist: empty %v, count %d, arena %d", s.Empty(), s.Count(), s.ArenaSize())
				}
			}
			m := &model{}
			for op := 0; op < 3000; op++ {
				switch r := rng.IntN(10); {
				case r < 5:
					k := base.MakeInternalKey(randUserKey(rng), base.SeqNum(rng.IntN(20)), kinds[rng.IntN(len(kinds))])
					v := make([]byte, rng.IntN(8))
					for i := range v {
						v[i] = byte(rng.Uint32())
					}
					err, merr := s.Add(k, v), m.add(entry{k.Clone(), v})
					if err != merr {
						t.Fatalf("Add(%v) = %v, model %v", k, err, merr)
					}
					if s.Count() != len(m.entries) || s.Empty() != (len(m.entries) == 0) {
						t.Fatalf("Count = %d Empty = %v, model %d", s.Count(), s.Empty(), len(m.entries))
					}
				case r == 5:
					k, limit := randUserKey(rng), 1+rng.IntN(4)
					var got, want []string
					s.Lookup(k, func(ik base.InternalKey, v []byte) bool {
						got = append(got, fmt.Sprintf("%v=%x", ik, v))
						return len(got) < limit
					})
					mi := newModelIter(m, nil, nil)
					for ok := mi.seekGE(k); ok && len(want) < limit; ok = mi.next() {
						e := mi.es[mi.pos]
						want = append(want, fmt.Sprintf("%v=%x", e.key, e.value))
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("op %d: Lookup(%q) saw %v, model %v", op, k, got, want)
					}
				default:
					lower, upper := randBound(rng), randBound(rng)
					it := s.NewIter(lower, upper)
					mi := newModelIter(m, lower, upper)
					for j := 0; j < 20; j++ {
						var ok, mok bool
						var step string
						switch rng.IntN(8) {
						case 0:
							k := randUserKey(rng)
							step = fmt.Sprintf("SeekGE(%q)", k)
							ok, mok = it.SeekGE(k), mi.seekGE(k)
						case 1:
							k := randUserKey(rng)
							step = fmt.Sprintf("SeekLT(%q)", k)
							ok, mok = it.SeekLT(k), mi.seekLT(k)
						case 2:
							k := base.MakeInternalKey(randUserKey(rng), base.SeqNum(rng.IntN(20)), kinds[rng.IntN(len(kinds))])
							step = fmt.Sprintf("SeekGEInternal(%v)", k)
							ok, mok = it.SeekGEInternal(k), mi.seekGEInternal(k)
						case 3:
							step = "First"
							ok, mok = it.First(), mi.set(0)
						case 4:
							step = "Last"
							ok, mok = it.Last(), mi.set(len(mi.es)-1)
						case 5, 6:
							step = "Next"
							ok, mok = it.Next(), mi.next()
						case 7:
							step = "Prev"
							ok, mok = it.Prev(), mi.prev()
						}
						checkSame(t, fmt.Sprintf("op %d bounds [%q,%q) %s", op, lower, upper, step), ok, it, mok, mi)
					}
					if err := it.Close(); err != nil || it.Error() != nil {
						t.Fatal(err)
					}
				}
			}
			checkScans(t, s, m)
		})
	}
}

// checkScans scans s whole both ways and checks it holds exactly the
// model's entries.
func checkScans(t *testing.T, s *Skiplist, m *model) {
	t.Helper()
	it := s.NewIter(nil, nil)
	i := 0
	for ok := it.First(); ok; ok = it.Next() {
		checkSame(t, "scan", true, it, true, &modelIter{es: m.entries, pos: i})
		i++
	}
	if i != len(m.entries) {
		t.Fatalf("forward scan saw %d entries, want %d", i, len(m.entries))
	}
	for ok := it.Last(); ok; ok = it.Prev() {
		i--
		checkSame(t, "reverse scan", true, it, true, &modelIter{es: m.entries, pos: i})
	}
	if i != 0 {
		t.Fatalf("reverse scan missed %d entries", i)
	}
}

func TestSkiplistBasics(t *testing.T) {
	s := NewSkiplist(1 << 16)
	if !s.Empty() || s.Count() != 0 {
		t.Fatal("new skiplist not empty")
	}
	it := s.NewIter(nil, nil)
	if it.First() || it.Last() || it.SeekGE([]byte("a")) || it.SeekLT([]byte("z")) || it.Next() || it.Prev() {
		t.Fatal("empty skiplist iterator positioned")
	}
	k := base.MakeInternalKey([]byte("a"), 5, base.KindSet)
	if err := s.Add(k, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(k, []byte("v2")); !errors.Is(err, ErrRecordExists) {
		t.Fatalf("duplicate Add = %v", err)
	}
	if err := s.Add(base.MakeInternalKey([]byte("a"), 5, base.KindDelete), nil); err != nil {
		t.Fatal("same seq, different kind must be accepted:", err)
	}
	if err := s.Add(base.MakeInternalKey([]byte("a"), 7, base.KindSet), []byte("new")); err != nil {
		t.Fatal(err)
	}
	// SeekGE lands on the newest version; SeekLT on the oldest of the previous key.
	if !it.SeekGE([]byte("a")) || it.Key().SeqNum() != 7 || string(it.Value()) != "new" {
		t.Fatalf("SeekGE: %v %q", it.Key(), it.Value())
	}
	if !it.SeekLT([]byte("b")) || it.Key().SeqNum() != 5 || it.Key().Kind() != base.KindDelete {
		t.Fatalf("SeekLT: %v", it.Key())
	}
	// Get-style lookup: newest version visible at snapshot 6.
	if !it.SeekGEInternal(base.MakeInternalKey([]byte("a"), 6, base.KindMax)) || it.Key().SeqNum() != 5 || string(it.Value()) != "v1" {
		t.Fatalf("SeekGEInternal: %v %q", it.Key(), it.Value())
	}
	// Keys and values stay valid (aliasing the arena) after further adds.
	key, val := it.Key(), it.Value()
	for i := range 100 {
		if err := s.Add(base.MakeInternalKey(fmt.Appendf(nil, "k%03d", i), 1, base.KindSet), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if string(key.UserKey) != "a" || string(val) != "v1" {
		t.Fatal("aliased key/value changed")
	}
	// Appending to a returned slice must not scribble on the arena.
	_ = append(key.UserKey, 'Z')
	if !it.First() || string(it.Key().UserKey) != "a" || string(it.Value()) != "new" {
		t.Fatal("arena corrupted by append")
	}
	if s.Count() != 103 {
		t.Fatalf("Count = %d", s.Count())
	}
	// Empty user key and nil value.
	if err := s.Add(base.MakeInternalKey(nil, 1, base.KindSet), nil); err != nil {
		t.Fatal(err)
	}
	if !it.First() || len(it.Key().UserKey) != 0 || len(it.Value()) != 0 {
		t.Fatalf("empty key: %v", it.Key())
	}
}

func TestArenaFull(t *testing.T) {
	s := NewSkiplist(4096)
	before := s.Size()
	if before == 0 || before > 4096 {
		t.Fatalf("initial size %d", before)
	}
	val := make([]byte, 100)
	n := 0
	for {
		err := s.Add(base.MakeInternalKey(fmt.Appendf(nil, "key%04d", n), 1, base.KindSet), val)
		if errors.Is(err, ErrArenaFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if n > 1000 {
			t.Fatal("arena never filled")
		}
	}
	size, count := s.Size(), s.Count()
	if count != n || size > 4096 {
		t.Fatalf("count %d (want %d), size %d", count, n, size)
	}
	// A failed Add changes nothing.
	if err := s.Add(base.MakeInternalKey([]byte("zzz"), 1, base.KindSet), make([]byte, 4096)); !errors.Is(err, ErrArenaFull) {
		t.Fatal(err)
	}
	if s.Size() != size || s.Count() != count {
		t.Fatal("failed Add changed the skiplist")
	}
	it := s.NewIter(nil, nil)
	i := 0
	for ok := it.First(); ok; ok = it.Next() {
		if want := fmt.Sprintf("key%04d", i); string(it.Key().UserKey) != want {
			t.Fatalf("entry %d = %q", i, it.Key().UserKey)
		}
		i++
	}
	if i != n {
		t.Fatalf("iterated %d of %d", i, n)
	}
	// A smaller entry may still fit in the remaining space.
	if rem := 4096 - size; rem >= 64 {
		if err := s.Add(base.MakeInternalKey([]byte("a"), 1, base.KindSet), nil); err != nil {
			t.Fatalf("small add with %d bytes left: %v", rem, err)
		}
	}

	// Tiny and zero arenas: usable, every Add fails cleanly.
	for _, sz := range []uint32{0, 1, 100} {
		s := NewSkiplist(sz)
		if err := s.Add(base.MakeInternalKey([]byte("a"), 1, base.KindSet), make([]byte, 64)); !errors.Is(err, ErrArenaFull) {
			t.Fatalf("arena %d: %v", sz, err)
		}
		if !s.Empty() || s.NewIter(nil, nil).First() {
			t.Fatal("tiny arena not empty")
		}
	}
}

// valueFor derives a value from a key so readers can detect torn entries.
func valueFor(k []byte, seq base.SeqNum) []byte {
	v := make([]byte, 0, 40)
	for range 4 {
		v = append(v, k...)
	}
	return binary.LittleEndian.AppendUint64(v, uint64(seq)*0x9e3779b97f4a7c15)
}

func TestConcurrentReaders(t *testing.T) {
	s := NewSkiplist(64 << 20)
	const writes = 20000
	var done atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	check := func(it *Iterator, prev *base.InternalKey) error {
		k := it.Key()
		if !bytes.Equal(it.Value(), valueFor(k.UserKey, k.SeqNum())) {
			return fmt.Errorf("torn entry %v", k)
		}
		if prev.UserKey != nil && base.CompareInternal(*prev, k) >= 0 {
			return fmt.Errorf("out of order: %v then %v", *prev, k)
		}
		*prev = k
		return nil
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for !done.Load() {
				it := s.NewIter(nil, nil)
				countBefore := s.Count()
				var prev base.InternalKey
				n := 0
				var ok bool
				if r%2 == 0 {
					for ok = it.First(); ok; ok = it.Next() {
						if err := check(it, &prev); err != nil {
							errc <- err
							return
						}
						n++
					}
				} else {
					// Reverse scan: check descending order.
					var next base.InternalKey
					for ok = it.Last(); ok; ok = it.Prev() {
						k := it.Key()
						if !bytes.Equal(it.Value(), valueFor(k.UserKey, k.SeqNum())) {
							errc <- fmt.Errorf("torn entry %v", k)
							return
						}
						if next.UserKey != nil && base.CompareInternal(k, next) >= 0 {
							errc <- fmt.Errorf("reverse out of order: %v then %v", next, k)
							return
						}
						next = k
						n++
					}
				}
				if n < countBefore {
					errc <- fmt.Errorf("scan saw %d entries, %d were added before it started", n, countBefore)
					return
				}
				// Random seeks followed by short mixed walks.
				for range 20 {
					k := fmt.Appendf(nil, "%08d", rng.IntN(writes))
					prev = base.InternalKey{}
					if it.SeekGE(k) {
						if bytes.Compare(it.Key().UserKey, k) < 0 {
							errc <- fmt.Errorf("SeekGE(%s) = %v", k, it.Key())
							return
						}
						for range 5 {
							if err := check(it, &prev); err != nil {
								errc <- err
								return
							}
							if !it.Next() {
								break
							}
						}
					}
					if it.SeekLT(k) && bytes.Compare(it.Key().UserKey, k) >= 0 {
						errc <- fmt.Errorf("SeekLT(%s) = %v", k, it.Key())
						return
					}
				}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range writes {
		k := fmt.Appendf(nil, "%08d", rng.IntN(writes))
		seq := base.SeqNum(i + 1)
		if err := s.Add(base.MakeInternalKey(k, seq, base.KindSet), valueFor(k, seq)); err != nil {
			t.Fatal(err)
		}
	}
	done.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if s.Count() != writes {
		t.Fatalf("Count = %d", s.Count())
	}
}

func TestRandomHeightDistribution(t *testing.T) {
	s := NewSkiplist(0)
	var hist [maxHeight + 1]int
	const n = 1 << 20
	for range n {
		h := s.randomHeight()
		if h < 1 || h > maxHeight {
			t.Fatalf("height %d", h)
		}
		hist[h]++
	}
	// p = 1/e: P(h=1) = 1-1/e ~ 0.632, P(h=2) = (1/e)(1-1/e) ~ 0.233.
	if f := float64(hist[1]) / n; f < 0.625 || f > 0.64 {
		t.Fatalf("P(h=1) = %f", f)
	}
	if f := float64(hist[2]) / n; f < 0.226 || f > 0.24 {
		t.Fatalf("P(h=2) = %f", f)
	}
}

func benchKeys(n int) [][]byte {
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, rng.Uint64()), rng.Uint64())
	}
	return keys
}

// BenchmarkAdd inserts random 16-byte keys with 100-byte values, starting a
// new skiplist every perList entries (so the list holds perList/2 entries on
// average).
func BenchmarkAdd(b *testing.B) {
	for _, perList := range []int{1 << 10, 1 << 17, 1 << 20} {
		b.Run(fmt.Sprintf("entries=%d", perList), func(b *testing.B) {
			keys := benchKeys(perList)
			val := make([]byte, 100)
			arenaSize := uint32(perList * 180)
			s := NewSkiplist(arenaSize)
			b.SetBytes(int64(len(keys[0]) + len(val)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				j := i % perList
				if j == 0 && i > 0 {
					b.StopTimer()
					s = NewSkiplist(arenaSize)
					b.StartTimer()
				}
				if err := s.Add(base.MakeInternalKey(keys[j], base.SeqNum(i), base.KindSet), val); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAddSequential inserts ascending keys, the common pattern of
// bulk loads and time-ordered workloads.
func BenchmarkAddSequential(b *testing.B) {
	const perList = 1 << 20
	val := make([]byte, 100)
	s := NewSkiplist(perList * 180)
	key := make([]byte, 16)
	b.SetBytes(int64(len(key) + len(val)))
	for i := 0; i < b.N; i++ {
		if i%perList == 0 && i > 0 {
			b.StopTimer()
			s = NewSkiplist(perList * 180)
			b.StartTimer()
		}
		binary.BigEndian.PutUint64(key[8:], uint64(i))
		if err := s.Add(base.MakeInternalKey(key, base.SeqNum(i), base.KindSet), val); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSeekGE(b *testing.B) {
	const n = 1 << 20
	keys := benchKeys(n)
	val := make([]byte, 100)
	s := NewSkiplist(n * 180)
	for i, k := range keys {
		if err := s.Add(base.MakeInternalKey(k, base.SeqNum(i), base.KindSet), val); err != nil {
			b.Fatal(err)
		}
	}
	it := s.NewIter(nil, nil)
	rng := rand.New(rand.NewPCG(5, 6))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !it.SeekGE(keys[rng.IntN(n)]) {
			b.Fatal("not found")
		}
	}
}

func BenchmarkIterNextPrev(b *testing.B) {
	const n = 1 << 16
	keys := benchKeys(n)
	s := NewSkiplist(n * 180)
	for i, k := range keys {
		if err := s.Add(base.MakeInternalKey(k, base.SeqNum(i), base.KindSet), nil); err != nil {
			b.Fatal(err)
		}
	}
	it := s.NewIter(nil, nil)
	b.Run("Next", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if !it.Next() {
				it.First()
			}
		}
	})
	b.Run("Prev", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if !it.Prev() {
				it.Last()
			}
		}
	})
}
