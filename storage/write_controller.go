package storage

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// writeController paces user writes to what background work can absorb, so
// that the hard limits (too many memtables, too many L0 files) that stop
// writes are rarely reached. This is the ArangoDB fix to RocksDB's stalls:
// measure the rate at which flushes and compactions actually drain data,
// and when the engine falls behind, slow writers smoothly to that rate
// instead of letting them run until everything stops.
//
// Pressure is a number in [0, 1] derived from the engine's state (queued
// memtables, L0 files, compaction debt). With no pressure writes are not
// delayed. Otherwise the allowed user write rate is
//
//	absorb * 2 * (1 - pressure), floored at absorb/20,
//
// where absorb is the measured number of user bytes per second that flushes
// plus compactions can process (accounting for write amplification). The
// controller settles where the allowed rate equals absorb, at pressure 0.5.
// Delays are applied through a token bucket, so each write waits in
// proportion to its size and no one-second interval is left empty.
type writeController struct {
	// active is true while pressure > 0, letting writers skip the
	// controller entirely (no lock, no clock read) when it is idle.
	active atomic.Bool
	mu     sync.Mutex
	// flushBW and compactBW are smoothed throughputs (bytes/s) of flushes
	// (memtable bytes in) and compactions (input bytes).
	flushBW   float64
	compactBW float64
	// writeAmp is the current compaction write amplification estimate.
	writeAmp float64
	// compactionSlots is how many compactions may run at once.
	compactionSlots float64
	pressure        float64
	next            time.Time
	// delayed accumulates the time writers were delayed by pacing.
	delayed time.Duration
}

// minPacedRate is the floor of the allowed rate, in bytes per second, when
// nothing has been measured yet.
const minPacedRate = 1 << 20

// maxPacingDebt bounds how far ahead of now the token bucket may run: the
// bytes that capped delays leave unpaid are carried to later writes only up
// to this much time.
const maxPacingDebt = time.Second

func newWriteController(slots int) *writeController {
	return &writeController{writeAmp: 1, compactionSlots: float64(max(1, slots))}
}

// ewma folds sample into avg with weight 0.3 (0 means unset).
func ewma(avg, sample float64) float64 {
	if avg == 0 {
		return sample
	}
	return 0.7*avg + 0.3*sample
}

// reportFlush records a flush of n memtable bytes that took d.
func (c *writeController) reportFlush(n uint64, d time.Duration) {
	if d <= 0 || n == 0 {
		return
	}
	c.mu.Lock()
	c.flushBW = ewma(c.flushBW, float64(n)/d.Seconds())
	c.mu.Unlock()
}

// reportCompaction records a compaction that read n bytes in d.
func (c *writeController) reportCompaction(n uint64, d time.Duration) {
	if d <= 0 || n == 0 {
		return
	}
	c.mu.Lock()
	c.compactBW = ewma(c.compactBW, float64(n)/d.Seconds())
	c.mu.Unlock()
}

// setState updates the pressure and the write amplification estimate.
func (c *writeController) setState(pressure, writeAmp float64) {
	c.mu.Lock()
	c.pressure = math.Max(0, math.Min(1, pressure))
	c.active.Store(c.pressure > 0)
	if writeAmp >= 1 {
		c.writeAmp = math.Min(writeAmp, 30)
	}
	c.mu.Unlock()
}

// absorbRateLocked returns the user bytes per second background work can
// absorb: the time to flush a byte plus the time to compact it writeAmp
// times across the available compaction slots.
func (c *writeController) absorbRateLocked() float64 {
	var secsPerByte float64
	if c.flushBW > 0 {
		secsPerByte += 1 / c.flushBW
	}
	if c.compactBW > 0 {
		secsPerByte += c.writeAmp / (c.compactBW * c.compactionSlots)
	}
	if secsPerByte == 0 {
		return 0
	}
	return 1 / secsPerByte
}

// delay returns how long a write of n bytes must wait, and reserves its
// slot in the token bucket.
func (c *writeController) delay(n int, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pressure <= 0 {
		c.next = time.Time{}
		return 0
	}
	absorb := c.absorbRateLocked()
	if absorb == 0 {
		absorb = minPacedRate
	}
	rate := math.Max(absorb*2*(1-c.pressure), absorb/20)
	if c.next.Before(now) {
		c.next = now
	}
	c.next = c.next.Add(time.Duration(float64(n) / rate * float64(time.Second)))
	if limit := now.Add(maxPacingDebt); c.next.After(limit) {
		// Writers outrun even capped delays: forget the older debt, or it
		// would hold every write at the cap long after the pressure eased.
		c.next = limit
	}
	d := c.next.Sub(now)
	if d < time.Millisecond {
		return 0
	}
	// Never hold one writer for long: the bucket still charges the bytes,
	// so later writes pay the rest.
	d = min(d, 100*time.Millisecond)
	c.delayed += d
	return d
}

// stats returns the pacing state for metrics.
func (c *writeController) stats() (pressure, absorb float64, delayed time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pressure, c.absorbRateLocked(), c.delayed
}

// linearPressure maps v in [lo, hi] to [0, 1].
func linearPressure(v, lo, hi float64) float64 {
	if v <= lo {
		return 0
	}
	if v >= hi || hi <= lo {
		return 1
	}
	return (v - lo) / (hi - lo)
}
