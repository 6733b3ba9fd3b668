package raftlog

import (
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/shale-db/shale/proto/codec"
	"github.com/shale-db/shale/storage"
)

// Log is the Raft log of one shard: it implements raft.Storage. Writes
// (Append, ApplySnapshot, Compact, Destroy, SetCallbacks) come from one
// goroutine, the shard's Raft loop; every method may be called concurrently
// with them from other goroutines.
//
// The log holds the entries (TruncatedIndex, last index]; the term of the
// entry at TruncatedIndex is kept (TruncatedTerm) for Raft's log matching.
// A change is visible to the Log's methods as soon as it is staged, and is
// durable once the batch it was staged into is written by Store.Commit. The
// caller must not let Raft observe a change (through Ready) before the
// batch holding it is committed.
type Log struct {
	store   *Store
	shardID uint64

	mu sync.RWMutex
	// truncIndex and truncTerm identify the entry before the first one kept.
	truncIndex, truncTerm uint64
	// lastIndex and lastTerm identify the last entry (the truncated one when
	// the log is empty).
	lastIndex, lastTerm uint64
	hs                  *raftpb.HardState // never nil; never mutated
	// cache holds a suffix of the log: cache[i] is the entry at index
	// lastIndex-len(cache)+1+i.
	cache       []*cacheEntry
	cachedBytes int64 // encoded size of the cached entries
	sizeBytes   int64 // approximate encoded size of the entries held
	// pins maps each uncommitted batch holding entries staged by Append to
	// the lowest index staged into it: cached entries at or above the lowest
	// pin are not evicted.
	pins map[*storage.Batch]uint64

	confStateFn func() *raftpb.ConfState
	snapshotFn  func() (*raftpb.Snapshot, error)
}

var _ raft.Storage = (*Log)(nil)

// maxPointDeletes is the longest suffix of replaced entries Append deletes
// with point deletions rather than a range deletion.
const maxPointDeletes = 16

// ShardID returns the shard whose log this is.
func (l *Log) ShardID() uint64 { return l.shardID }

// SetCallbacks installs the functions the Log calls for what the state
// machine, not the log, knows: confState returns the current configuration
// (for InitialState) and snapshot returns the metadata of the snapshot Raft
// would send to a follower that is behind the truncated index (for
// Snapshot; the data itself travels out of band, so Data is normally empty).
// The replica owning the log calls it once before creating its
// raft.RawNode. The callbacks are called without the Log's lock held, so
// they may call the Log's read methods.
func (l *Log) SetCallbacks(confState func() *raftpb.ConfState, snapshot func() (*raftpb.Snapshot, error)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.confStateFn, l.snapshotFn = confState, snapshot
}

// InitialState implements raft.Storage: it returns a copy of the last staged
// hard state (empty if none) and the configuration reported by the
// confState callback. It fails if SetCallbacks has not installed one.
func (l *Log) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	l.mu.RLock()
	hs, fn := l.hs, l.confStateFn
	l.mu.RUnlock()
	if fn == nil {
		return nil, nil, fmt.Errorf("raftlog: shard %d: InitialState before SetCallbacks installed a ConfState callback", l.shardID)
	}
	return codec.Clone(hs), raftpb.EnsureConfState(fn()), nil
}

// HardState returns a copy of the last staged hard state (empty if none was
// ever staged).
func (l *Log) HardState() *raftpb.HardState {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return codec.Clone(l.hs)
}

// TermVote returns the term and vote of the last staged hard state (zero
// if none was ever staged), without HardState's copy.
func (l *Log) TermVote() (term, vote uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.hs.GetTerm(), l.hs.GetVote()
}

// TruncatedIndex returns the index of the last entry removed from the log:
// FirstIndex is TruncatedIndex + 1.
func (l *Log) TruncatedIndex() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.truncIndex
}

// TruncatedTerm returns the term of the entry at TruncatedIndex.
func (l *Log) TruncatedTerm() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.truncTerm
}

// SizeBytes returns the approximate encoded size of the entries the log
// holds, for metrics and truncation decisions. It is exact after Store.Shard
// loads the log and while entries are appended; removing entries that are no
// longer cached (by Compact or a conflicting Append) subtracts an estimate
// based on their average size. It is zero when the log holds no entries.
func (l *Log) SizeBytes() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.sizeBytes
}

