package storage

import (
	"errors"
	"fmt"
	"slices"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
)

// Get returns a copy of the value of key, or ErrNotFound.
func (d *DB) Get(key []byte) ([]byte, error) {
	return d.getAt(key, latestSeq, false)
}

// GetWithOptions is Get with read options: with ro.CacheOnly it reads
// nothing from disk, failing with an error matching ErrIncomplete when the
// answer is not in memory.
func (d *DB) GetWithOptions(key []byte, ro ReadOptions) ([]byte, error) {
	return d.getAt(key, latestSeq, ro.CacheOnly)
}

// latestSeq is the seq argument of getAt and newIterAt that means "the
// latest state" (no snapshot can have it: a snapshot at seq 0 is real).
const latestSeq = base.MaxSeqNum

// getter accumulates the state of one point lookup as it walks the sources
// of a key from newest to oldest.
type getter struct {
	key      []byte
	seq      SeqNum // snapshot
	maxTomb  SeqNum // largest covering tombstone seen so far
	operands [][]byte
	value    []byte
	found    bool // a value was found (possibly merged)
	done     bool
	merger   MergeOperator
	err      error
}

// consume scans the versions of g.key in it (already seeked). It reports
// whether the lookup is complete.
func (g *getter) consume(it base.InternalIterator, ok bool) {
	for ; ok && g.visit(it.Key(), it.Value()); ok = it.Next() {
	}
	if err := it.Error(); err != nil && !g.done {
		g.err, g.done = err, true
	}
}

// visit takes one entry of the walk from g.key on, newest version first;
// it reports whether the walk should go on (the next entry may still be a
// version of g.key that decides the lookup).
func (g *getter) visit(k base.InternalKey, v []byte) bool {
	if string(k.UserKey) != string(g.key) {
		return false
	}
	s := k.SeqNum()
	if s > g.seq {
		return true
	}
	if g.maxTomb > s {
		g.finish(nil, false)
		return false
	}
	switch k.Kind() {
	case base.KindSet:
		g.finish(v, true)
		return false
	case base.KindDelete:
		g.finish(nil, false)
		return false
	case base.KindMerge:
		g.operands = append(g.operands, slices.Clone(v))
	}
	return true
}

// finish resolves the lookup with the base value (if any).
func (g *getter) finish(baseValue []byte, hasBase bool) {
	g.done = true
	if len(g.operands) == 0 {
		if hasBase {
			g.value, g.found = slices.Clone(baseValue), true
		}
		return
	}
	if g.merger == nil {
		g.err = fmt.Errorf("storage: key %s has merge operands but no MergeOperator is set", base.FormatKey(g.key))
		return
	}
	slices.Reverse(g.operands) // oldest first
	v, err := g.merger.FullMerge(g.key, baseValue, hasBase, g.operands)
	if err != nil {
		g.err = fmt.Errorf("storage: merge %s: %w", base.FormatKey(g.key), err)
		return
	}
	g.value, g.found = v, true
}

