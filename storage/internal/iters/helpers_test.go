package iters

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/internal/base"
	"go.uber.org/goleak"
)

var (
	seedFlag  = flag.Uint64("seed", 0, "run the randomized tests with this seed only (0 = time-based seeds)")
	itersFlag = flag.Int("rand-iters", 300, "number of seeds per randomized test")
)

func TestMain(m *testing.M) {
	flag.Parse()
	goleak.VerifyTestMain(m) // runs the tests and exits
}

// forEachSeed runs f for each seed of a randomized test, naming the seed so
// that a failure can be reproduced with -seed.
func forEachSeed(t *testing.T, f func(t *testing.T, rng *rand.Rand)) {
	t.Helper()
	if *seedFlag != 0 {
		seed := *seedFlag
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { f(t, rand.New(rand.NewPCG(seed, seed))) })
		return
	}
	n := *itersFlag
	if testing.Short() {
		n /= 10
	}
	start := uint64(time.Now().UnixNano())
	for i := 0; i < n; i++ {
		seed := start + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			f(t, rand.New(rand.NewPCG(seed, seed)))
		})
		if !ok {
			t.Fatalf("failed with seed %d; reproduce with: go test ./storage/internal/iters -run '%s' -seed=%d", seed, t.Name(), seed)
		}
	}
}

// entry is one internal entry of a test data set.
type entry struct {
	key   base.InternalKey
	value []byte
}

func (e entry) String() string { return fmt.Sprintf("%s=%s", e.key, e.value) }

type tombstone struct {
	start, end []byte
	seq        base.SeqNum
}

// naiveCovering is the test's Covering: a linear scan over tombstones.
type naiveCovering []tombstone

func (c naiveCovering) MaxCoveringSeq(key []byte, snapshot base.SeqNum) base.SeqNum {
	var m base.SeqNum
	for _, t := range c {
		if t.seq <= snapshot && t.seq > m && bytes.Compare(t.start, key) <= 0 && bytes.Compare(key, t.end) < 0 {
			m = t.seq
		}
	}
	return m
}

// concatMerger joins the base value (when any) and the operands, oldest
// first, with ",".
type concatMerger struct{}

func (concatMerger) Name() string { return "concat" }

func (concatMerger) FullMerge(key, existing []byte, hasExisting bool, operands [][]byte) ([]byte, error) {
	if len(operands) == 0 {
		return nil, errors.New("no operands")
	}
	if !hasExisting && existing != nil {
		return nil, errors.New("existing value without hasExisting")
	}
	var b []byte
	if hasExisting {
		b = append(b, existing...)
	}
	for _, op := range operands {
		if len(b) > 0 {
			b = append(b, ',')
		}
		b = append(b, op...)
	}
	return b, nil
}

func (concatMerger) PartialMerge(key []byte, operands [][]byte) ([]byte, bool) {
	return bytes.Join(operands, []byte(",")), true
}

// failingMerger fails every merge.
type failingMerger struct{ concatMerger }

var errMergeFailed = errors.New("merge failed")

func (failingMerger) FullMerge([]byte, []byte, bool, [][]byte) ([]byte, error) {
	return nil, errMergeFailed
}

func sortEntries(es []entry) {
	slices.SortStableFunc(es, func(a, b entry) int { return base.CompareInternal(a.key, b.key) })
}

func splitEntries(es []entry) ([]base.InternalKey, [][]byte) {
	keys := make([]base.InternalKey, len(es))
	vals := make([][]byte, len(es))
	for i, e := range es {
		keys[i], vals[i] = e.key, e.value
	}
	return keys, vals
}

func sliceIterOf(es []entry) *SliceIter {
	k, v := splitEntries(es)
	return NewSliceIter(k, v)
}

// testKeys is the user-key alphabet: short keys, including one that is a
// prefix of another so that key successors matter.
var testKeys = []string{"a", "b", "ba", "bb", "c", "d", "e", "f", "g", "h"}

