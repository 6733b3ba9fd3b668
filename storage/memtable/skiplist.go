// Package memtable implements the in-memory write buffer of the storage
// engine: an arena-backed skiplist of internal keys.
//
// The skiplist supports one writer at a time (callers serialize Add) running
// concurrently with any number of readers and iterators. Readers never block
// and never observe a partially inserted entry: a node is fully written
// before it is published with an atomic store, and links are published bottom
// level first, so every level a reader can reach is a sorted subsequence of
// the level below it.
//
// All nodes, keys and values live in one fixed-size, pointer-free arena
// allocated up front, so inserting costs no Go allocation and the skiplist
// adds nothing to GC scanning work regardless of its size.
package memtable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"unsafe"

	"github.com/shale-db/shale/storage/internal/base"
)

// ErrRecordExists is returned by Skiplist.Add when an entry with an identical
// internal key (same user key and trailer) is already present. Nothing is
// inserted in that case.
var ErrRecordExists = errors.New("memtable: record with this internal key already exists")

// maxHeight is the maximum tower height. With p = 1/4 it comfortably covers
// 4^20 entries, far more than any arena can hold.
const maxHeight = 20

// node is the in-arena layout of one entry. Only the first height elements of
// tower are allocated. The key bytes immediately precede the node (the gap
// to the node is alignment padding); the value lives in the arena's top
// region.
//
// prev and tower hold arena offsets and are accessed atomically; the other
// fields are written once before the node is published and are read-only
// afterwards.
type node struct {
	keySize     uint32
	valueOffset uint32
	valueSize   uint32
	prev        uint32 // level-0 back link
	trailer     uint64
	prefix      uint64 // keyPrefix(user key): decides most comparisons without touching the key bytes
	tower       [maxHeight]uint32
}

const (
	maxNodeSize  = uint32(unsafe.Sizeof(node{}))
	nodeHeadSize = uint64(unsafe.Offsetof(node{}.tower))
	linkSize     = uint64(unsafe.Sizeof(uint32(0)))
)

// Skiplist is a sorted set of (internal key, value) entries ordered by
// base.CompareInternal. See the package documentation for the concurrency
// contract. The zero value is not usable; create one with NewSkiplist.
type Skiplist struct {
	arena  *arena
	head   uint32 // sentinel before every entry
	tail   uint32 // sentinel after every entry
	height atomic.Uint32
	count  atomic.Int64
	rng    uint64 // xorshift state; only the writer touches it
	// splice is where the latest Add put its entry, for the next Add to
	// try first. Only the writer touches it.
	splice splice
	// ascending (0 to 3) counts up when an Add's entry goes right after
	// the previous Add's, and down when not: only while it is above 0 does
	// Add try the splice, so keys in random order pay nothing for it.
	ascending int
	// hinted counts the Adds the splice placed (for tests; writer only).
	hinted int
	// ahead folds the values Add loaded ahead (see Add); writer only.
	ahead uint64
}

// splice is, on every level i, a pair of adjacent nodes: prev[i] links to
// next[i] on level i, and the gap between them holds nothing on that level.
// The pairs nest: prev[i+1] <= prev[i] and next[i] <= next[i+1] (a node on
// level i+1 is on level i too). So a key that falls between the level-0
// pair falls between every level's pair, and Add can link it there without
// a search. Add keeps the splice exact: it is the only writer, and it
// renews the splice with every entry it links (the gaps right after that
// entry); readers never change links.
type splice struct {
	prev, next [maxHeight]uint32
}

// NewSkiplist returns an empty skiplist whose arena of arenaSize bytes is
// allocated immediately and never grows. An entry costs its key and value
// plus 32 + 4*height bytes (height is 1.33 on average) plus up to 7 bytes of
// alignment padding. The arena is enlarged to hold at least the two sentinel
// nodes (about 250 bytes), so Size may exceed a tiny arenaSize; sizes near
// 4 GiB are clamped to what 32-bit offsets can address.
func NewSkiplist(arenaSize uint32) *Skiplist {
	sentinels := 2 * (uint64(maxNodeSize) + nodeAlign)
	if uint64(arenaSize) < sentinels+nodeAlign {
		arenaSize = uint32(sentinels + nodeAlign)
	}
	return newSkiplistOn(newArena(arenaSize))
}

// newSkiplistOn builds an empty skiplist on a, whose space must be unused
// (fresh, or reset).
func newSkiplistOn(a *arena) *Skiplist {
	s := &Skiplist{arena: a, rng: rand.Uint64() | 1}
	s.head = s.newSentinel()
	s.tail = s.newSentinel()
	// A reused arena holds old bytes: the sentinels are written whole.
	*s.node(s.head) = node{}
	*s.node(s.tail) = node{}
	head, tail := s.node(s.head), s.node(s.tail)
	for i := range maxHeight {
		head.tower[i] = s.tail
	}
	tail.prev = s.head
	for i := range maxHeight {
		s.splice.prev[i], s.splice.next[i] = s.head, s.tail
	}
	s.ascending = 1
	s.height.Store(1)
	return s
}

