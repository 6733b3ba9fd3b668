package memtable

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// spliceKeys makes the keys of TestSkiplistSplice: ascending runs of
// several interleaved streams (as the Raft logs of several shards, or a
// shard's sorted records, reach one memtable), random keys, and repeats of
// recent keys, all sharing long prefixes so that comparisons go past the
// 8-byte prefix and the inline word compare.
type spliceKeys struct {
	rng     *rand.Rand
	streams []uint64 // next index of each stream
	recent  [][]byte
}

func (g *spliceKeys) streamKey(s int) []byte {
	// 'r' + stream (8 bytes BE) + 'e' + index (8 bytes BE): 18 bytes, all
	// alike in their first 9.
	k := []byte{'r'}
	k = binary.BigEndian.AppendUint64(k, uint64(s))
	k = append(k, 'e')
	k = binary.BigEndian.AppendUint64(k, g.streams[s])
	g.streams[s]++
	return k
}

func (g *spliceKeys) randomKey() []byte {
	switch g.rng.IntN(4) {
	case 0: // a dedup-like key: a 10-byte prefix and random bytes
		k := []byte("mdedup-id/")
		for range g.rng.IntN(14) {
			k = append(k, "ab\x00\xff"[g.rng.IntN(4)])
		}
		return k
	case 1: // a short key, against the zero-padded prefix
		return randUserKey(g.rng)
	default:
		k := make([]byte, g.rng.IntN(24))
		for i := range k {
			k[i] = "r\x00\x01e"[g.rng.IntN(4)]
		}
		return k
	}
}

// next returns a run of keys to add one after the other.
func (g *spliceKeys) next() [][]byte {
	var run [][]byte
	switch r := g.rng.IntN(10); {
	case r < 5: // an ascending run of one stream
		s := g.rng.IntN(len(g.streams))
		for range 1 + g.rng.IntN(20) {
			run = append(run, g.streamKey(s))
		}
	case r < 6: // a stream going back: a Raft log overwriting its tail
		s := g.rng.IntN(len(g.streams))
		g.streams[s] -= min(g.streams[s], uint64(g.rng.IntN(5)))
		for range 1 + g.rng.IntN(5) {
			run = append(run, g.streamKey(s))
		}
	case r < 7 && len(g.recent) > 0: // repeats, also of the last key
		for range 1 + g.rng.IntN(4) {
			run = append(run, g.recent[len(g.recent)-1-g.rng.IntN(min(len(g.recent), 3))])
		}
	case r < 8: // a sorted run of random keys (a sorted batch)
		for range 1 + g.rng.IntN(16) {
			run = append(run, g.randomKey())
		}
		sortKeys(run)
	default:
		for range 1 + g.rng.IntN(8) {
			run = append(run, g.randomKey())
		}
	}
	g.recent = append(g.recent, run...)
	if len(g.recent) > 64 {
		g.recent = g.recent[len(g.recent)-64:]
	}
	return run
}

func sortKeys(ks [][]byte) {
	for i := 1; i < len(ks); i++ {
		for j := i; j > 0 && bytes.Compare(ks[j-1], ks[j]) > 0; j-- {
			ks[j-1], ks[j] = ks[j], ks[j-1]
		}
	}
}

// TestSkiplistSplice checks the skiplist against the sorted-slice model
// under keys that mostly ascend (so most Adds take the splice), mixed with
// random keys, repeats, a stream going back, sequence numbers that rise or
// repeat, and a full arena, while readers scan and seek concurrently. Under
// -race every Add that takes the splice also checks it level by level
// (spliceError).
func TestSkiplistSplice(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			arena := uint32(1 << 20)
			if seed%3 == 2 {
				arena = 64 << 10 // fills up: ErrArenaFull must leave the splice usable
			}
			s := NewSkiplist(arena)
			g := &spliceKeys{rng: rng, streams: make([]uint64, 1+int(seed%6))}
			m := &model{}

			var done atomic.Bool
			var added atomic.Int64 // entries added so far (published after Add)
			var wg sync.WaitGroup
			errc := make(chan error, 4)
			for r := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rrng := rand.New(rand.NewPCG(seed, uint64(r)))
					for !done.Load() {
						before := int(added.Load())
						if err := scanSorted(s, before); err != nil {
							errc <- err
							return
						}
						it := s.NewIter(nil, nil)
						k := g2key(rrng)
						if it.SeekGE(k) && bytes.Compare(it.Key().UserKey, k) < 0 {
							errc <- fmt.Errorf("SeekGE(%q) = %v", k, it.Key())
							return
						}
						if it.SeekLT(k) && bytes.Compare(it.Key().UserKey, k) >= 0 {
							errc <- fmt.Errorf("SeekLT(%q) = %v", k, it.Key())
							return
						}
					}
				}()
			}

			var seq base.SeqNum
			var lastKey *base.InternalKey // the latest Add's
			full, hintedWant := 0, 0
			ascending := 1 // the skiplist's predictor, mirrored
			for len(m.entries) < 6000 && full < 50 {
				for _, uk := range g.next() {
					if rng.IntN(8) != 0 {
						seq++ // else the same seq again: ErrRecordExists for a repeat
					}
					k := base.MakeInternalKey(uk, seq, kinds[rng.IntN(3)])
					v := fmt.Appendf(nil, "%x/%d", uk, seq)
					// The model's position of k, against the previous Add's.
					lastPos := -1
					if lastKey != nil {
						lastPos = m.index(*lastKey)
					}
					err := s.Add(k, v)
					if err == ErrArenaFull {
						full++
						continue
					}
					merr := m.add(entry{k.Clone(), v})
					if err != merr {
						t.Fatalf("Add(%v) = %v, model %v", k, err, merr)
					}
					if err == nil {
						if m.index(k) == lastPos+1 {
							if ascending > 0 {
								hintedWant++
							}
							ascending = min(ascending+1, 3)
						} else if ascending > 0 {
							ascending--
						}
						kc := k.Clone()
						lastKey = &kc
						added.Add(1)
					}
				}
			}
			done.Store(true)
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			// Every entry that lands right after the previous Add's, while
			// Adds went in ascending order, is placed by the splice, and
			// only those.
			if s.hinted != hintedWant {
				t.Fatalf("%d Adds took the splice, %d landed right after the previous one", s.hinted, hintedWant)
			}
			if hintedWant < len(m.entries)/3 {
				t.Fatalf("only %d of %d Adds took the splice", hintedWant, len(m.entries))
			}
			if s.Count() != len(m.entries) {
				t.Fatalf("Count = %d, model %d", s.Count(), len(m.entries))
			}
			checkScans(t, s, m)
			t.Logf("%d entries, %d placed by the splice, arena full %d times", len(m.entries), s.hinted, full)
		})
	}
}

