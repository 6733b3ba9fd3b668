package shard

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// RecordCache remembers, for the shards of a node, the stored records of
// user keys that applies recently read or wrote, so that the apply of the
// next write to one of them (which needs the key's previous record: its
// create revision and version, and the replaced value for the change log)
// reads no engine. It holds at most its capacity in bytes (records, keys
// and a per-entry overhead) across every shard that uses it, evicting the
// least recently used first (CLOCK). A shard sees only what it put in
// itself, and forgets everything at once when its engine changes other than
// by its own applies (a range deletion, a restore from a snapshot): its
// entries are then unreachable and age out. A shard that starts on an empty
// engine (Bootstrap) also learns from the cache that a key is absent: until
// the cache first evicts or refuses one of its records, a key it holds
// nothing of is not in the engine. A nil *RecordCache caches nothing. All
// methods may be called concurrently.
type RecordCache struct {
	seed  maphash.Seed
	ns    atomic.Uint64
	parts [recordCacheParts]recordPart
}

// recordSpace is a shard's namespace in a RecordCache: its entries are
// keyed by id, and the shard takes a new space to forget them all.
type recordSpace struct {
	id uint64
	// complete, while set, says that the cache holds a record of every user
	// key the shard's engine holds, so that a key the cache holds nothing
	// of is absent. The shard sets it only on a space it took while its
	// engine held no user key and whose every write of a user key it puts
	// in the cache (Bootstrap, then Apply); the cache clears it for good
	// when it evicts an entry of the space or refuses one of its records,
	// under the lock of the part the key belongs to, which a lookup of
	// that key holds too.
	complete atomic.Bool
}

// RecordCacheMetrics is a point-in-time summary of a RecordCache.
type RecordCacheMetrics struct {
	// Bytes is what the cache holds now (records, keys and overhead).
	Bytes int64
	// Hits and Misses count, since the cache was made, the lookups of an
	// apply that found the key's record, or did not (the apply then read
	// the engine).
	Hits, Misses uint64
}

// recordCacheParts is how many independently locked parts a RecordCache
// has (apply workers of different shards rarely wait for each other).
const recordCacheParts = 16

// recordEntryOverhead is charged per entry on top of its key and record:
// an estimate of the map slot, the ring slot and the strings' headers.
const recordEntryOverhead = 96

// recordPart is one independently locked part of a RecordCache.
type recordPart struct {
	mu       sync.Mutex
	index    map[string]int // key -> slot in ring
	ring     []recordSlot
	free     []int // slots of ring that hold no entry
	hand     int
	used     int64
	capacity int64
	// hits and misses count the part's lookups (under mu, which a lookup
	// holds anyway: no cache line shared by every apply worker).
	hits, misses uint64
}

// recordSlot is one entry of a part: a namespaced key, its space and the
// record (present false: the key is known to be absent).
type recordSlot struct {
	key     string
	space   *recordSpace
	raw     []byte
	present bool
	live    bool // the slot holds an entry
	ref     bool // used since the hand last passed
}

// NewRecordCache returns a cache of at most capacityBytes bytes; a capacity
// <= 0 returns nil (no cache).
func NewRecordCache(capacityBytes int64) *RecordCache {
	if capacityBytes <= 0 {
		return nil
	}
	c := &RecordCache{seed: maphash.MakeSeed()}
	for i := range c.parts {
		c.parts[i].index = map[string]int{}
		c.parts[i].capacity = capacityBytes / recordCacheParts
	}
	return c
}

// namespace returns a namespace never returned before, not complete: a
// shard's entries are keyed by its current namespace, and it takes a new
// one to forget them all. Nil on a nil cache.
func (c *RecordCache) namespace() *recordSpace {
	if c == nil {
		return nil
	}
	return &recordSpace{id: c.ns.Add(1)}
}

// Metrics returns the cache's metrics (zero for nil).
func (c *RecordCache) Metrics() RecordCacheMetrics {
	if c == nil {
		return RecordCacheMetrics{}
	}
	var m RecordCacheMetrics
	for i := range c.parts {
		p := &c.parts[i]
		p.mu.Lock()
		m.Bytes += p.used
		m.Hits += p.hits
		m.Misses += p.misses
		p.mu.Unlock()
	}
	return m
}

// UsedBytes reports the bytes the cache holds now (0 for nil).
func (c *RecordCache) UsedBytes() int64 {
	if c == nil {
		return 0
	}
	var n int64
	for i := range c.parts {
		p := &c.parts[i]
		p.mu.Lock()
		n += p.used
		p.mu.Unlock()
	}
	return n
}

// recordKey builds the namespaced key of engine key ek into buf.
func recordKey(buf []byte, ns uint64, ek []byte) []byte {
	buf = binary.BigEndian.AppendUint64(buf[:0], ns)
	return append(buf, ek...)
}

func (c *RecordCache) part(key []byte) *recordPart {
	return &c.parts[maphash.Bytes(c.seed, key)%recordCacheParts]
}

// get returns the record cached under key (a recordKey in space sp):
// raw and present as put, present false when sp is complete and nothing is
// cached, and ok false when the cache does not know. raw must not be
// modified.
func (c *RecordCache) get(key []byte, sp *recordSpace) (raw []byte, present, ok bool) {
	p := c.part(key)
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := p.index[string(key)]
	if !ok {
		if sp.complete.Load() {
			p.hits++
			return nil, false, true
		}
		p.misses++
		return nil, false, false
	}
	p.hits++
	s := &p.ring[i]
	s.ref = true
	return s.raw, s.present, true
}

// put caches a record under key (a recordKey in space sp), replacing what
// was there; the cache keeps raw, which must not be modified afterwards. A
// record larger than a part's capacity is not cached (what was cached
// under key is dropped, and sp is no longer complete).
func (c *RecordCache) put(key, raw []byte, present bool, sp *recordSpace) {
	p := c.part(key)
	charge := int64(len(key) + len(raw) + recordEntryOverhead)
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := p.index[string(key)]
	if charge > p.capacity {
		if ok {
			p.drop(i)
		}
		sp.complete.Store(false)
		return
	}
	if ok {
		// Replace in place: the slot as a new entry would have it.
		s := &p.ring[i]
		p.used += int64(len(raw) - len(s.raw))
		s.raw, s.present, s.ref = raw, present, false
		for p.used > p.capacity {
			p.evictOne()
		}
		return
	}
	for p.used+charge > p.capacity {
		p.evictOne()
	}
	if n := len(p.free); n > 0 {
		i, p.free = p.free[n-1], p.free[:n-1]
	} else {
		p.ring = append(p.ring, recordSlot{})
		i = len(p.ring) - 1
	}
	p.ring[i] = recordSlot{key: string(key), space: sp, raw: raw, present: present, live: true}
	p.index[p.ring[i].key] = i
	p.used += charge
}

// drop removes the entry in slot i.
func (p *recordPart) drop(i int) {
	s := &p.ring[i]
	delete(p.index, s.key)
	p.used -= int64(len(s.key) + len(s.raw) + recordEntryOverhead)
	*s = recordSlot{}
	p.free = append(p.free, i)
}

// evictOne moves the hand to the first entry not used since it last
// passed, clearing the use marks it passes, and drops that entry, whose
// space is then no longer complete. The part must hold at least one entry.
func (p *recordPart) evictOne() {
	for {
		if p.hand >= len(p.ring) {
			p.hand = 0
		}
		s := &p.ring[p.hand]
		i := p.hand
		p.hand++
		switch {
		case !s.live:
		case s.ref:
			s.ref = false
		default:
			s.space.complete.Store(false)
			p.drop(i)
			return
		}
	}
}
