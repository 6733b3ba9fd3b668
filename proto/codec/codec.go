// Package codec encodes and decodes Shale's protobuf messages without
// protobuf's reflection: a message of package shale.v1 has the MarshalVT,
// UnmarshalVT and SizeVT methods that protoc-gen-go-vtproto generates
// (proto/shale/v1/*_vtproto.pb.go), and Marshal, Unmarshal, Size and the
// gRPC Codec use them; any other message (a well-known type, gRPC's health
// messages) goes through google.golang.org/protobuf as before, but for
// Raft's own messages (go.etcd.io/raft/v3/raftpb, generated without
// encoding methods), whose Message, Entry and HardState are encoded and
// decoded by hand (raftpb.go). The bytes are the same either way
// (TestRoundTripEveryMessage, TestRaftRoundTrip; TestNilMessageInOneof has
// the one exception).
//
// Decoding keeps the checks of proto.Unmarshal that the generated code
// lacks (wire.go): valid UTF-8 in proto3 strings, field numbers in range
// and well-formed unknown fields. What Unmarshal accepts, proto.Unmarshal
// accepts as the same message (FuzzUnmarshal); it refuses a little more: a
// known field sent with another wire type, which protobuf keeps as an
// unknown field. The generated code keeps no unknown fields of a
// google.protobuf.Any (an error detail).
//
// The codec is installed per server and per connection, never in gRPC's
// global registry: ServerOption for a grpc.Server, DialOption for a
// grpc.ClientConn.
package codec

