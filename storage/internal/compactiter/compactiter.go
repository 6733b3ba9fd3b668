// Package compactiter implements the compaction iterator: the filter that
// sits between the merged input of a memtable flush or a compaction and the
// writer of the output tables.
//
// It consumes the point entries (Set, Delete, Merge) of all inputs in
// internal order and yields the entries the output must contain so that
// every open snapshot, and the implicit latest view, reads exactly what it
// read before. Everything else is dropped: versions shadowed inside a
// snapshot stripe, entries covered by a range tombstone of the same stripe,
// deletions with nothing left to hide. Merge operands are folded with the
// merge operator, the compaction filter is consulted for values no snapshot
// can see, and at the bottommost level sequence numbers no snapshot needs are
// zeroed (the sequence-number garbage collection of the RocksDB
// space-amplification paper).
//
// # Snapshot stripes
//
// A snapshot S sees the entries with seq <= S. The open snapshots
// S1 < S2 < ... < Sk cut the sequence space into k+1 stripes:
//
//	stripe 0: seq <= S1, stripe i: S(i) < seq <= S(i+1), stripe k: seq > Sk
//
// Two entries are in the same stripe exactly when no snapshot can see one
// without the other, so within a stripe only the newest version of a key is
// ever read. Stripe 0 is the earliest stripe (visible to every snapshot);
// stripe k is the newest one (visible to no open snapshot, only to the
// latest view). Without snapshots there is a single stripe, both earliest
// and newest.
//
// # Range tombstones
//
// Range tombstones are not yielded; the caller writes them to the output
// separately. A point entry is dropped when a tombstone of its own stripe
// with a larger sequence number covers it. See [TombstoneNeeded] for which
// tombstones the caller must keep.
package compactiter

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/shale-db/shale/storage/internal/base"
)

// Covering answers range-tombstone coverage queries over the tombstones of
// the compaction inputs. Implementations must be deterministic for the life
// of an Iter.
type Covering interface {
	// MaxCoveringSeq returns the largest seq <= snapshot of a tombstone
	// covering key, or 0 when none does.
	MaxCoveringSeq(key []byte, snapshot base.SeqNum) base.SeqNum
}

// Options configure an Iter. The zero value is valid: no snapshots, not
// bottommost, no merge operator, no filter, no range tombstones.
type Options struct {
	// Snapshots are the open snapshots. They are copied, sorted and
	// deduplicated by New, so order does not matter. Every snapshot and the
	// implicit latest view read exactly the same data after compaction as
	// before (see [Iter] for the one exception, the compaction filter).
	Snapshots []base.SeqNum
	// Bottommost promises that no data for the compacted keys exists below
	// the output. It allows dropping Deletes of the earliest stripe (with
	// everything older), resolving merge runs that reach the end of their
	// key into Sets, and zeroing sequence numbers: a yielded Set or Merge
	// gets seq 0 when it is the only entry yielded for its key and its seq
	// is <= Snapshots[0] (any seq without snapshots). The caller must then
	// drop the range tombstones [TombstoneNeeded] rejects.
	Bottommost bool
	// Merger folds the Merge operands of one key and stripe (newest merge's
	// seq kept): FullMerge onto a Set of the stripe, or onto nothing when a
	// Delete, a covering tombstone or (without lower data) the end of the
	// key ends the run; otherwise PartialMerge, or the operands unchanged
	// when it refuses. When nil, Merge entries pass through unmerged,
	// together with the base entry they apply to.
	Merger base.Merger
	// Filter, when non-nil, is consulted for the Set values (including
	// fully merged results, but not the base of unmerged operands) of the
	// newest stripe (seq above every snapshot), the only values no open
	// snapshot can see. FilterChangeValue replaces the value.
	// FilterRemove turns the value into a deletion of the key at the same
	// seq: dropped outright when nothing older needs hiding (no snapshots
	// and no lower data), otherwise yielded as a Delete, so neither a lower
	// level nor an older version kept for a snapshot reappears in the
	// latest view.
	Filter base.CompactionFilter
	// OutputLevel is passed to Filter.
	OutputLevel int
	// RangeDels answers coverage queries over the range tombstones of the
	// inputs. Nil means there are none.
	RangeDels Covering
	// Horizon, when positive, is a history horizon H: the output keeps
	// every version visible at some sequence number >= H-1, as if a
	// snapshot were open at each of them (range tombstones likewise; see
	// [TombstoneNeeded] for the caller's side, which passes H-1 as one more
	// snapshot). Every read at a sequence number >= H-1 then reads after
	// compaction what it read before, except for the Filter's verdicts:
	// with a horizon the Filter is consulted for the newest version of a
	// key when its seq is above every open snapshot, and reads at or above
	// that version's seq see the filtered result (as the latest view does
	// without a horizon). Zero means no horizon.
	Horizon base.SeqNum
	// ElideTombstone, when non-nil, reports that no level below the output
	// holds data for userKey; for such keys Deletes and merge runs are
	// treated as with Bottommost, but sequence numbers are zeroed only when
	// Bottommost is set. Returning true wrongly resurrects lower data. When
	// nil, only Bottommost says so. It is called at most once per user key,
	// and only when the answer matters.
	ElideTombstone func(userKey []byte) bool
}

