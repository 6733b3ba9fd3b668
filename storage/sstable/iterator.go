package sstable

import (
	"bytes"

	"github.com/shale-db/shale/storage/internal/base"
)

// NewIter returns an iterator over the file's point entries whose user keys
// lie in [lower, upper); a nil bound is unbounded. The iterator supports
// forward and reverse iteration and skips reading data blocks that lie
// entirely outside the bounds where the index allows. The bounds slices
// must not be modified while the iterator is in use. The error is always
// nil today; it is there for future formats that read at creation.
func (r *Reader) NewIter(lower, upper []byte) (base.InternalIterator, error) {
	return &iterator{r: r, lower: lower, upper: upper, blockIdx: -1}, nil
}

// NewCacheOnlyIter is NewIter for an iterator that never reads the file:
// it serves data blocks from the block cache only, and fails (its Error
// matching ErrIncomplete) when it needs one the cache does not hold. A
// Reader without a cache holds no block.
func (r *Reader) NewCacheOnlyIter(lower, upper []byte) (base.InternalIterator, error) {
	return &iterator{r: r, lower: lower, upper: upper, blockIdx: -1, cacheOnly: true}, nil
}

// iterator is a two-level iterator: the in-memory index selects a data
// block, a blockIter walks it.
type iterator struct {
	r            *Reader
	lower, upper []byte
	blockIdx     int // index of the loaded block, -1 if none
	blk          blockIter
	// checkUpper is false when every key of the loaded block is < upper.
	checkUpper bool
	// checkLower is false when every key of the loaded block is >= lower.
	checkLower bool
	key        base.InternalKey
	valid      bool
	err        error
	closed     bool
	raw, dec   []byte
	cacheOnly  bool // read no block from the file (NewCacheOnlyIter)
}

var _ base.InternalIterator = (*iterator)(nil)

// loadBlock makes block i current (not positioned).
func (it *iterator) loadBlock(i int) bool {
	if it.blockIdx == i && it.blk.data != nil {
		return true
	}
	it.blockIdx = -1
	e := &it.r.index[i]
	var b []byte
	var err error
	if it.cacheOnly {
		b, err = it.r.cachedDataBlock(e.h)
	} else {
		b, err = it.r.readDataBlock(e.h, &it.raw, &it.dec)
	}
	if err != nil {
		it.err = err
		return false
	}
	if err := it.blk.init(b); err != nil {
		it.err = it.r.corrupt(e.h.Offset, "data block: %v", err)
		return false
	}
	it.blockIdx = i
	it.checkUpper = it.upper != nil && bytes.Compare(e.sep.UserKey, it.upper) >= 0
	// Keys of block i are > sep[i-1].
	it.checkLower = it.lower != nil && (i == 0 || bytes.Compare(it.r.index[i-1].sep.UserKey, it.lower) < 0)
	return true
}

// settle validates the block iterator's position and publishes the key.
// dir is +1 for forward movement, -1 for backward.
func (it *iterator) settle(ok bool, dir int) bool {
	for {
		if !ok {
			if it.blk.err != nil {
				return it.fail(it.r.corrupt(it.r.index[it.blockIdx].h.Offset, "data block: %v", it.blk.err))
			}
			// Move to the adjacent block.
			var i int
			if dir > 0 {
				i = it.blockIdx + 1
				if i >= len(it.r.index) ||
					(it.upper != nil && bytes.Compare(it.r.index[i-1].sep.UserKey, it.upper) >= 0) {
					return it.exhaust()
				}
			} else {
				i = it.blockIdx - 1
				if i < 0 || (it.lower != nil && bytes.Compare(it.r.index[i].sep.UserKey, it.lower) < 0) {
					return it.exhaust()
				}
			}
			if !it.loadBlock(i) {
				return it.fail(it.err)
			}
			if dir > 0 {
				ok = it.blk.first()
			} else {
				ok = it.blk.last()
			}
			continue
		}
		k, kok := base.DecodeInternalKey(it.blk.key)
		if !kok {
			return it.fail(it.r.corrupt(it.r.index[it.blockIdx].h.Offset,
				"data block: malformed internal key at block offset %d", it.blk.offset))
		}
		if dir > 0 && it.checkUpper && bytes.Compare(k.UserKey, it.upper) >= 0 {
			return it.exhaust()
		}
		if dir < 0 && it.checkLower && bytes.Compare(k.UserKey, it.lower) < 0 {
			return it.exhaust()
		}
		it.key = k
		it.valid = true
		return true
	}
}

