package storage

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

const apiMaxPacingDelay = 100 * time.Millisecond

// TestAPIWriteControllerDelay: no delay without pressure; the delay grows
// with pressure and with the write's size; a single write never waits more
// than the cap; tiny delays are not slept.
func TestAPIWriteControllerDelay(t *testing.T) {
	now := time.Unix(1000, 0)
	const n = 10 << 10

	c := newWriteController(2)
	if d := c.delay(n, now); d != 0 {
		t.Fatalf("delay at zero pressure: %v", d)
	}
	c.setState(0, 1)
	for i := 0; i < 100; i++ {
		if d := c.delay(1<<20, now); d != 0 {
			t.Fatalf("delay at zero pressure after %d writes: %v", i, d)
		}
	}

	// Fresh controllers (empty token bucket), nothing measured: the rate is
	// minPacedRate*2*(1-p), floored at minPacedRate/20.
	prev := time.Duration(0)
	for _, p := range []float64{0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1} {
		c := newWriteController(2)
		c.setState(p, 1)
		d := c.delay(n, now)
		rate := math.Max(minPacedRate*2*(1-p), minPacedRate/20.0)
		want := time.Duration(float64(n) / rate * float64(time.Second))
		if want > apiMaxPacingDelay {
			want = apiMaxPacingDelay
		}
		if diff := d - want; diff < -time.Microsecond || diff > time.Microsecond {
			t.Errorf("pressure %.2f: delay %v, want %v", p, d, want)
		}
		if d < prev {
			t.Errorf("pressure %.2f: delay %v below the delay %v at lower pressure", p, d, prev)
		}
		prev = d
	}
	if prev != apiMaxPacingDelay {
		t.Errorf("delay at full pressure for %d bytes = %v, want the %v cap", n, prev, apiMaxPacingDelay)
	}

	// At pressure 0.5 the allowed rate equals the absorb rate.
	c = newWriteController(1)
	c.reportFlush(4<<20, time.Second) // 4 MiB/s, nothing else measured
	c.setState(0.5, 1)
	if d, want := c.delay(40<<10, now), 9765625*time.Nanosecond; d < want-time.Microsecond || d > want+time.Microsecond {
		t.Errorf("40 KiB at pressure 0.5 and 4 MiB/s absorb: delay %v, want %v", d, want)
	}

	// Tiny writes are not slept, but their bytes are charged: the bucket
	// fills until a write has to wait.
	c = newWriteController(1)
	c.setState(0.5, 1)
	var first time.Duration = -1
	for i := 0; i < 100; i++ {
		d := c.delay(100, now)
		if d > 0 && first < 0 {
			first = time.Duration(i)
		}
	}
	if first < 0 {
		t.Error("100 small writes at the same instant were never delayed")
	}

	// The cap holds for every write, however far behind the bucket is, and
	// the bucket carries the excess to later writes.
	c = newWriteController(1)
	c.setState(1, 1)
	for i := 0; i < 200; i++ {
		d := c.delay(1<<20, now.Add(time.Duration(i)*time.Millisecond))
		if d > apiMaxPacingDelay {
			t.Fatalf("write %d delayed %v, above the %v cap", i, d, apiMaxPacingDelay)
		}
		if i > 0 && d != apiMaxPacingDelay {
			t.Fatalf("write %d behind a full bucket delayed only %v", i, d)
		}
	}
	if _, _, delayed := c.stats(); delayed != 200*apiMaxPacingDelay {
		t.Errorf("cumulative pacing delay %v, want %v", delayed, 200*apiMaxPacingDelay)
	}

	// Back at zero pressure the backlog is forgotten.
	c.setState(0, 1)
	if d := c.delay(1<<20, now); d != 0 {
		t.Errorf("delay after pressure dropped to zero: %v", d)
	}
	c.setState(0.5, 1)
	if d := c.delay(1<<10, now.Add(time.Hour)); d > 5*time.Millisecond {
		t.Errorf("after pressure returned, a 1 KiB write waited %v: old backlog kept", d)
	}
}

