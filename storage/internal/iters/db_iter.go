package iters

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/shale-db/shale/storage/internal/base"
)

// Covering reports the range tombstones visible at a snapshot.
type Covering interface {
	// MaxCoveringSeq returns the largest sequence number <= snapshot of a
	// range tombstone covering key, or 0 when none covers it.
	MaxCoveringSeq(key []byte, snapshot base.SeqNum) base.SeqNum
}

// DBIterOptions configures a DBIter.
type DBIterOptions struct {
	// SeqNum is the snapshot: entries with a larger sequence number are
	// invisible (entries with sequence number 0 are therefore always
	// visible). The zero value sees only such entries; use base.MaxSeqNum
	// to see every entry.
	SeqNum base.SeqNum
	// Lower and Upper bound the user keys yielded to [Lower, Upper); nil
	// means unbounded. The slices are retained, not copied.
	Lower, Upper []byte
	// Merger resolves Merge entries. When nil, meeting a visible Merge entry
	// fails the iterator with an error matching ErrNoMerger.
	Merger base.Merger
	// RangeDels, when not nil, reports the range tombstones visible at the
	// snapshot: a point entry with sequence number s is hidden when
	// MaxCoveringSeq(key, SeqNum) > s.
	RangeDels Covering
}

// ErrNoMerger is matched (errors.Is) by the error a DBIter reports when it
// meets a visible Merge entry but was configured without a Merger.
var ErrNoMerger = errors.New("merge entry found but no merger is configured")

// DBIterStats counts the calls a DBIter made on its internal iterator.
type DBIterStats struct {
	// Nexts and Prevs count internal Next and Prev calls.
	Nexts, Prevs int64
	// Seeks counts internal SeekGE, SeekLT, First and Last calls.
	Seeks int64
	// Merges counts FullMerge calls.
	Merges int64
}

type direction int8

const (
	dirForward direction = iota
	dirReverse
)

type position int8

const (
	posUnpositioned position = iota
	posValid
	posExhaustedEnd   // ran off the end (or the upper bound)
	posExhaustedStart // ran off the start (or the lower bound)
)

// DBIter is the user-visible iterator. Over an internal iterator it yields,
// for each user key in [Lower, Upper), the newest entry with sequence number
// <= SeqNum, resolved as follows: a Set yields its value; a Delete, or an
// entry hidden by a range tombstone, hides the key; a Merge is combined with
// the older visible Merge operands of the key (newest to oldest) up to a
// base value (a Set), or without one (a Delete, a hidden entry, or no older
// version), by Merger.FullMerge with the operands oldest first. Range
// deletion entries met in the internal stream are ignored.
//
// Guarantees:
//   - Reverse iteration yields exactly the reverse of forward iteration, and
//     Next/Prev may be mixed freely; a direction switch steps the internal
//     iterator instead of seeking it, unless the internal iterator is
//     exhausted.
//   - Key and Value are valid until the next positioning call (they may
//     point into the internal iterator's memory or into reused buffers).
//   - Next after the iterator ran off the start (Prev, SeekLT or Last
//     returned false) behaves as First; Prev after it ran off the end
//     behaves as Last. Next at the end, Prev at the start, and Next or Prev
//     before any positioning call return false.
//   - Errors (from the internal iterator, the Merger, a missing Merger or an
//     unknown entry kind) are sticky: every later positioning call returns
//     false and Error reports the first one.
//   - Stepping does not allocate in the steady state, except for what the
//     Merger allocates.
//
// A DBIter is not safe for concurrent use.
type DBIter struct {
	iter      base.InternalIterator
	opts      DBIterOptions
	iterValid bool // result of the last internal positioning call
	dir       direction
	pos       position
	// posAfter is set in the forward direction when the internal iterator
	// is already past every entry of the current key (after a merge).
	posAfter bool

	key, value []byte
	keyBuf     []byte // copy of the current (or scanned) user key
	valBuf     []byte // copy of a value (reverse direction, merge base)
	opBuf      []byte // merge operands, concatenated
	opEnds     []int  // end offsets of the operands in opBuf
	ops        [][]byte

	err    error
	stats  DBIterStats
	closed bool
}

// NewDBIter returns an unpositioned iterator over internal. The DBIter owns
// internal: Close closes it.
func NewDBIter(internal base.InternalIterator, opts DBIterOptions) *DBIter {
	d := &DBIter{iter: internal, opts: opts}
	if internal == nil {
		d.err = errors.New("iters: DBIter over a nil internal iterator")
	}
	return d
}

// Stats returns the counts of calls made on the internal iterator so far.
func (d *DBIter) Stats() DBIterStats { return d.stats }