func (it *iterator) fail(err error) bool {
	if it.err == nil {
		it.err = err
	}
	it.valid = false
	return false
}

func (it *iterator) exhaust() bool {
	it.valid = false
	it.blk.invalidate()
	return false
}

func (it *iterator) reset() bool {
	it.valid = false
	return it.err == nil
}

// SeekGE implements base.InternalIterator.
func (it *iterator) SeekGE(key []byte) bool {
	if !it.reset() {
		return false
	}
	if it.lower != nil && bytes.Compare(key, it.lower) < 0 {
		key = it.lower
	}
	if it.upper != nil && bytes.Compare(key, it.upper) >= 0 {
		return it.exhaust()
	}
	target := base.MakeSearchKey(key)
	i := it.r.findBlock(target)
	if i >= len(it.r.index) {
		return it.exhaust()
	}
	// Every key of block i is > sep[i-1].
	if it.upper != nil && i > 0 && bytes.Compare(it.r.index[i-1].sep.UserKey, it.upper) >= 0 {
		return it.exhaust()
	}
	if !it.loadBlock(i) {
		return it.fail(it.err)
	}
	return it.settle(it.blk.seekGE(target), +1)
}

// SeekLT implements base.InternalIterator.
func (it *iterator) SeekLT(key []byte) bool {
	if !it.reset() {
		return false
	}
	if it.upper != nil && bytes.Compare(key, it.upper) > 0 {
		key = it.upper
	}
	if it.lower != nil && bytes.Compare(key, it.lower) <= 0 {
		return it.exhaust()
	}
	return it.seekLT(base.MakeSearchKey(key))
}

func (it *iterator) seekLT(target base.InternalKey) bool {
	n := len(it.r.index)
	if n == 0 {
		return it.exhaust()
	}
	i := it.r.findBlock(target)
	if i == n {
		// Every key in the file is <= sep[n-1] < target.
		i = n - 1
		if it.lower != nil && bytes.Compare(it.r.index[i].sep.UserKey, it.lower) < 0 {
			return it.exhaust()
		}
		if !it.loadBlock(i) {
			return it.fail(it.err)
		}
		return it.settle(it.blk.last(), -1)
	}
	if it.lower != nil && bytes.Compare(it.r.index[i].sep.UserKey, it.lower) < 0 {
		return it.exhaust()
	}
	if !it.loadBlock(i) {
		return it.fail(it.err)
	}
	return it.settle(it.blk.seekLT(target), -1)
}

// First implements base.InternalIterator.
func (it *iterator) First() bool {
	if it.lower != nil {
		return it.SeekGE(it.lower)
	}
	if !it.reset() {
		return false
	}
	if len(it.r.index) == 0 {
		return it.exhaust()
	}
	if !it.loadBlock(0) {
		return it.fail(it.err)
	}
	return it.settle(it.blk.first(), +1)
}

// Last implements base.InternalIterator.
func (it *iterator) Last() bool {
	if it.upper != nil {
		return it.SeekLT(it.upper)
	}
	if !it.reset() {
		return false
	}
	n := len(it.r.index)
	if n == 0 {
		return it.exhaust()
	}
	if it.lower != nil && bytes.Compare(it.r.index[n-1].sep.UserKey, it.lower) < 0 {
		return it.exhaust()
	}
	if !it.loadBlock(n - 1) {
		return it.fail(it.err)
	}
	return it.settle(it.blk.last(), -1)
}

// Next implements base.InternalIterator.
func (it *iterator) Next() bool {
	if !it.valid {
		return false
	}
	it.valid = false
	return it.settle(it.blk.nextEntry(), +1)
}

// Prev implements base.InternalIterator.
func (it *iterator) Prev() bool {
	if !it.valid {
		return false
	}
	it.valid = false
	return it.settle(it.blk.prevEntry(), -1)
}

// Key implements base.InternalIterator.
func (it *iterator) Key() base.InternalKey { return it.key }

// Value implements base.InternalIterator.
func (it *iterator) Value() []byte { return it.blk.val }

// Error implements base.InternalIterator.
func (it *iterator) Error() error { return it.err }

// Close implements base.InternalIterator.
func (it *iterator) Close() error {
	it.closed = true
	it.valid = false
	it.blk = blockIter{}
	it.raw, it.dec = nil, nil
	return it.err
}
