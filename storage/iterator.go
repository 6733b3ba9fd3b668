package storage

import (
	"bytes"
	"errors"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/internal/iters"
	"github.com/shale-db/shale/storage/internal/rangedel"
	"github.com/shale-db/shale/storage/manifest"
)

// Iterator walks the keys of a DB (at a snapshot) in order, forward or
// backward, within bounds. It sees a consistent view: writes after its
// creation are invisible. Key and Value are valid until the next
// positioning call; copy them to keep them. An Iterator is not safe for
// concurrent use; Close it to release the files it pins.
type Iterator struct {
	it     *iters.DBIter
	rs     *readState
	closed bool
}

// NewIter returns an iterator over the DB's latest state (or the snapshot in
// opts).
func (d *DB) NewIter(opts *IterOptions) (*Iterator, error) {
	var o IterOptions
	if opts != nil {
		o = *opts
	}
	seq := latestSeq
	if o.Snapshot != nil {
		if o.Snapshot.db != d {
			return nil, errors.New("storage: snapshot belongs to another DB")
		}
		seq = o.Snapshot.seq
	}
	return d.newIterAt(o, seq)
}

// prefixSuccessor returns the smallest key greater than every key with the
// given prefix, or nil when there is none (all 0xff).
func prefixSuccessor(prefix []byte) []byte {
	s := bytes.Clone(prefix)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] != 0xff {
			s[i]++
			return s[:i+1]
		}
	}
	return nil
}

func (d *DB) newIterAt(o IterOptions, seq SeqNum) (*Iterator, error) {
	lower, upper := o.LowerBound, o.UpperBound
	var prefix []byte
	if o.Prefix != nil {
		prefix = o.Prefix
		if lower == nil || bytes.Compare(lower, prefix) < 0 {
			lower = prefix
		}
		if succ := prefixSuccessor(prefix); succ != nil && (upper == nil || bytes.Compare(succ, upper) < 0) {
			upper = succ
		}
	}
	usePrefixBloom := prefix != nil && d.opts.PrefixExtractor != nil &&
		bytes.Equal(d.opts.PrefixExtractor.Prefix(prefix), prefix)

	rs := d.loadReadState()
	if rs == nil {
		return nil, ErrClosed
	}
	if seq == latestSeq {
		seq = SeqNum(d.visibleSeq.Load()) // after pinning: see getAt
	}
	var children []base.InternalIterator
	var tombs []rangedel.Tombstone
	fail := func(err error) (*Iterator, error) {
		for _, c := range children {
			_ = c.Close()
		}
		rs.unref()
		return nil, err
	}
	for _, m := range rs.mems {
		children = append(children, m.points.NewIter(lower, upper))
		tombs = append(tombs, m.tombstones()...)
	}
	skipByPrefix := func(f *manifest.FileMetadata) (bool, error) {
		if !usePrefixBloom {
			return false, nil
		}
		h, err := d.tableFor(f, o.CacheOnly)
		if err != nil {
			return false, err
		}
		defer h.Release()
		return !h.Reader().MayContainPrefix(prefix), nil
	}
	for level, files := range rs.vers.Levels {
		var inRange []*manifest.FileMetadata
		for _, f := range files {
			if !fileOverlaps(f, lower, upper) || f.SmallestSeq > seq {
				continue
			}
			ts, err := d.tableRangeDelList(f, o.CacheOnly)
			if err != nil {
				return fail(err)
			}
			if ts != nil {
				tombs = append(tombs, ts.Clip(lower, upper)...)
			}
			inRange = append(inRange, f)
		}
		if len(inRange) == 0 {
			continue
		}
		if level == 0 {
			for _, f := range inRange {
				skip, err := skipByPrefix(f)
				if err != nil {
					return fail(err)
				}
				if skip {
					continue
				}
				it, err := d.newTableIter(f, lower, upper, o.CacheOnly)
				if err != nil {
					return fail(err)
				}
				children = append(children, it)
			}
			continue
		}
		bounds := make([]iters.FileBounds, len(inRange))
		for i, f := range inRange {
			bounds[i] = iters.FileBounds{Smallest: f.Smallest, Largest: f.Largest}
		}
		levelFiles := inRange
		children = append(children, iters.NewLevelIter(bounds, func(i int, lo, hi []byte) (base.InternalIterator, error) {
			if skip, err := skipByPrefix(levelFiles[i]); err != nil {
				return nil, err
			} else if skip {
				return iters.NewSliceIter(nil, nil), nil
			}
			return d.newTableIter(levelFiles[i], lo, hi, o.CacheOnly)
		}, lower, upper))
	}
	var covering iters.Covering
	if len(tombs) > 0 {
		covering = rangedel.NewList(tombs)
	}
	it := iters.NewDBIter(iters.NewMergingIter(children...), iters.DBIterOptions{
		SeqNum:    seq,
		Lower:     lower,
		Upper:     upper,
		Merger:    d.opts.MergeOperator,
		RangeDels: covering,
	})
	return &Iterator{it: it, rs: rs}, nil
}

// First moves to the first key and reports whether there is one.
func (i *Iterator) First() bool { return i.it.First() }

// Last moves to the last key and reports whether there is one.
func (i *Iterator) Last() bool { return i.it.Last() }

// SeekGE moves to the first key >= key.
func (i *Iterator) SeekGE(key []byte) bool { return i.it.SeekGE(key) }

// SeekLT moves to the last key < key.
func (i *Iterator) SeekLT(key []byte) bool { return i.it.SeekLT(key) }

// Next moves to the next key.
func (i *Iterator) Next() bool { return i.it.Next() }

// Prev moves to the previous key.
func (i *Iterator) Prev() bool { return i.it.Prev() }

// Valid reports whether the iterator is on a key.
func (i *Iterator) Valid() bool { return i.it.Valid() }

// Key returns the current key.
func (i *Iterator) Key() []byte { return i.it.Key() }

// Value returns the current value.
func (i *Iterator) Value() []byte { return i.it.Value() }

// Error returns the error that stopped the iterator, if any (a corrupt file,
// an I/O error, a failed merge).
func (i *Iterator) Error() error { return i.it.Error() }

// Close releases the iterator and returns its error, if any.
func (i *Iterator) Close() error {
	if i.closed {
		return nil
	}
	i.closed = true
	err := i.it.Close()
	i.rs.unref()
	return err
}
