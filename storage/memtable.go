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

// skiplistFixedOverhead is the arena space a skiplist uses before its first
// entry (the reserved nil offset and two full-height sentinel nodes, about
// 250 bytes). Arenas get it on top of the capacity the room checks count, so
// a batch admitted into an empty memtable sized for it always fits.
const skiplistFixedOverhead = 512

// memTable is one in-memory write buffer: point entries and range tombstones
// in two skiplists, and the WAL file holding the same writes. A single
// writer (the commit leader) inserts; readers never block.
type memTable struct {
	points    pointTable
	rangeDels atomic.Pointer[memtable.Skiplist]
	logNum    manifest.FileNum
	capacity  uint64
	shared    *Shared
	// cachedDels is the fragmented tombstone list of an immutable memtable.
	cachedDels atomic.Pointer[rangedel.List]
	immutable  atomic.Bool
	released   atomic.Bool
	// unlogged is set once a batch written with DisableWAL lands here: its
	// data is then only in memory until flushed.
	unlogged atomic.Bool
	// rangeDelArena is the capacity of the range-tombstone skiplist, once
	// created (charged to the shared budget too).
	rangeDelArena atomic.Int64
	// refs counts the DB's own reference (while the memtable is its mutable
	// or an immutable one) and one per read state listing it. At zero
	// nothing can reach the point skiplist any more, and its arena goes to
	// the shared pool of spare arenas.
	refs atomic.Int32
	// nextArenaAsked is set once this (mutable) memtable has asked the
	// shared pool to prepare the next memtable's arena. Under DB.mu.
	nextArenaAsked bool
}

func newMemTable(capacity uint64, logNum manifest.FileNum, shared *Shared, reserved bool, kind MemTableKind) *memTable {
	size := uint32(capacity + skiplistFixedOverhead)
	var points pointTable
	if kind == VectorMemTable {
		points = newVectorPoints(size)
	} else if sl := shared.arenas.get(size); sl != nil {
		points = skiplistPoints{sl}
	} else {
		points = skiplistPoints{memtable.NewSkiplist(size)}
	}
	m := &memTable{
		points:   points,
		logNum:   logNum,
		capacity: capacity,
		shared:   shared,
	}
	m.refs.Store(1)
	if !reserved {
		shared.memUsed.Add(int64(capacity))
	}
	return m
}

// unref drops a reference; the last one recycles the point skiplist's
// arena. Callers drop the DB's reference only once the memtable is out of
// d.mem and d.imm (and so out of every read state made afterwards).
func (m *memTable) unref() {
	if m.refs.Add(-1) == 0 {
		if sl, ok := m.points.(skiplistPoints); ok {
			m.shared.arenas.put(sl.Skiplist)
		}
		m.points = nil
	}
}

// release returns the memtable's bytes to the shared budget (once).
func (m *memTable) release() {
	if m.released.CompareAndSwap(false, true) {
		m.shared.memUsed.Add(-int64(m.capacity) - m.rangeDelArena.Load())
	}
}

// batchFootprint is the worst-case arena space b needs.
func batchFootprint(b *Batch) uint64 {
	return uint64(len(b.data)) + uint64(b.count)*maxNodeOverhead
}

// used returns the arena bytes in use by the fuller of the two skiplists.
func (m *memTable) used() uint64 {
	n := uint64(m.points.Size())
	if rd := m.rangeDels.Load(); rd != nil {
		n = max(n, uint64(rd.Size()))
	}
	return n
}

// hasRoom reports whether a batch with the given worst-case footprint fits.
// It compares with the space actually used, so a memtable fills up to its
// capacity however small the real nodes are.
func (m *memTable) hasRoom(footprint uint64) bool {
	return m.used()+footprint <= m.capacity+skiplistFixedOverhead
}

// empty reports whether nothing was written to the memtable.
func (m *memTable) empty() bool {
	return m.points.Empty() && m.rangeDels.Load() == nil
}

// apply inserts the batch's records with consecutive sequence numbers.
// The caller is the single writer.
func (m *memTable) apply(b *Batch, seq SeqNum) error {
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
				rd = memtable.NewSkiplist(uint32(m.capacity + skiplistFixedOverhead))
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
		// The identical entry is already there (the same batch applied
		// twice); the second copy adds nothing.
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

// rangeDelList returns the fragmented tombstones (nil when there are none),
// cached once immutable.
func (m *memTable) rangeDelList() *rangedel.List {
	if m.rangeDels.Load() == nil {
		return nil // no tombstones: nothing to build on the Get path
	}
	if l := m.cachedDels.Load(); l != nil {
		return l
	}
	// Whether the memtable was immutable before the list was read, not
	// after: a list read while the commit leader still wrote may lack its
	// last tombstones, and must not be cached for every later reader.
	immutable := m.immutable.Load()
	l := rangedel.NewList(m.tombstones())
	if immutable {
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
