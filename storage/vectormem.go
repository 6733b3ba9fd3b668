package storage

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/internal/iters"
	"github.com/shale-db/shale/storage/memtable"
)

// MemTableKind selects how a memtable stores its point entries.
type MemTableKind int

// The memtable kinds.
const (
	// SkiplistMemTable keeps entries sorted as they are inserted: every
	// read is fast. The default.
	SkiplistMemTable MemTableKind = iota
	// VectorMemTable appends entries unsorted and sorts them when read:
	// inserts are cheaper (no search), so a bulk load that reads little
	// goes faster; a read of the mutable memtable sorts what was added
	// since the last one (RocksDB's VectorRepFactory). Flushes sort once.
	VectorMemTable
)

// String returns "skiplist" or "vector".
func (k MemTableKind) String() string {
	if k == VectorMemTable {
		return "vector"
	}
	return "skiplist"
}

// pointTable holds a memtable's point entries. A single writer adds; any
// number of readers iterate concurrently with it.
type pointTable interface {
	// Add inserts an entry: memtable.ErrArenaFull when it does not fit,
	// memtable.ErrRecordExists when the identical internal key is there.
	Add(key base.InternalKey, value []byte) error
	// NewIter iterates the entries with user keys in [lower, upper), as of
	// the call (later adds may or may not be seen).
	NewIter(lower, upper []byte) base.InternalIterator
	// Size is the bytes in use, comparable with the capacity.
	Size() uint32
	// Empty reports whether nothing was added.
	Empty() bool
}

// skiplistPoints is a memtable.Skiplist as a pointTable.
type skiplistPoints struct{ *memtable.Skiplist }

func (s skiplistPoints) NewIter(lower, upper []byte) base.InternalIterator {
	return s.Skiplist.NewIter(lower, upper)
}

// vectorEntryOverhead is the bytes a vector entry costs beyond its key and
// value (its slot: slice headers and the trailer), counted by Size.
const vectorEntryOverhead = 64

// vectorPoints is the pointTable of a VectorMemTable: entries appended in
// arrival order; a read takes a sorted snapshot, merging the entries added
// since the previous one into it (each snapshot is a new slice, never
// changed, so iterators already open are unaffected). The writer's Add and
// the readers' snapshots share a mutex; an Add holds it only to append.
type vectorPoints struct {
	capacity uint32
	size     atomic.Uint32

	mu      sync.Mutex
	entries []vectorEntry // arrival order
	sorted  []vectorEntry // sorted snapshot of entries[:merged]
	merged  int
	chunk   []byte // the writer's current chunk
}

type vectorEntry struct {
	key    base.InternalKey
	value  []byte
	prefix uint64 // userKeyPrefix(key.UserKey)
}

func newVectorPoints(capacity uint32) *vectorPoints {
	return &vectorPoints{capacity: capacity}
}

func (v *vectorPoints) Add(key base.InternalKey, value []byte) error {
	n := uint32(len(key.UserKey) + len(value) + vectorEntryOverhead)
	if v.size.Load()+n > v.capacity {
		return memtable.ErrArenaFull
	}
	// Keys and values are copied into chunks of vectorChunkSize (one
	// allocation per chunk, not per entry); only the writer touches chunk.
	need := len(key.UserKey) + len(value)
	if len(v.chunk)+need > cap(v.chunk) {
		v.chunk = make([]byte, 0, max(vectorChunkSize, need))
	}
	start := len(v.chunk)
	v.chunk = append(append(v.chunk, key.UserKey...), value...)
	buf := v.chunk[start : start+need : start+need]
	e := vectorEntry{
		key:    base.InternalKey{UserKey: buf[:len(key.UserKey):len(key.UserKey)], Trailer: key.Trailer},
		value:  buf[len(key.UserKey):],
		prefix: userKeyPrefix(key.UserKey),
	}
	v.mu.Lock()
	v.entries = append(v.entries, e)
	v.mu.Unlock()
	v.size.Add(n)
	return nil
}

// vectorChunkSize is the size of the chunks a vector memtable copies keys
// and values into.
const vectorChunkSize = 256 << 10

// userKeyPrefix is the first 8 bytes of k, big-endian, zero-padded: it
// orders keys as bytes.Compare does wherever they differ, so most sort
// comparisons need not read the keys.
func userKeyPrefix(k []byte) uint64 {
	var b [8]byte
	copy(b[:], k)
	return binary.BigEndian.Uint64(b[:])
}

// compareEntries orders entries by internal key.
func compareEntries(a, b *vectorEntry) int {
	if a.prefix != b.prefix {
		if a.prefix < b.prefix {
			return -1
		}
		return 1
	}
	return base.CompareInternal(a.key, b.key)
}

func (v *vectorPoints) Size() uint32 { return v.size.Load() }

func (v *vectorPoints) Empty() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.entries) == 0
}

// snapshot returns the entries sorted by internal key.
func (v *vectorPoints) snapshot() []vectorEntry {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.merged == len(v.entries) {
		return v.sorted
	}
	// Sort small pointer-free references (prefix, index) rather than the
	// entries: cheaper to move, and most comparisons end at the prefix.
	type ref struct {
		prefix uint64
		i      int32
	}
	refs := make([]ref, len(v.entries)-v.merged)
	for i := range refs {
		refs[i] = ref{v.entries[v.merged+i].prefix, int32(v.merged + i)}
	}
	slices.SortFunc(refs, func(a, b ref) int {
		if a.prefix != b.prefix {
			if a.prefix < b.prefix {
				return -1
			}
			return 1
		}
		return base.CompareInternal(v.entries[a.i].key, v.entries[b.i].key)
	})
	fresh := make([]vectorEntry, len(refs))
	for i, r := range refs {
		fresh[i] = v.entries[r.i]
	}
	v.merged = len(v.entries)
	cmp := func(a, b vectorEntry) int { return compareEntries(&a, &b) }
	merged := make([]vectorEntry, 0, len(v.entries))
	i, j := 0, 0
	for i < len(v.sorted) && j < len(fresh) {
		if cmp(v.sorted[i], fresh[j]) <= 0 {
			merged = append(merged, v.sorted[i])
			i++
		} else {
			merged = append(merged, fresh[j])
			j++
		}
	}
	merged = append(append(merged, v.sorted[i:]...), fresh[j:]...)
	// An identical internal key added twice (a batch applied again) is one
	// entry, as in a skiplist.
	merged = slices.CompactFunc(merged, func(a, b vectorEntry) bool { return cmp(a, b) == 0 })
	v.sorted = merged
	return merged
}

func (v *vectorPoints) NewIter(lower, upper []byte) base.InternalIterator {
	s := v.snapshot()
	lo, hi := 0, len(s)
	if lower != nil {
		lo = sort.Search(len(s), func(i int) bool { return bytes.Compare(s[i].key.UserKey, lower) >= 0 })
	}
	if upper != nil {
		hi = lo + sort.Search(len(s)-lo, func(i int) bool { return bytes.Compare(s[lo+i].key.UserKey, upper) >= 0 })
	}
	keys := make([]base.InternalKey, hi-lo)
	values := make([][]byte, hi-lo)
	for i, e := range s[lo:hi] {
		keys[i], values[i] = e.key, e.value
	}
	return iters.NewSliceIter(keys, values)
}