// Scribble overwrites the whole arena with b, so that a test can check that
// nothing reads a skiplist it gave up (for recycling) any more. The
// skiplist must not be used afterwards except through Recycle.
func (s *Skiplist) Scribble(b byte) {
	buf := s.arena.buf
	for i := range buf {
		buf[i] = b
	}
}

// ArenaSize returns the capacity of the skiplist's arena in bytes.
func (s *Skiplist) ArenaSize() uint32 { return s.arena.cap }

// Recycle returns a new, empty skiplist on s's arena memory, which is reused
// as it is: neither reallocated nor zeroed (every field of a node is written
// before the node is linked, and readers only follow links). The caller
// must guarantee that nothing uses s any more — no reader, iterator or
// writer — because its memory is overwritten.
func (s *Skiplist) Recycle() *Skiplist {
	a := s.arena
	s.arena = nil
	a.lo.Store(nodeAlign)
	a.hi.Store(a.cap)
	return newSkiplistOn(a)
}

func (s *Skiplist) newSentinel() uint32 {
	off, _, _ := s.arena.allocEntry(0, uint64(maxNodeSize), 0) // room is guaranteed by NewSkiplist
	return off
}

// Size returns the number of arena bytes in use, sentinels included. It is
// safe to call concurrently with Add.
func (s *Skiplist) Size() uint32 { return s.arena.size() }

// Empty reports whether no entry has been added. It is safe to call
// concurrently with Add.
func (s *Skiplist) Empty() bool {
	return atomic.LoadUint32(&s.node(s.head).tower[0]) == s.tail
}

// Count returns the number of entries added so far. It is safe to call
// concurrently with Add.
func (s *Skiplist) Count() int { return int(s.count.Load()) }

// node returns the node stored at arena offset off.
func (s *Skiplist) node(off uint32) *node {
	return (*node)(unsafe.Add(s.arena.base, off))
}

func (s *Skiplist) next(off uint32, level int) uint32 {
	return atomic.LoadUint32(&s.node(off).tower[level])
}

// userKey returns the user key of the node nd stored at offset off.
func (s *Skiplist) userKey(off uint32, nd *node) []byte {
	return s.arena.bytes(off-nd.keySize, nd.keySize)
}

func (s *Skiplist) value(nd *node) []byte {
	return s.arena.bytes(nd.valueOffset, nd.valueSize)
}

// keyPrefix packs the first 8 bytes of k big-endian, zero-padded. Two keys
// whose prefixes differ order as their prefixes do; equal prefixes decide
// nothing (e.g. "a" and "a\x00").
func keyPrefix(k []byte) uint64 {
	if len(k) >= 8 {
		return binary.BigEndian.Uint64(k)
	}
	var p uint64
	for i, c := range k {
		p |= uint64(c) << (56 - 8*i)
	}
	return p
}

// compare orders key (whose keyPrefix is prefix) against the entry stored at
// offset off, like base.CompareInternal(key, that entry's key). Most
// comparisons are decided by the prefixes; equal prefixes go on in
// compareTie. The searches' loops spell the prefix step out: the compiler
// does not inline this function.
func (s *Skiplist) compare(key base.InternalKey, prefix uint64, off uint32) int {
	np := s.node(off).prefix
	if prefix == np {
		return s.compareTie(&key, off)
	}
	if prefix < np {
		return -1
	}
	return 1
}

// compareTie is compare for an entry whose prefix equals key's.
func (s *Skiplist) compareTie(key *base.InternalKey, off uint32) int {
	nd := s.node(off)
	if c := compareAfterPrefix(key.UserKey, s.userKey(off, nd)); c != 0 {
		return c
	}
	t := uint64(key.Trailer)
	switch {
	case t > nd.trailer:
		return -1
	case t < nd.trailer:
		return 1
	}
	return 0
}

