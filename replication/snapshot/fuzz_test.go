package snapshot

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Fuzz input format: a sequence of records, each a flags byte, a uvarint
// length and that many bytes of a protobuf-encoded SnapshotChunk. Flag bit 0
// replaces the chunk's crc32c with the checksum of its data (or, for the
// interleaved format, its running_crc32c with its file's so far), so that the
// fuzzer gets past the chunk checksum and exercises the offset, size and
// whole-file checks. Bytes that do not decode as a chunk become a chunk with
// those bytes as data.

func encodeFuzzInput(t testing.TB, chunks []*shalev1.SnapshotChunk, flags byte) []byte {
	var out []byte
	for _, c := range chunks {
		b, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, flags)
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

func decodeFuzzInput(data []byte, runningCRC bool) []*shalev1.SnapshotChunk {
	var chunks []*shalev1.SnapshotChunk
	running := map[uint32]uint32{}
	for len(data) > 0 {
		flags := data[0]
		data = data[1:]
		n, k := binary.Uvarint(data)
		if k <= 0 {
			break
		}
		data = data[k:]
		if n > uint64(len(data)) {
			n = uint64(len(data))
		}
		rec := data[:n]
		data = data[n:]
		c := &shalev1.SnapshotChunk{}
		if err := proto.Unmarshal(rec, c); err != nil {
			c = &shalev1.SnapshotChunk{Data: rec}
		}
		running[c.FileIndex] = UpdateCRC32C(running[c.FileIndex], c.Data)
		switch {
		case flags&1 != 0 && runningCRC:
			c.RunningCrc32C = running[c.FileIndex]
		case flags&1 != 0:
			c.Crc32C = CRC32C(c.Data)
		}
		chunks = append(chunks, c)
	}
	return chunks
}

func FuzzReceive(f *testing.F) {
	valid := validChunks(f)
	f.Add(encodeFuzzInput(f, valid, 0))
	f.Add(encodeFuzzInput(f, valid, 1))
	f.Add(encodeFuzzInput(f, valid[:4], 0))
	f.Add(encodeFuzzInput(f, append(cloneChunks(valid[:3]), valid[2:]...), 1))
	f.Add([]byte{})
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		chunks := decodeFuzzInput(data, false)
		staging := t.TempDir()
		hdr, dir, err := Receive(context.Background(), &sliceReceiver{chunks: chunks}, staging)
		checkReceived(t, staging, hdr, dir, err)
	})
}

// FuzzReceiveInterleaved is FuzzReceive for the interleaved format: flag bit
// 0 sets a chunk's running_crc32c to the checksum of its file index's data
// so far in the stream.
func FuzzReceiveInterleaved(f *testing.F) {
	valid := interleavedChunks()
	f.Add(encodeFuzzInput(f, valid, 0))
	f.Add(encodeFuzzInput(f, valid, 1))
	f.Add(encodeFuzzInput(f, valid[:4], 1))
	f.Add(encodeFuzzInput(f, append(cloneChunks(valid[:3]), valid[2:]...), 1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		chunks := decodeFuzzInput(data, true)
		staging := t.TempDir()
		hdr, dir, err := ReceiveInterleaved(context.Background(), &sliceReceiver{chunks: chunks}, staging)
		checkReceived(t, staging, hdr, dir, err)
	})
}

// checkReceived checks what a Receive of an in-memory stream returned: an
// error wrapping ErrCorrupt and nothing left in staging, or a directory
// holding exactly the header's files with its sizes and checksums.
func checkReceived(t *testing.T, staging string, hdr *shalev1.SnapshotHeader, dir string, err error) {
	t.Helper()
	if err != nil {
		if dir != "" || hdr != nil {
			t.Fatal("failed Receive returned a header or directory")
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error from an in-memory stream does not wrap ErrCorrupt: %v", err)
		}
		if entries, _ := os.ReadDir(staging); len(entries) != 0 {
			t.Fatalf("failed Receive left %v in the staging dir", entries)
		}
		return
	}
	// Success: the directory must hold exactly the header's files, with
	// the header's sizes and checksums.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(hdr.Files) {
		t.Fatalf("dir has %d entries, header lists %d files", len(entries), len(hdr.Files))
	}
	for _, hf := range hdr.Files {
		if filepath.Base(hf.Name) != hf.Name || hf.Name == "" || hf.Name == "." || hf.Name == ".." {
			t.Fatalf("accepted file name %q", hf.Name)
		}
		got, err := os.ReadFile(filepath.Join(dir, hf.Name))
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(got)) != hf.Size || crc32.Checksum(got, castagnoli) != hf.Crc32C {
			t.Fatalf("file %q: %d bytes crc %08x, header says %d bytes crc %08x",
				hf.Name, len(got), CRC32C(got), hf.Size, hf.Crc32C)
		}
	}
}
