package shard

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

func TestValueRoundTrip(t *testing.T) {
	for _, v := range []storedValue{
		{},
		{createRev: 1, modRev: 1, version: 1, value: []byte("x")},
		{createRev: math.MaxUint64, modRev: math.MaxUint64, version: math.MaxUint64, expire: math.MaxInt64, value: bytes.Repeat([]byte{0}, 100)},
		{createRev: 3, modRev: 9, version: 4, expire: -5},
	} {
		enc := encodeValue(nil, &v)
		if n := v.encodedSize(); n != len(enc) {
			t.Fatalf("%+v: encodedSize %d, encoding %d bytes", v, n, len(enc))
		}
		got, err := decodeValue(enc)
		if err != nil {
			t.Fatal(err)
		}
		if got.createRev != v.createRev || got.modRev != v.modRev || got.version != v.version || got.expire != v.expire || !bytes.Equal(got.value, v.value) {
			t.Fatalf("round trip %+v -> %+v", v, got)
		}
	}
}

func TestValueDecodeErrors(t *testing.T) {
	good := encodeValue(nil, &storedValue{createRev: 300, modRev: 300, version: 2, expire: 1 << 40, value: []byte("v")})
	bad := [][]byte{
		nil,
		{},
		{2, 0, 0, 0, 0},          // unknown format
		{valueFormatV1},          // no header fields
		{valueFormatV1, 0x80},    // truncated uvarint
		{valueFormatV1, 1, 1, 1}, // missing expiry
		append([]byte{valueFormatV1}, bytes.Repeat([]byte{0xff}, 11)...), // uvarint overflow
		good[:3],
	}
	for _, b := range bad {
		if _, err := decodeValue(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeValue(%x) = %v, want ErrCorrupt", b, err)
		}
	}
}

func TestExpiryOf(t *testing.T) {
	if got := expiryOf(100, 0); got != 0 {
		t.Fatal(got)
	}
	if got := expiryOf(100, -3); got != 0 {
		t.Fatal(got)
	}
	if got := expiryOf(100, 2); got != 100+2e6 {
		t.Fatal(got)
	}
	if got := expiryOf(math.MaxInt64-10, 1); got != math.MaxInt64 {
		t.Fatal(got)
	}
	if got := expiryOf(1, math.MaxInt64); got != math.MaxInt64 {
		t.Fatal(got)
	}
}

// FuzzDecodeValue checks that decoding arbitrary bytes never panics, that
// every failure wraps ErrCorrupt, and that whatever decodes re-encodes to a
// record that decodes to the same fields.
func FuzzDecodeValue(f *testing.F) {
	f.Add(encodeValue(nil, &storedValue{createRev: 1, modRev: 2, version: 3, expire: 4, value: []byte("hello")}))
	f.Add(encodeValue(nil, &storedValue{}))
	f.Add([]byte{valueFormatV1, 0x80, 0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeValue(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		v2, err := decodeValue(encodeValue(nil, &v))
		if err != nil {
			t.Fatalf("re-encoded value does not decode: %v", err)
		}
		if v2.createRev != v.createRev || v2.modRev != v.modRev || v2.version != v.version || v2.expire != v.expire || !bytes.Equal(v2.value, v.value) {
			t.Fatalf("re-encode changed %+v into %+v", v, v2)
		}
	})
}
