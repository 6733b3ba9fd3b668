package compactiter

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/shale-db/shale/storage/internal/base"
)

// kv is one internal entry of a test stream.
type kv struct {
	k base.InternalKey
	v []byte
}

func (e kv) String() string {
	if e.k.Kind() == base.KindDelete {
		return e.k.String()
	}
	return e.k.String() + " " + string(e.v)
}

func sortKVs(kvs []kv) {
	sort.SliceStable(kvs, func(i, j int) bool { return base.CompareInternal(kvs[i].k, kvs[j].k) < 0 })
}

// sliceIter is a slice-backed base.InternalIterator. When errAt >= 0, moving
// onto index errAt fails with errInjected.
type sliceIter struct {
	kvs    []kv
	pos    int
	errAt  int
	err    error
	closed bool
}

var errInjected = errors.New("injected input error")

func newSliceIter(kvs []kv) *sliceIter { return &sliceIter{kvs: kvs, errAt: -1} }

func (s *sliceIter) valid() bool {
	if s.errAt >= 0 && s.pos >= s.errAt {
		s.err = errInjected
		return false
	}
	return s.pos >= 0 && s.pos < len(s.kvs)
}

func (s *sliceIter) SeekGE(key []byte) bool {
	s.err = nil
	s.pos = sort.Search(len(s.kvs), func(i int) bool { return bytes.Compare(s.kvs[i].k.UserKey, key) >= 0 })
	return s.valid()
}

func (s *sliceIter) SeekLT(key []byte) bool {
	s.err = nil
	s.pos = sort.Search(len(s.kvs), func(i int) bool { return bytes.Compare(s.kvs[i].k.UserKey, key) >= 0 }) - 1
	return s.valid()
}

func (s *sliceIter) First() bool { s.err = nil; s.pos = 0; return s.valid() }
func (s *sliceIter) Last() bool  { s.err = nil; s.pos = len(s.kvs) - 1; return s.valid() }
func (s *sliceIter) Next() bool  { s.pos++; return s.valid() }
func (s *sliceIter) Prev() bool  { s.pos--; return s.valid() }

func (s *sliceIter) Key() base.InternalKey {
	if s.pos < 0 || s.pos >= len(s.kvs) {
		return base.InternalKey{}
	}
	// Hand out a fresh copy so that callers relying on the key beyond the
	// next positioning call are caught by later mutation.
	return s.kvs[s.pos].k.Clone()
}

func (s *sliceIter) Value() []byte {
	if s.pos < 0 || s.pos >= len(s.kvs) {
		return nil
	}
	return slices.Clone(s.kvs[s.pos].v)
}

func (s *sliceIter) Error() error { return s.err }
func (s *sliceIter) Close() error { s.closed = true; return s.err }

// tomb is a range tombstone [start, end) at seq.
type tomb struct {
	start, end string
	seq        base.SeqNum
}

func (t tomb) String() string { return fmt.Sprintf("%s-%s#%d", t.start, t.end, t.seq) }

// tombs implements Covering over a slice.
type tombs []tomb

func (ts tombs) MaxCoveringSeq(key []byte, snapshot base.SeqNum) base.SeqNum {
	var m base.SeqNum
	k := string(key)
	for _, t := range ts {
		if t.start <= k && k < t.end && t.seq <= snapshot && t.seq > m {
			m = t.seq
		}
	}
	return m
}

// concatMerger resolves merges by concatenation: existing + "+op1" + "+op2".
// PartialMerge refuses operand sets containing a '7' so that the unmerged
// path is exercised too.
type concatMerger struct{}

func (concatMerger) Name() string { return "concat" }

func (concatMerger) FullMerge(key, existing []byte, hasExisting bool, operands [][]byte) ([]byte, error) {
	var b []byte
	if hasExisting {
		b = append(b, existing...)
	}
	for _, op := range operands {
		if bytes.Equal(op, []byte("fail")) {
			return nil, errMergeFailed
		}
		b = append(b, '+')
		b = append(b, op...)
	}
	return b, nil
}

func (concatMerger) PartialMerge(key []byte, operands [][]byte) ([]byte, bool) {
	var b []byte
	for i, op := range operands {
		if bytes.ContainsRune(op, '7') {
			return nil, false
		}
		if i > 0 {
			b = append(b, '+')
		}
		b = append(b, op...)
	}
	return b, true
}

var errMergeFailed = errors.New("merge failed")

// testFilter removes keys ending in "x" and wraps the values of keys ending
// in "y" as "F(value)".
type testFilter struct {
	wantLevel int
	badLevel  bool
	calls     int
}

func (*testFilter) Name() string { return "test" }

func (f *testFilter) Filter(level int, key, value []byte) (base.FilterDecision, []byte) {
	f.calls++
	if level != f.wantLevel {
		f.badLevel = true
	}
	switch {
	case bytes.HasSuffix(key, []byte("x")):
		return base.FilterRemove, nil
	case bytes.HasSuffix(key, []byte("y")):
		return base.FilterChangeValue, filtered(value)
	}
	return base.FilterKeep, nil
}

