package cache

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// checkInvariants verifies every shard's internal bookkeeping.
func checkInvariants(t *testing.T, c *Cache) {
	t.Helper()
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		var size int64
		n := 0
		if s.hand != nil {
			e := s.hand
			for {
				if e.next.prev != e {
					t.Fatalf("shard %d: broken ring", i)
				}
				if s.entries[e.key] != e {
					t.Fatalf("shard %d: ring entry %v not in map", i, e.key)
				}
				size += e.charge
				n++
				e = e.next
				if e == s.hand {
					break
				}
				if n > len(s.entries) {
					t.Fatalf("shard %d: ring longer than map", i)
				}
			}
		}
		if n != len(s.entries) || size != s.size {
			t.Fatalf("shard %d: ring %d entries %d bytes, map %d entries, size %d", i, n, size, len(s.entries), s.size)
		}
		if s.size > s.capacity {
			t.Fatalf("shard %d: size %d > capacity %d", i, s.size, s.capacity)
		}
		inFiles := 0
		for fk, head := range s.files {
			if head.filePrev != nil {
				t.Fatalf("shard %d: file head has prev", i)
			}
			for e := head; e != nil; e = e.fileNext {
				if (fileKey{e.key.id, e.key.fileNum}) != fk || s.entries[e.key] != e {
					t.Fatalf("shard %d: bad file list entry %v", i, e.key)
				}
				if e.fileNext != nil && e.fileNext.filePrev != e {
					t.Fatalf("shard %d: broken file list", i)
				}
				inFiles++
			}
		}
		if inFiles != len(s.entries) {
			t.Fatalf("shard %d: %d entries on file lists, %d in map", i, inFiles, len(s.entries))
		}
		s.mu.Unlock()
	}
}

func val(n int, tag byte) []byte { return bytes.Repeat([]byte{tag}, n) }

func TestBasic(t *testing.T) {
	c := New(1 << 20)
	id := c.NewID()
	if id2 := c.NewID(); id == 0 || id2 == id {
		t.Fatalf("NewID: %d, %d", id, id2)
	}
	if _, ok := c.Get(id, 1, 0); ok {
		t.Fatal("hit on empty cache")
	}
	c.Set(id, 1, 0, []byte("hello"))
	c.Set(id, 1, 4096, []byte("world"))
	if v, ok := c.Get(id, 1, 0); !ok || string(v) != "hello" {
		t.Fatalf("Get = %q, %v", v, ok)
	}
	if _, ok := c.Get(id+1, 1, 0); ok {
		t.Fatal("namespaces collide")
	}
	c.Set(id, 1, 0, []byte("replaced"))
	if v, _ := c.Get(id, 1, 0); string(v) != "replaced" {
		t.Fatalf("after replace: %q", v)
	}
	m := c.Metrics()
	want := Metrics{Hits: 2, Misses: 2, Size: 13 + 2*EntryOverhead, Count: 2, Capacity: 1 << 20}
	if m != want {
		t.Fatalf("Metrics = %+v, want %+v", m, want)
	}
	checkInvariants(t, c)
}

func TestEvictionOrder(t *testing.T) {
	const blk = 100
	charge := blk + EntryOverhead
	c := newWithShards(3*charge, 1) // room for exactly three blocks
	set := func(off uint64) { c.Set(1, 1, off, val(blk, byte(off))) }
	has := func(off uint64) bool {
		s := &c.shards[0]
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.entries[key{1, 1, off}] != nil // peek without setting the reference bit
	}
	expect := func(offs ...uint64) {
		t.Helper()
		present := map[uint64]bool{}
		for _, o := range offs {
			present[o] = true
		}
		for o := uint64(0); o < 10; o++ {
			if has(o) != present[o] {
				t.Fatalf("block %d present=%v, want %v", o, has(o), present[o])
			}
		}
		checkInvariants(t, c)
	}

	// Without hits, oldest first.
	set(0)
	set(1)
	set(2)
	set(3)
	expect(1, 2, 3)
	set(4)
	expect(2, 3, 4)

	// A hit buys a second chance: 2 is referenced, so 3 goes instead.
	if _, ok := c.Get(1, 1, 2); !ok {
		t.Fatal("miss")
	}
	set(5)
	expect(2, 4, 5)
	// 2 lost its reference bit when the hand passed it; the hand now sits
	// at 4, and 5 was placed behind it, so the sweep order is 4, 2, 5 —
	// the same order LRU would use (2 was touched after 4 was inserted).
	set(6)
	expect(2, 5, 6)
	set(7)
	expect(5, 6, 7)
	set(8)
	expect(6, 7, 8)

	// Everything referenced: the hand clears all bits and evicts the oldest.
	for _, o := range []uint64{6, 7, 8} {
		c.Get(1, 1, o)
	}
	set(9)
	expect(7, 8, 9)

	// A larger block evicts as many as needed.
	c.Set(1, 1, 0, val(2*blk+int(EntryOverhead), 0))
	expect(0, 9)
	c.Set(1, 1, 1, val(3*blk+2*int(EntryOverhead), 1)) // the whole capacity
	expect(1)
}

