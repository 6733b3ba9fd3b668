package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/shale-db/shale/storage"
)

// DefaultEntryCacheBytes is the entry cache budget used when
// Options.EntryCacheBytes is zero.
const DefaultEntryCacheBytes = 16 << 20

// cacheEntryOverhead approximates the memory a cached entry costs beyond its
// encoded size (the cacheEntry and raftpb.Entry structs, FIFO slot).
const cacheEntryOverhead = 128

// Options configure a Store. The zero value is usable.
type Options struct {
	// EntryCacheBytes bounds the memory of the entry cache, shared by all
	// shards of the Store: recently appended entries are kept in memory so
	// that Raft reads them without touching the engine, and the oldest are
	// evicted first once the total exceeds the budget. Default
	// DefaultEntryCacheBytes (16 MiB); negative disables caching of
	// committed entries. Entries staged into a batch that Store.Commit has
	// not yet written stay in memory regardless of the budget (see Store).
	EntryCacheBytes int64
}

// Store is the Raft log of every shard on one node, kept in one storage
// engine. It is safe for concurrent use. The Store does not own the engine:
// the caller opens it (with a synced WAL) and closes it after its last use
// of the Store and its Logs.
//
// A Store must be the only writer of the engine's raft keys (see the package
// comment), and every batch holding changes staged by a Log must be written
// with Store.Commit: Commit is what releases staged entries to cache
// eviction. If Commit fails, the in-memory state of the Logs whose changes
// the batch held is ahead of the engine; the node must stop using the Store
// (and restart from the engine).
type Store struct {
	db         *storage.DB
	cacheLimit int64 // 0 when caching of committed entries is disabled

	mu   sync.Mutex // guards logs
	logs map[uint64]*Log

	// pendMu guards pending: the Logs that staged entries into each batch
	// not yet committed. Lock order: Log.mu before pendMu.
	pendMu  sync.Mutex
	pending map[*storage.Batch]map[*Log]struct{}

	// evictMu serialises eviction. Lock order: evictMu, then Log.mu, then
	// cacheMu.
	evictMu sync.Mutex
	// cacheMu guards the FIFO of cached entries (oldest first, with removed
	// entries skipped lazily) and the accounting below.
	cacheMu    sync.Mutex
	fifo       []*cacheEntry
	fifoHead   int
	cacheBytes int64 // memory charged for live cached entries
	cacheLive  int   // number of live cached entries
}

// cacheEntry is one entry held by a Log's cache.
type cacheEntry struct {
	log   *Log
	ent   *raftpb.Entry
	index uint64
	term  uint64
	size  int64 // encoded size (proto.Size)
	// removed is set (under log.mu) when the entry leaves its Log's cache.
	// A cacheEntry that is not removed is in its Log's cache.
	removed atomic.Bool
}

func (c *cacheEntry) charge() int64 { return c.size + cacheEntryOverhead }

// New returns a Store keeping Raft logs in db. It reads nothing: each
// shard's log is loaded by Shard.
func New(db *storage.DB, opts Options) *Store {
	limit := opts.EntryCacheBytes
	switch {
	case limit == 0:
		limit = DefaultEntryCacheBytes
	case limit < 0:
		limit = 0
	}
	return &Store{
		db:         db,
		cacheLimit: limit,
		logs:       make(map[uint64]*Log),
		pending:    make(map[*storage.Batch]map[*Log]struct{}),
	}
}

// Shard returns the log of shardID, loading it from the engine on the first
// call (a shard with no persisted state gets an empty log: truncated state
// (0, 0), no entries, empty hard state). Later calls return the same *Log,
// also after Log.Destroy. Loading validates the persisted state (truncated
// state checksum, hard state encoding, entries contiguous from the truncated
// index + 1, last entry's index); damage is an error wrapping ErrCorrupt.
// Loading walks the shard's entries once (to check them and total their
// size), so it costs a read of the shard's log.
func (s *Store) Shard(shardID uint64) (*Log, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.logs[shardID]; ok {
		return l, nil
	}
	l, err := s.load(shardID)
	if err != nil {
		return nil, err
	}
	s.logs[shardID] = l
	return l, nil
}

