// Package cache implements the block cache shared by every database instance
// in a process.
//
// Blocks are keyed by (id, fileNum, offset): id is a namespace handed out by
// NewID so unrelated databases never collide. The cache is split into
// independently locked shards chosen by a hash of the whole key. Each shard
// runs the CLOCK (second-chance) approximation of LRU: a hit only sets a
// per-entry reference bit under a read lock, so concurrent lookups never
// serialize on list manipulation; eviction sweeps a circular list, clearing
// reference bits and evicting the first unreferenced entry, so entries are
// evicted oldest-first except that one referenced since the hand last passed
// gets another round.
//
// Every entry also sits on a per-(id, fileNum) list within its shard, so
// EvictFile costs one map lookup per shard plus the file's own blocks.
package cache

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// EntryOverhead is the number of bytes charged to the capacity for each cached
// block on top of len(value): an estimate of the bookkeeping (entry struct and
// map slots) the block costs.
const EntryOverhead = int64(unsafe.Sizeof(entry{})) + 48

// Metrics is a point-in-time summary of a cache. Hits and Misses are
// cumulative since New. Size and Count are summed shard by shard, so under
// concurrent mutation they are approximate (each shard's contribution is
// exact at the moment it was read).
type Metrics struct {
	Hits     int64 // Get calls that found a block
	Misses   int64 // Get calls that did not
	Size     int64 // bytes charged: sum of len(value)+EntryOverhead
	Count    int64 // number of cached blocks
	Capacity int64 // configured capacity in bytes
}

// Cache is a sharded, concurrency-safe block cache. All methods may be called
// concurrently. A nil *Cache is valid and caches nothing.
type Cache struct {
	shards   []shard
	mask     uint64
	capacity atomic.Int64
	nextID   atomic.Uint64
	mu       sync.Mutex // serializes SetCapacity
}

type key struct{ id, fileNum, offset uint64 }

type fileKey struct{ id, fileNum uint64 }

type entry struct {
	key                key
	value              []byte
	charge             int64
	referenced         atomic.Bool
	next, prev         *entry // clock ring
	fileNext, filePrev *entry // per-file list (nil-terminated)
}

type shard struct {
	mu       sync.RWMutex
	entries  map[key]*entry
	files    map[fileKey]*entry // head of each file's list
	hand     *entry             // next entry the clock examines; nil when empty
	size     int64
	capacity int64
	hits     atomic.Int64
	misses   atomic.Int64
	_        [64]byte // keep neighbouring shards' hot words off this cache line
}

// New returns a cache holding at most capacityBytes bytes (values plus
// EntryOverhead per block). A capacity <= 0 caches nothing. The capacity is
// divided evenly among the shards; a value whose charge exceeds its shard's
// share is not cached.
func New(capacityBytes int64) *Cache {
	n := 16
	for n < 4*runtime.GOMAXPROCS(0) && n < 256 {
		n *= 2
	}
	return newWithShards(capacityBytes, n)
}

// newWithShards is New with an explicit shard count, a power of two.
func newWithShards(capacityBytes int64, n int) *Cache {
	c := &Cache{shards: make([]shard, n), mask: uint64(n - 1)}
	for i := range c.shards {
		c.shards[i].entries = make(map[key]*entry)
		c.shards[i].files = make(map[fileKey]*entry)
	}
	c.SetCapacity(capacityBytes)
	return c
}

// NewID returns a namespace identifier that no other call to NewID on this
// cache has returned or will return. IDs are never 0.
func (c *Cache) NewID() uint64 {
	if c == nil {
		return 0
	}
	return c.nextID.Add(1)
}

func (c *Cache) shard(k key) *shard {
	h := k.id*0x9e3779b97f4a7c15 ^ k.fileNum*0xc2b2ae3d27d4eb4f ^ k.offset*0x165667b19e3779f9
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return &c.shards[h&c.mask]
}

// Get returns the block cached for (id, fileNum, offset) and whether it was
// found. The returned slice is shared with the cache and other readers: it
// must not be modified. It stays valid (it is ordinary garbage-collected
// memory) even after the block is evicted.
func (c *Cache) Get(id, fileNum, offset uint64) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	k := key{id, fileNum, offset}
	s := c.shard(k)
	s.mu.RLock()
	e := s.entries[k]
	var v []byte
	if e != nil {
		v = e.value
		if !e.referenced.Load() { // avoid dirtying the line on repeated hits
			e.referenced.Store(true)
		}
	}
	s.mu.RUnlock()
	if e == nil {
		s.misses.Add(1)
		return nil, false
	}
	s.hits.Add(1)
	return v, true
}