// Stats counts what the iterator did. Between calls, every input entry
// consumed so far is accounted for exactly once:
//
//	EntriesIn == EntriesOut + DroppedShadowed + DroppedByTombstone +
//	             DroppedByFilter + ElidedDeletes + Merged
type Stats struct {
	// EntriesIn is the number of input entries consumed.
	EntriesIn int64
	// EntriesOut is the number of entries yielded.
	EntriesOut int64
	// DroppedShadowed counts entries hidden by a newer entry of the same
	// key in the same stripe.
	DroppedShadowed int64
	// DroppedByTombstone counts entries covered by a range tombstone of
	// their stripe.
	DroppedByTombstone int64
	// DroppedByFilter counts values the filter removed that were dropped
	// outright (a removal that had to become a Delete counts as output).
	DroppedByFilter int64
	// ElidedDeletes counts Delete entries dropped because nothing older
	// needed hiding.
	ElidedDeletes int64
	// Merged counts input entries folded into another output entry by the
	// merge operator: a merge of n inputs into one entry adds n-1.
	Merged int64
	// FilterRemoved counts FilterRemove decisions (dropped or turned into
	// a Delete).
	FilterRemoved int64
	// FilterChanged counts FilterChangeValue decisions.
	FilterChanged int64
	// SeqZeroed counts output entries whose sequence number was set to 0.
	SeqZeroed int64
}

// TombstoneNeeded reports whether a range tombstone with sequence number seq
// taken from the inputs must be written to the output for every snapshot
// (and the latest view) to keep reading what it read, given that the point
// entries were filtered by an Iter with the same snapshots and bottommost
// setting.
//
// Derivation. A tombstone at t is needed to hide (a) data below the output
// and (b) surviving output entries older than t. Below a non-bottommost
// output there may be data, so it is always needed there. At the bottommost
// level only (b) remains. Output entries covered by the tombstone in t's own
// stripe are dropped by the Iter, so the surviving covered ones lie in older
// stripes, which exist only when some snapshot S < t is open. Hence at the
// bottommost level the tombstone is needed exactly when Snapshots[0] < seq:
// one in the earliest stripe (seq <= Snapshots[0], or no snapshots) is
// droppable.
//
// Dropping these tombstones is also what keeps sequence-number zeroing
// safe: an entry zeroed by the Iter had seq s <= Snapshots[0], and after
// zeroing it would wrongly look covered by any tombstone t < s; every such
// tombstone lies in the earliest stripe, which this function rejects at the
// bottommost level. Callers must therefore not write tombstones this
// function rejects when the Iter ran with Bottommost.
//
// snapshots need not be sorted. An Iter run with a horizon H (Options.Horizon)
// is matched by passing H-1 as one more snapshot: the horizon's implicit
// snapshots at H-1 and above need a tombstone exactly when H-1 < seq.
func TombstoneNeeded(seq base.SeqNum, snapshots []base.SeqNum, bottommost bool) bool {
	if !bottommost {
		return true
	}
	for _, s := range snapshots {
		if s < seq {
			return true
		}
	}
	return false
}

// outEntry is one yielded entry; its slices point into Iter.arena.
type outEntry struct {
	key   base.InternalKey
	value []byte
}

// dropReason says why the rest of a stripe is skipped.
type dropReason uint8

const (
	dropShadowed dropReason = iota
	dropTombstone
)

