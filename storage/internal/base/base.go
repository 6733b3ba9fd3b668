// Package base holds the types every part of the storage engine shares:
// internal keys with their sequence-number/kind trailer, the internal
// iterator contract, and the corruption error that names the damaged file.
//
// It imports nothing from the rest of the engine, so leaf packages (wal,
// sstable, memtable, manifest) can depend on it without cycles.
package base

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
)

// SeqNum is a sequence number. Every write consumes one; a snapshot is a
// sequence number below which (inclusive) writes are visible. Only the low
// 56 bits are usable because the trailer packs the kind in the low byte.
type SeqNum uint64

// MaxSeqNum is the largest usable sequence number.
const MaxSeqNum SeqNum = 1<<56 - 1

// Kind says what an internal key records.
type Kind uint8

// The kinds. Their numeric values are part of the on-disk format (WAL
// batches and SST keys) and must never change.
const (
	KindDelete      Kind = 0
	KindSet         Kind = 1
	KindMerge       Kind = 2
	KindLogData     Kind = 3 // only in batches/WAL, never in memtables or SSTs
	KindRangeDelete Kind = 15
	// KindMax sorts before every other kind of the same user key and
	// sequence number; it is used to build seek keys.
	KindMax Kind = 255
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindDelete:
		return "DEL"
	case KindSet:
		return "SET"
	case KindMerge:
		return "MERGE"
	case KindLogData:
		return "LOGDATA"
	case KindRangeDelete:
		return "RANGEDEL"
	case KindMax:
		return "MAX"
	}
	return "KIND(" + strconv.Itoa(int(k)) + ")"
}

// Valid reports whether k is a kind that may be stored in an SST or memtable.
func (k Kind) Valid() bool {
	switch k {
	case KindDelete, KindSet, KindMerge, KindRangeDelete:
		return true
	}
	return false
}

// Trailer packs a sequence number and a kind: seq<<8 | kind.
type Trailer uint64

// MakeTrailer builds a trailer.
func MakeTrailer(seq SeqNum, kind Kind) Trailer { return Trailer(uint64(seq)<<8 | uint64(kind)) }

// SeqNum returns the trailer's sequence number.
func (t Trailer) SeqNum() SeqNum { return SeqNum(t >> 8) }

// Kind returns the trailer's kind.
func (t Trailer) Kind() Kind { return Kind(t & 0xff) }

// TrailerLen is the encoded size of a trailer.
const TrailerLen = 8

// InternalKey is a user key with its trailer. Internal keys order by user key
// ascending, then trailer descending (newest first).
type InternalKey struct {
	UserKey []byte
	Trailer Trailer
}

// MakeInternalKey builds an internal key.
func MakeInternalKey(userKey []byte, seq SeqNum, kind Kind) InternalKey {
	return InternalKey{UserKey: userKey, Trailer: MakeTrailer(seq, kind)}
}

// MakeSearchKey returns the internal key that sorts before every version of
// userKey, i.e. the key at which a seek for userKey should start.
func MakeSearchKey(userKey []byte) InternalKey {
	return InternalKey{UserKey: userKey, Trailer: MakeTrailer(MaxSeqNum, KindMax)}
}

// MakeRangeDeleteSentinel returns the key used as an exclusive upper bound
// when a file's extent ends at a range tombstone's end key: it sorts after
// every real key with user key < end and before every real key with user
// key == end.
func MakeRangeDeleteSentinel(end []byte) InternalKey {
	return InternalKey{UserKey: end, Trailer: MakeTrailer(MaxSeqNum, KindRangeDelete)}
}

// IsExclusiveSentinel reports whether k is a range-deletion sentinel, an
// exclusive bound that covers no key with user key equal to k.UserKey.
func (k InternalKey) IsExclusiveSentinel() bool {
	return k.Trailer == MakeTrailer(MaxSeqNum, KindRangeDelete)
}

// SeqNum returns the key's sequence number.
func (k InternalKey) SeqNum() SeqNum { return k.Trailer.SeqNum() }

// Kind returns the key's kind.
func (k InternalKey) Kind() Kind { return k.Trailer.Kind() }

// Size returns the encoded size of the key.
func (k InternalKey) Size() int { return len(k.UserKey) + TrailerLen }

// Encode writes the key into buf, which must have room for k.Size() bytes.
func (k InternalKey) Encode(buf []byte) {
	n := copy(buf, k.UserKey)
	binary.LittleEndian.PutUint64(buf[n:], uint64(k.Trailer))
}

// AppendEncoded appends the encoded key to dst.
func (k InternalKey) AppendEncoded(dst []byte) []byte {
	dst = append(dst, k.UserKey...)
	return binary.LittleEndian.AppendUint64(dst, uint64(k.Trailer))
}

// Clone returns a copy of k that shares no memory with it.
func (k InternalKey) Clone() InternalKey {
	if k.UserKey == nil {
		return k
	}
	return InternalKey{UserKey: append([]byte(nil), k.UserKey...), Trailer: k.Trailer}
}

// String formats the key as "userkey#seq,KIND" with the user key quoted when
// it is not printable.
func (k InternalKey) String() string {
	return fmt.Sprintf("%s#%d,%s", FormatKey(k.UserKey), k.SeqNum(), k.Kind())
}

// DecodeInternalKey splits an encoded internal key. ok is false when the
// encoding is shorter than a trailer.
func DecodeInternalKey(enc []byte) (k InternalKey, ok bool) {
	n := len(enc) - TrailerLen
	if n < 0 {
		return InternalKey{}, false
	}
	return InternalKey{UserKey: enc[:n:n], Trailer: Trailer(binary.LittleEndian.Uint64(enc[n:]))}, true
}

// CompareInternal orders internal keys: user key ascending, trailer descending.
func CompareInternal(a, b InternalKey) int {
	if c := bytes.Compare(a.UserKey, b.UserKey); c != 0 {
		return c
	}
	switch {
	case a.Trailer > b.Trailer:
		return -1
	case a.Trailer < b.Trailer:
		return 1
	}
	return 0
}

// CompareEncodedInternal compares two encoded internal keys the way
// CompareInternal compares decoded ones. Malformed keys (shorter than a
// trailer) sort by their raw bytes before well-formed ones.
func CompareEncodedInternal(a, b []byte) int {
	ka, oka := DecodeInternalKey(a)
	kb, okb := DecodeInternalKey(b)
	if !oka || !okb {
		if oka != okb {
			if !oka {
				return -1
			}
			return 1
		}
		return bytes.Compare(a, b)
	}
	return CompareInternal(ka, kb)
}

// FormatKey renders a user key for messages and tools: printable ASCII as is,
// anything else as hex.
func FormatKey(k []byte) string {
	for _, c := range k {
		if c < 0x20 || c > 0x7e {
			return fmt.Sprintf("0x%x", k)
		}
	}
	return string(k)
}