// load reads the persisted state of shardID.
func (s *Store) load(shardID uint64) (*Log, error) {
	l := &Log{store: s, shardID: shardID, hs: new(raftpb.HardState)}
	v, err := s.db.Get(truncatedStateKey(shardID))
	switch {
	case err == nil:
		if l.truncIndex, l.truncTerm, err = decodeTruncatedState(v); err != nil {
			return nil, fmt.Errorf("raftlog: shard %d: %w", shardID, err)
		}
	case !errors.Is(err, storage.ErrNotFound):
		return nil, fmt.Errorf("raftlog: shard %d: read truncated state: %w", shardID, err)
	}
	v, err = s.db.Get(hardStateKey(shardID))
	switch {
	case err == nil:
		if l.hs, err = decodeHardState(v); err != nil {
			return nil, fmt.Errorf("raftlog: shard %d: %w", shardID, err)
		}
	case !errors.Is(err, storage.ErrNotFound):
		return nil, fmt.Errorf("raftlog: shard %d: read hard state: %w", shardID, err)
	}

	// Walk the entries to find the last one, check that they are contiguous
	// and add up their sizes.
	l.lastIndex, l.lastTerm = l.truncIndex, l.truncTerm
	it, err := s.db.NewIter(&storage.IterOptions{
		LowerBound: entryKey(shardID, 0),
		UpperBound: entriesEnd(shardID),
	})
	if err != nil {
		return nil, fmt.Errorf("raftlog: shard %d: %w", shardID, err)
	}
	var lastVal []byte
	for ok := it.SeekGE(entryKey(shardID, l.truncIndex+1)); ok; ok = it.Next() {
		idx, isEntry := parseEntryKey(shardID, it.Key())
		switch {
		case !isEntry:
			err = fmt.Errorf("raftlog: shard %d: %w: malformed entry key %x", shardID, ErrCorrupt, it.Key())
		case idx != l.lastIndex+1:
			err = fmt.Errorf("raftlog: shard %d: %w: log has a gap: entry %d follows %d (truncated index %d)",
				shardID, ErrCorrupt, idx, l.lastIndex, l.truncIndex)
		}
		if err != nil {
			break
		}
		l.lastIndex = idx
		l.sizeBytes += int64(len(it.Value()))
		lastVal = append(lastVal[:0], it.Value()...)
	}
	if cerr := it.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("raftlog: shard %d: read entries: %w", shardID, cerr)
	}
	if err != nil {
		return nil, err
	}
	if l.lastIndex > l.truncIndex {
		e, err := decodeEntry(l.lastIndex, lastVal)
		if err != nil {
			return nil, fmt.Errorf("raftlog: shard %d entry %d: %w", shardID, l.lastIndex, err)
		}
		l.lastTerm = e.GetTerm()
	}
	return l, nil
}

