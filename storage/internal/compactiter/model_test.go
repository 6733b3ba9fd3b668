package compactiter

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

var (
	seedFlag  = flag.Uint64("seed", 0, "run the randomized model test with only this seed")
	seedsFlag = flag.Int("seeds", 3000, "number of seeds for the randomized model test")
)

var modelKeys = []string{"a", "b", "c", "dx", "ey", "f"}

// tombBounds are the possible tombstone bounds; "dx" and "ey" fall inside
// [d, e) and [e, f).
var tombBounds = []string{"a", "b", "c", "d", "e", "f", "g"}

// modelCase is one randomly generated compaction.
type modelCase struct {
	seed       uint64
	input      []kv // compaction inputs, internal order
	lower      []kv // data below the output (non-bottommost only)
	ts         tombs
	snaps      []base.SeqNum
	horizon    base.SeqNum // 0: none
	bottommost bool
	merger     bool
	filter     bool
	elide      bool // ElideTombstone set: true for keys without lower data
}

func genCase(seed uint64) *modelCase {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	c := &modelCase{
		seed:       seed,
		bottommost: rng.IntN(2) == 0,
		merger:     rng.IntN(5) != 0,
		filter:     rng.IntN(2) == 0,
	}
	keys := modelKeys[:2+rng.IntN(len(modelKeys)-1)]
	// Inputs use seqs from 100 up; lower-level data 1..99.
	seq := base.SeqNum(100)
	n := rng.IntN(45)
	for range n {
		seq += base.SeqNum(1 + rng.IntN(2)) // leave gaps for snapshots
		if rng.IntN(10) == 0 {
			i := rng.IntN(len(tombBounds) - 1)
			j := i + 1 + rng.IntN(len(tombBounds)-1-i)
			c.ts = append(c.ts, tomb{start: tombBounds[i], end: tombBounds[j], seq: seq})
			continue
		}
		k := keys[rng.IntN(len(keys))]
		switch r := rng.IntN(10); {
		case r < 4:
			c.input = append(c.input, kv{base.MakeInternalKey([]byte(k), seq, base.KindSet), fmt.Appendf(nil, "v%d", seq)})
		case r < 6:
			c.input = append(c.input, kv{base.MakeInternalKey([]byte(k), seq, base.KindDelete), nil})
		default:
			c.input = append(c.input, kv{base.MakeInternalKey([]byte(k), seq, base.KindMerge), fmt.Appendf(nil, "m%d", seq)})
		}
	}
	maxSeq := seq
	if c.bottommost {
		// Entries zeroed by an earlier bottommost compaction.
		for _, k := range keys {
			if rng.IntN(4) == 0 {
				c.input = append(c.input, kv{base.MakeInternalKey([]byte(k), 0, base.KindSet), []byte("z" + k)})
			}
		}
	} else {
		lseq := base.SeqNum(0)
		for _, k := range keys {
			for range rng.IntN(3) {
				lseq += base.SeqNum(1 + rng.IntN(5))
				kind := []base.Kind{base.KindSet, base.KindSet, base.KindDelete, base.KindMerge}[rng.IntN(4)]
				var v []byte
				if kind != base.KindDelete {
					v = fmt.Appendf(nil, "L%d", lseq)
				}
				c.lower = append(c.lower, kv{base.MakeInternalKey([]byte(k), lseq, kind), v})
			}
		}
		c.elide = rng.IntN(2) == 0
	}
	sortKVs(c.input)
	for range rng.IntN(5) {
		var s base.SeqNum
		if rng.IntN(8) == 0 {
			s = base.SeqNum(rng.IntN(100)) // below all inputs
		} else {
			s = 100 + base.SeqNum(rng.IntN(int(maxSeq-100)+3))
		}
		c.snaps = append(c.snaps, s)
	}
	slices.Sort(c.snaps)
	if rng.IntN(3) == 0 {
		// A history horizon somewhere in (or just past) the inputs.
		c.horizon = 95 + base.SeqNum(rng.IntN(int(maxSeq-95)+3))
	}
	return c
}

// maxSeq returns the largest seq of the inputs and tombstones.
func (c *modelCase) maxSeq() base.SeqNum {
	var m base.SeqNum
	for _, e := range c.input {
		m = max(m, e.k.SeqNum())
	}
	for _, t := range c.ts {
		m = max(m, t.seq)
	}
	return m
}

// newestSeq returns the seq of key's newest input entry (0 when none).
func (c *modelCase) newestSeq(key string) base.SeqNum {
	var m base.SeqNum
	for _, e := range c.input {
		if string(e.k.UserKey) == key {
			m = max(m, e.k.SeqNum())
		}
	}
	return m
}

func (c *modelCase) hasLower(key []byte) bool {
	for _, e := range c.lower {
		if string(e.k.UserKey) == string(key) {
			return true
		}
	}
	return false
}

