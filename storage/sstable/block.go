package sstable

import (
	"encoding/binary"
	"fmt"

	"github.com/shale-db/shale/storage/internal/base"
)

// blockWriter builds one block: prefix-compressed entries, then the restart
// offsets (uint32 LE each) and their count (uint32 LE).
type blockWriter struct {
	restartInterval int
	buf             []byte
	restarts        []uint32
	counter         int // entries since the last restart
	nEntries        int
	lastKey         []byte
}

func (w *blockWriter) reset() {
	w.buf = w.buf[:0]
	w.restarts = w.restarts[:0]
	w.counter = 0
	w.nEntries = 0
	w.lastKey = w.lastKey[:0]
}

// add appends an entry. Keys are not checked for order here.
func (w *blockWriter) add(key, value []byte) {
	shared := 0
	if w.counter >= w.restartInterval || w.nEntries == 0 {
		w.restarts = append(w.restarts, uint32(len(w.buf)))
		w.counter = 0
	} else {
		n := min(len(key), len(w.lastKey))
		for shared < n && key[shared] == w.lastKey[shared] {
			shared++
		}
	}
	w.buf = binary.AppendUvarint(w.buf, uint64(shared))
	w.buf = binary.AppendUvarint(w.buf, uint64(len(key)-shared))
	w.buf = binary.AppendUvarint(w.buf, uint64(len(value)))
	w.buf = append(w.buf, key[shared:]...)
	w.buf = append(w.buf, value...)
	w.lastKey = append(w.lastKey[:0], key...)
	w.counter++
	w.nEntries++
}

// estimatedSize is the size finish would return.
func (w *blockWriter) estimatedSize() int {
	n := len(w.restarts)
	if n == 0 {
		n = 1
	}
	return len(w.buf) + 4*n + 4
}

// finish appends the restart array and returns the block contents, which
// stay valid until the next reset.
func (w *blockWriter) finish() []byte {
	if len(w.restarts) == 0 {
		w.restarts = append(w.restarts, 0)
	}
	for _, r := range w.restarts {
		w.buf = binary.LittleEndian.AppendUint32(w.buf, r)
	}
	w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(len(w.restarts)))
	return w.buf
}

// blockEntry remembers one decoded entry of the current restart interval so
// that Prev does not have to re-decode from the restart point each time.
type blockEntry struct {
	offset, next     int
	keyStart, keyEnd int // in blockIter.cacheKeys
	valStart, valEnd int // in blockIter.data
}

// blockIter iterates over the entries of one block. Key bytes live in an
// iterator-owned buffer (they are prefix-compressed on disk); values alias
// the block. All decoding is bounds-checked: malformed input sets err and
// makes the iterator invalid, it never panics.
//
// Every block this package writes has at least one restart point and the
// first restart is offset 0. An iterator is invalid when offset < 0.
type blockIter struct {
	data        []byte
	restarts    int // offset of the restart array = end of entries
	numRestarts int

	offset int // current entry; -1 when invalid
	next   int // offset of the following entry
	valOff int // offset of the current value
	key    []byte
	val    []byte
	err    error

	cache     []blockEntry
	cacheKeys []byte
	target    base.InternalKey // seekLT target while filling
}

// init prepares the iterator over data and validates the restart array.
func (b *blockIter) init(data []byte) error {
	b.data = nil
	b.offset = -1
	b.err = nil
	b.key = b.key[:0]
	b.val = nil
	b.cache = b.cache[:0]
	b.cacheKeys = b.cacheKeys[:0]
	if len(data) < 4 {
		return fmt.Errorf("block too short (%d bytes)", len(data))
	}
	n := binary.LittleEndian.Uint32(data[len(data)-4:])
	if uint64(n) > uint64(len(data)-4)/4 || n == 0 {
		return fmt.Errorf("bad restart count %d for %d-byte block", n, len(data))
	}
	restarts := len(data) - 4 - 4*int(n)
	prev := -1
	for i := 0; i < int(n); i++ {
		r := int(binary.LittleEndian.Uint32(data[restarts+4*i:]))
		if (i == 0 && r != 0) || r <= prev || (restarts > 0 && r >= restarts) || (restarts == 0 && n != 1) {
			return fmt.Errorf("bad restart point %d (#%d)", r, i)
		}
		prev = r
	}
	b.data = data
	b.restarts = restarts
	b.numRestarts = int(n)
	return nil
}

