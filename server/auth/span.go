package auth

import (
	"bytes"
	"fmt"
	"slices"
	"sort"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Span is the set of keys k with Start <= k < End, in bytewise order. An
// End that is nil (or empty) means no upper bound: every key from Start on.
// A Span whose End is not after its Start holds no key.
type Span struct{ Start, End []byte }

// Unbounded reports whether the span has no upper bound.
func (s Span) Unbounded() bool { return len(s.End) == 0 }

// Empty reports whether the span holds no key.
func (s Span) Empty() bool { return !s.Unbounded() && bytes.Compare(s.Start, s.End) >= 0 }

// Contains reports whether key k is in the span.
func (s Span) Contains(k []byte) bool {
	return bytes.Compare(s.Start, k) <= 0 && (s.Unbounded() || bytes.Compare(k, s.End) < 0)
}

// String shows the span for error messages, keys quoted: key "a" for a span
// of one key, ["a", "b") for a range, ["a", end of key space) without upper
// bound.
func (s Span) String() string {
	switch {
	case s.Unbounded():
		return fmt.Sprintf("[%q, end of key space)", s.Start)
	case s.isKey():
		return fmt.Sprintf("key %q", s.Start)
	default:
		return fmt.Sprintf("[%q, %q)", s.Start, s.End)
	}
}

// isKey reports whether the span is KeySpan(s.Start), one key.
func (s Span) isKey() bool {
	return len(s.End) == len(s.Start)+1 && s.End[len(s.Start)] == 0 && bytes.HasPrefix(s.End, s.Start)
}

// KeySpan is the span of the one key k: [k, k+"\x00").
func KeySpan(k []byte) Span {
	end := make([]byte, len(k)+1)
	copy(end, k)
	return Span{Start: slices.Clone(k), End: end}
}

// PrefixSpan is the span of every key that starts with p: [p, the first key
// after every key with prefix p). An empty p, or a p of only 0xff bytes, has
// no upper bound.
func PrefixSpan(p []byte) Span {
	return Span{Start: slices.Clone(p), End: prefixEnd(p)}
}

// prefixEnd is the smallest key greater than every key starting with p, nil
// if there is none.
func prefixEnd(p []byte) []byte {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] != 0xff {
			end := make([]byte, i+1)
			copy(end, p)
			end[i]++
			return end
		}
	}
	return nil
}

// RangeSpan is [start, end); an empty end means no upper bound.
func RangeSpan(start, end []byte) Span {
	sp := Span{Start: slices.Clone(start)}
	if len(end) > 0 {
		sp.End = slices.Clone(end)
	}
	return sp
}

// PermissionSpan is the set of keys a permission covers: with prefix, the
// keys starting with key; with a range_end, [key, range_end); otherwise the
// one key key. It never fails: for a permission that ValidatePermission
// refuses, it is the span of the field that takes precedence (prefix, then
// range_end), with a range_end before key taken as key (an empty span), so
// Start <= End always holds when End is not nil.
func PermissionSpan(p *shalev1.Permission) Span {
	switch {
	case p.GetPrefix():
		return PrefixSpan(p.GetKey())
	case len(p.GetRangeEnd()) > 0:
		if bytes.Compare(p.GetRangeEnd(), p.GetKey()) < 0 {
			return RangeSpan(p.GetKey(), p.GetKey())
		}
		return RangeSpan(p.GetKey(), p.GetRangeEnd())
	default:
		return KeySpan(p.GetKey())
	}
}