// seekKeys additionally holds keys absent from the data.
var seekKeys = append(slices.Clone(testKeys), "", "a\x00", "b\x00", "bc", "dd", "z")

// genData generates a sorted set of unique internal entries and tombstones;
// maxSeq is the largest sequence number used.
func genData(rng *rand.Rand, allowRangeDelKind bool) (es []entry, tombs []tombstone, maxSeq base.SeqNum) {
	nKeys := 1 + rng.IntN(len(testKeys))
	keys := testKeys[:nKeys]
	if rng.IntN(2) == 0 {
		keys = slices.Clone(testKeys)
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		keys = keys[:nKeys]
	}
	n := rng.IntN(120)
	if rng.IntN(10) == 0 {
		n = 0
	}
	maxSeq = base.SeqNum(n + 5)
	seqs := rng.Perm(int(maxSeq))
	kinds := []base.Kind{base.KindSet, base.KindSet, base.KindDelete, base.KindMerge, base.KindMerge}
	for i := 0; i < n; i++ {
		k := keys[rng.IntN(len(keys))]
		seq := base.SeqNum(seqs[i] + 1)
		kind := kinds[rng.IntN(len(kinds))]
		if allowRangeDelKind && rng.IntN(30) == 0 {
			kind = base.KindRangeDelete
		}
		es = append(es, entry{base.MakeInternalKey([]byte(k), seq, kind), []byte(fmt.Sprintf("v%d", seq))})
	}
	// Some keys get a seq-0 version (as after a compaction to the bottom).
	for _, k := range keys {
		if rng.IntN(4) == 0 {
			kind := kinds[rng.IntN(len(kinds))]
			es = append(es, entry{base.MakeInternalKey([]byte(k), 0, kind), []byte("v0" + k)})
		}
	}
	sortEntries(es)
	for i := rng.IntN(5); i > 0; i-- {
		a, b := seekKeys[rng.IntN(len(seekKeys))], seekKeys[rng.IntN(len(seekKeys))]
		if a > b {
			a, b = b, a
		}
		tombs = append(tombs, tombstone{[]byte(a), []byte(b), base.SeqNum(1 + rng.IntN(int(maxSeq)))})
	}
	return es, tombs, maxSeq
}

func (t tombstone) String() string { return fmt.Sprintf("[%s,%s)#%d", t.start, t.end, t.seq) }

type kv struct{ k, v string }

// oracle computes the user-visible key/value pairs naively.
func oracle(es []entry, tombs naiveCovering, snap base.SeqNum, lower, upper []byte) []kv {
	byKey := map[string][]entry{}
	var userKeys []string
	for _, e := range es {
		k := string(e.key.UserKey)
		if _, ok := byKey[k]; !ok {
			userKeys = append(userKeys, k)
		}
		byKey[k] = append(byKey[k], e)
	}
	slices.Sort(userKeys)
	var out []kv
	for _, k := range userKeys {
		if lower != nil && k < string(lower) || upper != nil && k >= string(upper) {
			continue
		}
		vs := byKey[k]
		slices.SortFunc(vs, func(a, b entry) int { return base.CompareInternal(a.key, b.key) })
		cover := tombs.MaxCoveringSeq([]byte(k), snap)
		var ops []string
		var baseVal string
		hasBase, found := false, false
		for _, e := range vs {
			s := e.key.SeqNum()
			if s > snap || e.key.Kind() == base.KindRangeDelete {
				continue
			}
			if cover > s || e.key.Kind() == base.KindDelete {
				break
			}
			if e.key.Kind() == base.KindSet {
				baseVal, hasBase = string(e.value), true
				break
			}
			ops = append(ops, string(e.value))
		}
		switch {
		case len(ops) > 0:
			slices.Reverse(ops)
			if hasBase {
				ops = append([]string{baseVal}, ops...)
			}
			out = append(out, kv{k, strings.Join(ops, ",")})
			found = true
		case hasBase:
			out = append(out, kv{k, baseVal})
			found = true
		}
		_ = found
	}
	return out
}

