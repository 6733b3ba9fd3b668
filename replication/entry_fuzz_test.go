package replication

import (
	"bytes"
	"testing"
)

// FuzzDecodeEntry feeds arbitrary bytes (as found in a corrupted or hostile
// Raft log) to the entry framing decoder: it must return an error or a
// payload that re-encodes to the same bytes, never panic.
func FuzzDecodeEntry(f *testing.F) {
	f.Add(encodeEntry(7, []byte("k=v")))
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		id, payload, err := decodeEntry(data)
		if err != nil {
			return
		}
		if again := encodeEntry(id, payload); !bytes.Equal(again, data) {
			t.Fatalf("decode/encode mismatch: %x -> %x", data, again)
		}
	})
}