// TestAPIWriteControllerAbsorbRate: the absorb rate combines the flush and
// compaction throughputs, the write amplification and the compaction slots.
func TestAPIWriteControllerAbsorbRate(t *testing.T) {
	c := newWriteController(2)
	if _, a, _ := c.stats(); a != 0 {
		t.Fatalf("absorb rate with nothing measured: %v", a)
	}
	c.reportFlush(0, time.Second) // ignored
	c.reportFlush(1<<20, 0)       // ignored
	if _, a, _ := c.stats(); a != 0 {
		t.Fatalf("absorb rate after empty reports: %v", a)
	}
	c.reportFlush(10<<20, time.Second) // 10 MiB/s
	if _, a, _ := c.stats(); math.Abs(a-10<<20) > 1 {
		t.Fatalf("flush only: absorb %v, want %v", a, 10<<20)
	}
	c.reportFlush(20<<20, time.Second) // ewma: 0.7*10 + 0.3*20 = 13 MiB/s
	if _, a, _ := c.stats(); math.Abs(a-13<<20) > 1 {
		t.Fatalf("flush ewma: absorb %v, want %v", a, 13<<20)
	}
	c.reportCompaction(8<<20, 2*time.Second) // 4 MiB/s per compaction
	c.setState(0.3, 3)                       // write amp 3
	// secs per byte: 1/13Mi + 3/(4Mi*2)
	want := 1 / (1/float64(13<<20) + 3/(float64(4<<20)*2))
	if p, a, _ := c.stats(); math.Abs(a-want) > 1e-6*want || p != 0.3 {
		t.Fatalf("absorb %v pressure %v, want %v and 0.3", a, p, want)
	}
	// Write amplification is capped at 30 and ignored below 1; pressure is
	// clamped to [0, 1].
	c.setState(7, 1000)
	want = 1 / (1/float64(13<<20) + 30/(float64(4<<20)*2))
	if p, a, _ := c.stats(); math.Abs(a-want) > 1e-6*want || p != 1 {
		t.Fatalf("absorb %v pressure %v, want %v and 1", a, p, want)
	}
	c.setState(-1, 0.5)
	if p, a, _ := c.stats(); math.Abs(a-want) > 1e-6*want || p != 0 {
		t.Fatalf("absorb %v pressure %v after a write amp below 1, want %v and 0", a, p, want)
	}

	for _, tc := range []struct{ v, lo, hi, want float64 }{
		{0, 1, 3, 0}, {1, 1, 3, 0}, {2, 1, 3, 0.5}, {3, 1, 3, 1}, {9, 1, 3, 1}, {5, 4, 4, 1},
	} {
		if got := linearPressure(tc.v, tc.lo, tc.hi); got != tc.want {
			t.Errorf("linearPressure(%v, %v, %v) = %v, want %v", tc.v, tc.lo, tc.hi, got, tc.want)
		}
	}
}

