package snapshot

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/shale-db/shale/internal/directfile"
	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// The field numbers and wire types of SnapshotChunk (raft.proto).
const (
	fieldHeader        = 1
	fieldFileIndex     = 2
	fieldOffset        = 3
	fieldData          = 4
	fieldCrc32C        = 5
	fieldRunningCrc32C = 6
)

// HeldChunk is a chunk to send over a gRPC stream whose codec is
// codec.Codec (stream.SendMsg(&HeldChunk{...})): gRPC writes its Data
// straight from the caller's buffer, without copying it into an encoded
// message first. The bytes on the wire are those of the chunk's protobuf
// encoding.
type HeldChunk struct {
	// Chunk is the chunk. Its Data must not change until Release is
	// called.
	Chunk *shalev1.SnapshotChunk
	// Release, if set, is called at most once, when gRPC is done with
	// Chunk.Data: once it has written the bytes, which may be after
	// SendMsg returned, or as soon as they are copied (a chunk too small
	// to be worth holding, or one with a header). It is not called if
	// the chunk is never encoded (SendMsg failed first); the buffer is
	// then garbage like any other.
	Release func()
}

var _ codec.BufferMarshaler = (*HeldChunk)(nil)

// MarshalBuffers encodes the chunk as its fields before Data, Data itself
// (held, not copied) and the fields after it (codec.BufferMarshaler).
func (h *HeldChunk) MarshalBuffers() (mem.BufferSlice, error) {
	c := h.Chunk
	if c.Header != nil || mem.IsBelowBufferPoolingThreshold(cap(c.Data)) || len(c.ProtoReflect().GetUnknown()) != 0 {
		// Not the plain shape: encoded as a copy, as any message.
		b, err := codec.Codec{}.Marshal(c)
		h.release()
		return b, err
	}
	var small [48]byte // tags and varints before Data, then the fixed32s
	pre := small[:0]
	if c.FileIndex != 0 {
		pre = protowire.AppendTag(pre, fieldFileIndex, protowire.VarintType)
		pre = protowire.AppendVarint(pre, uint64(c.FileIndex))
	}
	if c.Offset != 0 {
		pre = protowire.AppendTag(pre, fieldOffset, protowire.VarintType)
		pre = protowire.AppendVarint(pre, c.Offset)
	}
	pre = protowire.AppendTag(pre, fieldData, protowire.BytesType)
	pre = protowire.AppendVarint(pre, uint64(len(c.Data)))
	post := pre[len(pre):]
	if c.Crc32C != 0 {
		post = protowire.AppendTag(post, fieldCrc32C, protowire.Fixed32Type)
		post = protowire.AppendFixed32(post, c.Crc32C)
	}
	if c.RunningCrc32C != 0 {
		post = protowire.AppendTag(post, fieldRunningCrc32C, protowire.Fixed32Type)
		post = protowire.AppendFixed32(post, c.RunningCrc32C)
	}
	// The small parts in one new slice of their own (gRPC keeps them
	// until it has written them); Data in a buffer whose last Free calls
	// Release instead of giving it to a pool.
	parts := append(pre[:len(pre):len(pre)], post...)
	data := c.Data
	out := mem.BufferSlice{mem.SliceBuffer(parts[:len(pre)]), mem.NewBuffer(&data, releasePool(h.release))}
	if len(post) > 0 {
		out = append(out, mem.SliceBuffer(parts[len(pre):]))
	}
	return out, nil
}

func (h *HeldChunk) release() {
	if h.Release != nil {
		h.Release()
	}
}

// releasePool is the mem.BufferPool of one held buffer: Put calls the
// function (gRPC's last reference to the buffer is gone).
type releasePool func()

// Get returns a new buffer (a held buffer's pool is never asked for one).
func (releasePool) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

// Put calls the function.
func (f releasePool) Put(*[]byte) { f() }

// ReceivedChunk decodes a chunk from a gRPC stream whose codec is
// codec.Codec (stream.RecvMsg(&ReceivedChunk{})) with one copy of its
// data, from gRPC's frames into a buffer of directfile.GetBuffer, which a
// directfile.Writer writes without copying it again. A chunk of any other
// shape (the header, unknown or repeated fields) is decoded by
// codec.Unmarshal into a buffer of its own. Either way the chunk is the
// message proto.Unmarshal would decode from the same bytes, and an
// encoding it refuses is an error.
type ReceivedChunk struct {
	// Chunk is the decoded chunk, a new one per UnmarshalBuffers.
	Chunk *shalev1.SnapshotChunk
}

