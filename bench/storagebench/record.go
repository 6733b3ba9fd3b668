package storagebench

import (
	"sync/atomic"
	"time"
)

// recorder times the operations of one measured phase. Operations are timed
// back to back with one clock read each: an operation's latency runs from
// the end of the previous one (or the start of the phase) to its own end,
// so it includes the benchmark's per-op work (picking and formatting the
// key), a few tens of nanoseconds. The same clock read attributes the
// operation to its wall-clock second, for min_ops_in_1s.
type recorder struct {
	start    time.Time
	last     time.Time
	end      time.Time
	hist     Histogram
	perSec   []int64
	ops      int64
	bytes    int64
	progress *atomic.Int64
}

func newRecorder(progress *atomic.Int64) *recorder {
	return &recorder{progress: progress, perSec: make([]int64, 0, 256)}
}

func (r *recorder) begin() {
	r.start = time.Now()
	r.last = r.start
}

// done records one timed operation that completed nops benchmark operations
// (1, or a batch's keys) and processed nbytes of keys and values.
func (r *recorder) done(nops, nbytes int64) {
	now := time.Now()
	r.hist.Record(now.Sub(r.last))
	r.last = now
	sec := int(now.Sub(r.start) / time.Second)
	for len(r.perSec) <= sec {
		r.perSec = append(r.perSec, 0)
	}
	r.perSec[sec] += nops
	r.ops += nops
	r.bytes += nbytes
	r.progress.Add(1)
}

func (r *recorder) finish() { r.end = time.Now() }

func (r *recorder) elapsed() time.Duration { return r.end.Sub(r.start) }

// wholeSeconds is the operations completed in each whole wall-clock second
// of the phase, in order (the partial last second left out).
func (r *recorder) wholeSeconds() []int64 {
	out := make([]int64, int(r.elapsed()/time.Second))
	copy(out, r.perSec)
	return out
}

// minOpsIn1s is the fewest operations completed in any whole wall-clock
// second of the phase (seconds counted from its start; the partial last
// second is left out), or all operations for a phase shorter than 1s.
// zeroSeconds counts the whole seconds with no operation completed.
func (r *recorder) minOpsIn1s() (minOps int64, zeroSeconds int) {
	full := int(r.elapsed() / time.Second)
	if full == 0 {
		return r.ops, 0
	}
	minOps = -1
	for s := range full {
		var n int64
		if s < len(r.perSec) {
			n = r.perSec[s]
		}
		if n == 0 {
			zeroSeconds++
		}
		if minOps < 0 || n < minOps {
			minOps = n
		}
	}
	return minOps, zeroSeconds
}