// ValidatePermission reports, as an InvalidArgument status error, what is
// wrong with p: its type must be READ, WRITE or READWRITE; prefix and
// range_end are exclusive; a range_end must be greater than key; a
// permission on one key (neither prefix nor range_end) needs a key.
func ValidatePermission(p *shalev1.Permission) error {
	if p == nil {
		return invalidArg("the permission is missing")
	}
	switch p.GetType() {
	case shalev1.PermissionType_PERMISSION_TYPE_READ, shalev1.PermissionType_PERMISSION_TYPE_WRITE,
		shalev1.PermissionType_PERMISSION_TYPE_READWRITE:
	default:
		return invalidArg("permission %s: the type must be READ, WRITE or READWRITE", describePermission(p))
	}
	switch {
	case p.GetPrefix() && len(p.GetRangeEnd()) > 0:
		return invalidArg("permission %s: prefix and range_end are exclusive", describePermission(p))
	case len(p.GetRangeEnd()) > 0 && bytes.Compare(p.GetRangeEnd(), p.GetKey()) <= 0:
		return invalidArg("permission %s: range_end must be greater than key", describePermission(p))
	case !p.GetPrefix() && len(p.GetRangeEnd()) == 0 && len(p.GetKey()) == 0:
		return invalidArg("permission %s: a permission on one key needs a key (an empty prefix grants every key)",
			describePermission(p))
	}
	return nil
}

// describePermission shows a permission as given, for error messages.
func describePermission(p *shalev1.Permission) string {
	t := p.GetType().String()
	switch {
	case p.GetPrefix() && len(p.GetRangeEnd()) > 0:
		return fmt.Sprintf("%s prefix %q range_end %q", t, p.GetKey(), p.GetRangeEnd())
	case p.GetPrefix():
		return fmt.Sprintf("%s prefix %q", t, p.GetKey())
	case len(p.GetRangeEnd()) > 0:
		return fmt.Sprintf("%s [%q, %q)", t, p.GetKey(), p.GetRangeEnd())
	default:
		return fmt.Sprintf("%s key %q", t, p.GetKey())
	}
}

// samePermission reports whether a and b are identical (nil and empty byte
// strings being equal).
func samePermission(a, b *shalev1.Permission) bool {
	return a.GetType() == b.GetType() && a.GetPrefix() == b.GetPrefix() &&
		bytes.Equal(a.GetKey(), b.GetKey()) && bytes.Equal(a.GetRangeEnd(), b.GetRangeEnd())
}

// spanSet is a union of spans kept as sorted, disjoint, non-adjacent spans:
// each span's Start is greater than the previous span's End. Only the last
// span may be unbounded. Because every byte string y with x < y has y itself
// between x and y, two spans that neither overlap nor touch have a key
// between them, so a span is covered by the union if and only if it lies
// inside one of these spans: one binary search.
type spanSet []Span

// newSpanSet merges spans (which it does not modify) into a spanSet.
func newSpanSet(spans []Span) spanSet {
	in := make([]Span, 0, len(spans))
	for _, s := range spans {
		if !s.Empty() {
			in = append(in, s)
		}
	}
	sort.Slice(in, func(i, j int) bool { return bytes.Compare(in[i].Start, in[j].Start) < 0 })
	var out spanSet
	for _, s := range in {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.Unbounded() {
				break // every later span starts inside it
			}
			if bytes.Compare(s.Start, last.End) <= 0 { // overlaps or touches
				if s.Unbounded() || bytes.Compare(s.End, last.End) > 0 {
					last.End = s.End
				}
				continue
			}
		}
		out = append(out, Span{Start: s.Start, End: s.End})
	}
	for i := range out {
		if out[i].Unbounded() {
			out[i].End = nil
		}
	}
	return out
}

// covers reports whether every key of sp is in the set. If not, gap is the
// first key of sp that is not.
func (ss spanSet) covers(sp Span) (ok bool, gap []byte) {
	if sp.Empty() {
		return true, nil
	}
	// i is the last span starting at or before sp.Start.
	i := sort.Search(len(ss), func(i int) bool { return bytes.Compare(ss[i].Start, sp.Start) > 0 }) - 1
	if i < 0 {
		return false, sp.Start
	}
	s := ss[i]
	if s.Unbounded() {
		return true, nil
	}
	if bytes.Compare(s.End, sp.Start) <= 0 {
		return false, sp.Start
	}
	if !sp.Unbounded() && bytes.Compare(sp.End, s.End) <= 0 {
		return true, nil
	}
	return false, s.End
}