// Valid reports whether the iterator is positioned at an entry.
func (d *DBIter) Valid() bool { return d.pos == posValid }

// Key returns the current user key, or nil when not positioned. It is valid
// until the next positioning call.
func (d *DBIter) Key() []byte {
	if d.pos != posValid {
		return nil
	}
	return d.key
}

// Value returns the current value, or nil when not positioned. It is valid
// until the next positioning call.
func (d *DBIter) Value() []byte {
	if d.pos != posValid {
		return nil
	}
	return d.value
}

// Error returns the first error the iterator met, if any.
func (d *DBIter) Error() error { return d.err }

// Close closes the internal iterator and returns the iterator's first error,
// or else the internal iterator's Close error. Closing twice is a no-op
// returning the same error.
func (d *DBIter) Close() error {
	if !d.closed {
		d.closed = true
		d.pos = posUnpositioned
		if d.iter != nil {
			if err := d.iter.Close(); err != nil && d.err == nil {
				d.err = err
			}
		}
	}
	return d.err
}

// usable resets the position and reports whether the iterator may move.
func (d *DBIter) usable() bool {
	if d.err != nil || d.closed {
		d.pos = posUnpositioned
		return false
	}
	return true
}

func (d *DBIter) checkIter() {
	if !d.iterValid {
		if err := d.iter.Error(); err != nil && d.err == nil {
			d.err = err
		}
	}
}

func (d *DBIter) next() {
	d.stats.Nexts++
	d.iterValid = d.iter.Next()
	d.checkIter()
}

func (d *DBIter) prev() {
	d.stats.Prevs++
	d.iterValid = d.iter.Prev()
	d.checkIter()
}

func (d *DBIter) seekGE(key []byte) {
	d.stats.Seeks++
	d.iterValid = d.iter.SeekGE(key)
	d.checkIter()
}

func (d *DBIter) seekLT(key []byte) {
	d.stats.Seeks++
	d.iterValid = d.iter.SeekLT(key)
	d.checkIter()
}

func (d *DBIter) coverSeq(key []byte) base.SeqNum {
	if d.opts.RangeDels == nil {
		return 0
	}
	return d.opts.RangeDels.MaxCoveringSeq(key, d.opts.SeqNum)
}

func (d *DBIter) kindError(k base.InternalKey) {
	if d.err == nil {
		d.err = fmt.Errorf("iters: unexpected entry %s: %w", k, base.ErrCorruption)
	}
}

// SeekGE positions at the first visible key >= key (and >= Lower).
func (d *DBIter) SeekGE(key []byte) bool {
	if !d.usable() {
		return false
	}
	if d.opts.Lower != nil && bytes.Compare(key, d.opts.Lower) < 0 {
		key = d.opts.Lower
	}
	d.dir = dirForward
	if d.opts.Upper != nil && bytes.Compare(key, d.opts.Upper) >= 0 {
		d.iterValid = false
		d.pos = posExhaustedEnd
		return false
	}
	d.seekGE(key)
	return d.findNextEntry()
}

// SeekLT positions at the last visible key < key (and < Upper).
func (d *DBIter) SeekLT(key []byte) bool {
	if !d.usable() {
		return false
	}
	if d.opts.Upper != nil && bytes.Compare(key, d.opts.Upper) > 0 {
		key = d.opts.Upper
	}
	d.dir = dirReverse
	if d.opts.Lower != nil && bytes.Compare(key, d.opts.Lower) <= 0 {
		d.iterValid = false
		d.pos = posExhaustedStart
		return false
	}
	d.seekLT(key)
	return d.findPrevEntry()
}

// First positions at the first visible key (SeekGE(Lower) when Lower is
// set).
func (d *DBIter) First() bool {
	if d.opts.Lower != nil {
		return d.SeekGE(d.opts.Lower)
	}
	if !d.usable() {
		return false
	}
	d.dir = dirForward
	d.stats.Seeks++
	d.iterValid = d.iter.First()
	d.checkIter()
	return d.findNextEntry()
}

// Last positions at the last visible key (SeekLT(Upper) when Upper is set).
func (d *DBIter) Last() bool {
	if d.opts.Upper != nil {
		return d.SeekLT(d.opts.Upper)
	}
	if !d.usable() {
		return false
	}
	d.dir = dirReverse
	d.stats.Seeks++
	d.iterValid = d.iter.Last()
	d.checkIter()
	return d.findPrevEntry()
}

