package memtable

import (
	"errors"
	"math"
	"sync/atomic"
	"unsafe"
)

// ErrArenaFull is returned by Skiplist.Add when the entry does not fit in the
// remaining arena space. Nothing is inserted in that case and the skiplist
// stays fully usable (for reads, and for smaller entries that still fit).
var ErrArenaFull = errors.New("memtable: arena full")

// nodeAlign is the alignment of every node. Nodes hold a uint64 trailer and
// uint32 links that are accessed atomically, so 8 covers both.
const nodeAlign = 8

// arena is a fixed-size byte buffer allocated from both ends: nodes (each
// preceded by its key) grow up from the bottom, values grow down from the
// top. Keeping values out of the node region packs the nodes a search visits
// densely, so fewer cache lines and pages are touched per lookup. The arena
// never grows and never frees; offset 0 is reserved as the nil offset. The
// buffer is backed by a []uint64 so it is 8-byte aligned and pointer-free (the
// GC never scans it).
//
// Only the single writer allocates; readers only read the sizes.
type arena struct {
	lo   atomic.Uint32 // next free offset of the bottom region
	hi   atomic.Uint32 // start of the top (value) region
	cap  uint32        // end of the usable space
	buf  []byte        // len(buf) >= cap + maxNodeSize (slack, see newArena)
	base unsafe.Pointer
}

// minHugeArena is the smallest arena whose pages are huge pages where the
// platform allows (adviseHugePages): an arena this large is a memtable
// that filled a smaller one before, or a recovery's, and fills.
const minHugeArena = 8 << 20

// maxArenaSize keeps every offset (plus the slack below) inside uint32.
const maxArenaSize = math.MaxUint32 - 2*maxNodeSize - nodeAlign

func newArena(size uint32) *arena {
	if size > maxArenaSize {
		size = maxArenaSize
	}
	// The slack past cap guarantees that viewing any node offset < cap as a
	// full-height *node stays inside the allocation (the checkptr
	// instrumentation enabled by -race verifies exactly that), even though
	// nodes are allocated with truncated towers.
	total := uint64(size) + uint64(maxNodeSize) + nodeAlign
	words := make([]uint64, (total+7)/8)
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	adviseHugePages(buf)
	a := &arena{cap: size, buf: buf, base: unsafe.Pointer(&words[0])}
	a.lo.Store(nodeAlign) // offset 0 is nil
	a.hi.Store(size)
	return a
}

// size returns the number of bytes allocated so far (including alignment
// padding and the reserved nil offset).
func (a *arena) size() uint32 {
	return a.lo.Load() + (a.cap - a.hi.Load())
}

// allocEntry reserves keySize bytes immediately followed by a nodeSize-byte
// node aligned to nodeAlign at the bottom, and valueSize bytes at the top. It
// returns the offsets of the node and the value, or ok=false (allocating
// nothing) when they do not fit. Only the writer calls it.
func (a *arena) allocEntry(keySize, nodeSize, valueSize uint64) (nodeOff, valueOff uint32, ok bool) {
	lo, hi := uint64(a.lo.Load()), uint64(a.hi.Load())
	start := (lo + keySize + nodeAlign - 1) &^ (nodeAlign - 1)
	end := start + nodeSize
	if valueSize > hi || end > hi-valueSize {
		return 0, 0, false
	}
	a.lo.Store(uint32(end))
	a.hi.Store(uint32(hi - valueSize))
	return uint32(start), uint32(hi - valueSize), true
}

// bytes returns buf[off:off+n] with capacity clipped so appends cannot
// scribble over neighbouring arena data.
func (a *arena) bytes(off, n uint32) []byte {
	end := off + n
	return a.buf[off:end:end]
}