func TestTooLarge(t *testing.T) {
	c := newWithShards(1000, 1)
	c.Set(1, 1, 0, val(10, 1))
	c.Set(1, 1, 0, val(1000, 2)) // too large: not cached, old value dropped
	if _, ok := c.Get(1, 1, 0); ok {
		t.Fatal("oversized value cached or stale value kept")
	}
	c.Set(1, 1, 1, val(1000-int(EntryOverhead), 3)) // exactly fits
	if _, ok := c.Get(1, 1, 1); !ok {
		t.Fatal("value of exactly the capacity not cached")
	}
	checkInvariants(t, c)

	// Sharded: a value bigger than one shard's share is not cached.
	c = New(1 << 20)
	share := int64(1<<20) / int64(len(c.shards))
	c.Set(1, 1, 0, val(int(share), 1))
	if _, ok := c.Get(1, 1, 0); ok {
		t.Fatal("value larger than shard share cached")
	}

	// Capacity 0 (and negative) caches nothing.
	for _, capacity := range []int64{0, -5} {
		c := New(capacity)
		c.Set(1, 1, 0, nil)
		if _, ok := c.Get(1, 1, 0); ok || c.Metrics().Count != 0 || c.Metrics().Capacity != 0 {
			t.Fatalf("capacity %d cached something", capacity)
		}
	}

	// A nil cache is a valid no-op.
	var nc *Cache
	nc.Set(1, 1, 1, []byte("x"))
	nc.EvictFile(1, 1)
	nc.SetCapacity(10)
	if _, ok := nc.Get(1, 1, 1); ok || nc.Metrics() != (Metrics{}) || nc.NewID() != 0 {
		t.Fatal("nil cache misbehaves")
	}
}

func TestEvictFile(t *testing.T) {
	c := New(64 << 20)
	a, b := c.NewID(), c.NewID()
	for f := uint64(1); f <= 5; f++ {
		for off := uint64(0); off < 200; off++ {
			c.Set(a, f, off*4096, val(10, byte(f)))
			c.Set(b, f, off*4096, val(10, byte(f)))
		}
	}
	c.EvictFile(a, 3)
	c.EvictFile(a, 99) // unknown file: no-op
	for f := uint64(1); f <= 5; f++ {
		for off := uint64(0); off < 200; off++ {
			_, okA := c.Get(a, f, off*4096)
			_, okB := c.Get(b, f, off*4096)
			if okA != (f != 3) || !okB {
				t.Fatalf("file %d offset %d: present a=%v b=%v", f, off, okA, okB)
			}
		}
	}
	m := c.Metrics()
	if m.Count != 9*200 || m.Size != 9*200*(10+EntryOverhead) {
		t.Fatalf("after EvictFile: %+v", m)
	}
	checkInvariants(t, c)
	// Blocks can be cached again after eviction.
	c.Set(a, 3, 0, []byte("again"))
	if v, ok := c.Get(a, 3, 0); !ok || string(v) != "again" {
		t.Fatal("re-Set after EvictFile failed")
	}
	checkInvariants(t, c)
}

func TestSetCapacity(t *testing.T) {
	c := New(1 << 20)
	for i := range uint64(1000) {
		c.Set(1, i%7, i, val(500, byte(i)))
	}
	before := c.Metrics()
	if before.Size > 1<<20 || before.Count == 0 {
		t.Fatalf("before: %+v", before)
	}
	c.SetCapacity(64 << 10)
	after := c.Metrics()
	if after.Size > 64<<10 || after.Count >= before.Count || after.Capacity != 64<<10 {
		t.Fatalf("after shrink: %+v", after)
	}
	checkInvariants(t, c)
	c.SetCapacity(0)
	if m := c.Metrics(); m.Size != 0 || m.Count != 0 {
		t.Fatalf("after SetCapacity(0): %+v", m)
	}
	c.SetCapacity(1 << 20)
	c.Set(1, 1, 1, []byte("x"))
	if _, ok := c.Get(1, 1, 1); !ok {
		t.Fatal("grown cache does not cache")
	}
	checkInvariants(t, c)
}