// Iter is the compaction iterator. It yields, in strictly increasing
// internal order and never twice with the same user key and sequence number,
// the point entries the output must hold. Every open snapshot reads the same
// values from (output + needed range tombstones + unchanged lower levels) as
// from (inputs + their range tombstones + lower levels); the latest view
// does too except for keys whose newest-stripe value the Filter removed or
// changed, where it reads the filtered result.
//
// An Iter is forward-only and not safe for concurrent use. It never panics
// on malformed input: out-of-order input, duplicate (user key, seq) pairs or
// non-point kinds end the iteration with an error matching
// base.ErrCorruption.
type Iter struct {
	in    base.InternalIterator
	opts  Options
	snaps []base.SeqNum // sorted, deduplicated; with a horizon H, ends with H-1
	// maxSnap is the largest open snapshot (0 when none), kept apart from
	// snaps because a horizon subsumes the snapshots at or above H-1.
	maxSnap base.SeqNum

	started   bool
	inValid   bool // input is positioned on an entry not yet consumed
	inChecked bool // that entry passed check
	err       error

	// Per user key state.
	curKey      []byte // owned copy of the current input user key
	haveKey     bool
	prevSeq     base.SeqNum // seq of the last consumed entry of curKey
	noLower     int8        // -1 unknown, 0 false, 1 true
	firstSeq    base.SeqNum // seq of curKey's first (newest) input entry
	emitted     int         // entries yielded for curKey so far
	skipStripe  int         // stripe whose remaining entries are dropped, or -1
	skipReason  dropReason
	stripeCover base.SeqNum // covering tombstone seq of the stripe being merged

	// Output queue, refilled when drained. Its slices live in arena, which
	// is reset on refill (hence "valid until Next").
	out    []outEntry
	outPos int
	arena  []byte

	// Merge run scratch.
	opVals [][]byte
	opSeqs []base.SeqNum
	opBuf  []byte
	opsOld [][]byte // operands oldest first, for the Merger

	stats Stats
}

// New returns an Iter over input, a stream of point entries in internal
// order. The Iter owns input from now on: Close closes it. Call First to
// start.
func New(input base.InternalIterator, opts Options) *Iter {
	snaps := append([]base.SeqNum(nil), opts.Snapshots...)
	sort.Slice(snaps, func(i, j int) bool { return snaps[i] < snaps[j] })
	n := 0
	for i, s := range snaps {
		if i == 0 || s != snaps[n-1] {
			snaps[n] = s
			n++
		}
	}
	snaps = snaps[:n]
	var maxSnap base.SeqNum
	if n > 0 {
		maxSnap = snaps[n-1]
	}
	if h := opts.Horizon; h > 0 {
		// The horizon stripes (one per seq >= H) subsume the snapshots at
		// or above H-1; H-1 itself ends the explicit stripes.
		i := sort.Search(len(snaps), func(i int) bool { return snaps[i] >= h-1 })
		snaps = append(snaps[:i], h-1)
	}
	opts.Snapshots = snaps
	return &Iter{in: input, opts: opts, snaps: snaps, maxSnap: maxSnap, skipStripe: -1}
}

// First positions the Iter on the first output entry, restarting from the
// beginning of the input (and resetting Stats) if it had already started.
// It returns false when there is no output entry; Error then tells an
// empty output from a failure.
func (it *Iter) First() bool {
	it.started = true
	it.err = nil
	it.stats = Stats{}
	it.haveKey = false
	it.curKey = it.curKey[:0]
	it.skipStripe = -1
	it.out = it.out[:0]
	it.outPos = 0
	if it.in == nil {
		return false
	}
	it.inChecked = false
	it.inValid = it.in.First()
	return it.fill()
}

// Next advances to the next output entry and reports whether there is one.
// Next before First behaves like First. After an error or exhaustion it keeps
// returning false.
func (it *Iter) Next() bool {
	if !it.started {
		return it.First()
	}
	if it.err != nil || it.in == nil {
		return false
	}
	if it.outPos < len(it.out) {
		it.outPos++
	}
	if it.outPos < len(it.out) {
		return true
	}
	return it.fill()
}

// Valid reports whether the Iter is positioned on an output entry.
func (it *Iter) Valid() bool {
	return it.err == nil && it.outPos < len(it.out)
}

// Key returns the current output key, or the zero InternalKey when not
// positioned. It is valid until the next call to Next or First.
func (it *Iter) Key() base.InternalKey {
	if !it.Valid() {
		return base.InternalKey{}
	}
	return it.out[it.outPos].key
}

