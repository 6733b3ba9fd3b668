package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shale-db/shale/storage/internal/base"
)

// Batch encoding (also the WAL record payload, format version 1):
//
//	header: seq uint64 LE | count uint32 LE
//	records, each: kind byte | key uvarint-len+bytes | value uvarint-len+bytes
//
// Set and Merge carry a key and a value, Delete a key only, RangeDelete the
// start key and the exclusive end key, LogData a blob only. Every record but
// LogData consumes one sequence number, in order, starting at seq; count is
// the number of such records.
const batchHeaderLen = 12

// maxBatchSize bounds a batch's encoding so offsets fit comfortably.
const maxBatchSize = 1 << 31

// ErrBatchTooLarge is returned by Apply for a batch over 2 GiB.
var ErrBatchTooLarge = errors.New("storage: batch too large")

// Batch is an ordered set of writes applied atomically by DB.Apply. A Batch
// is not safe for concurrent use. After Apply the batch may be reset and
// reused.
type Batch struct {
	data  []byte
	count uint32
	// memBytes estimates the memtable space the batch needs.
	memBytes uint64
	// hasRangeDel records whether the batch holds a range deletion.
	hasRangeDel bool
	// err is the first invalid record added (e.g. an empty range).
	err error
	// commit is the batch's entry in the commit queue while it is applied.
	commit commitWriter
}

// NewBatch returns an empty batch.
func NewBatch() *Batch { return &Batch{} }

// NewBatch returns an empty batch for this DB.
func (d *DB) NewBatch() *Batch { return NewBatch() }

func (b *Batch) init() {
	if len(b.data) == 0 {
		b.data = make([]byte, batchHeaderLen, 256)
	}
}

func (b *Batch) appendRecord(kind base.Kind, key, value []byte, hasValue bool) {
	b.init()
	b.data = append(b.data, byte(kind))
	b.data = binary.AppendUvarint(b.data, uint64(len(key)))
	b.data = append(b.data, key...)
	if hasValue {
		b.data = binary.AppendUvarint(b.data, uint64(len(value)))
		b.data = append(b.data, value...)
	}
	if kind != base.KindLogData {
		b.count++
		b.memBytes += uint64(len(key)+len(value)) + 64
	}
}

// Set records that key maps to value. The batch copies both.
func (b *Batch) Set(key, value []byte) { b.appendRecord(base.KindSet, key, value, true) }

// Delete records the removal of key.
func (b *Batch) Delete(key []byte) { b.appendRecord(base.KindDelete, key, nil, false) }

// Merge records a merge operand for key, combined with the key's value by
// the DB's MergeOperator when read or compacted.
func (b *Batch) Merge(key, operand []byte) { b.appendRecord(base.KindMerge, key, operand, true) }

// DeleteRange records the removal of every key in [start, end). An empty or
// inverted range makes Apply fail with an error.
func (b *Batch) DeleteRange(start, end []byte) {
	if bytes.Compare(start, end) >= 0 && b.err == nil {
		b.err = fmt.Errorf("storage: DeleteRange [%s, %s): start must be below end",
			base.FormatKey(start), base.FormatKey(end))
	}
	b.hasRangeDel = true
	b.appendRecord(base.KindRangeDelete, start, end, true)
}

// LogData records a blob that is written to the WAL (and so seen by
// UpdatesSince) but not to the database. It consumes no sequence number,
// except that a batch holding only LogData consumes one (so that every batch
// has a position of its own in the sequence).
func (b *Batch) LogData(blob []byte) { b.appendRecord(base.KindLogData, blob, nil, false) }

// seqSpan is the number of sequence numbers the batch consumes: its count,
// or one for a batch of LogData alone.
func (b *Batch) seqSpan() SeqNum { return SeqNum(max(b.count, 1)) }

// Count returns the number of records that consume sequence numbers.
func (b *Batch) Count() uint32 { return b.count }

// Empty reports whether the batch has no records at all.
func (b *Batch) Empty() bool { return len(b.data) <= batchHeaderLen }

// Len returns the size of the batch's encoding in bytes.
func (b *Batch) Len() int {
	if len(b.data) == 0 {
		return batchHeaderLen
	}
	return len(b.data)
}