// TestRandomizedModel drives a single-shard cache with random operations and
// compares what it holds against an exact CLOCK model kept as a slice.
func TestRandomizedModel(t *testing.T) {
	type mEntry struct {
		k      key
		v      []byte
		charge int64
		ref    bool
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 9))
		capacity := int64(rng.IntN(3000))
		c := newWithShards(capacity, 1)
		var ring []mEntry // ring[0] is the hand
		var size int64
		find := func(k key) int {
			for i, e := range ring {
				if e.k == k {
					return i
				}
			}
			return -1
		}
		removeAt := func(i int) {
			size -= ring[i].charge
			ring = append(ring[:i], ring[i+1:]...)
		}
		var hits, misses int64
		for op := 0; op < 5000; op++ {
			k := key{uint64(rng.IntN(2)), uint64(rng.IntN(3)), uint64(rng.IntN(10))}
			switch r := rng.IntN(10); {
			case r < 4:
				v, ok := c.Get(k.id, k.fileNum, k.offset)
				i := find(k)
				if ok != (i >= 0) {
					t.Fatalf("seed %d op %d: Get(%v) ok=%v, model %v", seed, op, k, ok, i >= 0)
				}
				if ok {
					hits++
					ring[i].ref = true
					if !bytes.Equal(v, ring[i].v) {
						t.Fatalf("Get(%v) = %q, want %q", k, v, ring[i].v)
					}
				} else {
					misses++
				}
			case r < 9:
				v := val(rng.IntN(300), byte(op))
				c.Set(k.id, k.fileNum, k.offset, v)
				if i := find(k); i >= 0 {
					removeAt(i)
				}
				ch := int64(len(v)) + EntryOverhead
				if ch <= capacity {
					for size > capacity-ch {
						if ring[0].ref {
							ring[0].ref = false
							ring = append(ring[1:], ring[0])
						} else {
							removeAt(0)
						}
					}
					ring = append(ring, mEntry{k, v, ch, false})
					size += ch
				}
			default:
				c.EvictFile(k.id, k.fileNum)
				for i := len(ring) - 1; i >= 0; i-- {
					if ring[i].k.id == k.id && ring[i].k.fileNum == k.fileNum {
						removeAt(i)
					}
				}
			}
			m := c.Metrics()
			if m.Count != int64(len(ring)) || m.Size != size || m.Hits != hits || m.Misses != misses {
				t.Fatalf("seed %d op %d: metrics %+v, model count %d size %d hits %d misses %d", seed, op, m, len(ring), size, hits, misses)
			}
		}
		checkInvariants(t, c)
	}
}

func blockValue(id, file, off uint64) []byte {
	v := make([]byte, 24+int(off%64))
	binary.LittleEndian.PutUint64(v, id)
	binary.LittleEndian.PutUint64(v[8:], file)
	binary.LittleEndian.PutUint64(v[16:], off)
	return v
}

func TestConcurrent(t *testing.T) {
	c := New(256 << 10)
	ids := []uint64{c.NewID(), c.NewID(), c.NewID()}
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 20000 {
				id, file, off := ids[rng.IntN(len(ids))], uint64(rng.IntN(8)), uint64(rng.IntN(256))*4096
				switch r := rng.IntN(100); {
				case r < 60:
					if v, ok := c.Get(id, file, off); ok && !bytes.Equal(v, blockValue(id, file, off)) {
						errc <- fmt.Errorf("Get(%d,%d,%d) returned a wrong block", id, file, off)
						return
					}
				case r < 97:
					c.Set(id, file, off, blockValue(id, file, off))
				case r < 99:
					c.EvictFile(id, file)
				default:
					if g == 0 {
						c.SetCapacity(int64(64<<10 + rng.IntN(256<<10)))
					}
					_ = c.Metrics()
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	checkInvariants(t, c)
	if m := c.Metrics(); m.Size > m.Capacity || m.Hits+m.Misses == 0 {
		t.Fatalf("metrics %+v", m)
	}
}

func BenchmarkGetParallel(b *testing.B) {
	c := New(64 << 20)
	id := c.NewID()
	const blocks = 8192
	for i := range uint64(blocks) {
		c.Set(id, i%16, i*4096, make([]byte, 4096))
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			i := uint64(rng.IntN(blocks))
			if _, ok := c.Get(id, i%16, i*4096); !ok {
				b.Error("miss")
				return
			}
		}
	})
}

func BenchmarkMixedParallel(b *testing.B) {
	c := New(16 << 20)
	id := c.NewID()
	val := make([]byte, 4096)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			i := uint64(rng.IntN(16384)) // working set 4x the capacity
			if _, ok := c.Get(id, i%16, i*4096); !ok {
				c.Set(id, i%16, i*4096, val)
			}
		}
	})
}