import (
	"fmt"
	"slices"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// vtMessage is a message with generated encoding methods.
type vtMessage interface {
	proto.Message
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
	UnmarshalVT(dAtA []byte) error
}

// Marshal returns the wire encoding of m, as proto.Marshal does.
func Marshal(m proto.Message) ([]byte, error) {
	return MarshalAppend(nil, m)
}

// MarshalAppend appends the wire encoding of m to b, as
// proto.MarshalOptions.MarshalAppend does.
func MarshalAppend(b []byte, m proto.Message) ([]byte, error) {
	vt, ok := m.(vtMessage)
	if !ok {
		if out, ok := raftMarshalAppend(b, m); ok {
			return out, nil
		}
		return proto.MarshalOptions{}.MarshalAppend(b, m)
	}
	return appendVT(b, vt, vt.SizeVT())
}

// appendVT appends vt's encoding, size bytes, to b.
func appendVT(b []byte, vt vtMessage, size int) ([]byte, error) {
	n := len(b)
	b = slices.Grow(b, size)[:n+size]
	if _, err := vt.MarshalToSizedBufferVT(b[n:]); err != nil {
		return b[:n], err
	}
	return b, nil
}

// Unmarshal decodes b into m, as proto.Unmarshal does: m is reset first,
// and the decoded message holds no reference to b.
func Unmarshal(b []byte, m proto.Message) error {
	vt, ok := m.(vtMessage)
	if !ok {
		if raftUnmarshal(b, m) {
			return nil
		}
		return proto.Unmarshal(b, m)
	}
	if err := checkWire(b, m); err != nil {
		return err
	}
	proto.Reset(m)
	return vt.UnmarshalVT(b)
}

// Size returns the length of m's wire encoding, as proto.Size does.
func Size(m proto.Message) int {
	if vt, ok := m.(vtMessage); ok {
		return vt.SizeVT()
	}
	if n, ok := raftSize(m); ok {
		return n
	}
	return proto.Size(m)
}

// Name is the codec's name, gRPC's name for protobuf: the content subtype
// of the calls it carries ("application/grpc+proto"), which every gRPC
// peer reads as protobuf.
const Name = "proto"

// Codec is a gRPC codec (encoding.CodecV2) for protobuf messages that uses
// the generated methods where a message has them. Its buffers come from
// gRPC's default pool, as those of gRPC's own codec do.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Name returns Name.
func (Codec) Name() string { return Name }

// BufferMarshaler is a value that encodes itself for gRPC as buffers of
// its own, which Codec sends as they are: a message whose bulk it hands
// gRPC without a copy (snapshot chunks).
type BufferMarshaler interface {
	// MarshalBuffers returns the value's wire encoding. gRPC owns the
	// slice's references and frees each buffer once it has written it,
	// which may be after its SendMsg returned.
	MarshalBuffers() (mem.BufferSlice, error)
}

// BufferUnmarshaler is a value that decodes itself from gRPC's buffers,
// without their being gathered into one first.
type BufferUnmarshaler interface {
	// UnmarshalBuffers decodes the wire encoding data into the value. It
	// keeps no reference to data's buffers, which gRPC recycles once it
	// returns.
	UnmarshalBuffers(data mem.BufferSlice) error
}

// Marshal encodes v, a protobuf message or a BufferMarshaler.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if bm, ok := v.(BufferMarshaler); ok {
		return bm.MarshalBuffers()
	}
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("codec: cannot marshal %T, not a protobuf message", v)
	}
	vt, ok := m.(vtMessage)
	if !ok {
		return marshalProto(m)
	}
	size := vt.SizeVT()
	if size <= plainMaxLen {
		buf, err := appendVT(nil, vt, size)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	// A longer encoding goes into a pooled buffer, also one below gRPC's
	// own pooling threshold (a get's response, most Raft batches): gRPC
	// frees the buffer once it has written it, and a later message reuses
	// it, where a buffer of its own would be garbage. The buffer is asked
	// for at least pooledMinLen long, as gRPC returns only such buffers to
	// the pool (mem.NewBuffer), and cut to size (a prefix of what Get
	// returned is what Put takes).
	pool := mem.DefaultBufferPool()
	buf := pool.Get(max(size, pooledMinLen))
	*buf = (*buf)[:size]
	if _, err := vt.MarshalToSizedBufferVT(*buf); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// plainMaxLen is the longest encoding that Codec.Marshal puts in a slice of
// its own rather than a pooled buffer: an empty pool hands out a 4 KiB
// buffer (its tier for pooledMinLen), which costs more than the small
// messages' own slices save. Pooling every length raised the bytes
// allocated per put by 9% and per ReadIndex get by 12% (BenchmarkCallsWrites,
// BenchmarkGet); pooling above 256 bytes lowered both.
const plainMaxLen = 256

// pooledMinLen is the least buffer capacity that gRPC returns to its pool
// once freed: for a shorter one mem.NewBuffer makes a plain slice, which is
// garbage after the write (TestPooledMinLen checks it against gRPC's
// threshold).
const pooledMinLen = 1<<10 + 1

// marshalProto is gRPC's own protobuf codec's Marshal, for messages
// without generated methods.
func marshalProto(m proto.Message) (mem.BufferSlice, error) {
	size := proto.Size(m)
	// UseCachedSize reuses the size just computed (m does not change
	// meanwhile).
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	b, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v, a protobuf message or a
// BufferUnmarshaler. The decoded message keeps no reference to data's
// buffers, which gRPC recycles.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if bu, ok := v.(BufferUnmarshaler); ok {
		return bu.UnmarshalBuffers(data)
	}
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("codec: cannot unmarshal into %T, not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return Unmarshal(buf.ReadOnlyData(), m)
}

// messageOf returns v as a protobuf message (an APIv1 message wrapped),
// or nil.
func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// ServerOption makes a gRPC server encode and decode every message with
// Codec, whatever content subtype a call names (a call naming another
// codec is decoded as protobuf all the same, as gRPC's default does for
// subtypes it has not registered).
func ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(Codec{}) }

// DialOption makes every call of a client connection encode and decode
// with Codec (sent as content subtype "proto").
func DialOption() grpc.DialOption {
	return grpc.WithDefaultCallOptions(grpc.ForceCodecV2(Codec{}))
}

// Clone returns a deep copy of m, as proto.CloneOf does, without
// protobuf's reflection where it can: a shale.v1 message by its generated
// CloneVT, Raft's HardState and ConfState by hand (raftpb.go); any other
// message by proto.CloneOf. A nil m gives a nil copy.
func Clone[M proto.Message](m M) M {
	switch x := any(m).(type) {
	case interface{ CloneMessageVT() proto.Message }:
		return x.CloneMessageVT().(M)
	case *raftpb.HardState:
		if x != nil && !hasUnknown(x) {
			return any(cloneHardState(x)).(M)
		}
	case *raftpb.ConfState:
		if x != nil && !hasUnknown(x) {
			return any(cloneConfState(x)).(M)
		}
	}
	return proto.CloneOf(m)
}