// compareAfterPrefix is bytes.Compare(a, b) for keys whose keyPrefix is
// equal. Keys of 8 bytes or more then share their first 8 bytes, and the
// rest is compared 8 bytes at a time, inline: keys that share a long
// prefix (a Raft log's entries, a shard's dedup records, all alike in
// their first 9 to 10 bytes) are told apart without a call.
func compareAfterPrefix(a, b []byte) int {
	if len(a) < 8 || len(b) < 8 {
		return bytes.Compare(a, b)
	}
	a, b = a[8:], b[8:]
	for len(a) >= 8 && len(b) >= 8 {
		x, y := binary.BigEndian.Uint64(a), binary.BigEndian.Uint64(b)
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
		a, b = a[8:], b[8:]
	}
	// Under 8 bytes left on one side: zero-padded, the first difference
	// decides; equal padded, the shorter key (a prefix of the other) is
	// first.
	if x, y := keyPrefix(a), keyPrefix(b); x != y {
		if x < y {
			return -1
		}
		return 1
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

// heightThresholds[h] is p^h scaled to 2^32 with p = 1/e: a node reaches
// height h+1 when a uniform 32-bit draw falls below it. With p = 1/e a search
// takes about e*ln(n) steps, and fewer of them fall on the sparse bottom
// levels, where each step is a cache miss, than with p = 1/4.
var heightThresholds = func() (t [maxHeight]uint32) {
	p := 1.0
	for h := range t {
		t[h] = uint32(p * float64(1<<32-1))
		p /= math.E
	}
	return t
}()

func (s *Skiplist) randomHeight() int {
	x := s.rng
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	s.rng = x
	r := uint32(x >> 32)
	h := 1
	for h < maxHeight && r < heightThresholds[h] {
		h++
	}
	return h
}

// Add inserts key with value. Both are copied into the arena, so the caller
// may reuse them afterwards. It returns ErrRecordExists if an entry with the
// identical internal key exists and ErrArenaFull if the entry does not fit;
// in both cases the skiplist is unchanged.
//
// Add must not be called concurrently with another Add; it may run
// concurrently with any number of readers and iterators.
//
// A key that lands right after the previous Add's entry (keys added in
// ascending order: a Raft log's entries, a sorted batch, a bulk load) is
// placed by the splice that Add left, with two comparisons instead of a
// search from the top; any other key is searched for as usual. The splice
// is tried only while recent Adds went in ascending order (see ascending).
func (s *Skiplist) Add(key base.InternalKey, value []byte) error {
	var prev, next [maxHeight]uint32
	listHeight := int(s.height.Load())
	prefix := keyPrefix(key.UserKey)

	// The splice's level-0 pair brackets key: so does every level's pair
	// (they nest, see splice), and key's place is between them.
	hinted := false
	p0, n0 := s.splice.prev[0], s.splice.next[0]
	if s.ascending > 0 && s.next(p0, 0) == n0 {
		lo := 1
		if p0 != s.head {
			lo = s.compare(key, prefix, p0)
		}
		if lo > 0 {
			hi := -1
			if n0 != s.tail {
				hi = s.compare(key, prefix, n0)
			}
			if hi == 0 {
				return ErrRecordExists
			}
			if hi < 0 {
				prev, next = s.splice.prev, s.splice.next
				hinted = true
			}
		} else if lo == 0 {
			return ErrRecordExists
		}
	}

	if !hinted {
		p := s.head
		var ahead uint64
		for i := listHeight - 1; i >= 0; i-- {
			n := s.next(p, i)
			for n != s.tail {
				// n was already compared one level up and found greater.
				if i+1 < listHeight && n == next[i+1] {
					break
				}
				if i > 0 {
					// Load the node the search goes to if it goes down
					// from p, while n's load is still in flight: the
					// search is a chain of cache misses, and this overlaps
					// the one of each level's first step with the last
					// step of the level above (wasted when the search
					// goes right instead).
					ahead ^= s.node(s.next(p, i-1)).prefix
				}
				// compare(key, prefix, n), by hand: the compiler does not
				// inline it, and most steps are decided by the prefixes.
				np := s.node(n).prefix
				if prefix < np {
					break
				}
				if prefix == np {
					c := s.compareTie(&key, n)
					if c == 0 {
						return ErrRecordExists
					}
					if c < 0 {
						break
					}
				}
				p = n
				n = s.next(p, i)
			}
			prev[i], next[i] = p, n
		}
		for i := listHeight; i < maxHeight; i++ {
			prev[i], next[i] = s.head, s.tail
		}
		s.ahead = ahead // keeps the loads: a value never used is not loaded
	}
	if invariants && hinted {
		// The splice is trusted without a search: check it whole
		// (invariants builds: -race or -tags invariants).
		if err := s.spliceError(&prev, &next); err != nil {
			// The only writer renews the splice with every link it makes.
			// invariant: a bad splice is a bug in Add.
			panic(err)
		}
	}

	height := s.randomHeight()
	ks, vs := uint64(len(key.UserKey)), uint64(len(value))
	nodeSize := nodeHeadSize + uint64(height)*linkSize
	off, voff, ok := s.arena.allocEntry(ks, nodeSize, vs)
	if !ok {
		return ErrArenaFull
	}
	nd := s.node(off)
	nd.keySize = uint32(ks)
	nd.valueOffset = voff
	nd.valueSize = uint32(vs)
	nd.trailer = uint64(key.Trailer)
	nd.prefix = prefix
	copy(s.userKey(off, nd), key.UserKey)
	copy(s.value(nd), value)

	// Publish bottom-up: once a reader can reach nd on level i it is
	// already linked on every level below.
	atomic.StoreUint32(&nd.prev, prev[0])
	for i := range height {
		atomic.StoreUint32(&nd.tower[i], next[i])
		atomic.StoreUint32(&s.node(prev[i]).tower[i], off)
	}
	atomic.StoreUint32(&s.node(next[0]).prev, off)

	if height > listHeight {
		s.height.Store(uint32(height))
	}
	s.count.Add(1)

	adjacent := prev[0] == p0 // nd went right after the previous Add's entry
	if adjacent {
		s.ascending = min(s.ascending+1, 3)
	} else if s.ascending > 0 {
		s.ascending--
	}
	if hinted {
		s.hinted++
	}
	// The next splice: the gaps right after nd. On the levels nd is not
	// on, the gap it fell in is still a gap.
	for i := range height {
		prev[i] = off
	}
	s.splice.prev, s.splice.next = prev, next

	return nil
}

// spliceError returns an error unless, on every level, prev links to next
// and each level's pair encloses the one below; levels above the list's
// height must hold the sentinels.
func (s *Skiplist) spliceError(prev, next *[maxHeight]uint32) error {
	h := int(s.height.Load())
	for i := range maxHeight {
		if i >= h {
			if prev[i] != s.head || next[i] != s.tail {
				return fmt.Errorf("memtable: splice level %d above the height %d holds %d, %d", i, h, prev[i], next[i])
			}
			continue
		}
		if s.next(prev[i], i) != next[i] {
			return fmt.Errorf("memtable: splice level %d: %d links to %d, not %d", i, prev[i], s.next(prev[i], i), next[i])
		}
		if i > 0 && (prev[i] != prev[i-1] && prev[i] != s.head && s.compareNodes(prev[i], prev[i-1]) > 0 ||
			next[i] != next[i-1] && next[i] != s.tail && s.compareNodes(next[i], next[i-1]) < 0) {
			return fmt.Errorf("memtable: splice level %d does not enclose level %d", i, i-1)
		}
	}
	return nil
}

// compareNodes orders the entries stored at a and b (neither a sentinel).
func (s *Skiplist) compareNodes(a, b uint32) int {
	na := s.node(a)
	k := base.InternalKey{UserKey: s.userKey(a, na), Trailer: base.Trailer(na.trailer)}
	return s.compare(k, na.prefix, b)
}

// seek returns the last node < key (or s.head) and the first node >= key (or
// s.tail) on level 0, and folds the values it loaded ahead (see Add) into
// *ahead, which the caller owns.
func (s *Skiplist) seek(key base.InternalKey, ahead *uint64) (before, after uint32) {
	prefix := keyPrefix(key.UserKey)
	p, ge := s.head, s.tail
	var fold uint64
	for i := int(s.height.Load()) - 1; i >= 0; i-- {
		n := s.next(p, i)
		// ge has already been found >= key one level up.
		for n != ge {
			if i > 0 {
				fold ^= s.node(s.next(p, i-1)).prefix // see Add
			}
			// compare(key, prefix, n) <= 0, by hand (see Add).
			if np := s.node(n).prefix; prefix < np || prefix == np && s.compareTie(&key, n) <= 0 {
				break
			}
			p = n
			n = s.next(p, i)
		}
		ge = n
	}
	*ahead ^= fold
	return p, ge
}

// NewIter returns an iterator over the entries whose user keys lie in
// [lower, upper); a nil bound means unbounded. The iterator implements
// base.InternalIterator and sees entries added concurrently on a best-effort
// basis: every entry it returns is complete, and the entries it returns are
// always in sorted order, but entries added after it was positioned may or
// may not be observed. The bounds are retained, not copied.
func (s *Skiplist) NewIter(lower, upper []byte) *Iterator {
	return &Iterator{list: s, lower: lower, upper: upper}
}

// Lookup calls visit with the entries from the first at or after key (its
// newest version first), in order, until visit returns false or they run
// out, seeing concurrent adds as an iterator does. The key and value passed
// to visit alias the arena (see the Iterator documentation). It is what a
// point read needs from an iterator, without allocating one.
func (s *Skiplist) Lookup(key []byte, visit func(k base.InternalKey, v []byte) bool) {
	it := Iterator{list: s}
	for ok := it.SeekGE(key); ok && visit(it.Key(), it.Value()); ok = it.Next() {
	}
}

func (s *Skiplist) seekGE(key base.InternalKey, ahead *uint64) uint32 {
	_, n := s.seek(key, ahead)
	return n
}

func (s *Skiplist) seekLT(key base.InternalKey, ahead *uint64) uint32 {
	p, _ := s.seek(key, ahead)
	return p
}