// Next moves to the following visible key.
func (d *DBIter) Next() bool {
	if d.err != nil || d.closed {
		d.pos = posUnpositioned
		return false
	}
	switch d.pos {
	case posExhaustedStart:
		return d.First()
	case posValid:
	default:
		return false
	}
	if d.dir == dirReverse {
		// The internal iterator is at the last entry before the current key
		// (or ran off the start): step over the current key's entries.
		if d.iterValid {
			d.next()
		} else if d.err == nil {
			d.seekGE(d.keyBuf)
		}
		for d.iterValid && bytes.Compare(d.iter.Key().UserKey, d.keyBuf) <= 0 {
			d.next()
		}
		d.dir = dirForward
		return d.findNextEntry()
	}
	if !d.posAfter {
		d.skipUserKey(d.key)
	}
	return d.findNextEntry()
}

// Prev moves to the preceding visible key.
func (d *DBIter) Prev() bool {
	if d.err != nil || d.closed {
		d.pos = posUnpositioned
		return false
	}
	switch d.pos {
	case posExhaustedEnd:
		return d.Last()
	case posValid:
	default:
		return false
	}
	if d.dir == dirForward {
		// The internal iterator is at the current key's entry or past all
		// of its entries: step back before the first of them.
		if !d.posAfter {
			d.keyBuf = append(d.keyBuf[:0], d.key...)
		}
		if d.iterValid {
			d.prev()
		} else if d.err == nil {
			d.seekLT(d.keyBuf)
		}
		for d.iterValid && bytes.Compare(d.iter.Key().UserKey, d.keyBuf) >= 0 {
			d.prev()
		}
		d.dir = dirReverse
	}
	return d.findPrevEntry()
}

// skipUserKey steps the internal iterator past the remaining entries of
// ukey, which may point into the internal iterator's memory.
func (d *DBIter) skipUserKey(ukey []byte) {
	d.keyBuf = append(d.keyBuf[:0], ukey...)
	d.skipKeyBuf()
}

// skipKeyBuf steps the internal iterator past the entries of keyBuf.
func (d *DBIter) skipKeyBuf() {
	for {
		d.next()
		if !d.iterValid || !bytes.Equal(d.iter.Key().UserKey, d.keyBuf) {
			return
		}
	}
}

// finish sets the position after a forward or reverse scan that found no
// entry.
func (d *DBIter) finish(exhausted position) bool {
	if d.err != nil {
		d.pos = posUnpositioned
	} else {
		d.pos = exhausted
	}
	d.key, d.value = nil, nil
	return false
}

// findNextEntry scans forward from the internal iterator's position to the
// first visible key.
func (d *DBIter) findNextEntry() bool {
	d.dir = dirForward
	d.posAfter = false
	for d.iterValid {
		ik := d.iter.Key()
		if d.opts.Upper != nil && bytes.Compare(ik.UserKey, d.opts.Upper) >= 0 {
			break
		}
		seq, kind := ik.SeqNum(), ik.Kind()
		if seq > d.opts.SeqNum || kind == base.KindRangeDelete {
			d.next()
			continue
		}
		switch kind {
		case base.KindDelete:
			d.skipUserKey(ik.UserKey)
		case base.KindSet:
			if d.coverSeq(ik.UserKey) > seq {
				d.skipUserKey(ik.UserKey)
				continue
			}
			d.key, d.value = ik.UserKey, d.iter.Value()
			d.pos = posValid
			return true
		case base.KindMerge:
			cover := d.coverSeq(ik.UserKey)
			if cover > seq {
				d.skipUserKey(ik.UserKey)
				continue
			}
			if !d.mergeForward(ik, cover) {
				return d.finish(posExhaustedEnd)
			}
			d.pos = posValid
			return true
		default:
			d.kindError(ik)
			return d.finish(posExhaustedEnd)
		}
	}
	return d.finish(posExhaustedEnd)
}

func (d *DBIter) resetOps() {
	d.opBuf = d.opBuf[:0]
	d.opEnds = d.opEnds[:0]
}

func (d *DBIter) addOp(v []byte) {
	d.opBuf = append(d.opBuf, v...)
	d.opEnds = append(d.opEnds, len(d.opBuf))
}

// operands returns the collected operands oldest first; newestFirst says
// in which order they were collected.
func (d *DBIter) operands(newestFirst bool) [][]byte {
	d.ops = d.ops[:0]
	n := len(d.opEnds)
	for i := 0; i < n; i++ {
		j := i
		if newestFirst {
			j = n - 1 - i
		}
		start := 0
		if j > 0 {
			start = d.opEnds[j-1]
		}
		d.ops = append(d.ops, d.opBuf[start:d.opEnds[j]:d.opEnds[j]])
	}
	return d.ops
}