// getAt reads key at snapshot seq, or at the latest state for latestSeq;
// with cacheOnly from memory only (ReadOptions.CacheOnly).
func (d *DB) getAt(key []byte, seq SeqNum, cacheOnly bool) ([]byte, error) {
	rs := d.loadReadState()
	if rs == nil {
		return nil, ErrClosed
	}
	defer rs.unref()
	if seq == latestSeq {
		// Pin the read state first, then take the sequence number: the
		// pinned memtables and version hold every version the number can
		// see. Taken the other way round, a newer write plus a flush and a
		// compaction in between could drop the version it needs.
		seq = SeqNum(d.visibleSeq.Load())
	}
	g := getter{key: key, seq: seq, merger: d.opts.MergeOperator}

	for _, m := range rs.mems {
		if t := m.rangeDelList().MaxCoveringSeq(key, seq); t > g.maxTomb {
			g.maxTomb = t
		}
		// A skiplist is walked in place (Skiplist.Lookup); not through a
		// pointTable method, whose callback would escape to the heap,
		// which is the allocation Lookup saves. A vector memtable (bulk
		// loads) iterates.
		if sl, ok := m.points.(skiplistPoints); ok {
			sl.Lookup(key, g.visit)
		} else {
			it := m.points.NewIter(nil, nil)
			g.consume(it, it.SeekGE(key))
			_ = it.Close()
		}
		if g.done {
			return g.result()
		}
	}
	for level := range rs.vers.Levels {
		files := rs.vers.Levels[level]
		if level == 0 {
			for _, f := range files {
				if fileContains(f, key) {
					if err := d.getFromTable(&g, f, cacheOnly); err != nil || g.done {
						return g.resultOr(err)
					}
				}
			}
			continue
		}
		i, found := slices.BinarySearchFunc(files, key, func(f *manifest.FileMetadata, k []byte) int {
			// Files ordered by Largest; find the first that may contain k.
			c := compareUser(f.Largest.UserKey, k)
			if c == 0 && f.Largest.IsExclusiveSentinel() {
				return -1
			}
			return c
		})
		_ = found
		if i < len(files) && fileContains(files[i], key) {
			if err := d.getFromTable(&g, files[i], cacheOnly); err != nil || g.done {
				return g.resultOr(err)
			}
		}
	}
	g.finish(nil, false)
	return g.result()
}

func (g *getter) resultOr(err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return g.result()
}

func (g *getter) result() ([]byte, error) {
	if g.err != nil {
		return nil, g.err
	}
	if !g.found {
		return nil, ErrNotFound
	}
	return g.value, nil
}

// getFromTable looks key up in one SST, consulting its tombstones and, for
// the point entries, its bloom filter.
func (d *DB) getFromTable(g *getter, f *manifest.FileMetadata, cacheOnly bool) error {
	if f.SmallestSeq > g.seq {
		return nil // everything in it is newer than the snapshot
	}
	rdl, err := d.tableRangeDelList(f, cacheOnly)
	if err != nil {
		return err
	}
	if rdl != nil {
		if t := rdl.MaxCoveringSeq(g.key, g.seq); t > g.maxTomb {
			g.maxTomb = t
		}
	}
	h, err := d.tableFor(f, cacheOnly)
	if err != nil {
		return err
	}
	defer h.Release()
	r := h.Reader()
	if !r.MayContain(g.key) {
		return nil
	}
	if err := r.Lookup(g.key, cacheOnly, g.visit); err != nil && g.err == nil {
		g.err = err
	}
	if g.err != nil && !errors.Is(g.err, ErrNotFound) {
		return g.err
	}
	return nil
}

// MultiGet reads keys as Get would, all at one sequence number: vals[i] is
// a copy of keys[i]'s value, or nil with errs[i] matching ErrNotFound when
// it has none; errs[i] is any other error of that key's read. It reads the
// keys in one pass over the memtables and SSTs, in key order, opening each
// table once and letting keys in one data block share its read, which makes
// it faster than a loop of Gets. Duplicate keys are allowed.
func (d *DB) MultiGet(keys [][]byte) (vals [][]byte, errs []error) {
	return d.multiGetAt(keys, latestSeq, false)
}

// MultiGetWithOptions is MultiGet with read options: with ro.CacheOnly a
// key whose answer is not in memory gets an error matching ErrIncomplete,
// and nothing is read from disk.
func (d *DB) MultiGetWithOptions(keys [][]byte, ro ReadOptions) (vals [][]byte, errs []error) {
	return d.multiGetAt(keys, latestSeq, ro.CacheOnly)
}