// FirstIndex implements raft.Storage: the index of the first entry the log
// may hold, TruncatedIndex + 1.
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.truncIndex + 1, nil
}

// LastIndex implements raft.Storage: the index of the last entry, or
// TruncatedIndex when the log holds none.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.lastIndex, nil
}

// Term implements raft.Storage: the term of the entry at i, for i in
// [TruncatedIndex, LastIndex]. It returns raft.ErrCompacted below that range
// and raft.ErrUnavailable above it.
func (l *Log) Term(i uint64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.termLocked(i)
}

func (l *Log) termLocked(i uint64) (uint64, error) {
	switch {
	case i < l.truncIndex:
		return 0, raft.ErrCompacted
	case i == l.truncIndex:
		return l.truncTerm, nil
	case i > l.lastIndex:
		return 0, raft.ErrUnavailable
	case i == l.lastIndex:
		return l.lastTerm, nil
	}
	if first := l.cacheFirstLocked(); i >= first {
		return l.cache[i-first].term, nil
	}
	v, err := l.store.db.Get(entryKey(l.shardID, i))
	if errors.Is(err, storage.ErrNotFound) {
		return 0, fmt.Errorf("raftlog: shard %d entry %d: %w: missing from the engine (log is (%d, %d])",
			l.shardID, i, ErrCorrupt, l.truncIndex, l.lastIndex)
	}
	if err != nil {
		return 0, fmt.Errorf("raftlog: shard %d entry %d: %w", l.shardID, i, err)
	}
	e, err := decodeEntry(i, v)
	if err != nil {
		return 0, fmt.Errorf("raftlog: shard %d entry %d: %w", l.shardID, i, err)
	}
	return e.GetTerm(), nil
}

// Entries implements raft.Storage with raft.MemoryStorage's contract: the
// entries [lo, hi), cut to the longest prefix whose total encoded size does
// not exceed maxSize, but never empty when lo < hi. It returns
// raft.ErrCompacted if lo <= TruncatedIndex and raft.ErrUnavailable if the
// log holds no entries. hi beyond LastIndex+1 (on which MemoryStorage
// panics) or lo > hi is an error. The returned slice is newly allocated;
// the entries must not be mutated.
func (l *Log) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	switch {
	case lo <= l.truncIndex:
		return nil, raft.ErrCompacted
	case hi > l.lastIndex+1:
		return nil, fmt.Errorf("raftlog: shard %d: entries [%d, %d) beyond last index %d: %w",
			l.shardID, lo, hi, l.lastIndex, raft.ErrUnavailable)
	case l.lastIndex == l.truncIndex:
		return nil, raft.ErrUnavailable
	case lo > hi:
		return nil, fmt.Errorf("raftlog: shard %d: invalid entries range [%d, %d)", l.shardID, lo, hi)
	}
	if lo == hi {
		return []*raftpb.Entry{}, nil
	}
	out := make([]*raftpb.Entry, 0, min(hi-lo, 64))
	var size uint64
	// add appends e unless the limit is reached; it reports whether to go on.
	add := func(e *raftpb.Entry, sz uint64) bool {
		if len(out) > 0 && size+sz > maxSize {
			return false
		}
		size += sz
		out = append(out, e)
		return true
	}
	first := l.cacheFirstLocked()
	if lo < first {
		done, err := l.readEntriesLocked(lo, min(hi, first), add)
		if err != nil {
			return nil, err
		}
		if done {
			return out, nil
		}
	}
	for i := max(lo, first); i < hi; i++ {
		ce := l.cache[i-first]
		if !add(ce.ent, uint64(ce.size)) {
			break
		}
	}
	return out, nil
}