// Value returns the current output value (nil for Deletes), or nil when not
// positioned. It is valid until the next call to Next or First.
func (it *Iter) Value() []byte {
	if !it.Valid() {
		return nil
	}
	return it.out[it.outPos].value
}

// Error returns the error that ended the iteration, if any: an input error,
// a merge operator error, or a corruption of the input order.
func (it *Iter) Error() error {
	if it.err != nil {
		return it.err
	}
	if it.in != nil && it.started && !it.inValid {
		return it.in.Error()
	}
	return nil
}

// Close closes the input and returns the first error met (the iteration's
// or the input's). The Iter must not be used afterwards.
func (it *Iter) Close() error {
	err := it.err
	if it.in != nil {
		if cerr := it.in.Close(); err == nil {
			err = cerr
		}
		it.in = nil
	}
	it.out = nil
	it.outPos = 0
	it.inValid = false
	return err
}

// Stats returns the counters accumulated since First.
func (it *Iter) Stats() Stats { return it.stats }

// ---- internals ----

func corrupt(format string, args ...any) error {
	return base.Corruptf("compaction input", -1, format, args...)
}

// stripeOf returns the stripe of seq: the number of snapshots below it.
// With a horizon H, every seq >= H is a stripe of its own (numbered on from
// the stripe of H-1).
func (it *Iter) stripeOf(seq base.SeqNum) int {
	if h := it.opts.Horizon; h > 0 && seq >= h {
		return len(it.snaps) + int(seq-h)
	}
	return sort.Search(len(it.snaps), func(i int) bool { return it.snaps[i] >= seq })
}

// stripeTop returns the largest seq of stripe i.
func (it *Iter) stripeTop(i int) base.SeqNum {
	if i < len(it.snaps) {
		return it.snaps[i]
	}
	if h := it.opts.Horizon; h > 0 {
		return h + base.SeqNum(i-len(it.snaps))
	}
	return base.MaxSeqNum
}

// filterable reports whether the Filter may judge a value of curKey at seq
// in stripe: without a horizon, a value of the newest stripe (no open
// snapshot sees it); with one, the key's newest version when it is above
// every open snapshot.
func (it *Iter) filterable(seq base.SeqNum, stripe int) bool {
	if it.opts.Horizon > 0 {
		return seq == it.firstSeq && seq > it.maxSnap
	}
	return stripe == len(it.snaps)
}

// keyHasNoLowerData reports whether nothing below the output holds curKey.
func (it *Iter) keyHasNoLowerData() bool {
	if it.opts.Bottommost {
		return true
	}
	if it.noLower < 0 {
		it.noLower = 0
		if it.opts.ElideTombstone != nil && it.opts.ElideTombstone(it.curKey) {
			it.noLower = 1
		}
	}
	return it.noLower == 1
}

// deleteElidable reports whether a deletion of curKey in stripe can be
// dropped together with everything older: only when nothing older is needed
// by anyone (earliest stripe) and nothing lower exists to hide.
func (it *Iter) deleteElidable(stripe int) bool {
	return stripe == 0 && it.keyHasNoLowerData()
}

// advance moves the input past the current entry.
func (it *Iter) advance() {
	it.stats.EntriesIn++
	it.inChecked = false
	it.inValid = it.in.Next()
}

// check validates the input entry k (the current input entry) against the
// previous one and switches the per-key state when k starts a new user key.
// It returns false (with it.err set) on corruption. Checking the same entry
// twice is a no-op.
func (it *Iter) check(k base.InternalKey) bool {
	if it.inChecked {
		return true
	}
	it.inChecked = true
	switch k.Kind() {
	case base.KindSet, base.KindDelete, base.KindMerge:
	default:
		it.err = corrupt("unexpected kind %s in point stream at %s", k.Kind(), k)
		return false
	}
	if it.haveKey {
		c := bytes.Compare(it.curKey, k.UserKey)
		if c > 0 {
			it.err = corrupt("keys out of order: %s after %s", k, base.FormatKey(it.curKey))
			return false
		}
		if c == 0 {
			if k.SeqNum() >= it.prevSeq {
				it.err = corrupt("versions out of order or duplicated: %s after seq %d", k, it.prevSeq)
				return false
			}
			it.prevSeq = k.SeqNum()
			return true
		}
	}
	it.curKey = append(it.curKey[:0], k.UserKey...)
	it.haveKey = true
	it.prevSeq = k.SeqNum()
	it.firstSeq = k.SeqNum()
	it.noLower = -1
	it.emitted = 0
	it.skipStripe = -1
	return true
}

