// Package bloom implements the bloom filter stored in Shale SST files.
//
// The filter and its hash are part of the on-disk format: both are fully
// deterministic (no per-process seeds) and must never change for a given
// format version.
//
// # Encoding
//
// A filter is m filter bytes (m >= 8) followed by one byte k, the number of
// probes (1 <= k <= MaxProbes). Bit i of the filter is bit (i%8) of byte i/8.
// Let nbits = 8*m and h = Hash(key). The probes are the bits
//
//	h % nbits, (h+d) % nbits, (h+2d) % nbits, ...   (k probes, 64-bit wrapping adds)
//
// where d = h>>33 | h<<31 (h rotated right by 33). A key may be in the set
// only if every probe bit is set.
//
// # Hash
//
// Hash is a 64-bit hash written for this package: the input is consumed in
// little-endian 8-byte words (the 1..7 byte tail is zero-padded into a final
// word); each word w updates the state s (initially
// 0x9e3779b97f4a7c15 ^ len*0xa0761d6478bd642f) as
// s = rotl64(s ^ (w * 0xe7037ed1a0b428db), 31) * 0xa0761d6478bd642f + 0x8ebc6af09c88c6e3,
// and the result is the state run through the finaliser
// x ^= x>>30; x *= 0xbf58476d1ce4e5b9; x ^= x>>27; x *= 0x94d049bb133111eb; x ^= x>>31.
package bloom

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
)

// MaxProbes is the largest number of probes a valid filter may use.
const MaxProbes = 30

// minFilterBytes is the smallest filter body the Builder produces.
const minFilterBytes = 8

const (
	hInit = 0x9e3779b97f4a7c15
	hMulA = 0xa0761d6478bd642f
	hMulB = 0xe7037ed1a0b428db
	hAdd  = 0x8ebc6af09c88c6e3
)

// Hash returns the deterministic 64-bit hash of b used for filter probes. Its
// value for a given input is part of the on-disk format and never changes.
func Hash(b []byte) uint64 {
	s := uint64(hInit) ^ uint64(len(b))*hMulA
	for len(b) >= 8 {
		s = step(s, binary.LittleEndian.Uint64(b))
		b = b[8:]
	}
	if len(b) > 0 {
		var w uint64
		for i := len(b) - 1; i >= 0; i-- {
			w = w<<8 | uint64(b[i])
		}
		s = step(s, w)
	}
	s ^= s >> 30
	s *= 0xbf58476d1ce4e5b9
	s ^= s >> 27
	s *= 0x94d049bb133111eb
	s ^= s >> 31
	return s
}

func step(s, w uint64) uint64 {
	return bits.RotateLeft64(s^(w*hMulB), 31)*hMulA + hAdd
}

// NumProbes returns the number of probes used for bitsPerKey bits per key:
// round(bitsPerKey * ln 2), clamped to [1, MaxProbes].
func NumProbes(bitsPerKey int) int {
	k := int(math.Round(float64(bitsPerKey) * math.Ln2))
	if k < 1 {
		k = 1
	}
	if k > MaxProbes {
		k = MaxProbes
	}
	return k
}

// Builder accumulates key hashes and builds a filter. The zero value is ready
// to use. A Builder is not safe for concurrent use.
type Builder struct {
	hashes []uint64
}

// AddKey adds key to the set.
func (b *Builder) AddKey(key []byte) { b.hashes = append(b.hashes, Hash(key)) }

// AddHash adds a key by its Hash value.
func (b *Builder) AddHash(h uint64) { b.hashes = append(b.hashes, h) }

// Len returns the number of hashes added since the last Reset (duplicates
// included).
func (b *Builder) Len() int { return len(b.hashes) }

// EstimatedSize returns the size Finish would produce for bitsPerKey.
func (b *Builder) EstimatedSize(bitsPerKey int) int {
	return filterBytes(len(b.hashes), bitsPerKey) + 1
}

// Reset forgets every added key, keeping allocated memory.
func (b *Builder) Reset() { b.hashes = b.hashes[:0] }

func filterBytes(n, bitsPerKey int) int {
	if bitsPerKey < 1 {
		bitsPerKey = 1
	}
	nb := (n*bitsPerKey + 7) / 8
	if nb < minFilterBytes {
		nb = minFilterBytes
	}
	return nb
}

// Finish appends the encoded filter for every added key to dst and returns
// it. The filter has no false negatives for added keys; with bitsPerKey = 10
// its false-positive rate is about 1%.
func (b *Builder) Finish(dst []byte, bitsPerKey int) []byte {
	nb := filterBytes(len(b.hashes), bitsPerKey)
	k := NumProbes(bitsPerKey)
	start := len(dst)
	dst = append(dst, make([]byte, nb+1)...)
	f := dst[start : start+nb]
	nbits := uint64(nb) * 8
	for _, h := range b.hashes {
		d := bits.RotateLeft64(h, -33)
		for i := 0; i < k; i++ {
			p := h % nbits
			f[p>>3] |= 1 << (p & 7)
			h += d
		}
	}
	dst[start+nb] = byte(k)
	return dst
}

// ErrInvalid is returned by Validate for a malformed filter.
var ErrInvalid = errors.New("bloom: malformed filter")

// Filter is an encoded filter as produced by Builder.Finish.
type Filter []byte

// Validate reports whether f is structurally valid (at least minimum size,
// probe count in range). MayContain on an invalid filter returns true.
func (f Filter) Validate() error {
	if len(f) < minFilterBytes+1 {
		return ErrInvalid
	}
	if k := f[len(f)-1]; k < 1 || k > MaxProbes {
		return ErrInvalid
	}
	return nil
}

// MayContain reports whether key may be in the set. It never returns false
// for a key that was added. It returns true for an invalid filter.
func (f Filter) MayContain(key []byte) bool { return f.MayContainHash(Hash(key)) }

// MayContainHash is MayContain for a key given by its Hash value.
func (f Filter) MayContainHash(h uint64) bool {
	if f.Validate() != nil {
		return true
	}
	k := int(f[len(f)-1])
	body := f[:len(f)-1]
	nbits := uint64(len(body)) * 8
	d := bits.RotateLeft64(h, -33)
	for i := 0; i < k; i++ {
		p := h % nbits
		if body[p>>3]&(1<<(p&7)) == 0 {
			return false
		}
		h += d
	}
	return true
}