func filtered(v []byte) []byte { return []byte("F(" + string(v) + ")") }

// filterAffects reports whether testFilter does anything to key.
func filterAffects(key string) bool {
	return strings.HasSuffix(key, "x") || strings.HasSuffix(key, "y")
}

// result is what a naive reader finds for a key.
type result struct {
	found bool
	val   string
}

func (r result) String() string {
	if !r.found {
		return "<none>"
	}
	return strconv.Quote(r.val)
}

// naiveGet reads key at snapshot snap from entries and tombstones the slow
// and obvious way: the newest visible entries, stopping at the first Set,
// Delete or covering tombstone, merges resolved with concatMerger.
func naiveGet(entries []kv, ts tombs, key string, snap base.SeqNum) result {
	var vis []kv
	for _, e := range entries {
		if string(e.k.UserKey) == key && e.k.SeqNum() <= snap {
			vis = append(vis, e)
		}
	}
	sort.SliceStable(vis, func(i, j int) bool { return vis[i].k.SeqNum() > vis[j].k.SeqNum() })
	cover := ts.MaxCoveringSeq([]byte(key), snap)
	var ops [][]byte // newest first
	var baseVal []byte
	hasBase := false
	for _, e := range vis {
		if e.k.SeqNum() < cover {
			break
		}
		if e.k.Kind() == base.KindMerge {
			ops = append(ops, e.v)
			continue
		}
		if e.k.Kind() == base.KindSet {
			baseVal, hasBase = e.v, true
		}
		break
	}
	if len(ops) == 0 {
		return result{found: hasBase, val: string(baseVal)}
	}
	slices.Reverse(ops)
	v, err := concatMerger{}.FullMerge([]byte(key), baseVal, hasBase, ops)
	if err != nil {
		return result{found: true, val: "ERROR " + err.Error()}
	}
	return result{found: true, val: string(v)}
}

// runIter drains an Iter, copying its output.
func runIter(it *Iter) ([]kv, error) {
	var out []kv
	for ok := it.First(); ok; ok = it.Next() {
		out = append(out, kv{k: it.Key().Clone(), v: slices.Clone(it.Value())})
	}
	return out, it.Error()
}

// checkOrder verifies the output invariants: strictly increasing internal
// order, distinct (user key, seq), and seq 0 only on the last entry of a key.
func checkOrder(out []kv) error {
	for i := 1; i < len(out); i++ {
		a, b := out[i-1].k, out[i].k
		if base.CompareInternal(a, b) >= 0 {
			return fmt.Errorf("output out of order: %s then %s", a, b)
		}
		if bytes.Equal(a.UserKey, b.UserKey) && a.SeqNum() == b.SeqNum() {
			return fmt.Errorf("two entries with the same key and seq: %s, %s", a, b)
		}
		if bytes.Equal(a.UserKey, b.UserKey) && a.SeqNum() == 0 {
			return fmt.Errorf("seq 0 entry %s is not the last of its key (then %s)", a, b)
		}
	}
	return nil
}

// parseEntry parses "key#seq,KIND [value]".
func parseEntry(line string) (kv, error) {
	ks, val, _ := strings.Cut(line, " ")
	uk, rest, ok := strings.Cut(ks, "#")
	if !ok {
		return kv{}, fmt.Errorf("bad entry %q", line)
	}
	seqS, kindS, ok := strings.Cut(rest, ",")
	if !ok {
		return kv{}, fmt.Errorf("bad entry %q", line)
	}
	seq, err := strconv.ParseUint(seqS, 10, 64)
	if err != nil {
		return kv{}, err
	}
	var kind base.Kind
	switch kindS {
	case "SET":
		kind = base.KindSet
	case "DEL":
		kind = base.KindDelete
	case "MERGE":
		kind = base.KindMerge
	case "RANGEDEL":
		kind = base.KindRangeDelete
	default:
		return kv{}, fmt.Errorf("bad kind %q", kindS)
	}
	return kv{k: base.MakeInternalKey([]byte(uk), base.SeqNum(seq), kind), v: []byte(val)}, nil
}

// parseTomb parses "start-end#seq".
func parseTomb(s string) (tomb, error) {
	r, seqS, ok := strings.Cut(s, "#")
	if !ok {
		return tomb{}, fmt.Errorf("bad tombstone %q", s)
	}
	start, end, ok := strings.Cut(r, "-")
	if !ok {
		return tomb{}, fmt.Errorf("bad tombstone %q", s)
	}
	seq, err := strconv.ParseUint(seqS, 10, 64)
	if err != nil {
		return tomb{}, err
	}
	return tomb{start: start, end: end, seq: base.SeqNum(seq)}, nil
}