// readEntriesLocked reads the entries [lo, hi) from the engine, passing each
// to add until add returns false; done reports that add did.
func (l *Log) readEntriesLocked(lo, hi uint64, add func(*raftpb.Entry, uint64) bool) (done bool, err error) {
	it, err := l.store.db.NewIter(&storage.IterOptions{
		LowerBound: entryKey(l.shardID, lo),
		UpperBound: entryKey(l.shardID, hi),
	})
	if err != nil {
		return false, fmt.Errorf("raftlog: shard %d: read entries [%d, %d): %w", l.shardID, lo, hi, err)
	}
	next := lo
	for ok := it.First(); ok && !done; ok = it.Next() {
		idx, isEntry := parseEntryKey(l.shardID, it.Key())
		if !isEntry || idx != next {
			err = fmt.Errorf("raftlog: shard %d entry %d: %w: missing from the engine (found key %x)",
				l.shardID, next, ErrCorrupt, it.Key())
			break
		}
		var e *raftpb.Entry
		if e, err = decodeEntry(idx, it.Value()); err != nil {
			err = fmt.Errorf("raftlog: shard %d entry %d: %w", l.shardID, idx, err)
			break
		}
		done = !add(e, uint64(len(it.Value())))
		next++
	}
	if cerr := it.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("raftlog: shard %d: read entries [%d, %d): %w", l.shardID, lo, hi, cerr)
	}
	if err == nil && !done && next != hi {
		err = fmt.Errorf("raftlog: shard %d entry %d: %w: missing from the engine (log is (%d, %d])",
			l.shardID, next, ErrCorrupt, l.truncIndex, l.lastIndex)
	}
	return done, err
}

// Snapshot implements raft.Storage by calling the snapshot callback
// installed by SetCallbacks; without one it returns
// raft.ErrSnapshotTemporarilyUnavailable.
func (l *Log) Snapshot() (*raftpb.Snapshot, error) {
	l.mu.RLock()
	fn := l.snapshotFn
	l.mu.RUnlock()
	if fn == nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	snap, err := fn()
	if err != nil {
		return nil, err
	}
	return raftpb.EnsureSnapshot(snap), nil
}