// ShardIDs lists, in increasing order, the shards with persisted Raft state
// (a hard state or a truncated state) in the engine, as committed: for
// restarting the node's replicas. Shards whose only keys are entries are not
// listed.
func (s *Store) ShardIDs() ([]uint64, error) {
	it, err := s.db.NewIter(&storage.IterOptions{
		LowerBound: []byte{keyPrefix},
		UpperBound: []byte{keyPrefix + 1},
	})
	if err != nil {
		return nil, fmt.Errorf("raftlog: list shards: %w", err)
	}
	var ids []uint64
	for ok := it.First(); ok; {
		k := it.Key()
		if len(k) < shardPrefixLen+1 {
			err = fmt.Errorf("raftlog: list shards: %w: malformed key %x", ErrCorrupt, k)
			break
		}
		id := binary.BigEndian.Uint64(k[1:shardPrefixLen])
		// The hard state and truncated state keys sort after the entries.
		if it.SeekGE(hardStateKey(id)) {
			k = it.Key()
			if bytes.HasPrefix(k, shardStart(id)) && len(k) == shardPrefixLen+1 &&
				(k[shardPrefixLen] == suffixHardState || k[shardPrefixLen] == suffixTruncated) {
				ids = append(ids, id)
			}
		}
		ok = it.SeekGE(shardEnd(id))
	}
	if cerr := it.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("raftlog: list shards: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// Commit writes b, a batch holding changes staged by Logs of this Store
// (and possibly other writes of the caller), durably: it returns once the
// batch is synced, so one fsync covers every shard of a Raft cycle. Then it
// releases the entries staged into b to cache eviction and evicts the
// oldest cached entries beyond the budget. b may be reset and reused after
// Commit returns.
func (s *Store) Commit(b *storage.Batch) error { return s.Write(b, true) }

// Write is Commit with the choice of syncing: a batch that only moves
// commit indexes (Raft's Ready.MustSync is false) need not be synced,
// because Raft can recover a lost commit index from its peers; entries,
// terms and votes must be.
func (s *Store) Write(b *storage.Batch, sync bool) error {
	if err := s.db.Apply(b, storage.WriteOptions{Sync: sync}); err != nil {
		return fmt.Errorf("raftlog: commit: %w", err)
	}
	s.pendMu.Lock()
	logs := s.pending[b]
	delete(s.pending, b)
	s.pendMu.Unlock()
	for l := range logs {
		l.mu.Lock()
		delete(l.pins, b)
		l.mu.Unlock()
	}
	s.evict()
	return nil
}

// CacheBytes returns the memory currently charged to the entry cache (the
// encoded size of the cached entries plus a fixed overhead per entry).
func (s *Store) CacheBytes() int64 {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	return s.cacheBytes
}

// addPending records that l staged entries into b. l.mu is held.
func (s *Store) addPending(b *storage.Batch, l *Log) {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	m := s.pending[b]
	if m == nil {
		m = make(map[*Log]struct{})
		s.pending[b] = m
	}
	m[l] = struct{}{}
}

// cacheAdded accounts for entries added to a Log's cache. The Log's mu is
// held.
func (s *Store) cacheAdded(ces []*cacheEntry) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	for _, ce := range ces {
		s.cacheBytes += ce.charge()
	}
	s.cacheLive += len(ces)
	s.fifo = append(s.fifo, ces...)
	// Drop the FIFO slots of entries that left their caches other than by
	// eviction (rewritten, compacted, destroyed), so the FIFO stays
	// proportional to the live entries.
	if n := len(s.fifo) - s.fifoHead; n > 1024 && n > 2*s.cacheLive {
		live := make([]*cacheEntry, 0, 2*s.cacheLive+len(ces))
		for _, ce := range s.fifo[s.fifoHead:] {
			if !ce.removed.Load() {
				live = append(live, ce)
			}
		}
		s.fifo, s.fifoHead = live, 0
	}
}

// cacheRemoved accounts for entries removed from a Log's cache (already
// marked removed). The Log's mu is held.
func (s *Store) cacheRemoved(charge int64, n int) {
	if n == 0 {
		return
	}
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	s.cacheBytes -= charge
	s.cacheLive -= n
}

// evict drops the oldest cached entries until the cache is within budget,
// stopping early at an entry still staged in an uncommitted batch.
func (s *Store) evict() {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	for {
		s.cacheMu.Lock()
		for s.fifoHead < len(s.fifo) && s.fifo[s.fifoHead].removed.Load() {
			s.fifo[s.fifoHead] = nil
			s.fifoHead++
		}
		if s.fifoHead == len(s.fifo) {
			s.fifo, s.fifoHead = s.fifo[:0], 0
		}
		if s.cacheBytes <= s.cacheLimit || s.fifoHead == len(s.fifo) {
			s.cacheMu.Unlock()
			return
		}
		ce := s.fifo[s.fifoHead]
		s.cacheMu.Unlock()

		l := ce.log
		l.mu.Lock()
		ok := l.evictThroughLocked(ce)
		l.mu.Unlock()
		if !ok {
			return
		}
	}
}
