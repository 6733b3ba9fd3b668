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
	for ; ok; ok = it.Next() {
		k := it.Key()
		if string(k.UserKey) != string(g.key) {
			break
		}
		s := k.SeqNum()
		if s > g.seq {
			continue
		}
		if g.maxTomb > s {
			g.finish(nil, false)
			return
		}
		switch k.Kind() {
		case base.KindSet:
			g.finish(it.Value(), true)
			return
		case base.KindDelete:
			g.finish(nil, false)
			return
		case base.KindMerge:
			g.operands = append(g.operands, slices.Clone(it.Value()))
		}
	}
	if err := it.Error(); err != nil {
		g.err, g.done = err, true
	}
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
		it := m.points.NewIter(nil, nil)
		g.consume(it, it.SeekGE(key))
		_ = it.Close()
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
	newIter := r.NewIter
	if cacheOnly {
		newIter = r.NewCacheOnlyIter
	}
	it, err := newIter(nil, nil)
	if err != nil {
		return fmt.Errorf("sst %s: %w", f.FileNum, err)
	}
	g.consume(it, it.SeekGE(g.key))
	if err := it.Close(); err != nil && g.err == nil {
		g.err = err
	}
	if g.err != nil && !errors.Is(g.err, ErrNotFound) {
		return g.err
	}
	return nil
}