func (b *blockIter) restartOffset(i int) int {
	return int(binary.LittleEndian.Uint32(b.data[b.restarts+4*i:]))
}

func (b *blockIter) corrupt(format string, args ...any) bool {
	if b.err == nil {
		b.err = fmt.Errorf(format, args...)
	}
	b.offset = -1
	return false
}

// uvarint32 decodes a uvarint that must fit in 31 bits.
func uvarint32(p []byte) (int, int) {
	if len(p) > 0 && p[0] < 0x80 {
		return int(p[0]), 1
	}
	v, n := binary.Uvarint(p)
	if n <= 0 || v > 1<<31-1 {
		return 0, -1
	}
	return int(v), n
}

// entryHeader decodes the entry header at off. It returns the shared and
// unshared key lengths, the value length and the header length, or ok=false
// when the entry does not fit in the entries area.
func (b *blockIter) entryHeader(off int) (shared, unshared, vlen, hdr int, ok bool) {
	if off < 0 || off >= b.restarts {
		return 0, 0, 0, 0, false
	}
	p := b.data[off:b.restarts]
	var n int
	if shared, n = uvarint32(p); n < 0 {
		return 0, 0, 0, 0, false
	}
	hdr = n
	if unshared, n = uvarint32(p[hdr:]); n < 0 {
		return 0, 0, 0, 0, false
	}
	hdr += n
	if vlen, n = uvarint32(p[hdr:]); n < 0 {
		return 0, 0, 0, 0, false
	}
	hdr += n
	if unshared > len(p)-hdr || vlen > len(p)-hdr-unshared {
		return 0, 0, 0, 0, false
	}
	return shared, unshared, vlen, hdr, true
}

// decodeAt decodes the entry at off; b.key must hold the previous entry's
// key (or anything, if off is a restart point).
func (b *blockIter) decodeAt(off int) bool {
	shared, unshared, vlen, hdr, ok := b.entryHeader(off)
	if !ok || shared > len(b.key) {
		return b.corrupt("malformed block entry at block offset %d", off)
	}
	ks := off + hdr
	b.key = append(b.key[:shared], b.data[ks:ks+unshared]...)
	b.valOff = ks + unshared
	b.val = b.data[b.valOff : b.valOff+vlen : b.valOff+vlen]
	b.offset = off
	b.next = ks + unshared + vlen
	return true
}

// restartKey returns the full key stored at restart point i without
// touching the iterator position.
func (b *blockIter) restartKey(i int) ([]byte, bool) {
	off := b.restartOffset(i)
	shared, unshared, _, hdr, ok := b.entryHeader(off)
	if !ok || shared != 0 {
		b.corrupt("malformed restart entry at block offset %d", off)
		return nil, false
	}
	return b.data[off+hdr : off+hdr+unshared], true
}

func (b *blockIter) invalidate() {
	b.offset = -1
	b.cache = b.cache[:0]
	b.cacheKeys = b.cacheKeys[:0]
}

// first positions at the first entry.
func (b *blockIter) first() bool {
	b.invalidate()
	if b.data == nil || b.restarts == 0 {
		return false
	}
	b.key = b.key[:0]
	return b.decodeAt(0)
}

// nextEntry moves forward one entry.
func (b *blockIter) nextEntry() bool {
	b.cache = b.cache[:0]
	b.cacheKeys = b.cacheKeys[:0]
	if b.offset < 0 || b.next >= b.restarts {
		b.offset = -1
		return false
	}
	return b.decodeAt(b.next)
}

// push remembers the current entry in the Prev cache.
func (b *blockIter) push() {
	ks := len(b.cacheKeys)
	b.cacheKeys = append(b.cacheKeys, b.key...)
	vs := b.valOff
	b.cache = append(b.cache, blockEntry{
		offset: b.offset, next: b.next,
		keyStart: ks, keyEnd: len(b.cacheKeys),
		valStart: vs, valEnd: vs + len(b.val),
	})
}

