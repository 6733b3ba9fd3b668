// Package iters holds the iterators that combine the engine's sources of
// internal keys into one view: MergingIter (a heap merge of several
// internal iterators), LevelIter (the lazily opened files of one sorted
// level) and DBIter (the user-visible iterator that resolves versions,
// snapshots, deletions, range tombstones and merges).
//
// The package depends only on base and the standard library; callers adapt
// memtables, SST readers and range-tombstone sets through the small
// interfaces declared here.
package iters

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/shale-db/shale/storage/internal/base"
)

// SliceIter is a base.InternalIterator over in-memory slices of keys and
// values. It is meant for tests and for small in-memory sources. It never
// copies the slices it is given, so the caller must not modify them while the
// iterator is in use.
//
// Unlike the general contract, Next and Prev on an exhausted SliceIter are
// well defined: Next after running off the start moves to the first entry,
// Prev after running off the end moves to the last one, and Next at the end
// (Prev at the start) stays exhausted.
type SliceIter struct {
	keys   []base.InternalKey
	values [][]byte
	pos    int // -1 before the start, len(keys) after the end
	err    error
}

// NewSliceIter returns an iterator over keys, whose i-th entry has value
// values[i] (or nil when values is shorter). keys must be in
// base.CompareInternal order (equal keys are allowed); if they are not, every
// positioning call returns false and Error reports the first misordered key.
func NewSliceIter(keys []base.InternalKey, values [][]byte) *SliceIter {
	it := &SliceIter{keys: keys, values: values, pos: -1}
	for i := 1; i < len(keys); i++ {
		if base.CompareInternal(keys[i-1], keys[i]) > 0 {
			it.err = fmt.Errorf("iters: slice iterator keys out of order at index %d: %s > %s",
				i, keys[i-1], keys[i])
			break
		}
	}
	return it
}

func (it *SliceIter) valid() bool { return it.pos >= 0 && it.pos < len(it.keys) }

// SeekGE positions at the first entry whose user key is >= key.
func (it *SliceIter) SeekGE(key []byte) bool {
	if it.err != nil {
		return false
	}
	it.pos = it.searchGE(key)
	return it.valid()
}

// SeekLT positions at the last entry whose user key is < key.
func (it *SliceIter) SeekLT(key []byte) bool {
	if it.err != nil {
		return false
	}
	it.pos = it.searchGE(key) - 1
	return it.valid()
}

// searchGE returns the index of the first entry with user key >= key.
func (it *SliceIter) searchGE(key []byte) int {
	return sort.Search(len(it.keys), func(i int) bool {
		return bytes.Compare(it.keys[i].UserKey, key) >= 0
	})
}

// First positions at the first entry.
func (it *SliceIter) First() bool {
	if it.err != nil {
		return false
	}
	it.pos = 0
	return it.valid()
}

// Last positions at the last entry.
func (it *SliceIter) Last() bool {
	if it.err != nil {
		return false
	}
	it.pos = len(it.keys) - 1
	return it.valid()
}

// Next moves to the following entry.
func (it *SliceIter) Next() bool {
	if it.err != nil {
		return false
	}
	if it.pos < len(it.keys) {
		it.pos++
	}
	return it.valid()
}

// Prev moves to the preceding entry.
func (it *SliceIter) Prev() bool {
	if it.err != nil {
		return false
	}
	if it.pos >= 0 {
		it.pos--
	}
	return it.valid()
}

// Key returns the current key, or the zero key when not positioned.
func (it *SliceIter) Key() base.InternalKey {
	if !it.valid() {
		return base.InternalKey{}
	}
	return it.keys[it.pos]
}

// Value returns the current value, or nil when not positioned.
func (it *SliceIter) Value() []byte {
	if !it.valid() || it.pos >= len(it.values) {
		return nil
	}
	return it.values[it.pos]
}

// Error returns the construction error, if any.
func (it *SliceIter) Error() error { return it.err }

// Close returns the iterator's error; it releases nothing.
func (it *SliceIter) Close() error { return it.err }
