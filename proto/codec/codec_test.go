package codec

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// shaleMessages returns a new message of every message type of package
// shale.v1 (map entries aside), sorted by name.
func shaleMessages(t testing.TB) []proto.Message {
	t.Helper()
	var out []proto.Message
	var walk func(protoreflect.MessageDescriptors)
	walk = func(mds protoreflect.MessageDescriptors) {
		for i := range mds.Len() {
			md := mds.Get(i)
			if md.IsMapEntry() {
				continue
			}
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				t.Fatalf("%s: %v", md.FullName(), err)
			}
			out = append(out, mt.New().Interface())
			walk(md.Messages())
		}
	}
	protoregistry.GlobalFiles.RangeFilesByPackage("shale.v1", func(fd protoreflect.FileDescriptor) bool {
		walk(fd.Messages())
		return true
	})
	// Make sure the package's files are all there: the protos are
	// registered when the package is linked in, which shalev1 ensures.
	_ = shalev1.File_shale_v1_kv_proto
	if len(out) < 50 {
		t.Fatalf("found %d shale.v1 message types, expected the package's every one", len(out))
	}
	return out
}

// filler fills messages with values: every field set (one case of each
// oneof, chosen by variant), lists of two, maps of mapLen entries,
// nested messages down to a depth of 3.
type filler struct {
	rnd     *rand.Rand
	variant int
	mapLen  int
}

func (f *filler) fill(m protoreflect.Message, depth int) {
	md := m.Descriptor()
	fds := md.Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() {
			if o.Fields().Get(f.variant%o.Fields().Len()) != fd {
				continue
			}
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for j := range f.mapLen {
				k := f.scalar(fd.MapKey(), j).MapKey()
				if fd.MapValue().Message() != nil {
					v := mp.NewValue()
					if depth < 3 {
						f.fill(v.Message(), depth+1)
					}
					mp.Set(k, v)
				} else {
					mp.Set(k, f.scalar(fd.MapValue(), j))
				}
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for j := range 2 {
				if fd.Message() != nil {
					v := l.NewElement()
					if depth < 3 {
						f.fill(v.Message(), depth+1)
					}
					l.Append(v)
				} else {
					l.Append(f.scalar(fd, j))
				}
			}
		case fd.Message() != nil:
			if depth < 3 {
				f.fill(m.Mutable(fd).Message(), depth+1)
			} else {
				m.Mutable(fd) // set, empty
			}
		default:
			m.Set(fd, f.scalar(fd, 0))
		}
	}
}

// scalar returns a value of fd's kind, never the zero value (which proto3
// would not encode).
func (f *filler) scalar(fd protoreflect.FieldDescriptor, j int) protoreflect.Value {
	n := f.rnd.Uint64()>>uint(f.rnd.IntN(63)) | 1
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		if vals.Len() == 1 {
			return protoreflect.ValueOfEnum(vals.Get(0).Number())
		}
		return protoreflect.ValueOfEnum(vals.Get(1 + int(n%uint64(vals.Len()-1))).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(n) | 1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		if j%2 == 1 {
			return protoreflect.ValueOfInt64(-int64(n >> 1))
		}
		return protoreflect.ValueOfInt64(int64(n >> 1))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n) | 1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(n)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n%1000) + 0.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n%100000) + 0.25)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("s%d-%d-é", j, n%1000))
	case protoreflect.BytesKind:
		b := make([]byte, 1+f.rnd.IntN(40))
		for i := range b {
			b[i] = byte(f.rnd.Uint32())
		}
		return protoreflect.ValueOfBytes(b)
	}
	panic(fmt.Sprintf("kind %v", fd.Kind()))
}

// filled returns a filled copy of the type of m, one per variant.
func filled(m proto.Message, variant, mapLen int) proto.Message {
	out := m.ProtoReflect().New()
	f := &filler{rnd: rand.New(rand.NewPCG(uint64(variant), 7)), variant: variant, mapLen: mapLen}
	f.fill(out, 0)
	return out.Interface()
}

// variants is how many values of each type the tests try: enough for
// every oneof's every case (the largest has 8).
const variants = 10

// TestEveryShaleMessageHasGeneratedMethods: every message type of package
// shale.v1 takes the codec's fast path. A .proto file left out of
// buf.gen.yaml's vtproto plugin would fall back to reflection silently.
func TestEveryShaleMessageHasGeneratedMethods(t *testing.T) {
	for _, m := range shaleMessages(t) {
		if _, ok := m.(vtMessage); !ok {
			t.Errorf("%T has no generated MarshalVT/UnmarshalVT/SizeVT", m)
		}
	}
}

