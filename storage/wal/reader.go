package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/shale-db/shale/storage/internal/base"
)

// ErrTornTail is matched (errors.Is) by the error Reader.Next returns when
// the log ends in the middle of a record: inside a chunk header, inside a
// chunk payload, or after a First or Middle chunk whose record never got its
// Last chunk. The returned error wraps ErrTornTail with the file name and the
// offset of the incomplete record (or chunk). A crash during an append leaves
// exactly this behind, so recovery may tolerate it at the end of the last
// log.
var ErrTornTail = errors.New("log ends inside a record (torn tail)")

// scan positions for ValidRecordFollows.
const (
	scanNextBlock = -1 // resume at the next block boundary
	scanNever     = -2 // the stream cannot be scanned (read error)
)

// Reader reads the records of a log written by Writer. See the package
// documentation for the format and for the meaning of the errors.
//
// Once Next returns an error (including io.EOF), every later call returns the
// same error. A Reader is not safe for concurrent use.
type Reader struct {
	r    io.Reader
	name string
	err  error // terminal result, sticky

	started    bool  // a block has been read
	blockStart int64 // file offset of buf[0]
	n          int   // valid bytes in buf; < BlockSize means the final block
	pos        int   // next unread byte of buf
	skip       int   // bytes of the first block to skip (NewReaderAt)

	rec       []byte // assembly buffer for fragmented records
	lastStart int64  // offset of the record last returned
	lastEnd   int64  // offset just past the record last returned

	scanPos  int  // where ValidRecordFollows starts in buf (or scanNextBlock/scanNever)
	scanDone bool // ValidRecordFollows already ran
	scanRes  bool
	// lenFlip is set when the chunk Next stopped at checks out under a
	// length one bit away from its stored one: its length field is damaged.
	lenFlip bool

	buf [BlockSize]byte
}

// NewReader returns a Reader for the log read from r, which must be
// positioned at the start of the log. name identifies the log in errors.
func NewReader(r io.Reader, name string) *Reader {
	return &Reader{r: r, name: name, lastStart: -1}
}

// NewReaderAt returns a Reader that continues a log at file offset offset,
// which must be a record boundary: 0 or a value that Reader.ValidOffset
// returned for the same log. r must be positioned at the start of the block
// holding offset, that is at file offset offset - offset%BlockSize (for
// example an io.SectionReader starting there); the reader skips the first
// offset%BlockSize bytes of the first block it reads. name identifies the log
// in errors.
//
// From such an offset the Reader returns exactly the records, and ends with
// exactly the outcome (io.EOF, ErrTornTail or corruption, with the same
// offsets), that a Reader started at the beginning of the log would return
// after the record ending at offset. Offsets stay file offsets:
// LastRecordOffset, ValidOffset and the offsets in errors are the same as
// for that Reader, and ValidOffset returns offset until a record is read. A
// Reader that ended with io.EOF on a log that is still being appended to can
// therefore be replaced by NewReaderAt at its ValidOffset to read the
// records appended since.
//
// If r ends before the first offset%BlockSize bytes of its block, the log
// is shorter than offset and Next returns an error matching
// io.ErrUnexpectedEOF; a negative offset makes Next fail likewise. A log
// that ends before a block-aligned offset cannot be told from one that ends
// at it (r yields nothing in both cases: Next returns io.EOF), so a caller
// whose offset may be stale should compare it with the log's size. At an
// offset that is not a record boundary Next still never returns a payload
// whose chunks failed their checksums, but it may report corruption or
// return records that start at chunk boundaries inside other records.
func NewReaderAt(r io.Reader, name string, offset int64) *Reader {
	rd := &Reader{r: r, name: name, lastStart: -1}
	if offset < 0 {
		rd.err = fmt.Errorf("wal: %s: negative start offset %d: %w", name, offset, io.ErrUnexpectedEOF)
		rd.scanPos = scanNever
		return rd
	}
	rd.blockStart = offset - offset%BlockSize
	rd.skip = int(offset % BlockSize)
	rd.lastEnd = offset
	return rd
}

// Next returns the payload of the next record. The slice is valid only until
// the next call to Next or ValidRecordFollows; callers that keep it must copy.
//
// At the clean end of the log Next returns io.EOF. It returns an error
// matching ErrTornTail when the log ends inside a record, a
// *base.CorruptionError naming the file and the offset of the damaged chunk
// when a chunk is invalid, and a wrapped I/O error when reading fails. It
// never returns a payload whose chunks did not all pass their checksums.
func (r *Reader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	rec, err := r.next()
	if err != nil {
		r.err = err
		return nil, err
	}
	return rec, nil
}

// LastRecordOffset returns the file offset of the first chunk header of the
// record most recently returned by Next, or -1 if none was returned.
func (r *Reader) LastRecordOffset() int64 { return r.lastStart }