// TestAPIWritePacingKeepsWritesFlowing: with a tiny memtable and slow SST
// writes the engine falls behind; pacing then delays writes (PacingDelay >
// 0) but every one-second span still completes writes.
func TestAPIWritePacingKeepsWritesFlowing(t *testing.T) {
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.Latency(
		errorfs.And(errorfs.Ops(errorfs.OpWrite, errorfs.OpSync), errorfs.PathSuffix(".sst")),
		2*time.Millisecond))
	opts := apiSmallOptions(fs)
	opts.MemTableSize = 64 << 10
	opts.L0CompactionTrigger = 2
	opts.L0SlowdownTrigger = 6
	opts.L0StopTrigger = 12
	opts.MaxConcurrentCompactions = 1
	opts.Shared = NewShared(&SharedOptions{CompactionWorkers: 1, FlushWorkers: 1})
	defer opts.Shared.Close()
	d := apiMustOpen(t, "db", opts)
	defer d.Close()

	const (
		window   = 100 * time.Millisecond
		duration = 3 * time.Second
		writers  = 2
	)
	nWindows := int(duration / window)
	counts := make([]atomic.Int64, nWindows+1)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, writers)
	var total atomic.Int64
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			val := make([]byte, 200)
			for i := 0; ; i++ {
				if time.Since(start) >= duration {
					return
				}
				k := fmt.Appendf(nil, "w%d-%07d", w, i%20000)
				if err := d.Set(k, val, NoSync); err != nil {
					errs[w] = err
					return
				}
				total.Add(1)
				if idx := int(time.Since(start) / window); idx <= nWindows {
					counts[idx].Add(1)
				}
			}
		}(w)
	}
	// Watchdog: if no write completes for 700 ms, capture every goroutine's
	// stack, to show where writers wait should the check below fail. It
	// also counts heartbeats per window: a window with almost none means
	// the whole process was not scheduled (a loaded test machine), which
	// says nothing about the engine.
	var stacks []byte
	beats := make([]atomic.Int64, nWindows+1)
	watchdogDone := make(chan struct{})
	go func() {
		defer close(watchdogDone)
		last, lastChange := total.Load(), time.Now()
		for time.Since(start) < duration {
			time.Sleep(5 * time.Millisecond)
			if idx := int(time.Since(start) / window); idx <= nWindows {
				beats[idx].Add(1)
			}
			if n := total.Load(); n != last {
				last, lastChange = n, time.Now()
			} else if stacks == nil && time.Since(lastChange) > 700*time.Millisecond {
				buf := make([]byte, 1<<20)
				stacks = buf[:runtime.Stack(buf, true)]
			}
		}
	}()
	wg.Wait()
	<-watchdogDone
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	m := d.Metrics()
	var hist []int64
	for i := 0; i < nWindows; i++ {
		hist = append(hist, counts[i].Load())
	}
	t.Logf("%d writes; per 100ms: %v", total.Load(), hist)
	t.Logf("pacing delay %v, pressure %.2f, absorb %.0f B/s, stalls %d (%v), flushes %d, compactions %d, L0 %d",
		m.PacingDelay, m.WritePressure, m.PacingAbsorbRate, m.Stalls, m.StallTime, m.Flushes, m.Compactions, m.Levels[0].Files)
	var beatHist []int64
	for i := 0; i < nWindows; i++ {
		beatHist = append(beatHist, beats[i].Load())
	}
	empty, starved := 0, 0
	for i, c := range hist {
		if c == 0 && beatHist[i] < 3 { // ~20 expected: the process was starved
			starved++
			continue
		}
		if c == 0 {
			empty++
			if empty >= 10 {
				t.Logf("heartbeats per 100ms: %v", beatHist)
				t.Logf("goroutines during the gap:\n%s", stacks)
				t.Fatalf("no write completed in the 1s span ending at window %d (per-100ms counts %v)", i, hist)
			}
		} else {
			empty = 0
		}
	}
	if starved > nWindows/3 {
		t.Skipf("the test process was starved of CPU in %d of %d windows (heartbeats %v): inconclusive", starved, nWindows, beatHist)
	}
	if m.PacingDelay <= 0 {
		t.Errorf("the engine fell behind (flushes %d, compactions %d) but writes were never paced", m.Flushes, m.Compactions)
	}
	if m.Flushes < 3 {
		t.Errorf("only %d flushes: the workload did not stress background work", m.Flushes)
	}
}

// TestAPIWriteControllerRecoversAfterOverload: when many writers outrun even
// the strongest pacing, the per-write cap leaves part of each write's charge
// in the token bucket. Once the pressure eases the allowed rate must rise
// promptly: the debt of the overload may not keep every write at the cap
// for as long as the overload lasted.
//
// Simulated with a virtual clock: 8 writers of 4 KiB at pressure 1 for 10 s,
// then pressure 0.1 (allowed rate 1.8 MiB/s, about 0.5 ms of charge per
// 1 KiB write). Two seconds later writes must no longer wait the cap.
func TestAPIWriteControllerRecoversAfterOverload(t *testing.T) {
	c := newWriteController(1)
	c.setState(1, 1)
	start := time.Unix(1000, 0)
	clocks := make([]time.Time, 8)
	for i := range clocks {
		clocks[i] = start
	}
	// run advances the writers until the virtual time reaches until and
	// returns the number of writes and the largest delay seen after from.
	run := func(n int, from, until time.Time) (writes int, maxAfter time.Duration) {
		for {
			w := 0
			for i := range clocks {
				if clocks[i].Before(clocks[w]) {
					w = i
				}
			}
			if !clocks[w].Before(until) {
				return writes, maxAfter
			}
			d := c.delay(n, clocks[w])
			if d > apiMaxPacingDelay {
				t.Fatalf("delay %v above the cap", d)
			}
			if !clocks[w].Before(from) && d > maxAfter {
				maxAfter = d
			}
			clocks[w] = clocks[w].Add(d + 50*time.Microsecond)
			writes++
		}
	}
	overloadEnd := start.Add(10 * time.Second)
	run(4<<10, start, overloadEnd)
	c.setState(0.1, 1)
	writes, maxAfter := run(1<<10, overloadEnd.Add(2*time.Second), overloadEnd.Add(4*time.Second))
	t.Logf("after the overload: %d writes in 4 s, largest delay in the last 2 s %v", writes, maxAfter)
	if maxAfter >= apiMaxPacingDelay {
		t.Fatalf("2 s after the pressure dropped to 0.1, 1 KiB writes still wait the %v cap: the overload's debt outlives it", apiMaxPacingDelay)
	}
}
