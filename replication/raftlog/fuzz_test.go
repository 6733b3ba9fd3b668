package raftlog

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzDecodeTruncatedState checks that the truncated-state decoder never
// panics, reports every rejected input as ErrCorrupt, and accepts only
// exact encodings.
func FuzzDecodeTruncatedState(f *testing.F) {
	f.Add(encodeTruncatedState(0, 0))
	f.Add(encodeTruncatedState(12345, 7))
	f.Add(encodeTruncatedState(1<<63, 1<<62))
	f.Add([]byte{})
	f.Add([]byte("garbage"))
	f.Add(make([]byte, truncatedStateLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		index, term, err := decodeTruncatedState(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if re := encodeTruncatedState(index, term); !bytes.Equal(re, b) {
			t.Fatalf("accepted %x, which re-encodes as %x", b, re)
		}
	})
}

// FuzzDecodeEntry checks that decoding a stored entry never panics and
// returns only the entry of the index asked for.
func FuzzDecodeEntry(f *testing.F) {
	for _, e := range ents(1, 4, 2) {
		b, _ := proto.Marshal(e)
		f.Add(e.GetIndex(), b)
	}
	f.Add(uint64(0), []byte{})
	f.Add(uint64(7), []byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, index uint64, b []byte) {
		e, err := decodeEntry(index, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if e.GetIndex() != index {
			t.Fatalf("decoded entry %d for index %d", e.GetIndex(), index)
		}
		if _, err := decodeHardState(b); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("hard state error %v does not wrap ErrCorrupt", err)
		}
	})
}
