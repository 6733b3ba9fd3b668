package compact

import (
	"bytes"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
)

// span is a range of user keys. start is inclusive; end is inclusive unless
// endExclusive. The unbounded flags make the respective bound infinite (and
// the key ignored).
type span struct {
	start, end     []byte
	endExclusive   bool
	unboundedStart bool
	unboundedEnd   bool
}

// spanOfKeys is the user-key span of the internal-key interval
// [smallest, largest]. A largest that is a range-deletion sentinel is an
// exclusive bound, unless that would make the span empty (a degenerate file
// whose only content is the sentinel), in which case it is treated as
// inclusive so that the file still conservatively overlaps its own key.
func spanOfKeys(smallest, largest base.InternalKey) span {
	s := span{start: smallest.UserKey, end: largest.UserKey}
	if largest.IsExclusiveSentinel() && bytes.Compare(s.start, s.end) < 0 {
		s.endExclusive = true
	}
	return s
}

func fileSpan(f *manifest.FileMetadata) span { return spanOfKeys(f.Smallest, f.Largest) }

// endsBefore reports whether every key of a lies before key k.
func (a span) endsBefore(k []byte) bool {
	if a.unboundedEnd {
		return false
	}
	c := bytes.Compare(a.end, k)
	return c < 0 || (c == 0 && a.endExclusive)
}

// startsAfter reports whether every key of a lies after the end of b.
func (a span) startsAfter(b span) bool {
	if a.unboundedStart || b.unboundedEnd {
		return false
	}
	c := bytes.Compare(a.start, b.end)
	return c > 0 || (c == 0 && b.endExclusive)
}

// overlaps reports whether a and b share at least one user key.
func (a span) overlaps(b span) bool {
	return !a.startsAfter(b) && !b.startsAfter(a)
}

// union returns the smallest span covering a and b.
func (a span) union(b span) span {
	r := a
	if b.unboundedStart || (!a.unboundedStart && bytes.Compare(b.start, a.start) < 0) {
		r.start, r.unboundedStart = b.start, b.unboundedStart
	}
	switch {
	case a.unboundedEnd || b.unboundedEnd:
		r.end, r.endExclusive, r.unboundedEnd = nil, false, true
	default:
		c := bytes.Compare(a.end, b.end)
		switch {
		case c < 0:
			r.end, r.endExclusive = b.end, b.endExclusive
		case c == 0:
			r.endExclusive = a.endExclusive && b.endExclusive
		}
	}
	return r
}

// sortedOverlap returns the half-open index range [lo, hi) of the files of a
// sorted, non-overlapping level (L1+) whose user-key span overlaps s. It
// relies on both Smallest and Largest being non-decreasing along the slice,
// which the level invariant guarantees; lo == hi means no overlap.
func sortedOverlap(files []*manifest.FileMetadata, s span) (lo, hi int) {
	n := len(files)
	// lo: first file that does not end before s.start.
	if !s.unboundedStart {
		l, h := 0, n
		for l < h {
			m := int(uint(l+h) >> 1)
			if fileSpan(files[m]).endsBefore(s.start) {
				l = m + 1
			} else {
				h = m
			}
		}
		lo = l
	}
	// hi: first file that starts after s.end.
	hi = n
	if !s.unboundedEnd {
		l, h := lo, n
		for l < h {
			m := int(uint(l+h) >> 1)
			if fileSpan(files[m]).startsAfter(s) {
				h = m
			} else {
				l = m + 1
			}
		}
		hi = l
	}
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// expandSorted returns the clean-cut index range of a sorted level covering
// s: every file overlapping s, plus, transitively, every file sharing a user
// key with one already chosen (neighbours whose boundaries share a user key
// that is not excluded by a sentinel). The returned span covers s and all
// chosen files.
func expandSorted(files []*manifest.FileMetadata, s span) (lo, hi int, cover span) {
	cover = s
	lo, hi = sortedOverlap(files, s)
	for lo < hi {
		// In a sorted level the first file has the smallest start and the
		// last one the largest end, so they bound the whole run.
		cover = cover.union(fileSpan(files[lo])).union(fileSpan(files[hi-1]))
		nlo, nhi := sortedOverlap(files, cover)
		if nlo >= lo && nhi <= hi {
			break
		}
		lo, hi = min(lo, nlo), max(hi, nhi)
	}
	return lo, hi, cover
}

// closureL0 returns the indexes (in slice order, newest first) of the L0 files
// overlapping s, closed transitively: any L0 file overlapping the span of the
// chosen set is chosen as well. Because L0 files may overlap arbitrarily,
// this guarantees that no L0 file left out shares a user key with the chosen
// set, so no older version of a chosen key stays above newer ones.
func closureL0(files []*manifest.FileMetadata, s span) (idx []int, cover span) {
	cover = s
	in := make([]bool, len(files))
	for changed := true; changed; {
		changed = false
		for i, f := range files {
			if in[i] {
				continue
			}
			fs := fileSpan(f)
			if fs.overlaps(cover) {
				in[i] = true
				cover = cover.union(fs)
				changed = true
			}
		}
	}
	for i, ok := range in {
		if ok {
			idx = append(idx, i)
		}
	}
	return idx, cover
}

// keyBounds returns the smallest Smallest and the largest Largest (internal
// key order) over the given file sets. ok is false when there are no files.
func keyBounds(sets ...[]*manifest.FileMetadata) (smallest, largest base.InternalKey, ok bool) {
	for _, set := range sets {
		for _, f := range set {
			if !ok {
				smallest, largest, ok = f.Smallest, f.Largest, true
				continue
			}
			if base.CompareInternal(f.Smallest, smallest) < 0 {
				smallest = f.Smallest
			}
			if base.CompareInternal(f.Largest, largest) > 0 {
				largest = f.Largest
			}
		}
	}
	return smallest, largest, ok
}

func totalSize(files []*manifest.FileMetadata) uint64 {
	var n uint64
	for _, f := range files {
		n = satAdd(n, f.Size)
	}
	return n
}

func anyCompacting(files []*manifest.FileMetadata) bool {
	for _, f := range files {
		if f.Compacting {
			return true
		}
	}
	return false
}
