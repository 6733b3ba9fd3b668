// Package rangedel turns possibly overlapping range tombstones into
// non-overlapping fragments and answers "is this key deleted?" queries over
// them.
//
// A range tombstone [Start, End)#Seq deletes every key k with
// Start <= k < End whose sequence number is lower than Seq, as seen by
// readers whose snapshot includes Seq (snapshot >= Seq).
package rangedel

import (
	"bytes"
	"slices"
	"sort"

	"github.com/shale-db/shale/storage/internal/base"
)

// Tombstone is one range deletion: it deletes keys in [Start, End) written
// before Seq. A tombstone with Start >= End is empty and covers nothing.
type Tombstone struct {
	Start, End []byte
	Seq        base.SeqNum
}

// Span is a fragment [Start, End) together with the sequence numbers of every
// tombstone that covers it, in descending order without duplicates. Seqs is
// never empty.
type Span struct {
	Start, End []byte
	Seqs       []base.SeqNum
}

// Fragment splits ts, given in any order, into spans that are sorted by Start,
// pairwise non-overlapping and non-empty. Every key is covered by exactly the
// same set of sequence numbers in the output as in the input, and a key not
// covered by any tombstone lies in no span. Adjacent spans with identical
// sequence sets are merged. Empty tombstones (Start >= End) are ignored.
//
// The output's keys alias the input tombstones' keys; Fragment copies no key
// bytes and does not modify ts.
func Fragment(ts []Tombstone) []Span {
	valid := make([]Tombstone, 0, len(ts))
	bounds := make([][]byte, 0, 2*len(ts))
	for _, t := range ts {
		if bytes.Compare(t.Start, t.End) < 0 {
			valid = append(valid, t)
			bounds = append(bounds, t.Start, t.End)
		}
	}
	if len(valid) == 0 {
		return nil
	}
	slices.SortFunc(bounds, bytes.Compare)
	bounds = slices.CompactFunc(bounds, bytes.Equal)
	slices.SortStableFunc(valid, func(a, b Tombstone) int { return bytes.Compare(a.Start, b.Start) })

	var (
		spans  []Span
		active []Tombstone // tombstones with Start <= current bound < End
		seqs   []base.SeqNum
		next   int // next tombstone of valid to activate
	)
	for i := 0; i+1 < len(bounds); i++ {
		lo, hi := bounds[i], bounds[i+1]
		for next < len(valid) && bytes.Compare(valid[next].Start, lo) <= 0 {
			active = append(active, valid[next])
			next++
		}
		active = slices.DeleteFunc(active, func(t Tombstone) bool { return bytes.Compare(t.End, lo) <= 0 })
		if len(active) == 0 {
			continue
		}
		seqs = seqs[:0]
		for _, t := range active {
			seqs = append(seqs, t.Seq)
		}
		slices.SortFunc(seqs, func(a, b base.SeqNum) int { return cmpSeqDesc(a, b) })
		seqs = slices.Compact(seqs)
		if n := len(spans); n > 0 && bytes.Equal(spans[n-1].End, lo) && slices.Equal(spans[n-1].Seqs, seqs) {
			spans[n-1].End = hi
			continue
		}
		spans = append(spans, Span{Start: lo, End: hi, Seqs: slices.Clone(seqs)})
	}
	return spans
}

func cmpSeqDesc(a, b base.SeqNum) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// List is an immutable, binary-searchable set of fragmented range tombstones.
// It owns copies of its keys, so it does not depend on the memory it was
// built from. All methods are safe for concurrent use; a nil *List is valid
// and empty.
type List struct {
	spans []Span
}

