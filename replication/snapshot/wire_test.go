package snapshot

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/internal/directfile"
	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// split cuts b into buffers at the given lengths (the rest last), as gRPC
// hands a message over in the pieces its frames brought.
func split(b []byte, cuts ...int) mem.BufferSlice {
	var out mem.BufferSlice
	for _, n := range cuts {
		n = max(0, min(n, len(b)))
		out = append(out, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return append(out, mem.SliceBuffer(b))
}

// TestHeldChunkEncoding: a HeldChunk encodes to the bytes of the chunk's
// protobuf encoding, holds a large Data (the buffer itself is in the
// slice, not a copy) until gRPC frees it and only then calls Release, and
// copies a small chunk or a header chunk and releases it at once.
func TestHeldChunkEncoding(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for _, c := range []*shalev1.SnapshotChunk{
		{FileIndex: 3, Offset: 5 << 20, Data: data, RunningCrc32C: 0xdeadbeef},
		{Data: data},
		{FileIndex: 1, Data: data, Crc32C: 7, RunningCrc32C: 1 << 31},
		{FileIndex: 1 << 31, Offset: 1 << 63, Data: data[:4096]},
		{FileIndex: 2, Data: []byte("small")},
		{Header: &shalev1.SnapshotHeader{ShardId: 9, Files: []*shalev1.SnapshotFile{{Name: "a", Size: 1}}}},
	} {
		want, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		released := 0
		h := &HeldChunk{Chunk: c, Release: func() { released++ }}
		bs, err := codec.Codec{}.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if got := bs.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("chunk %d/%d: encoded %d bytes, protobuf's are %d (or differ)", c.FileIndex, c.Offset, len(got), len(want))
		}
		held := c.Header == nil && !mem.IsBelowBufferPoolingThreshold(cap(c.Data))
		if held {
			found := false
			for _, b := range bs {
				if d := b.ReadOnlyData(); len(d) == len(c.Data) && &d[0] == &c.Data[0] {
					found = true
				}
			}
			if !found {
				t.Fatalf("chunk %d/%d: Data copied, not held", c.FileIndex, c.Offset)
			}
			if released != 0 {
				t.Fatalf("chunk %d/%d: released before gRPC freed it", c.FileIndex, c.Offset)
			}
		}
		bs.Free()
		if released != 1 {
			t.Fatalf("chunk %d/%d (held %v): released %d times after the free, want 1", c.FileIndex, c.Offset, held, released)
		}
	}
}

// TestReceivedChunkDecoding decodes chunks cut into buffers at every
// place around their fields: the chunk is the one encoded, a chunk of the
// plain shape gets its Data in an aligned buffer of directfile's pool
// (directfile.PutBuffer keeps it), and anything else decodes as
// codec.Unmarshal does.
func TestReceivedChunkDecoding(t *testing.T) {
	data := bytes.Repeat([]byte("abcdefgh"), directfile.BufferSize/8)
	plain := []*shalev1.SnapshotChunk{
		{FileIndex: 3, Offset: 5 << 20, Data: data, RunningCrc32C: 0xdeadbeef},
		{FileIndex: 1, Data: data[:100], Crc32C: 9},
		{Offset: 1, Data: []byte{}},
		{},
	}
	other := []*shalev1.SnapshotChunk{
		{Header: &shalev1.SnapshotHeader{ShardId: 9}},
	}
	check := func(c *shalev1.SnapshotChunk, enc []byte, wantPooled bool) {
		t.Helper()
		for _, cut := range []int{0, 1, 2, 3, 4, 5, 7, 100, len(enc) - 5, len(enc) - 1} {
			var r ReceivedChunk
			if err := (codec.Codec{}).Unmarshal(split(enc, cut, 3, 16384), &r); err != nil {
				t.Fatalf("cut at %d: %v", cut, err)
			}
			if !proto.Equal(r.Chunk, c) {
				t.Fatalf("cut at %d: decoded %v, want %v", cut, r.Chunk, c)
			}
			if len(c.Data) > 0 && wantPooled && cap(r.Chunk.Data) != directfile.BufferSize {
				t.Fatalf("cut at %d: Data of capacity %d, not a pool buffer", cut, cap(r.Chunk.Data))
			}
		}
	}
	for _, c := range plain {
		enc, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		check(c, enc, true)
	}
	for _, c := range other {
		enc, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		check(c, enc, false)
	}
	// A field twice (the last one counts), an unknown field, a varint of
	// 10 bytes: the general decoder's.
	twice := protowire.AppendTag(nil, fieldFileIndex, protowire.VarintType)
	twice = protowire.AppendVarint(twice, 4)
	twice = protowire.AppendTag(twice, fieldFileIndex, protowire.VarintType)
	twice = protowire.AppendVarint(twice, 5)
	check(&shalev1.SnapshotChunk{FileIndex: 5}, twice, false)
	unknown := protowire.AppendTag(nil, 99, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 1)
	var r ReceivedChunk
	if err := (codec.Codec{}).Unmarshal(split(unknown), &r); err != nil || len(r.Chunk.ProtoReflect().GetUnknown()) == 0 {
		t.Fatalf("unknown field: %v, %v", r.Chunk, err)
	}
	long := protowire.AppendTag(nil, fieldOffset, protowire.VarintType)
	long = protowire.AppendVarint(long, 1<<63)
	check(&shalev1.SnapshotChunk{Offset: 1 << 63}, long, false)
	// Truncated data: an error, as codec.Unmarshal's.
	enc, _ := proto.Marshal(plain[0])
	if err := (codec.Codec{}).Unmarshal(split(enc[:len(enc)-10], 50), &r); err == nil {
		t.Fatal("a truncated chunk decoded")
	}
}

// FuzzReceivedChunk: whatever the bytes and however gRPC cut them,
// ReceivedChunk decodes exactly what codec.Unmarshal decodes (the same
// chunk, or an error for both), and a chunk it decodes encodes back
// through HeldChunk as protobuf encodes it.
func FuzzReceivedChunk(f *testing.F) {
	for _, c := range []*shalev1.SnapshotChunk{
		{FileIndex: 3, Offset: 5 << 20, Data: bytes.Repeat([]byte("x"), 3000), RunningCrc32C: 0xdeadbeef},
		{FileIndex: 1, Data: []byte("data"), Crc32C: 9},
		{Header: &shalev1.SnapshotHeader{ShardId: 9, Files: []*shalev1.SnapshotFile{{Name: "f", Size: 3}}}},
	} {
		enc, err := proto.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(enc, uint16(3), uint16(10))
	}
	f.Add([]byte{0x10, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, uint16(1), uint16(1))
	f.Add([]byte{0x22, 0x05, 1, 2}, uint16(0), uint16(1))
	f.Fuzz(func(t *testing.T, enc []byte, cut1, cut2 uint16) {
		want := &shalev1.SnapshotChunk{}
		werr := codec.Unmarshal(enc, want)
		var r ReceivedChunk
		gerr := (codec.Codec{}).Unmarshal(split(enc, int(cut1), int(cut2)), &r)
		switch {
		case (werr == nil) != (gerr == nil):
			t.Fatalf("codec.Unmarshal: %v; ReceivedChunk: %v", werr, gerr)
		case werr != nil:
			return
		case !proto.Equal(r.Chunk, want):
			t.Fatalf("decoded %v, codec.Unmarshal %v", r.Chunk, want)
		}
		wantEnc, err := proto.Marshal(r.Chunk)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := codec.Codec{}.Marshal(&HeldChunk{Chunk: r.Chunk})
		if err != nil {
			t.Fatal(err)
		}
		if got := bs.Materialize(); !bytes.Equal(got, wantEnc) {
			t.Fatalf("re-encoded %x, protobuf %x", got, wantEnc)
		}
		bs.Free()
		directfile.PutBuffer(r.Chunk.Data)
	})
}