// TestRoundTripEveryMessage round-trips values of every shale.v1 message
// type through Marshal/Unmarshal and through the gRPC codec, and checks
// the bytes and sizes against protobuf's: the generated code writes what
// proto.Marshal (deterministic) writes, so records it encodes read the
// same, and nodes of either build understand each other.
func TestRoundTripEveryMessage(t *testing.T) {
	c := Codec{}
	for _, typ := range shaleMessages(t) {
		name := string(typ.ProtoReflect().Descriptor().FullName())
		for v := range variants {
			// Maps of one entry: a map's order is not fixed, not even
			// by proto.Marshal unless deterministic.
			for _, m := range []proto.Message{typ.ProtoReflect().New().Interface(), filled(typ, v, 1)} {
				want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
				if err != nil {
					t.Fatalf("%s: proto.Marshal: %v", name, err)
				}
				got, err := Marshal(m)
				if err != nil {
					t.Fatalf("%s: Marshal: %v", name, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s (variant %d): Marshal wrote\n%x\nproto.Marshal\n%x", name, v, got, want)
				}
				if s, ps := Size(m), proto.Size(m); s != ps || s != len(want) {
					t.Fatalf("%s: Size %d, proto.Size %d, encoding %d bytes", name, s, ps, len(want))
				}
				if got, err := MarshalAppend([]byte("prefix"), m); err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
					t.Fatalf("%s: MarshalAppend: %x, %v", name, got, err)
				}
				back := m.ProtoReflect().New().Interface()
				if err := Unmarshal(want, back); err != nil {
					t.Fatalf("%s: Unmarshal: %v", name, err)
				}
				if !proto.Equal(back, m) {
					t.Fatalf("%s: Unmarshal gave %v, want %v", name, back, m)
				}

				bs, err := c.Marshal(m)
				if err != nil {
					t.Fatalf("%s: Codec.Marshal: %v", name, err)
				}
				if !bytes.Equal(bs.Materialize(), want) {
					t.Fatalf("%s: Codec.Marshal wrote other bytes than proto.Marshal", name)
				}
				back = m.ProtoReflect().New().Interface()
				if err := c.Unmarshal(bs, back); err != nil {
					t.Fatalf("%s: Codec.Unmarshal: %v", name, err)
				}
				bs.Free()
				if !proto.Equal(back, m) {
					t.Fatalf("%s: Codec round trip gave %v, want %v", name, back, m)
				}
			}
			// Maps of several entries: equal once decoded.
			m := filled(typ, v, 3)
			enc, err := Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			back := m.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(enc, back); err != nil || !proto.Equal(back, m) {
				t.Fatalf("%s: proto.Unmarshal of Marshal's bytes: %v, %v", name, back, err)
			}
		}
	}
}

// TestUnmarshalResets: as proto.Unmarshal, Unmarshal replaces what the
// message held rather than merging into it.
func TestUnmarshalResets(t *testing.T) {
	m := &shalev1.PutRequest{Key: []byte("old"), Value: []byte("v"), PrevKv: true}
	enc, _ := Marshal(&shalev1.PutRequest{Key: []byte("new")})
	if err := Unmarshal(enc, m); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m, &shalev1.PutRequest{Key: []byte("new")}) {
		t.Fatalf("got %v", m)
	}
}

// TestUnmarshalDoesNotAlias: a decoded message keeps no reference to the
// input, which gRPC recycles once decoded.
func TestUnmarshalDoesNotAlias(t *testing.T) {
	enc, _ := Marshal(&shalev1.Call{Method: "Put", Request: []byte("request"), TraceContext: map[string]string{"k": "v"}})
	m := &shalev1.Call{}
	if err := Unmarshal(enc, m); err != nil {
		t.Fatal(err)
	}
	for i := range enc {
		enc[i] = 'x'
	}
	if m.GetMethod() != "Put" || string(m.GetRequest()) != "request" || m.GetTraceContext()["k"] != "v" {
		t.Fatalf("decoded message changed with its input: %v", m)
	}
}