// NewList fragments ts (see Fragment) into a List. ts is not modified or
// retained.
func NewList(ts []Tombstone) *List {
	spans := Fragment(ts)
	// Copy keys and seqs into two shared backing arrays.
	var nKey, nSeq int
	for _, s := range spans {
		nKey += len(s.Start) + len(s.End)
		nSeq += len(s.Seqs)
	}
	keys := make([]byte, 0, nKey)
	seqs := make([]base.SeqNum, 0, nSeq)
	own := func(k []byte) []byte {
		start := len(keys)
		keys = append(keys, k...)
		return keys[start:len(keys):len(keys)]
	}
	for i := range spans {
		s := &spans[i]
		if i > 0 && bytes.Equal(spans[i-1].End, s.Start) {
			s.Start = spans[i-1].End // already owned
		} else {
			s.Start = own(s.Start)
		}
		s.End = own(s.End)
		start := len(seqs)
		seqs = append(seqs, s.Seqs...)
		s.Seqs = seqs[start:len(seqs):len(seqs)]
	}
	return &List{spans: spans}
}

// Empty reports whether the list covers no key.
func (l *List) Empty() bool { return l == nil || len(l.spans) == 0 }

// Spans returns the list's fragments, sorted by Start and non-overlapping.
// The slice and everything it references are shared with the list and must
// not be modified.
func (l *List) Spans() []Span {
	if l == nil {
		return nil
	}
	return l.spans
}

// spanIndex returns the index of the first span whose End is > key; the key
// is covered by that span iff the index is in range and its Start <= key.
func (l *List) spanIndex(key []byte) int {
	return sort.Search(len(l.spans), func(i int) bool { return bytes.Compare(l.spans[i].End, key) > 0 })
}

// maxSeqAtOrBelow returns the largest of seqs (descending) that is <= snap,
// or 0 if there is none.
func maxSeqAtOrBelow(seqs []base.SeqNum, snap base.SeqNum) base.SeqNum {
	// Spans usually carry few seqs and readers usually use a recent
	// snapshot, so the first element is the common answer.
	if len(seqs) > 0 && seqs[0] <= snap {
		return seqs[0]
	}
	i := sort.Search(len(seqs), func(i int) bool { return seqs[i] <= snap })
	if i < len(seqs) {
		return seqs[i]
	}
	return 0
}

func (l *List) maxCoveringAt(i int, key []byte, snap base.SeqNum) base.SeqNum {
	if i >= len(l.spans) || bytes.Compare(l.spans[i].Start, key) > 0 {
		return 0
	}
	return maxSeqAtOrBelow(l.spans[i].Seqs, snap)
}

// MaxCoveringSeq returns the largest sequence number <= snapshotSeq among the
// tombstones covering key, or 0 if none does. It costs O(log n).
func (l *List) MaxCoveringSeq(key []byte, snapshotSeq base.SeqNum) base.SeqNum {
	if l.Empty() {
		return 0
	}
	return l.maxCoveringAt(l.spanIndex(key), key, snapshotSeq)
}

// Covers reports whether a tombstone visible at snapshotSeq (seq <=
// snapshotSeq) deletes key written at keySeq (keySeq < seq). It costs
// O(log n).
func (l *List) Covers(key []byte, keySeq, snapshotSeq base.SeqNum) bool {
	return l.MaxCoveringSeq(key, snapshotSeq) > keySeq
}

// Visibility selects which of a span's sequence numbers to keep when
// clipping. It receives a scratch copy of the span's seqs (descending), which
// it may modify, and returns the seqs to keep, in descending order (typically
// a subslice of its argument).
type Visibility func(seqs []base.SeqNum) []base.SeqNum

// SnapshotVisibility returns a Visibility for compactions with the given open
// snapshots (any order). Of the seqs that fall in the same snapshot stripe —
// seqs no open snapshot (and not the latest state) can tell apart — it keeps
// only the newest, which covers every key the others cover for every reader
// that can see any of them. The snapshots slice is copied.
func SnapshotVisibility(snapshots []base.SeqNum) Visibility {
	snaps := slices.Clone(snapshots)
	slices.Sort(snaps)
	stripe := func(s base.SeqNum) int {
		// The stripe is identified by the oldest snapshot that sees s.
		i, _ := slices.BinarySearch(snaps, s)
		return i
	}
	return func(seqs []base.SeqNum) []base.SeqNum {
		kept := seqs[:0]
		last := -1
		for _, s := range seqs {
			if st := stripe(s); st != last {
				kept = append(kept, s)
				last = st
			}
		}
		return kept
	}
}