// multiGetAt is getAt for many keys (see MultiGet).
func (d *DB) multiGetAt(keys [][]byte, seq SeqNum, cacheOnly bool) ([][]byte, []error) {
	vals, errs := make([][]byte, len(keys)), make([]error, len(keys))
	rs := d.loadReadState()
	if rs == nil {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return vals, errs
	}
	defer rs.unref()
	if seq == latestSeq {
		seq = SeqNum(d.visibleSeq.Load()) // after pinning: see getAt
	}
	gs := make([]getter, len(keys))
	pending := make([]int, len(keys)) // indexes of unresolved keys, in key order
	for i, k := range keys {
		gs[i] = getter{key: k, seq: seq, merger: d.opts.MergeOperator}
		pending[i] = i
	}
	slices.SortStableFunc(pending, func(a, b int) int { return compareUser(keys[a], keys[b]) })
	unresolved := func() {
		n := 0
		for _, i := range pending {
			if !gs[i].done {
				pending[n] = i
				n++
			}
		}
		pending = pending[:n]
	}

	for _, m := range rs.mems {
		rdl := m.rangeDelList()
		it := m.points.NewIter(nil, nil)
		for _, i := range pending {
			g := &gs[i]
			if t := rdl.MaxCoveringSeq(g.key, seq); t > g.maxTomb {
				g.maxTomb = t
			}
			g.consume(it, it.SeekGE(g.key))
		}
		_ = it.Close()
		unresolved()
	}
	for level := range rs.vers.Levels {
		if len(pending) == 0 {
			break
		}
		files := rs.vers.Levels[level]
		if level == 0 {
			for _, f := range files {
				var in []int
				for _, i := range pending {
					if fileContains(f, gs[i].key) {
						in = append(in, i)
					}
				}
				if len(in) > 0 {
					d.getManyFromTable(gs, in, f, cacheOnly)
					unresolved()
				}
			}
			continue
		}
		// Files of L1+ are sorted and disjoint: walk them with the sorted
		// keys, each file taking the run of keys it contains.
		for start := 0; start < len(pending); {
			key := gs[pending[start]].key
			i, _ := slices.BinarySearchFunc(files, key, func(f *manifest.FileMetadata, k []byte) int {
				c := compareUser(f.Largest.UserKey, k)
				if c == 0 && f.Largest.IsExclusiveSentinel() {
					return -1
				}
				return c
			})
			if i >= len(files) {
				break
			}
			end := start
			for end < len(pending) && fileContains(files[i], gs[pending[end]].key) {
				end++
			}
			if end == start {
				start++ // before the file: not in this level
				continue
			}
			d.getManyFromTable(gs, pending[start:end], files[i], cacheOnly)
			start = end
		}
		unresolved()
	}
	for i := range gs {
		if !gs[i].done {
			gs[i].finish(nil, false)
		}
		vals[i], errs[i] = gs[i].result()
	}
	return vals, errs
}

// getManyFromTable is getFromTable for the keys gs[i], i in idx (in key
// order), with one table reference and one iterator: keys in one data
// block share its read. An error fails the keys it concerns.
func (d *DB) getManyFromTable(gs []getter, idx []int, f *manifest.FileMetadata, cacheOnly bool) {
	failAll := func(err error) {
		for _, i := range idx {
			gs[i].err, gs[i].done = err, true
		}
	}
	if f.SmallestSeq > gs[idx[0]].seq {
		return
	}
	rdl, err := d.tableRangeDelList(f, cacheOnly)
	if err != nil {
		failAll(err)
		return
	}
	if rdl != nil {
		for _, i := range idx {
			if t := rdl.MaxCoveringSeq(gs[i].key, gs[i].seq); t > gs[i].maxTomb {
				gs[i].maxTomb = t
			}
		}
	}
	h, err := d.tableFor(f, cacheOnly)
	if err != nil {
		failAll(err)
		return
	}
	defer h.Release()
	r := h.Reader()
	newIter := r.NewIter
	if cacheOnly {
		newIter = r.NewCacheOnlyIter
	}
	var it base.InternalIterator
	for _, i := range idx {
		g := &gs[i]
		if !r.MayContain(g.key) {
			continue
		}
		if it == nil {
			if it, err = newIter(nil, nil); err != nil {
				g.err, g.done = fmt.Errorf("sst %s: %w", f.FileNum, err), true
				continue
			}
		}
		g.consume(it, it.SeekGE(g.key))
		if it.Error() != nil {
			// The error is this key's; the next key gets a fresh iterator.
			_ = it.Close()
			it = nil
		}
	}
	if it != nil {
		_ = it.Close()
	}
}