// trackingIter wraps an iterator, counting open iterators and optionally
// failing after a number of calls.
type trackingIter struct {
	base.InternalIterator
	open     *int
	closed   bool
	failAt   int // fail on this call (1-based); 0 = never
	calls    int
	err      error
	closeErr error
}

var errInjected = errors.New("injected failure")

func (t *trackingIter) step(f func() bool) bool {
	if t.err != nil {
		return false
	}
	t.calls++
	if t.failAt > 0 && t.calls >= t.failAt {
		t.err = errInjected
		return false
	}
	return f()
}

func (t *trackingIter) SeekGE(k []byte) bool {
	return t.step(func() bool { return t.InternalIterator.SeekGE(k) })
}
func (t *trackingIter) SeekLT(k []byte) bool {
	return t.step(func() bool { return t.InternalIterator.SeekLT(k) })
}
func (t *trackingIter) First() bool { return t.step(t.InternalIterator.First) }
func (t *trackingIter) Last() bool  { return t.step(t.InternalIterator.Last) }
func (t *trackingIter) Next() bool  { return t.step(t.InternalIterator.Next) }
func (t *trackingIter) Prev() bool  { return t.step(t.InternalIterator.Prev) }
func (t *trackingIter) Error() error {
	if t.err != nil {
		return t.err
	}
	return t.InternalIterator.Error()
}
func (t *trackingIter) Close() error {
	if t.closed {
		return errors.New("closed twice")
	}
	t.closed = true
	if t.open != nil {
		*t.open--
	}
	if t.closeErr != nil {
		return t.closeErr
	}
	return t.Error()
}

// level is a generated level: files with their entries.
type level struct {
	files   []FileBounds
	entries [][]entry
}

// genLevel splits sorted entries into sorted, non-overlapping files, with
// random extended bounds, exclusive sentinels and files without point keys.
func genLevel(rng *rand.Rand, es []entry) level {
	var lv level
	var chunks [][]entry
	for i := 0; i < len(es); {
		n := 1 + rng.IntN(8)
		if i+n > len(es) {
			n = len(es) - i
		}
		chunks = append(chunks, es[i:i+n])
		i += n
	}
	rangeDelKey := func(uk []byte, seq base.SeqNum) base.InternalKey {
		return base.MakeInternalKey(uk, seq, base.KindRangeDelete)
	}
	for ci, ch := range chunks {
		fb := FileBounds{Smallest: ch[0].key, Largest: ch[len(ch)-1].key}
		first, last := ch[0].key.UserKey, ch[len(ch)-1].key.UserKey
		var prevLast []byte
		if ci > 0 {
			prevLast = chunks[ci-1][len(chunks[ci-1])-1].key.UserKey
		}
		var nextFirst []byte
		if ci+1 < len(chunks) {
			nextFirst = chunks[ci+1][0].key.UserKey
		}
		// A file without point keys in a user-key gap before this one.
		if (ci == 0 || !bytes.Equal(prevLast, first)) && rng.IntN(4) == 0 {
			start := []byte("")
			if n := len(lv.files); n > 0 {
				pl := lv.files[n-1].Largest
				start = pl.UserKey
				if !pl.IsExclusiveSentinel() {
					start = append(slices.Clone(start), 0)
				}
			}
			if bytes.Compare(start, first) < 0 {
				lv.files = append(lv.files, FileBounds{
					Smallest: rangeDelKey(start, 1),
					Largest:  base.MakeRangeDeleteSentinel(first),
				})
				lv.entries = append(lv.entries, nil)
			}
		}
		// Extend the smallest bound with a range tombstone start.
		if (ci == 0 || !bytes.Equal(prevLast, first)) && rng.IntN(4) == 0 {
			fb.Smallest = rangeDelKey(first, base.MaxSeqNum-1)
		}
		// End at an exclusive sentinel.
		if rng.IntN(3) == 0 {
			switch {
			case nextFirst == nil:
				fb.Largest = base.MakeRangeDeleteSentinel(append(slices.Clone(last), 'z'))
			case bytes.Compare(last, nextFirst) < 0:
				fb.Largest = base.MakeRangeDeleteSentinel(nextFirst)
			}
		}
		lv.files = append(lv.files, fb)
		lv.entries = append(lv.entries, ch)
	}
	return lv
}