// ValidOffset returns the file offset just past the last chunk of the record
// most recently returned by Next (0 if none was returned, or the start
// offset of a Reader made by NewReaderAt): the length of the log's intact
// prefix as far as it has been read. It is a record boundary, at which
// NewReaderAt can continue the log.
func (r *Reader) ValidOffset() int64 { return r.lastEnd }

func (r *Reader) torn(off int64) error {
	return fmt.Errorf("wal: %s: record at offset %d: %w", r.name, off, ErrTornTail)
}

func (r *Reader) corrupt(off int64, resume int, format string, args ...any) error {
	r.scanPos = resume
	return base.Corruptf(r.name, off, "wal: "+format, args...)
}

// readBlock reads the next block into buf. A short block marks the end of
// the stream.
func (r *Reader) readBlock() error {
	if r.started {
		r.blockStart += int64(r.n)
	}
	r.started = true
	r.pos = 0
	n, err := io.ReadFull(r.r, r.buf[:])
	r.n = n
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		r.n = 0
		r.scanPos = scanNever
		return fmt.Errorf("wal: reading %s at offset %d: %w", r.name, r.blockStart+int64(n), err)
	}
	if r.skip > 0 {
		// The first block of a Reader from NewReaderAt: start at the offset.
		skip := r.skip
		r.skip = 0
		if n < skip {
			r.scanPos = scanNever
			return fmt.Errorf("wal: %s: log ends at offset %d, before the start offset %d: %w",
				r.name, r.blockStart+int64(n), r.blockStart+int64(skip), io.ErrUnexpectedEOF)
		}
		r.pos = skip
	}
	return nil
}

// finalBlock reports whether buf holds the last block of the stream.
func (r *Reader) finalBlock() bool { return r.started && r.n < BlockSize }

func (r *Reader) next() ([]byte, error) {
	r.rec = r.rec[:0]
	inRec := false
	recStart := int64(-1)
	for {
		if r.n-r.pos < HeaderSize {
			if !r.finalBlock() {
				// Block trailer (padding) or no block yet: move on.
				if err := r.readBlock(); err != nil {
					return nil, err
				}
				continue
			}
			off := r.blockStart + int64(r.pos)
			r.scanPos = scanNextBlock
			if inRec {
				return nil, r.torn(recStart)
			}
			for _, b := range r.buf[r.pos:r.n] {
				if b != 0 {
					return nil, r.torn(off)
				}
			}
			return nil, io.EOF
		}

		off := r.blockStart + int64(r.pos)
		h := r.buf[r.pos : r.pos+HeaderSize]
		sum := binary.LittleEndian.Uint32(h[0:4])
		length := int(binary.LittleEndian.Uint16(h[4:6]))
		typ := h[6]
		if sum == 0 && length == 0 && typ == 0 {
			// Zeroed space: the end of the written data, unless intact
			// chunks follow later (ValidRecordFollows probes from here).
			r.scanPos = r.pos
			if inRec {
				return nil, r.torn(recStart)
			}
			return nil, io.EOF
		}
		end := r.pos + HeaderSize + length
		if typ < chunkFull || typ > chunkLast {
			// The type byte may be the damage: the chunks after this one
			// are still found if its length is intact.
			resume := scanNextBlock
			if end <= r.n {
				resume = end
			}
			return nil, r.corrupt(off, resume, "invalid chunk type %d", typ)
		}
		if end > r.n {
			resume := scanNextBlock
			if e, ok := r.lengthFlipEnd(typ, sum, length); ok {
				// Not a torn write: the header's length field is damaged
				// (ValidRecordFollows reports it).
				r.lenFlip, resume = true, e
			}
			if r.finalBlock() && end <= BlockSize {
				r.scanPos = resume
				if inRec {
					return nil, r.torn(recStart)
				}
				return nil, r.torn(off)
			}
			return nil, r.corrupt(off, resume,
				"chunk length %d exceeds the %d bytes left in its block", length, BlockSize-r.pos-HeaderSize)
		}
		payload := r.buf[r.pos+HeaderSize : end]
		if chunkChecksum(typ, payload) != sum {
			resume := end
			if e, ok := r.lengthFlipEnd(typ, sum, length); ok {
				r.lenFlip, resume = true, e
			}
			return nil, r.corrupt(off, resume, "chunk checksum mismatch (type %d, length %d)", typ, length)
		}

		// The chunk is intact; check that it belongs where it is. On a
		// sequencing error the chunk itself is valid data after the damage,
		// so ValidRecordFollows starts at it.
		switch typ {
		case chunkFull:
			if inRec {
				return nil, r.corrupt(off, r.pos, "Full chunk inside the record that started at offset %d", recStart)
			}
			r.pos = end
			r.lastStart, r.lastEnd = off, r.blockStart+int64(end)
			return payload, nil
		case chunkFirst:
			if inRec {
				return nil, r.corrupt(off, r.pos, "First chunk inside the record that started at offset %d", recStart)
			}
			inRec, recStart = true, off
			r.rec = append(r.rec, payload...)
		case chunkMiddle:
			if !inRec {
				return nil, r.corrupt(off, r.pos, "Middle chunk without a First chunk")
			}
			r.rec = append(r.rec, payload...)
		case chunkLast:
			if !inRec {
				return nil, r.corrupt(off, r.pos, "Last chunk without a First chunk")
			}
			r.rec = append(r.rec, payload...)
			r.pos = end
			r.lastStart, r.lastEnd = recStart, r.blockStart+int64(end)
			return r.rec, nil
		}
		r.pos = end
	}
}