// sameKey reports whether the input entry k belongs to curKey.
func (it *Iter) sameKey(k base.InternalKey) bool {
	return it.haveKey && bytes.Equal(it.curKey, k.UserKey)
}

// emit appends an output entry, copying key and value into the arena. last
// says that no further entry of curKey will be emitted after this one.
func (it *Iter) emit(seq base.SeqNum, kind base.Kind, value []byte, stripe int, last bool) {
	if last && it.opts.Bottommost && stripe == 0 && it.emitted == 0 && seq != 0 &&
		(kind == base.KindSet || kind == base.KindMerge) {
		// The only version of the key, visible to every snapshot, with
		// nothing below it: its sequence number carries no information.
		// Being the last entry of the key, seq 0 keeps the order intact.
		seq = 0
		it.stats.SeqZeroed++
	}
	start := len(it.arena)
	it.arena = append(it.arena, it.curKey...)
	kEnd := len(it.arena)
	it.arena = append(it.arena, value...)
	vEnd := len(it.arena)
	e := outEntry{key: base.MakeInternalKey(it.arena[start:kEnd:kEnd], seq, kind)}
	if kind != base.KindDelete {
		e.value = it.arena[kEnd:vEnd:vEnd]
	}
	it.out = append(it.out, e)
	it.emitted++
	it.stats.EntriesOut++
}

// emitValue yields a Set (an input Set or a fully merged result) in stripe,
// consulting the filter when the value is filterable.
func (it *Iter) emitValue(seq base.SeqNum, value []byte, stripe int) {
	if it.opts.Filter != nil && it.filterable(seq, stripe) {
		dec, nv := it.opts.Filter.Filter(it.opts.OutputLevel, it.curKey, value)
		switch dec {
		case base.FilterRemove:
			it.stats.FilterRemoved++
			// The value becomes a deletion of the key at seq.
			if it.deleteElidable(stripe) {
				it.stats.DroppedByFilter++
				return
			}
			it.emit(seq, base.KindDelete, nil, stripe, true)
			return
		case base.FilterChangeValue:
			it.stats.FilterChanged++
			value = nv
		}
	}
	it.emit(seq, base.KindSet, value, stripe, true)
}

// fill refills the output queue from the input. It returns whether the queue
// holds an entry.
func (it *Iter) fill() bool {
	it.out = it.out[:0]
	it.outPos = 0
	it.arena = it.arena[:0]
	for len(it.out) == 0 {
		if it.err != nil || !it.inValid {
			return false
		}
		k := it.in.Key()
		if !it.check(k) {
			return false
		}
		seq := k.SeqNum()
		stripe := it.stripeOf(seq)
		if stripe == it.skipStripe {
			if it.skipReason == dropTombstone {
				it.stats.DroppedByTombstone++
			} else {
				it.stats.DroppedShadowed++
			}
			it.advance()
			continue
		}
		// First entry of curKey in this stripe: the only one any reader of
		// the stripe can see, unless it is a Merge.
		var cover base.SeqNum
		if it.opts.RangeDels != nil {
			cover = it.opts.RangeDels.MaxCoveringSeq(it.curKey, it.stripeTop(stripe))
		}
		it.skipStripe = stripe
		if seq < cover {
			it.skipReason = dropTombstone
			it.stats.DroppedByTombstone++
			it.advance()
			continue
		}
		it.skipReason = dropShadowed
		switch k.Kind() {
		case base.KindSet:
			it.emitValue(seq, it.in.Value(), stripe)
			it.advance()
		case base.KindDelete:
			if it.deleteElidable(stripe) {
				it.stats.ElidedDeletes++
			} else {
				it.emit(seq, base.KindDelete, nil, stripe, true)
			}
			it.advance()
		case base.KindMerge:
			it.stripeCover = cover
			it.mergeRun(stripe)
		}
	}
	return true
}

// baseKind describes what ended a merge run.
type baseKind uint8

const (
	baseNone      baseKind = iota // stripe or key ended without a base
	baseSet                       // a Set of the same stripe
	baseDelete                    // a Delete of the same stripe
	baseTombstone                 // a range tombstone of the same stripe
)

