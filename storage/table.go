package storage

import (
	"fmt"
	"sync"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/internal/rangedel"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/sstable"
	"github.com/shale-db/shale/storage/vfs"
)

// tablePath returns the path of SST num.
func (d *DB) tablePath(num manifest.FileNum) string {
	return d.fs.Join(d.dirname, manifest.MakeFilename(manifest.FileTypeTable, num))
}

// readerOptions returns the options to open SST num with.
func (d *DB) readerOptions(num manifest.FileNum, path string) sstable.ReaderOptions {
	ro := sstable.ReaderOptions{
		Cache:    d.shared.BlockCache,
		CacheID:  d.cacheID,
		FileNum:  uint64(num),
		FileName: path,
	}
	if d.opts.PrefixExtractor != nil {
		ro.PrefixExtractor = d.opts.PrefixExtractor.Prefix
		ro.PrefixExtractorName = d.opts.PrefixExtractor.Name()
	}
	return ro
}

// openTable returns a reference to the reader of SST meta, opening it on a
// table-cache miss.
func (d *DB) openTable(meta *manifest.FileMetadata) (tableHandle, error) {
	return d.shared.tables.get(tableKey{d.cacheID, meta.FileNum}, func() (*sstable.Reader, vfs.File, error) {
		path := d.tablePath(meta.FileNum)
		f, err := d.fs.Open(path)
		if err != nil {
			return nil, nil, fmt.Errorf("open sst %s: %w", meta.FileNum, err)
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, nil, fmt.Errorf("stat sst %s: %w", meta.FileNum, err)
		}
		r, err := sstable.NewReader(f, fi.Size(), d.readerOptions(meta.FileNum, path))
		if err != nil {
			_ = f.Close()
			return nil, nil, fmt.Errorf("open sst %s: %w", meta.FileNum, err)
		}
		return r, f, nil
	})
}

// tableFor returns a reference to the reader of SST meta: openTable, or
// with cacheOnly the reader only if the table cache has it open already
// (an error matching ErrIncomplete otherwise).
func (d *DB) tableFor(meta *manifest.FileMetadata, cacheOnly bool) (tableHandle, error) {
	if !cacheOnly {
		return d.openTable(meta)
	}
	if h, ok := d.shared.tables.peek(tableKey{d.cacheID, meta.FileNum}); ok {
		return h, nil
	}
	return tableHandle{}, fmt.Errorf("sst %s is not open: %w", meta.FileNum, ErrIncomplete)
}

// tableIter is an SST iterator that releases its table reference on Close.
type tableIter struct {
	base.InternalIterator
	h tableHandle
}

func (t *tableIter) Close() error {
	err := t.InternalIterator.Close()
	t.h.Release()
	return err
}

// newTableIter returns an iterator over the point entries of meta within
// [lower, upper); with cacheOnly it reads nothing from disk (tableFor,
// sstable.Reader.NewCacheOnlyIter).
func (d *DB) newTableIter(meta *manifest.FileMetadata, lower, upper []byte, cacheOnly bool) (base.InternalIterator, error) {
	h, err := d.tableFor(meta, cacheOnly)
	if err != nil {
		return nil, err
	}
	var it base.InternalIterator
	if cacheOnly {
		it, err = h.Reader().NewCacheOnlyIter(lower, upper)
	} else {
		it, err = h.Reader().NewIter(lower, upper)
	}
	if err != nil {
		h.Release()
		return nil, fmt.Errorf("sst %s: %w", meta.FileNum, err)
	}
	return &tableIter{InternalIterator: it, h: h}, nil
}

// tombstoneCache memoises the fragmented range tombstones of SSTs, keyed by
// file number (SSTs are immutable). Files without tombstones map to nil.
type tombstoneCache struct {
	m sync.Map // manifest.FileNum -> *rangedel.List (nil for none)
}

// tableTombstones returns the range tombstones of SST meta, or nil.
func (d *DB) tableTombstones(meta *manifest.FileMetadata) ([]rangedel.Tombstone, error) {
	h, err := d.openTable(meta)
	if err != nil {
		return nil, err
	}
	defer h.Release()
	r := h.Reader()
	if r.Properties().NumRangeDeletions == 0 {
		return nil, nil
	}
	rds, err := r.RangeDels()
	if err != nil {
		return nil, fmt.Errorf("sst %s: range tombstones: %w", meta.FileNum, err)
	}
	ts := make([]rangedel.Tombstone, len(rds))
	for i, rd := range rds {
		ts[i] = rangedel.Tombstone{Start: rd.Start, End: rd.End, Seq: rd.Seq}
	}
	return ts, nil
}

// tableRangeDelList returns the fragmented tombstones of SST meta (nil when
// it has none), cached per file. With cacheOnly it reads nothing from disk:
// tombstones not cached yet are known only for an open table without any
// (an error matching ErrIncomplete otherwise).
func (d *DB) tableRangeDelList(meta *manifest.FileMetadata, cacheOnly bool) (*rangedel.List, error) {
	if v, ok := d.tombstones.m.Load(meta.FileNum); ok {
		return v.(*rangedel.List), nil
	}
	if cacheOnly {
		h, err := d.tableFor(meta, true)
		if err != nil {
			return nil, err
		}
		defer h.Release()
		if h.Reader().Properties().NumRangeDeletions > 0 {
			return nil, fmt.Errorf("sst %s: range tombstones not loaded: %w", meta.FileNum, ErrIncomplete)
		}
		return nil, nil
	}
	ts, err := d.tableTombstones(meta)
	if err != nil {
		return nil, err
	}
	var l *rangedel.List
	if len(ts) > 0 {
		l = rangedel.NewList(ts)
	}
	d.tombstones.m.Store(meta.FileNum, l)
	return l, nil
}

// fileContains reports whether user key k lies within meta's bounds.
func fileContains(meta *manifest.FileMetadata, k []byte) bool {
	if compareUser(k, meta.Smallest.UserKey) < 0 {
		return false
	}
	c := compareUser(k, meta.Largest.UserKey)
	return c < 0 || (c == 0 && !meta.Largest.IsExclusiveSentinel())
}

// fileOverlaps reports whether meta may hold keys in [lower, upper) (nil
// bounds are unbounded).
func fileOverlaps(meta *manifest.FileMetadata, lower, upper []byte) bool {
	if upper != nil && string(meta.Smallest.UserKey) >= string(upper) {
		return false
	}
	if lower != nil {
		c := compareUser(meta.Largest.UserKey, lower)
		if c < 0 || (c == 0 && meta.Largest.IsExclusiveSentinel()) {
			return false
		}
	}
	return true
}

func compareUser(a, b []byte) int {
	switch {
	case string(a) < string(b):
		return -1
	case string(a) > string(b):
		return 1
	}
	return 0
}