// Set caches value for (id, fileNum, offset), replacing any previous value.
// The cache retains value without copying; nobody may modify it afterwards.
// The block is charged len(value)+EntryOverhead; if that exceeds the shard's
// capacity the block is not cached (and a previous value for the key is
// dropped). Inserting may evict other blocks.
func (c *Cache) Set(id, fileNum, offset uint64, value []byte) {
	if c == nil {
		return
	}
	k := key{id, fileNum, offset}
	s := c.shard(k)
	charge := int64(len(value)) + EntryOverhead
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.entries[k]; old != nil {
		s.remove(old)
	}
	if charge > s.capacity {
		return
	}
	// Make room first so the sweep can never pick the new block itself.
	s.evictTo(s.capacity - charge)
	s.insert(&entry{key: k, value: value, charge: charge})
}

// EvictFile drops every cached block of fileNum in namespace id. Its cost is
// proportional to the number of shards plus the number of blocks dropped.
func (c *Cache) EvictFile(id, fileNum uint64) {
	if c == nil {
		return
	}
	fk := fileKey{id, fileNum}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		_, present := s.files[fk]
		s.mu.RUnlock()
		if !present {
			continue
		}
		s.mu.Lock()
		for e := s.files[fk]; e != nil; {
			next := e.fileNext
			s.remove(e)
			e = next
		}
		s.mu.Unlock()
	}
}

// Metrics returns the cache's counters; see Metrics for their consistency.
func (c *Cache) Metrics() Metrics {
	if c == nil {
		return Metrics{}
	}
	m := Metrics{Capacity: c.capacity.Load()}
	for i := range c.shards {
		s := &c.shards[i]
		m.Hits += s.hits.Load()
		m.Misses += s.misses.Load()
		s.mu.RLock()
		m.Size += s.size
		m.Count += int64(len(s.entries))
		s.mu.RUnlock()
	}
	return m
}

// SetCapacity changes the capacity (negative means 0) and, when it shrinks,
// evicts blocks until every shard fits its new share. Blocks that no longer
// fit any shard are evicted too.
func (c *Cache) SetCapacity(bytes int64) {
	if c == nil {
		return
	}
	bytes = max(bytes, 0)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capacity.Store(bytes)
	n := int64(len(c.shards))
	for i := range c.shards {
		s := &c.shards[i]
		share := bytes / n
		if int64(i) < bytes%n {
			share++
		}
		s.mu.Lock()
		s.capacity = share
		s.evictTo(share)
		s.mu.Unlock()
	}
}

// insert adds e as the newest entry: just behind the hand, so a full sweep
// reaches it last. s.mu must be held exclusively.
func (s *shard) insert(e *entry) {
	s.entries[e.key] = e
	s.size += e.charge
	if s.hand == nil {
		e.next, e.prev = e, e
		s.hand = e
	} else {
		e.next, e.prev = s.hand, s.hand.prev
		e.prev.next = e
		s.hand.prev = e
	}
	fk := fileKey{e.key.id, e.key.fileNum}
	if head := s.files[fk]; head != nil {
		e.fileNext = head
		head.filePrev = e
	}
	s.files[fk] = e
}

// remove unlinks e from every structure. s.mu must be held exclusively.
func (s *shard) remove(e *entry) {
	delete(s.entries, e.key)
	s.size -= e.charge
	if e.next == e {
		s.hand = nil
	} else {
		if s.hand == e {
			s.hand = e.next
		}
		e.prev.next = e.next
		e.next.prev = e.prev
	}
	e.next, e.prev = nil, nil
	fk := fileKey{e.key.id, e.key.fileNum}
	if e.filePrev != nil {
		e.filePrev.fileNext = e.fileNext
	} else if e.fileNext != nil {
		s.files[fk] = e.fileNext
	} else {
		delete(s.files, fk)
	}
	if e.fileNext != nil {
		e.fileNext.filePrev = e.filePrev
	}
	e.fileNext, e.filePrev = nil, nil
}

// evictTo runs the clock until the shard holds at most target bytes. Each
// entry is passed over at most once (after its reference bit is cleared)
// before being evicted, so this terminates within two sweeps. s.mu must be
// held exclusively.
func (s *shard) evictTo(target int64) {
	for s.size > target && s.hand != nil {
		e := s.hand
		if e.referenced.Load() {
			e.referenced.Store(false)
			s.hand = e.next
			continue
		}
		s.remove(e)
	}
}