// mergeRun collects the Merge operands of curKey in stripe starting at the
// current input entry, then resolves them against whatever ended the run.
func (it *Iter) mergeRun(stripe int) {
	it.opVals = it.opVals[:0]
	it.opSeqs = it.opSeqs[:0]
	it.opBuf = it.opBuf[:0]
	addOp := func(seq base.SeqNum, v []byte) {
		it.opSeqs = append(it.opSeqs, seq)
		start := len(it.opBuf)
		it.opBuf = append(it.opBuf, v...)
		// When opBuf reallocates, earlier operands stay valid in the old
		// array: it is only ever appended to during a run.
		it.opVals = append(it.opVals, it.opBuf[start:len(it.opBuf):len(it.opBuf)])
	}
	k := it.in.Key()
	addOp(k.SeqNum(), it.in.Value())
	it.advance()

	bk := baseNone
	var baseSeq base.SeqNum
	var baseVal []byte
	keyEnded := false
	for {
		if !it.inValid {
			if err := it.in.Error(); err != nil {
				it.err = err
				return
			}
			keyEnded = true
			break
		}
		k = it.in.Key()
		if !it.sameKey(k) {
			keyEnded = true
			break
		}
		if !it.check(k) {
			return
		}
		seq := k.SeqNum()
		if it.stripeOf(seq) != stripe {
			break
		}
		if seq < it.stripeCover {
			// Covered: the tombstone acts as the base, and the rest of the
			// stripe is dropped by fill.
			bk = baseTombstone
			it.skipReason = dropTombstone
			break
		}
		if k.Kind() == base.KindMerge {
			addOp(seq, it.in.Value())
			it.advance()
			continue
		}
		baseSeq = seq
		if k.Kind() == base.KindSet {
			bk = baseSet
			baseVal = append([]byte(nil), it.in.Value()...)
		} else {
			bk = baseDelete
		}
		it.advance()
		break
	}

	n := len(it.opSeqs)
	m := it.opts.Merger
	if m == nil {
		it.passThrough(stripe, bk, baseSeq, baseVal)
		return
	}
	// Operands oldest first, as the Merger wants them.
	it.opsOld = it.opsOld[:0]
	for i := n - 1; i >= 0; i-- {
		it.opsOld = append(it.opsOld, it.opVals[i])
	}
	ops := it.opsOld
	newest := it.opSeqs[0]
	switch {
	case bk == baseSet:
		v, err := m.FullMerge(it.curKey, baseVal, true, ops)
		if err != nil {
			it.err = fmt.Errorf("compactiter: merging key %s: %w", base.FormatKey(it.curKey), err)
			return
		}
		it.stats.Merged += int64(n)
		it.emitValue(newest, v, stripe)
	case bk == baseDelete || bk == baseTombstone || (keyEnded && it.keyHasNoLowerData()):
		v, err := m.FullMerge(it.curKey, nil, false, ops)
		if err != nil {
			it.err = fmt.Errorf("compactiter: merging key %s: %w", base.FormatKey(it.curKey), err)
			return
		}
		if bk == baseDelete {
			it.stats.Merged += int64(n)
		} else {
			it.stats.Merged += int64(n - 1)
		}
		it.emitValue(newest, v, stripe)
	default:
		// No base in this stripe, and older data may exist (an older stripe
		// or a lower level): the result must stay a Merge.
		if n > 1 {
			if v, ok := m.PartialMerge(it.curKey, ops); ok {
				it.stats.Merged += int64(n - 1)
				it.emit(newest, base.KindMerge, v, stripe, true)
				return
			}
		}
		for i := range n {
			it.emit(it.opSeqs[i], base.KindMerge, it.opVals[i], stripe, i == n-1)
		}
	}
}

// passThrough yields a merge run unmerged (no Merger): the operands, then the
// base they apply to when it is still needed.
func (it *Iter) passThrough(stripe int, bk baseKind, baseSeq base.SeqNum, baseVal []byte) {
	keepBase := bk == baseSet || (bk == baseDelete && !it.deleteElidable(stripe))
	n := len(it.opSeqs)
	for i := range n {
		it.emit(it.opSeqs[i], base.KindMerge, it.opVals[i], stripe, i == n-1 && !keepBase)
	}
	switch {
	case bk == baseSet:
		// Not filtered: readers see the merged value, not this one.
		it.emit(baseSeq, base.KindSet, baseVal, stripe, true)
	case bk == baseDelete && keepBase:
		it.emit(baseSeq, base.KindDelete, nil, stripe, true)
	case bk == baseDelete:
		it.stats.ElidedDeletes++
	}
}