var _ codec.BufferUnmarshaler = (*ReceivedChunk)(nil)

// UnmarshalBuffers decodes data into r.Chunk (codec.BufferUnmarshaler).
func (r *ReceivedChunk) UnmarshalBuffers(data mem.BufferSlice) error {
	if c, ok := decodeChunk(data); ok {
		r.Chunk = c
		return nil
	}
	c := &shalev1.SnapshotChunk{}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := codec.Unmarshal(buf.ReadOnlyData(), c); err != nil {
		return fmt.Errorf("snapshot: decode chunk: %w", err)
	}
	r.Chunk = c
	return nil
}

// decodeChunk decodes a chunk of the plain shape, fields 2 to 6 each at
// most once with their own wire types and varints of at most 9 bytes, its
// Data copied into a buffer of directfile.GetBuffer. It returns false for
// anything else, which the general decoder then takes.
func decodeChunk(data mem.BufferSlice) (*shalev1.SnapshotChunk, bool) {
	cu := cursor{bufs: data, size: data.Len()}
	c := &shalev1.SnapshotChunk{}
	var seen uint8
	ok := true
	for ok && !cu.end() {
		var tag uint64
		if tag, ok = cu.varint(); !ok {
			break
		}
		if tag>>3 < fieldFileIndex || tag>>3 > fieldRunningCrc32C {
			ok = false
			break
		}
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		if seen&(1<<num) != 0 {
			ok = false
			break
		}
		seen |= 1 << num
		switch num {
		case fieldFileIndex, fieldOffset:
			var v uint64
			if ok = typ == protowire.VarintType; ok {
				v, ok = cu.varint()
			}
			if num == fieldFileIndex {
				c.FileIndex = uint32(v)
			} else {
				c.Offset = v
			}
		case fieldCrc32C, fieldRunningCrc32C:
			var b [4]byte
			if ok = typ == protowire.Fixed32Type && cu.copyTo(b[:]); ok {
				if num == fieldCrc32C {
					c.Crc32C = binary.LittleEndian.Uint32(b[:])
				} else {
					c.RunningCrc32C = binary.LittleEndian.Uint32(b[:])
				}
			}
		case fieldData:
			var n uint64
			if ok = typ == protowire.BytesType; ok {
				n, ok = cu.varint()
			}
			if !ok || n > uint64(cu.remaining()) {
				ok = false
				break
			}
			if n == 0 {
				c.Data = []byte{}
				break
			}
			buf := directfile.GetBuffer(int(n))
			if ok = cu.copyTo(*buf); !ok {
				directfile.PutBuffer(*buf)
				break
			}
			c.Data = *buf
		}
	}
	if !ok {
		directfile.PutBuffer(c.Data) // drops what is not the pool's

		return nil, false
	}
	return c, true
}

// cursor reads a BufferSlice from its start.
type cursor struct {
	bufs mem.BufferSlice
	size int // bytes in bufs
	i    int // the buffer being read
	off  int // the next byte in it
	read int // bytes read
}

func (cu *cursor) end() bool { return cu.remaining() == 0 }

func (cu *cursor) remaining() int { return cu.size - cu.read }

// next returns the unread bytes of the current buffer, moving past empty
// and finished ones; nil at the end.
func (cu *cursor) next() []byte {
	for cu.i < len(cu.bufs) {
		if b := cu.bufs[cu.i].ReadOnlyData(); cu.off < len(b) {
			return b[cu.off:]
		}
		cu.i++
		cu.off = 0
	}
	return nil
}

// varint reads a varint of at most 9 bytes (longer ones, which protobuf's
// decoders do not all treat alike, are the general decoder's).
func (cu *cursor) varint() (uint64, bool) {
	var v uint64
	for shift := 0; shift < 63; shift += 7 {
		b := cu.next()
		if b == nil {
			return 0, false
		}
		cu.off++
		cu.read++
		v |= uint64(b[0]&0x7f) << shift
		if b[0] < 0x80 {
			return v, true
		}
	}
	return 0, false
}

// copyTo fills dst with the next len(dst) bytes.
func (cu *cursor) copyTo(dst []byte) bool {
	for len(dst) > 0 {
		b := cu.next()
		if b == nil {
			return false
		}
		k := copy(dst, b)
		dst = dst[k:]
		cu.off += k
		cu.read += k
	}
	return true
}
