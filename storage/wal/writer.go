package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
)

// BlockSize is the size of a log block. Chunks never cross block boundaries.
const BlockSize = 32 << 10

// HeaderSize is the size of a chunk header: checksum (4), length (2), type (1).
const HeaderSize = 7

// maxPayload is the largest payload a single chunk can carry.
const maxPayload = BlockSize - HeaderSize

// Chunk types. Their values are part of the on-disk format.
const (
	chunkFull   = 1
	chunkFirst  = 2
	chunkMiddle = 3
	chunkLast   = 4
)

const maskDelta = 0xa282ead8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// typeCRC[t] is the unmasked CRC-32C of the single byte t, the prefix of
// every chunk checksum. Precomputing it avoids building a one-byte slice per
// chunk.
var typeCRC = func() (t [chunkLast + 1]uint32) {
	for i := range t {
		t[i] = crc32.Checksum([]byte{byte(i)}, castagnoli)
	}
	return t
}()

// chunkChecksum returns the masked checksum of a chunk with type typ and
// payload p. typ must be a valid chunk type.
func chunkChecksum(typ byte, p []byte) uint32 {
	c := crc32.Update(typeCRC[typ], castagnoli, p)
	return ((c >> 15) | (c << 17)) + maskDelta
}

// Writer frames records into an io.Writer using the format described in the
// package documentation.
//
// The Writer keeps the current block in memory. Bytes reach the underlying
// writer when a block fills up and when Flush is called; Flush does not pad
// the block, so the next record continues at the right position of the same
// block. Writing a record performs no allocation.
//
// Once a write to the underlying writer fails, the Writer is broken: every
// later call returns that error (the log's tail is then unknown and the log
// must be abandoned). A Writer is not safe for concurrent use.
type Writer struct {
	w       io.Writer
	err     error
	base    int64 // file offset of block[0]
	off     int   // bytes of block filled
	flushed int   // bytes of block already handed to w
	// block buffers the current block from flushed to off. Bytes below
	// flushed are never read again, so between a Flush and the next
	// record the Writer needs no buffer: with a pool it hands it back.
	block *[BlockSize]byte
	pool  *BlockPool
}

// BlockPool lends block buffers to the Writers that use it (SetBlockPool):
// such a Writer holds a buffer only from its first record after a Flush to
// the next Flush, so many logs that are mostly idle share a few buffers
// instead of keeping 32 KiB each. The zero value is ready to use; it is safe
// for concurrent use.
type BlockPool struct{ p sync.Pool }

func (p *BlockPool) get() *[BlockSize]byte {
	if b, ok := p.p.Get().(*[BlockSize]byte); ok {
		return b
	}
	return new([BlockSize]byte)
}

// NewWriter returns a Writer that appends records to w, which must be
// positioned at the start of an empty log (offset 0).
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w}
}

// SetBlockPool makes the Writer borrow its block buffer from p while it
// has unflushed bytes, and give it back on Flush. Call it before the first
// WriteRecord.
func (w *Writer) SetBlockPool(p *BlockPool) {
	w.pool = p
}

// NewWriterAt returns a Writer that continues a log of size bytes, written
// by an earlier Writer and ended by a Flush: w must append at offset size
// (for example a file opened for appending). Records written through it are
// laid out exactly as if the earlier Writer had gone on writing, so a log can
// be closed between records and reopened without keeping a file open.
func NewWriterAt(w io.Writer, size int64) *Writer {
	if size < 0 {
		size = 0
	}
	off := int(size % BlockSize)
	return &Writer{w: w, base: size - int64(off), off: off, flushed: off}
}

// WriteRecord appends p as one record and returns the file offset at which
// the record's first chunk header starts. The record is not necessarily
// handed to the underlying writer until Flush. p may be empty or of any size
// and is not retained.
func (w *Writer) WriteRecord(p []byte) (int64, error) {
	if w.err != nil {
		return -1, w.err
	}
	if w.block == nil {
		if w.pool != nil {
			w.block = w.pool.get()
		} else {
			w.block = new([BlockSize]byte)
		}
	}
	start := int64(-1)
	first := true
	for {
		if BlockSize-w.off < HeaderSize {
			// Too little room for a header: zero the trailer, move on.
			clear(w.block[w.off:])
			w.off = BlockSize
			if err := w.writeBlock(); err != nil {
				return -1, err
			}
		}
		if start < 0 {
			start = w.base + int64(w.off)
		}
		n := min(len(p), BlockSize-w.off-HeaderSize)
		last := n == len(p)
		var typ byte
		switch {
		case first && last:
			typ = chunkFull
		case first:
			typ = chunkFirst
		case last:
			typ = chunkLast
		default:
			typ = chunkMiddle
		}
		h := w.block[w.off : w.off+HeaderSize]
		binary.LittleEndian.PutUint32(h[0:4], chunkChecksum(typ, p[:n]))
		binary.LittleEndian.PutUint16(h[4:6], uint16(n))
		h[6] = typ
		copy(w.block[w.off+HeaderSize:], p[:n])
		w.off += HeaderSize + n
		p = p[n:]
		first = false
		if w.off == BlockSize {
			if err := w.writeBlock(); err != nil {
				return -1, err
			}
		}
		if last {
			return start, nil
		}
	}
}

// writeBlock hands the unflushed rest of the full block to w and starts a
// new block.
func (w *Writer) writeBlock() error {
	if err := w.write(w.block[w.flushed:BlockSize]); err != nil {
		return err
	}
	w.base += BlockSize
	w.off, w.flushed = 0, 0
	return nil
}

func (w *Writer) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	n, err := w.w.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		w.err = fmt.Errorf("wal: write at offset %d: %w", w.base+int64(w.flushed), err)
		return w.err
	}
	return nil
}

// Flush hands every buffered byte to the underlying writer. It does not sync
// anything; syncing is the caller's business (e.g. vfs.File.Sync after
// Flush).
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if w.block == nil {
		return nil // nothing written since the last Flush
	}
	if err := w.write(w.block[w.flushed:w.off]); err != nil {
		return err
	}
	w.flushed = w.off
	if w.pool != nil {
		w.pool.p.Put(w.block)
		w.block = nil
	}
	return nil
}

// Size returns the number of bytes logically written so far, flushed or not:
// the offset at which the next chunk or block padding will be written.
func (w *Writer) Size() int64 {
	return w.base + int64(w.off)
}