// TestInvalidUTF8Refused: a string with invalid UTF-8, wherever it is in a
// message, is refused as proto.Unmarshal refuses it; bytes fields may hold
// anything.
func TestInvalidUTF8Refused(t *testing.T) {
	bad := "\xff\xfe"
	for _, tc := range []struct {
		name string
		m    proto.Message
	}{
		{"string field", &shalev1.Call{Method: bad}},
		{"map key", &shalev1.Call{Method: "Put", TraceContext: map[string]string{bad: "v"}}},
		{"map value", &shalev1.Call{Method: "Put", TraceContext: map[string]string{"k": bad}}},
		{"in a list of messages", &shalev1.CallBatch{Calls: []*shalev1.Call{{Method: "Get"}, {Method: bad}}}},
		{"in a nested message", &shalev1.ResultBatch{Results: []*shalev1.CallResult{{Message: "ok"}, {Details: []*anypb.Any{{TypeUrl: bad}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := proto.MarshalOptions{}.Marshal(tc.m)
			if err == nil {
				t.Fatal("proto.Marshal encoded invalid UTF-8")
			}
			// proto.Marshal refuses to write it: the generated code does not.
			enc, err = Marshal(tc.m)
			if err != nil {
				t.Fatal(err)
			}
			if err := proto.Unmarshal(enc, tc.m.ProtoReflect().New().Interface()); err == nil {
				t.Fatal("proto.Unmarshal accepted invalid UTF-8")
			}
			if err := Unmarshal(enc, tc.m.ProtoReflect().New().Interface()); err == nil {
				t.Fatal("Unmarshal accepted invalid UTF-8")
			}
			if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(enc)}, tc.m.ProtoReflect().New().Interface()); err == nil {
				t.Fatal("Codec.Unmarshal accepted invalid UTF-8")
			}
		})
	}
	// Bytes are bytes.
	enc, _ := Marshal(&shalev1.PutRequest{Key: []byte(bad), Value: []byte(bad)})
	if err := Unmarshal(enc, &shalev1.PutRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestFallback: messages without generated methods (well-known types,
// gRPC's health messages, Raft's raftpb) go through
// protobuf exactly as gRPC's own codec sends them.
func TestFallback(t *testing.T) {
	std := encoding.GetCodecV2(grpcproto.Name)
	st, _ := structpb.NewStruct(map[string]any{"a": "b"})
	for _, m := range []any{
		durationpb.New(1234567),
		st,
		&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING},
		&raftpb.Message{Type: raftpb.MsgApp.Enum(), To: proto.Uint64(2), From: proto.Uint64(1), Term: proto.Uint64(3), Index: proto.Uint64(9),
			Entries: []*raftpb.Entry{{Term: proto.Uint64(3), Index: proto.Uint64(10), Data: []byte("cmd")}}},
		&raftpb.HardState{Term: proto.Uint64(5), Vote: proto.Uint64(2), Commit: proto.Uint64(77)},
	} {
		name := fmt.Sprintf("%T", m)
		if _, ok := messageOf(m).(vtMessage); ok {
			t.Fatalf("%s has generated methods; pick another type for this test", name)
		}
		want, err := std.Marshal(m)
		if err != nil {
			t.Fatalf("%s: gRPC's codec: %v", name, err)
		}
		got, err := Codec{}.Marshal(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got.Materialize(), want.Materialize()) {
			t.Fatalf("%s: wrote %x, gRPC's codec %x", name, got.Materialize(), want.Materialize())
		}
		if b, err := Marshal(messageOf(m)); err != nil || !bytes.Equal(b, want.Materialize()) {
			t.Fatalf("%s: Marshal: %x, %v", name, b, err)
		}
		if Size(messageOf(m)) != len(want.Materialize()) {
			t.Fatalf("%s: Size %d, encoding %d bytes", name, Size(messageOf(m)), len(want.Materialize()))
		}
		back := messageOf(m).ProtoReflect().New().Interface()
		if err := (Codec{}).Unmarshal(got, back); err != nil {
			t.Fatalf("%s: Unmarshal: %v", name, err)
		}
		if !proto.Equal(back, messageOf(m)) {
			t.Fatalf("%s: round trip gave %v", name, back)
		}
	}
	if _, err := (Codec{}).Marshal(struct{}{}); err == nil {
		t.Fatal("marshalled a non-message")
	}
	if err := (Codec{}).Unmarshal(nil, &struct{}{}); err == nil {
		t.Fatal("unmarshalled into a non-message")
	}
}

// TestLargeMessagePooled: an encoding above gRPC's pooling threshold goes
// into a pooled buffer, and still reads back.
func TestLargeMessagePooled(t *testing.T) {
	m := &shalev1.PutRequest{Key: []byte("k"), Value: bytes.Repeat([]byte("v"), 64<<10)}
	bs, err := Codec{}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(m)
	if !bytes.Equal(bs.Materialize(), want) {
		t.Fatal("large message encoded differently")
	}
	back := &shalev1.PutRequest{}
	if err := (Codec{}).Unmarshal(bs, back); err != nil || !proto.Equal(back, m) {
		t.Fatalf("round trip: %v", err)
	}
	bs.Free()
}

// TestPooledMinLen: pooledMinLen is the least capacity that gRPC pools
// (a gRPC upgrade that moves its threshold fails here), and an encoding
// longer than plainMaxLen but below gRPC's threshold goes into a pooled
// buffer, not a plain slice.
func TestPooledMinLen(t *testing.T) {
	if mem.IsBelowBufferPoolingThreshold(pooledMinLen) || !mem.IsBelowBufferPoolingThreshold(pooledMinLen-1) {
		t.Fatalf("pooledMinLen %d is not gRPC's least pooled length", pooledMinLen)
	}
	for _, n := range []int{plainMaxLen + 1, pooledMinLen - 1} {
		m := &shalev1.PutRequest{Value: make([]byte, n)}
		bs, err := Codec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, plain := bs[0].(mem.SliceBuffer); plain || len(bs) != 1 || bs.Len() != proto.Size(m) {
			t.Fatalf("a %d-byte value encoded into %d buffers (%d bytes), the first a %T", n, len(bs), bs.Len(), bs[0])
		}
		bs.Free()
	}
}

// TestPooledBuffersNotShared: encodings held while others are encoded and
// freed, in a random order, keep their bytes: a buffer goes back to the
// pool only when its own holder frees it. Run with -race too.
func TestPooledBuffersNotShared(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 72))
	type held struct {
		bs   mem.BufferSlice
		want []byte
	}
	var live []held
	for i := range 5000 {
		if len(live) > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(len(live))
			live[k].bs.Free()
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		} else {
			v := make([]byte, rng.IntN(3000))
			for j := range v {
				v[j] = byte(rng.Uint32())
			}
			m := &shalev1.PutRequest{Key: fmt.Appendf(nil, "k%d", i), Value: v}
			bs, err := Codec{}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := proto.Marshal(m)
			live = append(live, held{bs, want})
		}
		for _, h := range live {
			if !bytes.Equal(h.bs.Materialize(), h.want) {
				t.Fatalf("step %d: a held encoding changed", i)
			}
		}
	}
	for _, h := range live {
		h.bs.Free()
	}
}