// openLevel returns a LevelIter over lv that checks that at most one file is
// open at a time and that files outside the bounds are not opened.
func openLevel(t *testing.T, lv level, lower, upper []byte, openCount *int) *LevelIter {
	return NewLevelIter(lv.files, func(i int, lo, hi []byte) (base.InternalIterator, error) {
		if *openCount != 0 {
			t.Errorf("opening file %d while %d files are open", i, *openCount)
		}
		f := lv.files[i]
		if upper != nil && bytes.Compare(f.Smallest.UserKey, upper) >= 0 {
			t.Errorf("opened file %d [%s, %s] above upper %q", i, f.Smallest, f.Largest, upper)
		}
		if lower != nil && !mayContainGE(f.Largest, lower) {
			t.Errorf("opened file %d [%s, %s] below lower %q", i, f.Smallest, f.Largest, lower)
		}
		*openCount++
		return &trackingIter{InternalIterator: sliceIterOf(lv.entries[i]), open: openCount}, nil
	}, lower, upper)
}

func filterBounds(es []entry, lower, upper []byte) []entry {
	var out []entry
	for _, e := range es {
		if lower != nil && bytes.Compare(e.key.UserKey, lower) < 0 || upper != nil && bytes.Compare(e.key.UserKey, upper) >= 0 {
			continue
		}
		out = append(out, e)
	}
	return out
}

func randBounds(rng *rand.Rand) (lower, upper []byte) {
	if rng.IntN(2) == 0 {
		lower = []byte(seekKeys[rng.IntN(len(seekKeys))])
	}
	if rng.IntN(2) == 0 {
		upper = []byte(seekKeys[rng.IntN(len(seekKeys))])
	}
	return lower, upper
}

func randSeekKey(rng *rand.Rand) []byte { return []byte(seekKeys[rng.IntN(len(seekKeys))]) }

// compareInternalIters drives got and want with the same random operations
// and fails on the first difference. After a positioning call returns false
// only repositioning calls follow, as the contract requires.
func compareInternalIters(t *testing.T, rng *rand.Rand, got, want base.InternalIterator, nOps int) {
	t.Helper()
	valid := false
	var trace []string
	for i := 0; i < nOps; i++ {
		var op string
		var g, w bool
		r := rng.IntN(10)
		if !valid && r >= 4 {
			r = rng.IntN(4)
		}
		switch r {
		case 0:
			op = "First"
			g, w = got.First(), want.First()
		case 1:
			op = "Last"
			g, w = got.Last(), want.Last()
		case 2:
			k := randSeekKey(rng)
			op = fmt.Sprintf("SeekGE(%q)", k)
			g, w = got.SeekGE(k), want.SeekGE(k)
		case 3:
			k := randSeekKey(rng)
			op = fmt.Sprintf("SeekLT(%q)", k)
			g, w = got.SeekLT(k), want.SeekLT(k)
		case 4, 5, 6:
			op = "Next"
			g, w = got.Next(), want.Next()
		default:
			op = "Prev"
			g, w = got.Prev(), want.Prev()
		}
		trace = append(trace, op)
		if err := got.Error(); err != nil {
			t.Fatalf("ops %v: unexpected error %v", trace, err)
		}
		if g != w {
			t.Fatalf("ops %v: got %v, want %v (want key %s)", trace, g, w, want.Key())
		}
		valid = g
		if !g {
			continue
		}
		if gk, wk := got.Key(), want.Key(); base.CompareInternal(gk, wk) != 0 || !bytes.Equal(got.Value(), want.Value()) {
			t.Fatalf("ops %v: got %s=%q, want %s=%q", trace, gk, got.Value(), wk, want.Value())
		}
	}
}