// mergeForward resolves the merge whose newest visible operand is at the
// internal iterator's position (key ik, range-tombstone cover seq cover),
// leaving the internal iterator past every entry of the key.
func (d *DBIter) mergeForward(ik base.InternalKey, cover base.SeqNum) bool {
	if d.opts.Merger == nil {
		d.err = fmt.Errorf("iters: key %s: %w", base.FormatKey(ik.UserKey), ErrNoMerger)
		return false
	}
	d.keyBuf = append(d.keyBuf[:0], ik.UserKey...)
	d.resetOps()
	d.addOp(d.iter.Value())
	hasBase := false
	stopped := false // stopped before the end of the key's versions
	for !stopped {
		d.next()
		if !d.iterValid {
			break
		}
		k := d.iter.Key()
		if !bytes.Equal(k.UserKey, d.keyBuf) {
			break
		}
		seq, kind := k.SeqNum(), k.Kind()
		if seq > d.opts.SeqNum || kind == base.KindRangeDelete {
			continue
		}
		if cover > seq {
			stopped = true
			break
		}
		switch kind {
		case base.KindSet:
			d.valBuf = append(d.valBuf[:0], d.iter.Value()...)
			hasBase = true
			stopped = true
		case base.KindDelete:
			stopped = true
		case base.KindMerge:
			d.addOp(d.iter.Value())
		default:
			d.kindError(k)
			return false
		}
	}
	if stopped {
		d.skipKeyBuf()
	}
	if d.err != nil {
		return false
	}
	d.posAfter = true
	return d.fullMerge(hasBase, true)
}

func (d *DBIter) fullMerge(hasBase bool, newestFirst bool) bool {
	var existing []byte
	if hasBase {
		existing = d.valBuf
	}
	d.stats.Merges++
	v, err := d.opts.Merger.FullMerge(d.keyBuf, existing, hasBase, d.operands(newestFirst))
	if err != nil {
		d.err = fmt.Errorf("iters: merging key %s: %w", base.FormatKey(d.keyBuf), err)
		return false
	}
	d.key, d.value = d.keyBuf, v
	return true
}

// findPrevEntry scans backward from the internal iterator's position to the
// last visible key, leaving the internal iterator at the last entry before
// that key's entries.
func (d *DBIter) findPrevEntry() bool {
	const (
		stNone = iota
		stDeleted
		stValue
		stMerge
	)
	d.dir = dirReverse
	d.posAfter = false
	state := stNone
	haveKey, coverKnown, hasBase := false, false, false
	var cover base.SeqNum
	for d.iterValid {
		ik := d.iter.Key()
		if haveKey && !bytes.Equal(ik.UserKey, d.keyBuf) {
			if state == stValue || state == stMerge {
				break
			}
			haveKey = false
		}
		if !haveKey {
			if d.opts.Lower != nil && bytes.Compare(ik.UserKey, d.opts.Lower) < 0 {
				break
			}
			d.keyBuf = append(d.keyBuf[:0], ik.UserKey...)
			haveKey, coverKnown, state = true, false, stNone
		}
		seq, kind := ik.SeqNum(), ik.Kind()
		if seq > d.opts.SeqNum || kind == base.KindRangeDelete {
			d.prev()
			continue
		}
		if kind != base.KindDelete && !coverKnown {
			cover, coverKnown = d.coverSeq(d.keyBuf), true
		}
		switch kind {
		case base.KindDelete:
			state = stDeleted
		case base.KindSet:
			if cover > seq {
				state = stDeleted
			} else {
				d.valBuf = append(d.valBuf[:0], d.iter.Value()...)
				state = stValue
			}
		case base.KindMerge:
			if cover > seq {
				state = stDeleted
				break
			}
			switch state {
			case stNone, stDeleted:
				hasBase = false
				d.resetOps()
			case stValue:
				hasBase = true
				d.resetOps()
			}
			d.addOp(d.iter.Value())
			state = stMerge
		default:
			d.kindError(ik)
			return d.finish(posExhaustedStart)
		}
		d.prev()
	}
	if d.err != nil {
		return d.finish(posExhaustedStart)
	}
	switch state {
	case stValue:
		d.key, d.value = d.keyBuf, d.valBuf
	case stMerge:
		if d.opts.Merger == nil {
			d.err = fmt.Errorf("iters: key %s: %w", base.FormatKey(d.keyBuf), ErrNoMerger)
			return d.finish(posExhaustedStart)
		}
		if !d.fullMerge(hasBase, false) {
			return d.finish(posExhaustedStart)
		}
	default:
		return d.finish(posExhaustedStart)
	}
	d.pos = posValid
	return true
}
