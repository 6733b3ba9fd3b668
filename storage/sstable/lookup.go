package sstable

import (
	"sync"

	"github.com/shale-db/shale/storage/internal/base"
)

// Lookup calls visit with the file's point entries from the first at or
// after key (its newest version first), in order, until visit returns
// false or the entries run out, and returns the error that ended the walk
// (nil when visit stopped it or the file had no more). The key and value
// passed to visit are valid only during that call. With cacheOnly it reads
// no block from the file, as NewCacheOnlyIter. It is what a point read
// needs from an iterator, without allocating one: its iterator is reused
// from one Lookup to the next.
func (r *Reader) Lookup(key []byte, cacheOnly bool, visit func(k base.InternalKey, v []byte) bool) error {
	it := lookupIters.Get().(*iterator)
	it.r, it.blockIdx, it.cacheOnly = r, -1, cacheOnly
	for ok := it.SeekGE(key); ok && visit(it.key, it.blk.val); ok = it.Next() {
	}
	err := it.err
	it.release()
	return err
}

// lookupIters holds the iterators of Lookups, with their block iterators'
// key buffers and their read buffers, between uses.
var lookupIters = sync.Pool{New: func() any { return new(iterator) }}

// maxPooledBuf bounds the read buffers an iterator keeps in lookupIters: a
// file's huge block does not stay pinned in the pool.
const maxPooledBuf = 256 << 10

// release returns a Lookup's iterator to lookupIters, keeping its buffers
// (emptied) and nothing of the file it read.
func (it *iterator) release() {
	keyBuf, cache, cacheKeys := it.blk.key[:0], it.blk.cache[:0], it.blk.cacheKeys[:0]
	raw, dec := it.raw[:0], it.dec[:0]
	if cap(raw) > maxPooledBuf {
		raw = nil
	}
	if cap(dec) > maxPooledBuf {
		dec = nil
	}
	*it = iterator{raw: raw, dec: dec}
	it.blk.key, it.blk.cache, it.blk.cacheKeys = keyBuf, cache, cacheKeys
	lookupIters.Put(it)
}
