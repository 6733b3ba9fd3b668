package storage

import (
	"errors"
	"sync/atomic"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/internal/rangedel"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/memtable"
)

// maxNodeOverhead bounds the arena bytes a skiplist node needs beyond its key
// and value (header plus the tallest tower). Room checks use it so that a
// batch never runs out of arena space half applied.
const maxNodeOverhead = 24 + 2*4*20

// memTable is one in-memory write buffer: point entries and range tombstones
// in two skiplists, and the WAL file holding the same writes. A single
// writer (the commit leader) inserts; readers never block.
type memTable struct {
	points    *memtable.Skiplist
	rangeDels atomic.Pointer[memtable.Skiplist]
	logNum    manifest.FileNum
	capacity  uint64
	// reserved counts the worst-case bytes of batches admitted into it.
	reserved uint64
	shared   *Shared
	// cachedDels is the fragmented tombstone list of an immutable memtable.
	cachedDels atomic.Pointer[rangedel.List]
	immutable  atomic.Bool
	released   atomic.Bool
}

func newMemTable(capacity uint64, logNum manifest.FileNum, shared *Shared) *memTable {
	m := &memTable{
		points:   memtable.NewSkiplist(uint32(capacity)),
		logNum:   logNum,
		capacity: capacity,
		shared:   shared,
	}
	shared.memUsed.Add(int64(capacity))
	return m
}

// release returns the memtable's bytes to the shared budget (once).
func (m *memTable) release() {
	if m.released.CompareAndSwap(false, true) {
		m.shared.memUsed.Add(-int64(m.capacity))
	}
}

// batchFootprint is the worst-case arena space b needs.
func batchFootprint(b *Batch) uint64 {
	return uint64(len(b.data)) + uint64(b.count)*maxNodeOverhead
}

// hasRoom reports whether a batch with the given footprint fits.
func (m *memTable) hasRoom(footprint uint64) bool {
	return m.reserved+footprint <= m.capacity
}

// empty reports whether nothing was written to the memtable.
func (m *memTable) empty() bool {
	return m.points.Empty() && m.rangeDels.Load() == nil
}

// apply inserts the batch's records with consecutive sequence numbers.
// The caller is the single writer.
func (m *memTable) apply(b *Batch, seq SeqNum) error {
	m.reserved += batchFootprint(b)
	r := b.Reader()
	for {
		kind, key, value, ok := r.Next()
		if !ok {
			break
		}
		switch kind {
		case base.KindLogData:
			continue
		case base.KindRangeDelete:
			rd := m.rangeDels.Load()
			if rd == nil {
				// Same arena size as the points: the room check in hasRoom then
				// guarantees both skiplists fit any admitted batch.
				rd = memtable.NewSkiplist(uint32(m.capacity))
				m.rangeDels.Store(rd)
			}
			if err := rd.Add(base.MakeInternalKey(key, seq, kind), value); err != nil {
				return m.addErr(err)
			}
		default:
			if err := m.points.Add(base.MakeInternalKey(key, seq, kind), value); err != nil {
				return m.addErr(err)
			}
		}
		seq++
	}
	return r.Err()
}

func (m *memTable) addErr(err error) error {
	if errors.Is(err, memtable.ErrRecordExists) {
		// Replaying a WAL record already applied (recovery from a WAL whose
		// data also reached an SST) inserts identical entries: harmless.
		return nil
	}
	return err
}

// tombstones returns the memtable's range tombstones.
func (m *memTable) tombstones() []rangedel.Tombstone {
	rd := m.rangeDels.Load()
	if rd == nil {
		return nil
	}
	var ts []rangedel.Tombstone
	it := rd.NewIter(nil, nil)
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		ts = append(ts, rangedel.Tombstone{Start: k.UserKey, End: it.Value(), Seq: k.SeqNum()})
	}
	_ = it.Close()
	return ts
}

// rangeDelList returns the fragmented tombstones, cached once immutable.
func (m *memTable) rangeDelList() *rangedel.List {
	if l := m.cachedDels.Load(); l != nil {
		return l
	}
	l := rangedel.NewList(m.tombstones())
	if m.immutable.Load() {
		m.cachedDels.Store(l)
	}
	return l
}

// approxBytes is the memory in use (for metrics).
func (m *memTable) approxBytes() uint64 {
	n := uint64(m.points.Size())
	if rd := m.rangeDels.Load(); rd != nil {
		n += uint64(rd.Size())
	}
	return n
}
