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

// FuzzDecodePacked feeds arbitrary bytes to the packed entry decoder (a
// Raft entry of several proposals, packed.go): it must return an error or
// proposals that re-encode to the same bytes, never panic.
func FuzzDecodePacked(f *testing.F) {
	enc := appendPackedCommand([]byte{entryVersionPacked}, 0, 7, []byte("a=1"))
	f.Add(appendPackedCommand(enc, 7, 1<<63+5, []byte("b=2")))
	f.Add(enc)
	f.Add([]byte{entryVersionPacked, 1, 0, 2, 0})
	f.Add([]byte{entryVersionPacked, 0x80, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		cmds, err := decodePacked(data)
		if err != nil {
			return
		}
		if len(cmds) < 2 {
			t.Fatalf("decoded %d proposals from %x", len(cmds), data)
		}
		again := []byte{entryVersionPacked}
		var prev uint64
		for _, c := range cmds {
			again = appendPackedCommand(again, prev, c.id, c.payload)
			prev = c.id
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("decode/encode mismatch: %x -> %x", data, again)
		}
	})
}