func (c *modelCase) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed=%d bottommost=%v merger=%v filter=%v elide=%v snapshots=%v horizon=%d\n",
		c.seed, c.bottommost, c.merger, c.filter, c.elide, c.snaps, c.horizon)
	b.WriteString("input:\n")
	for _, e := range c.input {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	fmt.Fprintf(&b, "tombstones: %v\n", []tomb(c.ts))
	if len(c.lower) > 0 {
		b.WriteString("lower:\n")
		for _, e := range c.lower {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	return b.String()
}

// runModel compacts c and checks the output against the naive reader. It
// returns a description of the first discrepancy, or "".
func runModel(c *modelCase) (problem string, out []kv) {
	flt := &testFilter{wantLevel: 4}
	opts := Options{
		Snapshots:   c.snaps,
		Horizon:     c.horizon,
		Bottommost:  c.bottommost,
		OutputLevel: 4,
	}
	if c.merger {
		opts.Merger = concatMerger{}
	}
	if c.filter {
		opts.Filter = flt
	}
	if len(c.ts) > 0 {
		opts.RangeDels = c.ts
	}
	if c.elide {
		opts.ElideTombstone = func(k []byte) bool { return !c.hasLower(k) }
	}
	in := newSliceIter(c.input)
	it := New(in, opts)
	out, err := runIter(it)
	if err != nil {
		return fmt.Sprintf("iteration error: %v", err), out
	}
	if err := it.Close(); err != nil || !in.closed {
		return fmt.Sprintf("close: %v (input closed %v)", err, in.closed), out
	}
	if err := checkOrder(out); err != nil {
		return err.Error(), out
	}
	if flt.badLevel {
		return "filter called with the wrong level", out
	}
	st := it.Stats()
	if st.EntriesIn != int64(len(c.input)) || st.EntriesOut != int64(len(out)) {
		return fmt.Sprintf("stats in/out %d/%d, want %d/%d", st.EntriesIn, st.EntriesOut, len(c.input), len(out)), out
	}
	if sum := st.EntriesOut + st.DroppedShadowed + st.DroppedByTombstone + st.DroppedByFilter + st.ElidedDeletes + st.Merged; sum != st.EntriesIn {
		return fmt.Sprintf("stats do not add up: %+v", st), out
	}
	for _, e := range out {
		if !c.bottommost && e.k.SeqNum() < 100 {
			return fmt.Sprintf("seq zeroed at non-bottommost: %s", e), out
		}
	}

	var kept tombs
	tombSnaps := c.snaps
	if c.horizon > 0 {
		tombSnaps = append(slices.Clone(c.snaps), c.horizon-1)
	}
	for _, t := range c.ts {
		if TombstoneNeeded(t.seq, tombSnaps, c.bottommost) {
			kept = append(kept, t)
		}
	}
	before := append(slices.Clone(c.input), c.lower...)
	after := append(slices.Clone(out), c.lower...)
	views := append(slices.Clone(c.snaps), base.MaxSeqNum)
	if c.horizon > 0 {
		// Every seq from H-1 on reads as a snapshot would.
		for s := c.horizon - 1; s <= c.maxSeq()+1; s++ {
			views = append(views, s)
		}
	}
	var maxSnap base.SeqNum
	if len(c.snaps) > 0 {
		maxSnap = c.snaps[len(c.snaps)-1]
	}
	for _, snap := range views {
		for _, k := range modelKeys {
			want := naiveGet(before, c.ts, k, snap)
			got := naiveGet(after, kept, k, snap)
			// Views that may see the filter's verdict: the latest; with a
			// horizon, also every view at or above the key's newest
			// version when no snapshot sees that version.
			filterView := snap == base.MaxSeqNum
			if c.horizon > 0 && !slices.Contains(c.snaps, snap) {
				if n := c.newestSeq(k); n > maxSnap && snap >= n {
					filterView = true
				}
			}
			if c.filter && filterView && filterAffects(k) {
				// The latest view may see the filter's verdict on the
				// newest value, and must when there is nothing else.
				fv := result{}
				if want.found && strings.HasSuffix(k, "y") {
					fv = result{found: true, val: string(filtered([]byte(want.val)))}
				}
				strict := c.bottommost && len(c.snaps) == 0 && c.merger && c.horizon == 0
				if got != fv && (strict || got != want) {
					return fmt.Sprintf("latest view of filtered key %q: got %s, want %s (filtered) or %s (strict=%v)", k, got, fv, want, strict), out
				}
				continue
			}
			if got != want {
				return fmt.Sprintf("key %q at snapshot %d: got %s, want %s", k, snap, got, want), out
			}
		}
	}
	return "", out
}

func TestModel(t *testing.T) {
	seeds := *seedsFlag
	if testing.Short() {
		seeds = 300
	}
	first := uint64(1)
	if *seedFlag != 0 {
		first, seeds = *seedFlag, 1
	}
	failures := 0
	for seed := first; seed < first+uint64(seeds); seed++ {
		c := genCase(seed)
		if problem, out := runModel(c); problem != "" {
			var b strings.Builder
			for _, e := range out {
				fmt.Fprintf(&b, "  %s\n", e)
			}
			t.Errorf("seed %d: %s\n%soutput:\n%s(rerun with -seed=%d)", seed, problem, c, b.String(), seed)
			if failures++; failures >= 5 {
				t.FailNow()
			}
		}
	}
}