// TestOverGRPC: a server and a connection each with the codec installed
// (and no global registration) serve a shale.v1 message and a message
// without generated methods (the health service's) alike.
func TestOverGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOption())
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	shalev1.RegisterKVServer(srv, echoKV{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	for _, opts := range [][]grpc.DialOption{{DialOption()}, nil} { // with the codec, and a plain client
		cc, err := grpc.NewClient(lis.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health check: %v, %v", resp, err)
		}
		put, err := shalev1.NewKVClient(cc).Put(ctx, &shalev1.PutRequest{Key: []byte("k"), Value: []byte("v")})
		if err != nil || put.GetHeader().GetRevision() != 1 || string(put.GetPrevKv().GetValue()) != "v" {
			t.Fatalf("put: %v, %v", put, err)
		}
		_, err = shalev1.NewKVClient(cc).Put(ctx, &shalev1.PutRequest{Key: []byte("k"), Value: []byte(strings.Repeat("v", 100<<10))})
		if err != nil {
			t.Fatalf("large put: %v", err)
		}
		_ = cc.Close()
	}
}

// echoKV answers Put with the value it was sent.
type echoKV struct{ shalev1.UnimplementedKVServer }

func (echoKV) Put(_ context.Context, r *shalev1.PutRequest) (*shalev1.PutResponse, error) {
	return &shalev1.PutResponse{Header: &shalev1.ResponseHeader{Revision: 1}, PrevKv: &shalev1.KeyValue{Key: r.GetKey(), Value: r.GetValue()}}, nil
}

// fuzzTypes are the messages the fuzz target decodes: what a node reads
// from clients and peers on every write, and what the SDK reads back.
var fuzzTypes = []proto.Message{
	&shalev1.CallBatch{}, &shalev1.ResultBatch{}, &shalev1.PutRequest{}, &shalev1.PutResponse{},
	&shalev1.TxnRequest{}, &shalev1.BatchRequest{}, &shalev1.RaftCommand{}, &shalev1.CommandResult{},
	&shalev1.RaftMessageBatch{}, &shalev1.ScanResponse{}, &shalev1.WatchResponse{},
}

// canonicalUnknown rewrites the tags of the unknown fields of m, and of
// the messages in it, in their shortest form, and drops those of a
// google.protobuf.Any.
func canonicalUnknown(m protoreflect.Message) {
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		m.SetUnknown(nil)
	}
	if u := m.GetUnknown(); len(u) > 0 {
		var out []byte
		for len(u) > 0 {
			num, typ, n := protowire.ConsumeTag(u)
			v := protowire.ConsumeFieldValue(num, typ, u[n:])
			if n < 0 || v < 0 {
				return
			}
			out = append(protowire.AppendTag(out, num, typ), u[n:n+v]...)
			u = u[n+v:]
		}
		m.SetUnknown(out)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
					canonicalUnknown(v.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := range v.List().Len() {
					canonicalUnknown(v.List().Get(i).Message())
				}
			}
		case fd.Message() != nil:
			canonicalUnknown(v.Message())
		}
		return true
	})
}