// pop makes the most recently cached entry current.
func (b *blockIter) pop() bool {
	e := b.cache[len(b.cache)-1]
	b.cache = b.cache[:len(b.cache)-1]
	b.key = append(b.key[:0], b.cacheKeys[e.keyStart:e.keyEnd]...)
	b.cacheKeys = b.cacheKeys[:e.keyStart]
	b.val = b.data[e.valStart:e.valEnd:e.valEnd]
	b.valOff = e.valStart
	b.offset = e.offset
	b.next = e.next
	return true
}

// fillFrom decodes entries from restart point r forward, caching each one,
// and stops before the first entry at offset >= stopOff, or (when target is
// useTarget) before the first entry >= b.target. It then pops the last cached
// entry. It returns false when nothing was cached or on corruption.
func (b *blockIter) fillFrom(r, stopOff int, useTarget bool) bool {
	b.invalidate()
	b.key = b.key[:0]
	off := b.restartOffset(r)
	for off < b.restarts && off < stopOff {
		if !b.decodeAt(off) {
			return false
		}
		if useTarget {
			c, ok := cmpKey(b.key, b.target)
			if !ok {
				return b.corrupt("malformed internal key at block offset %d", off)
			}
			if c >= 0 {
				break
			}
		}
		b.push()
		off = b.next
	}
	if len(b.cache) == 0 {
		b.offset = -1
		return false
	}
	return b.pop()
}

// last positions at the last entry.
func (b *blockIter) last() bool {
	b.invalidate()
	if b.data == nil || b.restarts == 0 {
		return false
	}
	return b.fillFrom(b.numRestarts-1, b.restarts, false)
}

// prevEntry moves back one entry.
func (b *blockIter) prevEntry() bool {
	if b.offset < 0 {
		return false
	}
	if len(b.cache) > 0 {
		return b.pop()
	}
	cur := b.offset
	if cur == 0 {
		b.offset = -1
		return false
	}
	// Largest restart strictly before cur.
	lo, hi := 0, b.numRestarts
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if b.restartOffset(m) < cur {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return b.corrupt("entry at block offset %d precedes first restart", cur)
	}
	ok := b.fillFrom(lo-1, cur, false)
	if !ok && b.err == nil {
		return b.corrupt("no entry before block offset %d", cur)
	}
	return ok
}

// cmpKey compares an encoded internal key with target. Malformed keys
// (shorter than a trailer) make ok false.
func cmpKey(enc []byte, target base.InternalKey) (c int, ok bool) {
	k, ok := base.DecodeInternalKey(enc)
	if !ok {
		return 0, false
	}
	return base.CompareInternal(k, target), true
}

// seekGE positions at the first entry >= target.
func (b *blockIter) seekGE(target base.InternalKey) bool {
	b.invalidate()
	if b.data == nil || b.restarts == 0 {
		return false
	}
	// Find the first restart whose key is > target; start from the one before.
	lo, hi := 0, b.numRestarts
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		k, ok := b.restartKey(m)
		if !ok {
			return false
		}
		c, ok := cmpKey(k, target)
		if !ok {
			return b.corrupt("malformed internal key at restart %d", m)
		}
		if c <= 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	r := lo - 1
	if r < 0 {
		r = 0
	}
	b.key = b.key[:0]
	if !b.decodeAt(b.restartOffset(r)) {
		return false
	}
	for {
		c, ok := cmpKey(b.key, target)
		if !ok {
			return b.corrupt("malformed internal key at block offset %d", b.offset)
		}
		if c >= 0 {
			return true
		}
		if !b.nextEntry() {
			return false
		}
	}
}

// seekLT positions at the last entry < target.
func (b *blockIter) seekLT(target base.InternalKey) bool {
	b.invalidate()
	if b.data == nil || b.restarts == 0 {
		return false
	}
	// Find the first restart whose key is >= target; start from the one before.
	lo, hi := 0, b.numRestarts
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		k, ok := b.restartKey(m)
		if !ok {
			return false
		}
		c, ok := cmpKey(k, target)
		if !ok {
			return b.corrupt("malformed internal key at restart %d", m)
		}
		if c < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return false
	}
	b.target = target
	ok := b.fillFrom(lo-1, b.restarts, true)
	b.target = base.InternalKey{}
	return ok
}
