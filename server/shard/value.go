package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// ErrCorrupt marks data read from the engine that cannot be decoded: a
// damaged stored value or metadata record. Errors wrapping it are returned,
// never panics.
var ErrCorrupt = errors.New("shard: corrupt data")

// valueFormatV1 is the first byte of a stored value in the current format.
const valueFormatV1 = 1

// storedValue is a user key's stored record: its revisions, expiry and value.
type storedValue struct {
	createRev, modRev, version uint64
	// expire is the expiry time in Unix nanoseconds, 0 for never.
	expire int64
	value  []byte
}

// expired reports whether the value counts as absent at time now.
func (v *storedValue) expired(now int64) bool {
	return v.expire != 0 && v.expire <= now
}

// live reports whether v is present (non-nil and not expired) at now.
func live(v *storedValue, now int64) bool { return v != nil && !v.expired(now) }

// encodeValue appends the encoding of v to dst: the format byte, then
// create_revision, mod_revision and version as uvarints, expire_unix_nanos
// as a varint, then the value bytes.
func encodeValue(dst []byte, v *storedValue) []byte {
	dst = append(dst, valueFormatV1)
	dst = binary.AppendUvarint(dst, v.createRev)
	dst = binary.AppendUvarint(dst, v.modRev)
	dst = binary.AppendUvarint(dst, v.version)
	dst = binary.AppendVarint(dst, v.expire)
	return append(dst, v.value...)
}

// encodedSize returns the length of v's encoding (encodeValue).
func (v *storedValue) encodedSize() int {
	return 1 + protowire.SizeVarint(v.createRev) + protowire.SizeVarint(v.modRev) + protowire.SizeVarint(v.version) +
		protowire.SizeVarint(protowire.EncodeZigZag(v.expire)) + len(v.value)
}

// decodeValue decodes a stored value. The returned value aliases b. Any
// malformed input yields an error wrapping ErrCorrupt.
func decodeValue(b []byte) (storedValue, error) {
	var v storedValue
	if len(b) == 0 {
		return v, fmt.Errorf("%w: empty stored value", ErrCorrupt)
	}
	if b[0] != valueFormatV1 {
		return v, fmt.Errorf("%w: unknown value format %d", ErrCorrupt, b[0])
	}
	p := b[1:]
	for i, dst := range []*uint64{&v.createRev, &v.modRev, &v.version} {
		x, n := binary.Uvarint(p)
		if n <= 0 {
			return storedValue{}, fmt.Errorf("%w: bad value header field %d", ErrCorrupt, i)
		}
		*dst = x
		p = p[n:]
	}
	x, n := binary.Varint(p)
	if n <= 0 {
		return storedValue{}, fmt.Errorf("%w: bad value expiry", ErrCorrupt)
	}
	v.expire = x
	v.value = p[n:]
	return v, nil
}

// keyValue builds the API KeyValue of a user key and its stored record,
// copying the bytes.
func keyValue(userKey []byte, v *storedValue, keysOnly bool) *shalev1.KeyValue {
	kv := &shalev1.KeyValue{
		Key:             bytes.Clone(userKey),
		CreateRevision:  v.createRev,
		ModRevision:     v.modRev,
		Version:         v.version,
		ExpireUnixNanos: v.expire,
	}
	if !keysOnly {
		kv.Value = bytes.Clone(v.value)
	}
	return kv
}

// expiryOf returns the expiry of a write at time ts with the given TTL in
// milliseconds (0 when ttlMs <= 0), saturating instead of overflowing.
func expiryOf(ts, ttlMs int64) int64 {
	if ttlMs <= 0 {
		return 0
	}
	const nsPerMs = int64(1e6)
	if ttlMs > math.MaxInt64/nsPerMs {
		return math.MaxInt64
	}
	d := ttlMs * nsPerMs
	if ts > 0 && ts > math.MaxInt64-d {
		return math.MaxInt64
	}
	return ts + d
}
