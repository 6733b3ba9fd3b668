package storagebench

import (
	"encoding/binary"
	"math/rand/v2"
)

// KeyGen formats benchmark keys: key number n is stored as its big-endian
// uint64 in the first 8 bytes, the remaining bytes of the fixed key size are
// zero, as in db_bench. Keys therefore sort like their numbers and never
// start with 0xff.
//
// Workloads that fill a database write the even numbers 2*i for i in
// [0, num); the odd numbers in between are keys that are guaranteed absent,
// used by the miss lookups, so misses fall between existing keys (where
// only the bloom filters can answer them) rather than past the key range.
type KeyGen struct {
	size int
	buf  []byte
}

// NewKeyGen returns a key generator for keys of size bytes (at least 8).
func NewKeyGen(size int) *KeyGen {
	size = max(size, 8)
	return &KeyGen{size: size, buf: make([]byte, size)}
}

// Key returns key number n in a buffer reused by the next call.
func (g *KeyGen) Key(n uint64) []byte {
	binary.BigEndian.PutUint64(g.buf, n)
	return g.buf
}

// Present returns the key of the i-th stored record (number 2*i).
func (g *KeyGen) Present(i uint64) []byte { return g.Key(2 * i) }

// Absent returns a key that no workload ever stores (number 2*i+1).
func (g *KeyGen) Absent(i uint64) []byte { return g.Key(2*i + 1) }

// Size is the key size.
func (g *KeyGen) Size() int { return g.size }

// ValueGen hands out values of a fixed size that compress to about half
// their size: like db_bench's generator with compression ratio 0.5, a
// 1 MiB buffer is built from pieces of valueSize bytes whose first half is
// random and whose second half repeats the first half, and values are
// consecutive windows of that buffer.
type ValueGen struct {
	size int
	data []byte
	pos  int
}

// NewValueGen builds the value source from rng.
func NewValueGen(size int, rng *rand.Rand) *ValueGen {
	size = max(size, 1)
	n := max(1<<20, 2*size)
	data := make([]byte, 0, n+size)
	piece := make([]byte, size)
	for len(data) < n {
		half := (size + 1) / 2
		for i := range half {
			piece[i] = byte(' ' + rng.IntN(95)) // printable, like db_bench
		}
		for i := half; i < size; i++ {
			piece[i] = piece[i-half]
		}
		data = append(data, piece...)
	}
	return &ValueGen{size: size, data: data}
}

// Next returns the next value; it stays valid (it is never overwritten).
func (g *ValueGen) Next() []byte {
	if g.pos+g.size > len(g.data) {
		g.pos = 0
	}
	v := g.data[g.pos : g.pos+g.size]
	g.pos += g.size
	return v
}

// Size is the value size.
func (g *ValueGen) Size() int { return g.size }

// newRand returns the deterministic generator of one (seed, stream) pair.
func newRand(seed, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream^0x9e3779b97f4a7c15))
}
