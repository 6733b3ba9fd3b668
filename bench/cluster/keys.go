package cluster

import (
	"math"
	"math/rand/v2"
)

// KeySize is the size of every benchmark key in bytes.
const KeySize = 16

// DefaultValueSize is the default value size in bytes, as in etcd's
// benchmark documentation.
const DefaultValueSize = 256

// mix64 is splitmix64's finalizer, a bijection on uint64 that spreads
// consecutive record numbers over the whole range.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

const hexDigits = "0123456789abcdef"

// AppendKey appends the key of record i (16 lowercase hex digits of
// mix64(i)) to dst.
func AppendKey(dst []byte, i uint64) []byte {
	v := mix64(i)
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hexDigits[(v>>uint(shift))&0xf])
	}
	return dst
}

// values hands out fixed-size values: windows of a 1 MiB buffer of random
// printable bytes. It is shared (read-only) by every client.
type values struct {
	size int
	data []byte
}

func newValues(size int, seed uint64) *values {
	size = max(size, 1)
	n := max(1<<20, 2*size)
	r := newRand(seed, 0xa1)
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(' ' + r.IntN(95))
	}
	return &values{size: size, data: data}
}

// pick returns a value chosen with r; it is never modified.
func (v *values) pick(r *rand.Rand) []byte {
	off := r.IntN(len(v.data) - v.size + 1)
	return v.data[off : off+v.size]
}

// newRand returns the deterministic generator of one (seed, stream) pair.
func newRand(seed, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream^0x9e3779b97f4a7c15))
}

// ZipfianTheta is YCSB's default zipfian constant.
const ZipfianTheta = 0.99

// Zipfian draws integers in [0, n) with a zipfian distribution: item k
// (0-based) has probability proportional to 1/(k+1)^theta. It is YCSB's
// ZipfianGenerator (Gray et al., "Quickly generating billion-record
// synthetic databases", SIGMOD 1994). A Zipfian is immutable after
// NewZipfian and safe for concurrent use; every caller brings its own
// random source.
type Zipfian struct {
	n     uint64
	theta float64
	alpha float64
	zetaN float64
	eta   float64
	half  float64 // 1 + 0.5^theta
}

// NewZipfian returns a generator over [0, n) with constant theta in (0, 1).
// It computes zeta(n, theta) once, in O(n).
func NewZipfian(n uint64, theta float64) *Zipfian {
	n = max(n, 1)
	zeta2 := zeta(2, theta)
	zetaN := zeta(n, theta)
	z := &Zipfian{
		n:     n,
		theta: theta,
		alpha: 1 / (1 - theta),
		zetaN: zetaN,
		half:  1 + math.Pow(0.5, theta),
	}
	if n > 1 {
		z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta2/zetaN)
	}
	return z
}

func zeta(n uint64, theta float64) float64 {
	var s float64
	for i := uint64(1); i <= n; i++ {
		s += 1 / math.Pow(float64(i), theta)
	}
	return s
}

// N is the number of items.
func (z *Zipfian) N() uint64 { return z.n }

// Next draws the next item using r.
func (z *Zipfian) Next(r *rand.Rand) uint64 {
	u := r.Float64()
	uz := u * z.zetaN
	if uz < 1 || z.n == 1 {
		return 0
	}
	if uz < z.half {
		return 1
	}
	k := uint64(float64(z.n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
	return min(k, z.n-1)
}