// ValidRecordFollows reports whether, after the point where Next stopped
// (with an error or io.EOF), the rest of the log contains any chunk with a
// valid checksum. Recovery uses it to tell a torn or garbage tail left by a
// crash (false: nothing intact follows) from damage in the middle of the log
// (true).
//
// It also reports true when the chunk Next stopped at (with ErrTornTail or a
// corruption error) has a valid checksum under a payload length that differs
// from its stored length in a single bit: the length field is damaged, which
// a crash does not do, and the chunks after it (which such a length may hide
// past the apparent end of the log) are scanned from its true end.
//
// It scans the chunks of the remaining blocks from each block boundary (every
// block starts with a chunk header), and the chunk right after the damaged
// one when its length was plausible. It consumes the rest of the stream;
// afterwards Next keeps returning its earlier error. It returns false if Next
// has not failed yet or failed with an I/O error, or if reading fails during
// the scan. Calling it again returns the same answer.
func (r *Reader) ValidRecordFollows() bool {
	if r.err == nil {
		return false
	}
	if r.scanDone {
		return r.scanRes
	}
	r.scanDone = true
	r.scanRes = r.scan()
	return r.scanRes
}

func (r *Reader) scan() bool {
	pos := r.scanPos
	if pos == scanNever {
		return false
	}
	if r.lenFlip {
		return true
	}
	for {
		if pos >= 0 && r.validChunkFrom(pos) {
			return true
		}
		if r.finalBlock() {
			return false
		}
		if err := r.readBlock(); err != nil {
			return false
		}
		pos = 0
	}
}

// lengthFlipEnd reports whether the chunk whose header is at r.pos has a
// valid checksum under a payload length one bit away from length, and where
// the chunk then ends in buf.
func (r *Reader) lengthFlipEnd(typ byte, sum uint32, length int) (int, bool) {
	start := r.pos + HeaderSize
	for b := 0; b < 16; b++ {
		l := length ^ 1<<b
		if start+l <= r.n && chunkChecksum(typ, r.buf[start:start+l]) == sum {
			return start + l, true
		}
	}
	return 0, false
}

// validChunkFrom walks the chunks of buf starting at pos and reports whether
// one of them is valid. At an invalid or zeroed header the position of the
// following chunk is unknown, so it probes every later offset of the block.
func (r *Reader) validChunkFrom(pos int) bool {
	for r.n-pos >= HeaderSize {
		typ, end, ok := r.chunkAt(pos)
		if !ok {
			return r.probeFrom(pos + 1)
		}
		if typ != 0 {
			return true
		}
		pos = end
	}
	return false
}

// chunkAt decodes the chunk header at pos. ok is false when the header is
// impossible (bad type, or a payload past the data); otherwise typ is the
// chunk's type when its checksum matches and 0 when it does not, and end is
// where the chunk ends.
func (r *Reader) chunkAt(pos int) (typ byte, end int, ok bool) {
	h := r.buf[pos : pos+HeaderSize]
	sum := binary.LittleEndian.Uint32(h[0:4])
	length := int(binary.LittleEndian.Uint16(h[4:6]))
	t := h[6]
	end = pos + HeaderSize + length
	if t < chunkFull || t > chunkLast || end > r.n {
		return 0, 0, false
	}
	if chunkChecksum(t, r.buf[pos+HeaderSize:end]) != sum {
		return 0, end, true
	}
	return t, end, true
}

// probeFrom reports whether any offset at or after pos in the block holds a
// chunk with a valid checksum. Used only after damage (a zeroed region or a
// garbled header), it costs a checksum per plausible offset; a false match
// has probability 2^-32 per offset.
func (r *Reader) probeFrom(pos int) bool {
	for ; r.n-pos >= HeaderSize; pos++ {
		if typ, _, ok := r.chunkAt(pos); ok && typ != 0 {
			return true
		}
	}
	return false
}