// index returns the position of k in the model (which must hold it).
func (m *model) index(k base.InternalKey) int {
	i, found := slices.BinarySearchFunc(m.entries, k, func(a entry, k base.InternalKey) int {
		return base.CompareInternal(a.key, k)
	})
	if !found {
		panic(fmt.Sprintf("%v not in the model", k))
	}
	return i
}

func g2key(rng *rand.Rand) []byte {
	k := []byte{'r'}
	k = binary.BigEndian.AppendUint64(k, uint64(rng.IntN(6)))
	return binary.BigEndian.AppendUint64(append(k, 'e'), uint64(rng.IntN(500)))
}

// scanSorted scans s forward: entries in order, values matching keys, and
// at least atLeast of them.
func scanSorted(s *Skiplist, atLeast int) error {
	it := s.NewIter(nil, nil)
	var prev base.InternalKey
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if prev.UserKey != nil && base.CompareInternal(prev, k) >= 0 {
			return fmt.Errorf("out of order: %v then %v", prev, k)
		}
		if want := fmt.Appendf(nil, "%x/%d", k.UserKey, k.SeqNum()); !bytes.Equal(it.Value(), want) {
			return fmt.Errorf("entry %v holds %q", k, it.Value())
		}
		prev = k.Clone()
		n++
	}
	if n < atLeast {
		return fmt.Errorf("scan saw %d entries, %d were added before it", n, atLeast)
	}
	return nil
}

// FuzzCompareAfterPrefix checks the inline comparison against
// bytes.Compare for keys with equal 8-byte prefixes.
func FuzzCompareAfterPrefix(f *testing.F) {
	f.Add([]byte("mdedup-id/abc"), []byte("mdedup-id/abd"))
	f.Add([]byte("r\x00\x00\x00\x00\x00\x00\x00\x07e\x00\x00\x00\x00\x00\x00\x01\x00"), []byte("r\x00\x00\x00\x00\x00\x00\x00\x07e\x00\x00\x00\x00\x00\x00\x00\xff"))
	f.Add([]byte("a"), []byte("a\x00"))
	f.Add([]byte("abcdefgh"), []byte("abcdefgh\x00"))
	f.Add([]byte("abcdefghijklmnop"), []byte("abcdefghijklmnop"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if keyPrefix(a) != keyPrefix(b) {
			// Make the prefixes equal: b takes a's first 8 bytes.
			if len(a) >= 8 && len(b) >= 8 {
				b = append(append([]byte(nil), a[:8]...), b[8:]...)
			} else {
				b = append([]byte(nil), a...)
			}
		}
		want := bytes.Compare(a, b)
		if got := compareAfterPrefix(a, b); got != want {
			t.Fatalf("compareAfterPrefix(%q, %q) = %d, want %d", a, b, got, want)
		}
		if got := compareAfterPrefix(b, a); got != -want {
			t.Fatalf("compareAfterPrefix(%q, %q) = %d, want %d", b, a, got, -want)
		}
	})
}

// TestSpliceValidated breaks the splice on purpose: spliceError reports
// it, and Add, whose level-0 check finds it broken, searches from the top
// and still puts the entry in its place.
func TestSpliceValidated(t *testing.T) {
	s := NewSkiplist(1 << 16)
	m := &model{}
	add := func(k string, seq base.SeqNum) {
		t.Helper()
		ik := base.MakeInternalKey([]byte(k), seq, base.KindSet)
		if err := s.Add(ik, []byte(k)); err != nil {
			t.Fatal(err)
		}
		_ = m.add(entry{ik.Clone(), []byte(k)})
	}
	for i, k := range []string{"a", "c", "e", "g"} {
		add(k, base.SeqNum(i+1))
	}
	if err := s.spliceError(&s.splice.prev, &s.splice.next); err != nil {
		t.Fatalf("a sound splice: %v", err)
	}
	// Point the level-0 pair at "c" and "e" while claiming "g" follows
	// "c": a splice that does not link.
	var ahead uint64
	c := s.seekGE(base.MakeSearchKey([]byte("c")), &ahead)
	s.splice.prev[0] = c
	if err := s.spliceError(&s.splice.prev, &s.splice.next); err == nil {
		t.Fatal("spliceError accepted a pair that does not link")
	}
	hinted := s.hinted
	add("d", 10) // after "c": inside the broken pair
	if s.hinted != hinted {
		t.Fatalf("Add took a broken splice")
	}
	if err := s.spliceError(&s.splice.prev, &s.splice.next); err != nil {
		t.Fatalf("the splice Add left: %v", err)
	}
	add("b", 11)
	checkScans(t, s, m)
}