// Reset empties the batch, keeping its buffer.
func (b *Batch) Reset() {
	if b.data != nil {
		b.data = b.data[:batchHeaderLen]
		clear(b.data)
	}
	b.count, b.memBytes, b.hasRangeDel, b.err = 0, 0, false, nil
}

// SeqNum returns the sequence number of the batch's first record; it is set
// by Apply, and for batches returned by UpdatesSince.
func (b *Batch) SeqNum() SeqNum {
	if len(b.data) < batchHeaderLen {
		return 0
	}
	return SeqNum(binary.LittleEndian.Uint64(b.data))
}

// LastSeqNum returns the sequence number of the batch's last record (of
// its one position, for a batch of LogData alone); like SeqNum, it is set
// by Apply and for batches returned by UpdatesSince.
func (b *Batch) LastSeqNum() SeqNum { return b.SeqNum() + b.seqSpan() - 1 }

func (b *Batch) setSeqNum(seq SeqNum) {
	b.init()
	binary.LittleEndian.PutUint64(b.data, uint64(seq))
	binary.LittleEndian.PutUint32(b.data[8:], b.count)
}

// Repr returns the batch's encoding. It aliases the batch's buffer.
func (b *Batch) Repr() []byte {
	b.init()
	binary.LittleEndian.PutUint32(b.data[8:], b.count)
	return b.data
}

// SetRepr replaces the batch's contents with a copy of an encoding produced
// by Repr (or read from a WAL), validating it.
func (b *Batch) SetRepr(data []byte) error {
	nb, err := decodeBatch(append([]byte(nil), data...))
	if err != nil {
		return err
	}
	*b = *nb
	return nil
}

// decodeBatch validates data (which it keeps) and returns the batch it
// encodes.
func decodeBatch(data []byte) (*Batch, error) {
	if len(data) < batchHeaderLen {
		return nil, fmt.Errorf("batch of %d bytes is shorter than its header", len(data))
	}
	b := &Batch{data: data}
	want := binary.LittleEndian.Uint32(data[8:])
	r := b.Reader()
	for {
		kind, key, value, ok := r.Next()
		if !ok {
			break
		}
		if kind != base.KindLogData {
			b.count++
			b.memBytes += uint64(len(key)+len(value)) + 64
		}
		if kind == base.KindRangeDelete {
			b.hasRangeDel = true
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	if b.count != want {
		return nil, fmt.Errorf("batch header says %d records, found %d", want, b.count)
	}
	return b, nil
}

// BatchReader walks the records of a batch in order.
type BatchReader struct {
	data []byte
	off  int
	err  error
}

// Reader returns a reader positioned before the batch's first record.
func (b *Batch) Reader() *BatchReader {
	b.init()
	return &BatchReader{data: b.data, off: batchHeaderLen}
}

// Next returns the next record. value is nil for Delete and LogData (whose
// blob is returned as key). ok is false at the end or on a malformed batch
// (see Err).
func (r *BatchReader) Next() (kind Kind, key, value []byte, ok bool) {
	if r.off >= len(r.data) || r.err != nil {
		return 0, nil, nil, false
	}
	kind = base.Kind(r.data[r.off])
	r.off++
	readStr := func() ([]byte, bool) {
		n, w := binary.Uvarint(r.data[r.off:])
		if w <= 0 || n > uint64(len(r.data)-r.off-w) {
			r.err = fmt.Errorf("batch record at offset %d: bad length", r.off)
			return nil, false
		}
		s := r.data[r.off+w : r.off+w+int(n) : r.off+w+int(n)]
		r.off += w + int(n)
		return s, true
	}
	switch kind {
	case base.KindSet, base.KindMerge, base.KindRangeDelete:
		if key, ok = readStr(); !ok {
			return 0, nil, nil, false
		}
		if value, ok = readStr(); !ok {
			return 0, nil, nil, false
		}
	case base.KindDelete, base.KindLogData:
		if key, ok = readStr(); !ok {
			return 0, nil, nil, false
		}
	default:
		r.err = fmt.Errorf("batch record at offset %d: unknown kind %d", r.off-1, kind)
		return 0, nil, nil, false
	}
	return kind, key, value, true
}

// Err returns the decoding error that stopped Next, if any.
func (r *BatchReader) Err() error { return r.err }