// Append stages entries and the hard state hs into b, and updates the Log's
// in-memory state at once. hs nil or empty (raft.IsEmptyHardState) leaves
// the hard state unchanged. entries must have consecutive indices, the
// first at most LastIndex+1; entries at or below TruncatedIndex are
// ignored. Entries overlapping the log replace its suffix: every persisted
// entry after the last new one is deleted (point deletions for a short
// suffix, one range deletion for a long one). On error nothing is staged or
// changed.
//
// The new entries stay cached, whatever the cache budget, until b is
// written by Store.Commit.
func (l *Log) Append(b *storage.Batch, entries []*raftpb.Entry, hs *raftpb.HardState) error {
	var hsVal []byte
	if !raft.IsEmptyHardState(hs) {
		var err error
		if hsVal, err = codec.Marshal(hs); err != nil {
			return fmt.Errorf("raftlog: shard %d: encode hard state: %w", l.shardID, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range entries {
		if e == nil || e.Index == nil || e.GetIndex() != entries[0].GetIndex()+uint64(i) {
			return fmt.Errorf("raftlog: shard %d: append: entry %d has index %d, want %d",
				l.shardID, i, e.GetIndex(), entries[0].GetIndex()+uint64(i))
		}
	}
	if len(entries) > 0 {
		k := entries[0].GetIndex()
		switch newLast := k + uint64(len(entries)) - 1; {
		case newLast <= l.truncIndex:
			entries = nil
		case k <= l.truncIndex:
			entries = entries[l.truncIndex+1-k:]
		case k > l.lastIndex+1:
			return fmt.Errorf("raftlog: shard %d: append at index %d would leave a gap after last index %d",
				l.shardID, k, l.lastIndex)
		}
	}
	vals := make([][]byte, len(entries))
	for i, e := range entries {
		var err error
		if vals[i], err = codec.Marshal(e); err != nil {
			return fmt.Errorf("raftlog: shard %d entry %d: encode: %w", l.shardID, e.GetIndex(), err)
		}
	}

	// Stage.
	if len(entries) > 0 {
		k := entries[0].GetIndex()
		newLast := k + uint64(len(entries)) - 1
		for i, v := range vals {
			b.Set(entryKey(l.shardID, k+uint64(i)), v)
		}
		// Delete the entries beyond the new last one: a few point deletions
		// for the usual short conflicting suffix, else one range deletion.
		if n := l.lastIndex - min(newLast, l.lastIndex); n > maxPointDeletes {
			b.DeleteRange(entryKey(l.shardID, newLast+1), entryKey(l.shardID, l.lastIndex+1))
		} else {
			for i := newLast + 1; i <= l.lastIndex; i++ {
				b.Delete(entryKey(l.shardID, i))
			}
		}
	}
	if hsVal != nil {
		b.Set(hardStateKey(l.shardID), hsVal)
	}

	// Update the in-memory state.
	if hsVal != nil {
		l.hs = codec.Clone(hs)
	}
	if len(entries) == 0 {
		return nil
	}
	k := entries[0].GetIndex()
	if k <= l.lastIndex {
		l.removeSuffixLocked(k)
	}
	ces := make([]*cacheEntry, len(entries))
	for i, e := range entries {
		ces[i] = &cacheEntry{log: l, ent: e, index: e.GetIndex(), term: e.GetTerm(), size: int64(len(vals[i]))}
		l.cachedBytes += ces[i].size
		l.sizeBytes += ces[i].size
	}
	l.cache = append(l.cache, ces...)
	l.store.cacheAdded(ces)
	last := entries[len(entries)-1]
	l.lastIndex, l.lastTerm = last.GetIndex(), last.GetTerm()
	if l.pins == nil {
		l.pins = make(map[*storage.Batch]uint64)
	}
	if p, ok := l.pins[b]; !ok || k < p {
		l.pins[b] = k
	}
	l.store.addPending(b, l)
	return nil
}

// removeSuffixLocked forgets the entries from index k (in (truncIndex,
// lastIndex]) on: the cache keeps only what precedes k, sizeBytes drops
// their size (estimated for uncached ones) and the last entry becomes k-1.
func (l *Log) removeSuffixLocked(k uint64) {
	first := l.cacheFirstLocked()
	if k < first {
		// Uncached entries [k, first) go: estimate their size.
		uncached := first - 1 - l.truncIndex
		l.sizeBytes -= l.uncachedEstimateLocked(first-k, uncached)
		k = first
	}
	if k <= l.lastIndex {
		l.dropCacheLocked(int(k-first), len(l.cache), true)
	}
	l.lastIndex = k - 1
	if len(l.cache) > 0 {
		l.lastTerm = l.cache[len(l.cache)-1].term
	}
	// Otherwise lastTerm is fixed by the caller, who appends after k-1.
	l.fixSizeLocked()
}

// uncachedEstimateLocked estimates the size of n of the count uncached
// entries.
func (l *Log) uncachedEstimateLocked(n, count uint64) int64 {
	uncachedBytes := l.sizeBytes - l.cachedBytes
	if count == 0 || uncachedBytes <= 0 {
		return 0
	}
	if n >= count {
		return uncachedBytes
	}
	return int64(float64(uncachedBytes) * float64(n) / float64(count))
}

// fixSizeLocked keeps sizeBytes sane after estimates.
func (l *Log) fixSizeLocked() {
	if l.sizeBytes < l.cachedBytes || l.lastIndex == l.truncIndex {
		l.sizeBytes = l.cachedBytes
	}
}

// cacheFirstLocked returns the index of the first cached entry
// (lastIndex+1 when the cache is empty).
func (l *Log) cacheFirstLocked() uint64 {
	return l.lastIndex + 1 - uint64(len(l.cache))
}

// dropCacheLocked removes cache[from:to] (from == 0 or to == len) from the
// cache. With fromSize, their size is also subtracted from sizeBytes.
func (l *Log) dropCacheLocked(from, to int, fromSize bool) {
	if from >= to {
		return
	}
	var charge, size int64
	for _, ce := range l.cache[from:to] {
		ce.removed.Store(true)
		charge += ce.charge()
		size += ce.size
	}
	l.cachedBytes -= size
	if fromSize {
		l.sizeBytes -= size
	}
	clear(l.cache[from:to])
	if from == 0 {
		l.cache = l.cache[to:]
	} else {
		l.cache = l.cache[:from]
	}
	if len(l.cache) == 0 {
		l.cache = nil
	}
	l.store.cacheRemoved(charge, to-from)
}

// evictThroughLocked evicts the cached entries up to ce (the oldest in the
// store's FIFO that is still cached) unless that would evict an entry
// staged into an uncommitted batch. It reports whether it did (or ce was no
// longer cached).
func (l *Log) evictThroughLocked(ce *cacheEntry) bool {
	if ce.removed.Load() {
		return true
	}
	for _, p := range l.pins {
		if ce.index >= p {
			return false
		}
	}
	first := l.cacheFirstLocked()
	l.dropCacheLocked(0, int(ce.index-first)+1, false)
	return true
}

// ApplySnapshot stages the log of a freshly bootstrapped or freshly
// snapshotted replica into b: every entry is deleted and the truncated state
// becomes (index, term), so that FirstIndex is index+1 and LastIndex index.
// hs nil or empty leaves the hard state unchanged. It returns
// raft.ErrSnapOutOfDate (and stages nothing) when the log is already
// truncated at or beyond index (a non-zero truncated index): the analogue of
// raft.MemoryStorage.ApplySnapshot refusing a snapshot no newer than its
// own, except that the truncated state, which Compact also advances, is
// what counts.
func (l *Log) ApplySnapshot(b *storage.Batch, index, term uint64, hs *raftpb.HardState) error {
	var hsVal []byte
	if !raft.IsEmptyHardState(hs) {
		var err error
		if hsVal, err = codec.Marshal(hs); err != nil {
			return fmt.Errorf("raftlog: shard %d: encode hard state: %w", l.shardID, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.truncIndex != 0 && l.truncIndex >= index {
		return raft.ErrSnapOutOfDate
	}
	b.DeleteRange(entryKey(l.shardID, 0), entriesEnd(l.shardID))
	b.Set(truncatedStateKey(l.shardID), encodeTruncatedState(index, term))
	if hsVal != nil {
		b.Set(hardStateKey(l.shardID), hsVal)
		l.hs = codec.Clone(hs)
	}
	l.dropCacheLocked(0, len(l.cache), true)
	l.truncIndex, l.truncTerm = index, term
	l.lastIndex, l.lastTerm = index, term
	l.sizeBytes = 0
	return nil
}

// Compact stages into b the removal of the entries up to index (one
// DeleteRange) and sets the truncated state to (index, Term(index)). Like
// raft.MemoryStorage.Compact, it returns raft.ErrCompacted (staging
// nothing) if index <= TruncatedIndex; index beyond LastIndex is an error
// wrapping raft.ErrUnavailable.
func (l *Log) Compact(b *storage.Batch, index uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if index <= l.truncIndex {
		return raft.ErrCompacted
	}
	if index > l.lastIndex {
		return fmt.Errorf("raftlog: shard %d: compact %d beyond last index %d: %w",
			l.shardID, index, l.lastIndex, raft.ErrUnavailable)
	}
	term, err := l.termLocked(index)
	if err != nil {
		return err
	}
	b.DeleteRange(entryKey(l.shardID, 0), entryKey(l.shardID, index+1))
	b.Set(truncatedStateKey(l.shardID), encodeTruncatedState(index, term))

	first := l.cacheFirstLocked()
	if index >= first {
		l.dropCacheLocked(0, int(index-first)+1, true)
		// Everything uncached was below first: it all goes.
		l.sizeBytes = l.cachedBytes
	} else {
		uncached := first - 1 - l.truncIndex
		l.sizeBytes -= l.uncachedEstimateLocked(index-l.truncIndex, uncached)
	}
	l.truncIndex, l.truncTerm = index, term
	l.fixSizeLocked()
	return nil
}

// Destroy stages into b the removal of all of the shard's state (entries,
// hard state, truncated state): the replica was removed from the node. The
// Log becomes empty (truncated state (0, 0), empty hard state) and its
// callbacks are cleared; Store.Shard keeps returning it, for a replica of
// the shard created on the node later.
func (l *Log) Destroy(b *storage.Batch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b.DeleteRange(shardStart(l.shardID), shardEnd(l.shardID))
	l.dropCacheLocked(0, len(l.cache), true)
	l.truncIndex, l.truncTerm, l.lastIndex, l.lastTerm = 0, 0, 0, 0
	l.hs = new(raftpb.HardState)
	l.sizeBytes = 0
	l.confStateFn, l.snapshotFn = nil, nil
}