// FuzzUnmarshal decodes arbitrary bytes as each of fuzzTypes with
// Unmarshal and with proto.Unmarshal. What Unmarshal accepts, protobuf
// accepts too, as the same message; it may refuse more (a known field
// sent with another wire type, which protobuf keeps as an unknown field).
// What it decodes re-encodes to bytes protobuf reads back as the same.
func FuzzUnmarshal(f *testing.F) {
	for i, typ := range fuzzTypes {
		for v := range 3 {
			b, err := Marshal(filled(typ, i*3+v, 1))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(uint8(i), b)
		}
	}
	f.Add(uint8(0), []byte{0x0a, 0x02, 0x12, 0x01})
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		typ := fuzzTypes[int(which)%len(fuzzTypes)]
		got := typ.ProtoReflect().New().Interface()
		err := Unmarshal(data, got)
		want := typ.ProtoReflect().New().Interface()
		perr := proto.Unmarshal(data, want)
		viaCodec := typ.ProtoReflect().New().Interface()
		cerr := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, viaCodec)
		if (err == nil) != (cerr == nil) {
			t.Fatalf("Unmarshal: %v; Codec.Unmarshal: %v", err, cerr)
		}
		if err != nil {
			return
		}
		if perr != nil {
			t.Fatalf("Unmarshal accepted what proto.Unmarshal refuses (%v): %x", perr, data)
		}
		// protobuf rewrites an unknown field's tag in its shortest form,
		// the generated code keeps the bytes it got; it drops those of a
		// google.protobuf.Any.
		canonicalUnknown(got.ProtoReflect())
		canonicalUnknown(viaCodec.ProtoReflect())
		canonicalUnknown(want.ProtoReflect())
		if !proto.Equal(got, want) || !proto.Equal(viaCodec, want) {
			t.Fatalf("decoded %v, proto.Unmarshal %v", got, want)
		}
		enc, err := Marshal(got)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if Size(got) != len(enc) {
			t.Fatalf("Size %d, encoding %d bytes", Size(got), len(enc))
		}
		again := typ.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(enc, again); err != nil || !proto.Equal(again, got) {
			t.Fatalf("proto.Unmarshal of the re-encoding: %v, %v", again, err)
		}
	})
}

// TestNilMessageInOneof pins down the one known difference from
// proto.Marshal: a oneof whose case holds a nil message (the wrapper set,
// its message not) is written by the generated code as if the oneof were
// unset, where proto.Marshal writes an empty message of that case. Getters
// read both alike (GetTxn() is nil, its fields zero); a type switch on the
// oneof does not, so no code of ours builds such a value (every wrapper it
// sets holds a message). vtprotobuf's next commit writes the empty message
// but sizes it for a two-byte tag, which corrupts the encoding of fields
// numbered 1-15: the generator stays at v0.6.0 (Makefile) until a release
// fixes both.
func TestNilMessageInOneof(t *testing.T) {
	for _, tc := range []struct{ m, unset proto.Message }{
		{&shalev1.RaftCommand{Epoch: 3, Command: &shalev1.RaftCommand_Txn{}}, &shalev1.RaftCommand{Epoch: 3}},
		{&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Expire{}}, &shalev1.RaftCommand{}},
		{&shalev1.RequestOp{Op: &shalev1.RequestOp_Put{}}, &shalev1.RequestOp{}},
		{&shalev1.ResponseOp{Op: &shalev1.ResponseOp_Get{}}, &shalev1.ResponseOp{}},
	} {
		want, _ := proto.Marshal(tc.unset)
		got, err := Marshal(tc.m)
		if err != nil || !bytes.Equal(got, want) || Size(tc.m) != len(want) {
			t.Fatalf("%v: Marshal %x (%v), Size %d; want %x, as for %v", tc.m, got, err, Size(tc.m), want, tc.unset)
		}
	}
}
