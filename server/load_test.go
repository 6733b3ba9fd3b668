package server

import (
	"testing"
	"time"
)

// loadTicker drives a shard's load tracker on an injected clock: each step
// counts rate requests and ends a one-second tick led in term (0: not led).
type loadTicker struct {
	l   *shardLoad
	now time.Time
}

func newLoadTicker() *loadTicker {
	lt := &loadTicker{l: &shardLoad{}, now: time.Unix(1_800_000_000, 0)}
	lt.l.tick(lt.now, 0, 60) // the first tick only starts the clock
	return lt
}

func (lt *loadTicker) step(rate int, term uint64) {
	lt.l.ops.Add(uint64(rate))
	lt.now = lt.now.Add(time.Second)
	lt.l.tick(lt.now, term, 60)
}

// TestMergeGuardNeedsSustainedQuiet: two neighbours whose requests (45 a
// second, all on the right, against a guard of 30: half of a split
// threshold of 60) dip for a second, then for three, are not quiet enough to
// merge at any tick while the load runs; once it stops, they are after
// mergeQuietTicks quiet ticks, not one sooner. Before, the guard read the
// last tick's rate alone, and a single slow second merged the halves of a
// load split back under that load (TestAutomaticMergeCountsLoadLedElsewhere
// in loaded runs: 6.5-9.3 s after the split).
func TestMergeGuardNeedsSustainedQuiet(t *testing.T) {
	const splitQPS, term = 60, 7
	left, right := newLoadTicker(), newLoadTicker()
	load := make([]int, 40)
	for i := range load {
		load[i] = 45
	}
	load[12] = 20                          // one slow second
	load[20], load[21], load[22] = 0, 5, 3 // three
	for i, rate := range load {
		left.step(0, term)
		right.step(rate, term)
		if quietForMerge(left.l.report(term), right.l.report(term), splitQPS) {
			t.Fatalf("tick %d (%d requests/s, dips at 12 and 20-22): quiet enough to merge while the load runs (right's report %+v)",
				i, rate, right.l.report(term))
		}
	}
	for i := 1; i <= mergeQuietTicks; i++ {
		left.step(0, term)
		right.step(2, term)
		quiet := quietForMerge(left.l.report(term), right.l.report(term), splitQPS)
		if want := i == mergeQuietTicks; quiet != want {
			t.Fatalf("%d quiet ticks after the load: quiet enough to merge %v, want %v (reports %+v, %+v)",
				i, quiet, want, left.l.report(term), right.l.report(term))
		}
	}
	// Together over the guard, each under it: not quiet.
	for i := 0; i < mergeQuietTicks; i++ {
		left.step(16, term)
		right.step(16, term)
	}
	if quietForMerge(left.l.report(term), right.l.report(term), splitQPS) {
		t.Fatalf("16 + 16 requests a second passed a guard of 30 (reports %+v, %+v)", left.l.report(term), right.l.report(term))
	}
}

// TestMergeGuardCountsOnlyTicksLedInOneTerm: a node's load history counts
// for the merge guard only over ticks it led the shard through, in the
// term it still leads it in. A follower's quiet counts (clients send it
// nothing), a leadership just taken (its first tick was partly a
// follower's), or a history from an earlier term say nothing of the
// shard's load.
func TestMergeGuardCountsOnlyTicksLedInOneTerm(t *testing.T) {
	lt := newLoadTicker()
	for i := 0; i < 2*mergeQuietTicks; i++ {
		lt.step(0, 0)
	}
	if rep := lt.l.report(0); rep.ticks != 0 {
		t.Fatalf("a follower's history: %+v, want no ticks", rep)
	}
	lt.step(0, 3) // leadership taken during this tick: not led throughout
	if rep := lt.l.report(3); rep.ticks != 0 {
		t.Fatalf("after the tick a leadership began in: %+v, want no ticks", rep)
	}
	for i := 1; i <= mergeQuietTicks+2; i++ {
		lt.step(10, 3)
		want := loadReport{ticks: min(i, mergeQuietTicks), peak: 10}
		if rep := lt.l.report(3); rep != want {
			t.Fatalf("led tick %d: %+v, want %+v", i, rep, want)
		}
	}
	if rep := lt.l.report(4); rep.ticks != 0 {
		t.Fatalf("the term-3 history asked for in term 4: %+v, want no ticks", rep)
	}
	lt.step(10, 5) // a new term (the leadership lost and won back within the tick)
	if rep := lt.l.report(5); rep.ticks != 0 {
		t.Fatalf("after the tick a new term began in: %+v, want no ticks", rep)
	}
	// The peak is over the window only: a busy tick ages out.
	lt.step(50, 5)
	for i := 0; i < mergeQuietTicks; i++ {
		if rep := lt.l.report(5); rep.peak != 50 {
			t.Fatalf("%d ticks after a 50/s one: peak %v, want 50", i, rep.peak)
		}
		lt.step(1, 5)
	}
	if rep := lt.l.report(5); rep != (loadReport{ticks: mergeQuietTicks, peak: 1}) {
		t.Fatalf("a window after the busy tick: %+v, want %d ticks at peak 1", rep, mergeQuietTicks)
	}
}

// TestLoadSplitNeedsTicksLed: the load split's hot ticks count ticks above
// the threshold led by this node, and any other tick resets them.
func TestLoadSplitNeedsTicksLed(t *testing.T) {
	lt := newLoadTicker()
	for i, c := range []struct {
		rate int
		term uint64
		hot  int
	}{{100, 2, 1}, {100, 2, 2}, {100, 0, 0}, {100, 2, 1}, {30, 2, 0}, {61, 2, 1}, {61, 2, 2}} {
		lt.step(c.rate, c.term)
		lt.l.mu.Lock()
		hot := lt.l.hotTicks
		lt.l.mu.Unlock()
		if hot != c.hot {
			t.Fatalf("tick %d (%d/s, term %d): %d hot ticks, want %d", i, c.rate, c.term, hot, c.hot)
		}
	}
}
