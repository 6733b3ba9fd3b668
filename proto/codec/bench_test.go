package codec

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// putPath is every message a put's request and answer are encoded as, in
// the order they are made, as the SDK and a node build them for a put of a
// 16-byte key and a 256-byte value: the SDK's request and the KV.Calls
// batch carrying it, the Raft command the leader proposes, the Raft
// transport's batch carrying the entry to a follower, the result the
// shard records for deduplication, and the answer back.
func putPath() []struct {
	name string
	m    proto.Message
	grpc bool // sent by gRPC itself (its codec), not nested in another message
} {
	key := []byte("0123456789abcdef")
	value := bytes.Repeat([]byte("v"), 256)
	reqID := bytes.Repeat([]byte{7}, 16)
	req := &shalev1.PutRequest{Header: &shalev1.RequestHeader{RequestId: reqID, FirstAttempt: true}, Key: key, Value: value}
	body, _ := proto.Marshal(req)
	cmd := &shalev1.RaftCommand{
		RequestId: reqID, FirstAttempt: true, Epoch: 4, TimestampUnixNanos: 1_795_000_000_000_000_000,
		Hlc:     &shalev1.HlcTimestamp{WallNanos: 1_795_000_000_000_000_000, Logical: 3},
		Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: key, Value: value}}}}}},
	}
	entry, _ := proto.Marshal(cmd)
	// The envelope holds a raftpb.Message (MsgApp) with the entry: raftpb
	// encodes it; its bytes stand in here.
	raftMsg := append(bytes.Repeat([]byte{1}, 40), entry...)
	header := &shalev1.ResponseHeader{ShardId: 9, Revision: 123456, NodeId: 2, Epoch: 4}
	resp := &shalev1.PutResponse{Header: header}
	result := &shalev1.CommandResult{Txn: &shalev1.TxnResponse{Header: header, Succeeded: true,
		Results: []*shalev1.ResponseOp{{Op: &shalev1.ResponseOp_Put{Put: &shalev1.PutResponse{Header: header}}}}}}
	respBody, _ := proto.Marshal(resp)
	return []struct {
		name string
		m    proto.Message
		grpc bool
	}{
		{"PutRequest", req, false},
		{"CallBatch", &shalev1.CallBatch{Calls: []*shalev1.Call{{Id: 77, Method: "Put", Request: body, TimeoutMs: 10000}}}, true},
		{"RaftCommand", cmd, false},
		{"RaftMessageBatch", &shalev1.RaftMessageBatch{ClusterId: "c0ffee00-1234-5678-9abc-def012345678", FromNodeId: 1, ToNodeId: 2,
			Messages: []*shalev1.RaftEnvelope{{ShardId: 9, Message: raftMsg}}, Hlc: cmd.GetHlc()}, true},
		{"CommandResult", result, false},
		{"PutResponse", resp, false},
		{"ResultBatch", &shalev1.ResultBatch{Results: []*shalev1.CallResult{{Id: 77, Response: respBody}}}, true},
	}
}

// BenchmarkPutPath encodes and decodes each message of a put's path,
// with protobuf's reflection (proto.Marshal and proto.Unmarshal, or gRPC's
// own codec for what gRPC sends) and with this package (Marshal and
// Unmarshal, or Codec): before and after the generated code.
func BenchmarkPutPath(b *testing.B) {
	std := encoding.GetCodecV2(grpcproto.Name)
	for _, p := range putPath() {
		enc, _ := proto.Marshal(p.m)
		type way struct {
			name           string
			encode, decode func(b *testing.B)
		}
		newMsg := func() proto.Message { return p.m.ProtoReflect().New().Interface() }
		var ways []way
		if p.grpc {
			via := func(c encoding.CodecV2) way {
				return way{
					encode: func(b *testing.B) {
						for b.Loop() {
							bs, err := c.Marshal(p.m)
							if err != nil {
								b.Fatal(err)
							}
							bs.Free()
						}
					},
					decode: func(b *testing.B) {
						data := mem.BufferSlice{mem.SliceBuffer(enc)}
						for b.Loop() {
							if err := c.Unmarshal(data, newMsg()); err != nil {
								b.Fatal(err)
							}
						}
					},
				}
			}
			ways = []way{via(std), via(Codec{})}
			ways[0].name, ways[1].name = "proto", "vt"
		} else {
			ways = []way{{
				name: "proto",
				encode: func(b *testing.B) {
					for b.Loop() {
						if _, err := proto.Marshal(p.m); err != nil {
							b.Fatal(err)
						}
					}
				},
				decode: func(b *testing.B) {
					for b.Loop() {
						if err := proto.Unmarshal(enc, newMsg()); err != nil {
							b.Fatal(err)
						}
					}
				},
			}, {
				name: "vt",
				encode: func(b *testing.B) {
					for b.Loop() {
						if _, err := Marshal(p.m); err != nil {
							b.Fatal(err)
						}
					}
				},
				decode: func(b *testing.B) {
					for b.Loop() {
						if err := Unmarshal(enc, newMsg()); err != nil {
							b.Fatal(err)
						}
					}
				},
			}}
		}
		for _, w := range ways {
			b.Run(p.name+"/encode/"+w.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(enc)))
				w.encode(b)
			})
			b.Run(p.name+"/decode/"+w.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(enc)))
				w.decode(b)
			})
		}
	}
}

// BenchmarkPutPathTotal encodes and decodes every message of a put's path
// once per iteration.
func BenchmarkPutPathTotal(b *testing.B) {
	path := putPath()
	encs := make([][]byte, len(path))
	for i, p := range path {
		encs[i], _ = proto.Marshal(p.m)
	}
	std := encoding.GetCodecV2(grpcproto.Name)
	run := func(b *testing.B, c encoding.CodecV2, marshal func(proto.Message) ([]byte, error), unmarshal func([]byte, proto.Message) error) {
		b.ReportAllocs()
		for b.Loop() {
			for i, p := range path {
				out := p.m.ProtoReflect().New().Interface()
				if p.grpc {
					bs, err := c.Marshal(p.m)
					if err != nil {
						b.Fatal(err)
					}
					bs.Free()
					if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(encs[i])}, out); err != nil {
						b.Fatal(err)
					}
					continue
				}
				if _, err := marshal(p.m); err != nil {
					b.Fatal(err)
				}
				if err := unmarshal(encs[i], out); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("proto", func(b *testing.B) { run(b, std, proto.Marshal, proto.Unmarshal) })
	b.Run("vt", func(b *testing.B) { run(b, Codec{}, Marshal, Unmarshal) })
}
