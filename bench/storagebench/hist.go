package storagebench

import (
	"math"
	"math/bits"
	"time"
)

// histSubBits sets the histogram's precision: every power of two is split
// into 2^histSubBits buckets, so a recorded value is off by at most 1/64
// (about 1.6%) of itself. Values below 128 ns are exact.
const histSubBits = 6

// histBuckets covers every uint64 value.
const histBuckets = (64 - histSubBits) << histSubBits

// Histogram is a log-bucketed latency histogram in the spirit of HDR
// histograms: constant-time Record, fixed memory (about 30 KiB), bounded
// relative error. The zero value is ready to use. It is not safe for
// concurrent use.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	min    uint64
	max    uint64
	sum    float64
}

// bucketOf maps a value to its bucket index: exact below 2^(histSubBits+1),
// then 2^histSubBits buckets per power of two.
func bucketOf(v uint64) int {
	if v < 1<<(histSubBits+1) {
		return int(v)
	}
	shift := bits.Len64(v) - histSubBits - 1
	return (shift+1)<<histSubBits + int(v>>uint(shift)) - 1<<histSubBits
}

// bucketBounds returns the smallest and largest value of bucket i.
func bucketBounds(i int) (lo, hi uint64) {
	if i < 1<<(histSubBits+1) {
		return uint64(i), uint64(i)
	}
	shift := i>>histSubBits - 1
	m := uint64(i&(1<<histSubBits-1) + 1<<histSubBits)
	lo = m << uint(shift)
	hi = lo + (1 << uint(shift)) - 1
	return lo, hi
}

// Record adds one observation.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.n }

// Max is the largest observation (exact).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Min is the smallest observation (exact).
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Mean is the average observation.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the value at quantile q in [0, 1]: the midpoint of the
// bucket holding the ceil(q*n)-th smallest observation, clamped to the
// exact min and max.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		seen += c
		if seen >= rank {
			lo, hi := bucketBounds(i)
			v := lo + (hi-lo)/2
			v = min(max(v, h.min), h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}

// Merge adds the observations of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}