// Clip returns the list's fragments restricted to [lower, upper) (a nil bound
// is unbounded), one Tombstone per (fragment, seq), ordered by Start
// ascending and then Seq descending. Any two returned tombstones have either
// identical or disjoint bounds. The returned keys alias the list's memory or
// lower/upper and must not be modified.
func (l *List) Clip(lower, upper []byte) []Tombstone {
	return l.ClipVisible(lower, upper, nil)
}

// ClipVisible is Clip with the seqs of every fragment passed through vis
// (nil keeps all of them); fragments left with no seq are omitted.
func (l *List) ClipVisible(lower, upper []byte, vis Visibility) []Tombstone {
	if l.Empty() || (lower != nil && upper != nil && bytes.Compare(lower, upper) >= 0) {
		return nil
	}
	i := 0
	if lower != nil {
		i = l.spanIndex(lower)
	}
	var out []Tombstone
	var scratch []base.SeqNum
	for ; i < len(l.spans); i++ {
		s := &l.spans[i]
		if upper != nil && bytes.Compare(s.Start, upper) >= 0 {
			break
		}
		start, end := s.Start, s.End
		if lower != nil && bytes.Compare(start, lower) < 0 {
			start = lower
		}
		if upper != nil && bytes.Compare(end, upper) > 0 {
			end = upper
		}
		seqs := s.Seqs
		if vis != nil {
			scratch = append(scratch[:0], s.Seqs...)
			seqs = vis(scratch)
		}
		for _, seq := range seqs {
			out = append(out, Tombstone{Start: start, End: end, Seq: seq})
		}
	}
	return out
}

// Cursor answers coverage queries against a List, remembering the fragment
// it found last. For keys queried in ascending or descending order the cost
// is amortized O(1) per query (O(log d) for a jump over d fragments); for
// arbitrary order it is O(log n) like the List methods, and always correct.
// A Cursor is not safe for concurrent use; create one per iterator. The zero
// Cursor behaves as a cursor over an empty list.
type Cursor struct {
	l *List
	i int // index of the first span with End > the last queried key
}

// NewCursor returns a cursor over l.
func (l *List) NewCursor() Cursor { return Cursor{l: l} }

func (c *Cursor) endAfter(j int, key []byte) bool {
	return bytes.Compare(c.l.spans[j].End, key) > 0
}

// seek updates c.i to the first span with End > key by galloping from the
// previous position.
func (c *Cursor) seek(key []byte) int {
	n := len(c.l.spans)
	i := min(max(c.i, 0), n)
	switch {
	case i < n && !c.endAfter(i, key):
		// Forward: the answer is in (i, n].
		lo, step := i+1, 1
		hi := lo
		for hi < n && !c.endAfter(hi, key) {
			lo = hi + 1
			hi += step
			step *= 2
		}
		hi = min(hi, n)
		i = lo + sort.Search(hi-lo, func(j int) bool { return c.endAfter(lo+j, key) })
	case i > 0 && c.endAfter(i-1, key):
		// Backward: the answer is in [0, i-1].
		hi, step := i-1, 1
		lo := hi - step
		for lo >= 0 && c.endAfter(lo, key) {
			hi = lo
			step *= 2
			lo = hi - step
		}
		lo = max(lo+1, 0)
		i = lo + sort.Search(hi-lo, func(j int) bool { return c.endAfter(lo+j, key) })
	}
	c.i = i
	return i
}

// MaxCoveringSeq is List.MaxCoveringSeq using and updating the cursor's
// position.
func (c *Cursor) MaxCoveringSeq(key []byte, snapshotSeq base.SeqNum) base.SeqNum {
	if c.l.Empty() {
		return 0
	}
	return c.l.maxCoveringAt(c.seek(key), key, snapshotSeq)
}

// Covers is List.Covers using and updating the cursor's position.
func (c *Cursor) Covers(key []byte, keySeq, snapshotSeq base.SeqNum) bool {
	return c.MaxCoveringSeq(key, snapshotSeq) > keySeq
}
