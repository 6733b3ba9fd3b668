package codec

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// raftTypes are the raftpb types the codec encodes and decodes by hand.
var raftTypes = []proto.Message{&raftpb.Message{}, &raftpb.Entry{}, &raftpb.HardState{}}

// raftCases are raftpb values whose fields are set in the ways the
// filler does not: zero values present, empty but present bytes, a
// snapshot without metadata, nested responses.
func raftCases() []proto.Message {
	u := proto.Uint64
	app := raftpb.MsgApp
	normal := raftpb.EntryNormal
	cc := raftpb.EntryConfChangeV2
	return []proto.Message{
		&raftpb.Message{},
		&raftpb.Message{Type: &app, To: u(0), From: u(0), Term: u(0), Reject: proto.Bool(false), Context: []byte{}},
		&raftpb.Message{Type: &app, To: u(2), From: u(1), Term: u(7), LogTerm: u(7), Index: u(1 << 40), Commit: u(99),
			Entries: []*raftpb.Entry{{Term: u(7), Index: u(100), Type: &normal, Data: bytes.Repeat([]byte("v"), 300)}, {}, {Data: []byte{}}, {Type: &cc}}},
		&raftpb.Message{Snapshot: &raftpb.Snapshot{}},
		&raftpb.Message{Snapshot: &raftpb.Snapshot{Data: []byte{}, Metadata: &raftpb.SnapshotMetadata{}}},
		&raftpb.Message{Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: u(5), Term: u(2),
			ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}, LearnersNext: []uint64{1 << 63}, AutoLeave: proto.Bool(true)}}}},
		&raftpb.Message{Responses: []*raftpb.Message{{To: u(1)}, {Responses: []*raftpb.Message{{Vote: u(3), RejectHint: u(4)}}}}},
		&raftpb.Entry{},
		&raftpb.Entry{Term: u(0), Index: u(0), Type: &normal, Data: []byte{}},
		&raftpb.HardState{},
		&raftpb.HardState{Term: u(0), Vote: u(0), Commit: u(0)},
		&raftpb.HardState{Term: u(1 << 63), Vote: u(3), Commit: u(1 << 20)},
	}
}

// TestRaftRoundTrip: the hand-written encoding of raftpb messages is
// proto.Marshal's, byte for byte, Size is its length, and decoding gives
// back what proto.Unmarshal does.
func TestRaftRoundTrip(t *testing.T) {
	msgs := raftCases()
	for _, typ := range raftTypes {
		for v := range variants {
			msgs = append(msgs, filled(typ, v, 0))
		}
	}
	for _, m := range msgs {
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := raftSize(m); !ok {
			t.Fatalf("%T %v left to protobuf", m, m)
		}
		got, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%T %v:\nencoded %x\nprotobuf %x", m, m, got, want)
		}
		if Size(m) != len(want) {
			t.Fatalf("%T %v: Size %d, protobuf's encoding %d bytes", m, m, Size(m), len(want))
		}
		back := m.ProtoReflect().New().Interface()
		if !raftUnmarshal(want, back) {
			t.Fatalf("%T %v: decoding left to protobuf", m, m)
		}
		if !proto.Equal(back, m) {
			t.Fatalf("decoded %v, want %v", back, m)
		}
		// Unmarshal resets: decoding into a used message gives the same.
		if err := Unmarshal(want, back); err != nil || !proto.Equal(back, m) {
			t.Fatalf("second decode %v (%v), want %v", back, err, m)
		}
	}
}

// TestRaftAliasing: UnmarshalRaftMessageAliasing decodes what Unmarshal
// does, with entries' data and contexts that are slices of the encoding,
// each capped at its length; messages decoded from one buffer stay intact
// while their entries are appended to, and an encoding it leaves to
// protobuf decodes all the same. The messages are random: entries of
// random lengths (empty ones too), contexts, nested responses.
func TestRaftAliasing(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 72))
	u := proto.Uint64
	app := raftpb.MsgApp
	var msgs []*raftpb.Message
	for _, c := range raftCases() {
		if m, ok := c.(*raftpb.Message); ok {
			msgs = append(msgs, m)
		}
	}
	for v := range variants {
		msgs = append(msgs, filled(&raftpb.Message{}, v, 0).(*raftpb.Message))
	}
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for range 300 {
		m := &raftpb.Message{Type: &app, To: u(rng.Uint64N(5)), Index: u(rng.Uint64())}
		for range rng.IntN(6) {
			m.Entries = append(m.Entries, &raftpb.Entry{Index: u(rng.Uint64N(1000)), Data: randBytes(rng.IntN(3) * rng.IntN(400))})
		}
		if rng.IntN(3) == 0 {
			m.Context = randBytes(rng.IntN(20))
		}
		if rng.IntN(5) == 0 {
			m.Responses = []*raftpb.Message{{To: u(1), Context: randBytes(8)}}
		}
		msgs = append(msgs, m)
	}
	withUnknown := &raftpb.Message{To: u(3), Context: []byte("c")}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
	msgs = append(msgs, withUnknown)

	// All the encodings in one buffer, as envelopes share a batch's.
	var buf []byte
	var spans [][2]int
	for _, m := range msgs {
		start := len(buf)
		var err error
		if buf, err = MarshalAppend(buf, m); err != nil {
			t.Fatal(err)
		}
		spans = append(spans, [2]int{start, len(buf)})
	}
	within := func(b []byte) bool {
		if len(b) == 0 {
			return false
		}
		lo, hi := uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&buf[len(buf)-1]))
		first, last := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[len(b)-1]))
		return first >= lo && last <= hi
	}
	decoded := make([]*raftpb.Message, len(msgs))
	for i, sp := range spans {
		decoded[i] = &raftpb.Message{}
		if err := UnmarshalRaftMessageAliasing(buf[sp[0]:sp[1]:sp[1]], decoded[i]); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !proto.Equal(decoded[i], msgs[i]) {
			t.Fatalf("message %d: decoded %v, want %v", i, decoded[i], msgs[i])
		}
		d := decoded[i]
		if hasUnknown(msgs[i]) {
			if within(d.Context) {
				t.Fatalf("message %d left to protobuf aliases its encoding", i)
			}
			continue
		}
		for _, e := range d.Entries {
			if len(e.Data) > 0 && (!within(e.Data) || cap(e.Data) != len(e.Data)) {
				t.Fatalf("message %d: entry data not a capped slice of the encoding", i)
			}
		}
		if len(d.Context) > 0 && (!within(d.Context) || cap(d.Context) != len(d.Context)) {
			t.Fatalf("message %d: context not a capped slice of the encoding", i)
		}
	}
	// Appending to every entry's data and context leaves the others'.
	for _, d := range decoded {
		for _, e := range d.Entries {
			e.Data = append(e.Data, 0xff)
		}
		d.Context = append(d.Context, 0xff)
	}
	for i, d := range decoded {
		for j, e := range d.Entries {
			e.Data = e.Data[:len(e.Data)-1]
			if !bytes.Equal(e.Data, msgs[i].Entries[j].Data) {
				t.Fatalf("message %d entry %d changed", i, j)
			}
		}
		d.Context = d.Context[:len(d.Context)-1]
		if !bytes.Equal(d.Context, msgs[i].Context) {
			t.Fatalf("message %d context changed", i)
		}
	}
}

// TestRaftLeftToProtobuf: what the hand-written code does not cover is
// encoded and decoded by protobuf, with protobuf's result.
func TestRaftLeftToProtobuf(t *testing.T) {
	withUnknown := &raftpb.Message{To: proto.Uint64(3)}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
	entryUnknown := &raftpb.Entry{Index: proto.Uint64(1)}
	entryUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 50, protowire.VarintType), 1))
	for _, m := range []proto.Message{
		withUnknown,
		&raftpb.Message{Entries: []*raftpb.Entry{entryUnknown}},
		&raftpb.Message{Responses: []*raftpb.Message{withUnknown}},
		entryUnknown,
	} {
		if _, ok := raftMarshalAppend(nil, m); ok {
			t.Fatalf("%v: encoded by hand despite its unknown fields", m)
		}
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Marshal(m)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%v: encoded %x (%v), protobuf %x", m, got, err, want)
		}
		if Size(m) != len(want) {
			t.Fatalf("Size %d, want %d", Size(m), len(want))
		}
		back := m.ProtoReflect().New().Interface()
		if raftUnmarshal(want, back) {
			t.Fatalf("%x: unknown fields decoded by hand", want)
		}
		if err := Unmarshal(want, back); err != nil || !proto.Equal(back, m) {
			t.Fatalf("decoded %v (%v), want %v", back, err, m)
		}
	}
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	for _, tc := range []struct {
		name string
		typ  proto.Message
		b    []byte
	}{
		{"unknown enum value", &raftpb.Message{}, protowire.AppendVarint(tag(1, protowire.VarintType), 200)},
		{"negative enum value", &raftpb.Entry{}, protowire.AppendVarint(tag(1, protowire.VarintType), 1<<64-1)},
		{"packed voters", &raftpb.Message{}, protowire.AppendBytes(tag(9, protowire.BytesType),
			protowire.AppendBytes(tag(2, protowire.BytesType), protowire.AppendBytes(tag(1, protowire.BytesType),
				protowire.AppendBytes(tag(1, protowire.BytesType), []byte{1, 2, 3}))))},
		{"snapshot twice", &raftpb.Message{}, append(protowire.AppendBytes(tag(9, protowire.BytesType), []byte{0x0a, 0x01, 0x61}),
			protowire.AppendBytes(tag(9, protowire.BytesType), []byte{0x12, 0x02, 0x10, 0x05})...)},
		{"fixed64 term", &raftpb.HardState{}, protowire.AppendFixed64(tag(1, protowire.Fixed64Type), 9)},
		{"field number 0", &raftpb.HardState{}, []byte{0x00, 0x01}},
		{"truncated", &raftpb.Entry{}, []byte{0x22, 0x05, 0x01}},
	} {
		got := tc.typ.ProtoReflect().New().Interface()
		if raftUnmarshal(tc.b, got) {
			t.Fatalf("%s: decoded by hand", tc.name)
		}
		want := tc.typ.ProtoReflect().New().Interface()
		perr := proto.Unmarshal(tc.b, want)
		err := Unmarshal(tc.b, got)
		if (err == nil) != (perr == nil) || (err == nil && !proto.Equal(got, want)) {
			t.Fatalf("%s: decoded %v (%v), protobuf %v (%v)", tc.name, got, err, want, perr)
		}
	}
}

// FuzzRaftUnmarshal decodes arbitrary bytes as each raftpb type the codec
// handles by hand, with Unmarshal and with proto.Unmarshal: both refuse
// or both decode the same message, which Marshal encodes as proto.Marshal
// does.
func FuzzRaftUnmarshal(f *testing.F) {
	for i, typ := range raftTypes {
		for v := range 3 {
			b, err := proto.Marshal(filled(typ, v, 0))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(uint8(i), b)
		}
	}
	for _, m := range raftCases() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		for i, typ := range raftTypes {
			if typ.ProtoReflect().Descriptor() == m.ProtoReflect().Descriptor() {
				f.Add(uint8(i), b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		typ := raftTypes[int(which)%len(raftTypes)]
		got := typ.ProtoReflect().New().Interface()
		err := Unmarshal(data, got)
		want := typ.ProtoReflect().New().Interface()
		perr := proto.Unmarshal(data, want)
		if (err == nil) != (perr == nil) {
			t.Fatalf("Unmarshal: %v; proto.Unmarshal: %v", err, perr)
		}
		if err != nil {
			return
		}
		if !proto.Equal(got, want) {
			t.Fatalf("decoded %v, proto.Unmarshal %v", got, want)
		}
		enc, err := Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		penc, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, penc) || Size(got) != len(penc) {
			t.Fatalf("encoded %x (Size %d), proto.Marshal %x", enc, Size(got), penc)
		}
	})
}

// TestClone: Clone copies every field of every shale.v1 message and of
// Raft's HardState and ConfState (the filler sets them all, so a field
// the hand-written copies miss fails here), and the copy shares nothing
// that a change to it would show in the original.
func TestClone(t *testing.T) {
	msgs := []proto.Message{(*raftpb.HardState)(nil), (*shalev1.ShardDescriptor)(nil)}
	for _, typ := range append(shaleMessages(t), &raftpb.HardState{}, &raftpb.ConfState{}, &raftpb.Message{}) {
		for v := range 3 {
			msgs = append(msgs, filled(typ, v, 2))
		}
	}
	for _, m := range msgs {
		c := Clone(m)
		if !proto.Equal(c, m) {
			t.Fatalf("Clone(%v) = %v", m, c)
		}
		if !m.ProtoReflect().IsValid() {
			continue
		}
		det := proto.MarshalOptions{Deterministic: true}
		want, err := det.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		scribble(c.ProtoReflect())
		if got, _ := det.Marshal(m); !bytes.Equal(got, want) {
			t.Fatalf("changing the clone changed the original %T", m)
		}
	}
}

// scribble changes, in place, every field set in m and in the messages
// it holds: bytes are overwritten where they lie, list elements are
// replaced, scalars set anew.
func scribble(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					scribble(mv.Message())
				}
				return true
			})
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				if fd.Message() != nil {
					scribble(l.Get(i).Message())
				} else if fd.Kind() == protoreflect.BytesKind {
					flip(l.Get(i).Bytes())
				} else {
					l.Set(i, changed(fd, l.Get(i)))
				}
			}
		case fd.Message() != nil:
			scribble(v.Message())
		case fd.Kind() == protoreflect.BytesKind:
			flip(v.Bytes())
		default:
			m.Set(fd, changed(fd, v))
		}
		return true
	})
}

func flip(b []byte) {
	for i := range b {
		b[i] ^= 0xff
	}
}

// changed returns a value of fd's kind other than v, for the scalar kinds
// of shale.v1 and raftpb.
func changed(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(!v.Bool())
	case protoreflect.EnumKind:
		return v // an enum's other value may not exist; the filler sets few
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v.String() + "x")
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(v.Int()) + 1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(v.Int() + 1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(v.Uint()) + 1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(v.Uint() + 1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(v.Float()) + 1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(v.Float() + 1)
	}
	return v
}

// BenchmarkRaftMessage encodes and decodes a leader's append of eight
// 300-byte entries and a follower's acknowledgement, with protobuf and
// with the codec.
func BenchmarkRaftMessage(b *testing.B) {
	u := proto.Uint64
	app, resp, normal := raftpb.MsgApp, raftpb.MsgAppResp, raftpb.EntryNormal
	mApp := &raftpb.Message{Type: &app, To: u(2), From: u(1), Term: u(3), LogTerm: u(3), Index: u(1000), Commit: u(998)}
	for i := range 8 {
		mApp.Entries = append(mApp.Entries, &raftpb.Entry{Term: u(3), Index: u(1001 + uint64(i)), Type: &normal, Data: bytes.Repeat([]byte{'x'}, 300)})
	}
	mResp := &raftpb.Message{Type: &resp, To: u(1), From: u(2), Term: u(3), LogTerm: u(3), Index: u(1008), Commit: u(998)}
	for _, tc := range []struct {
		name string
		m    *raftpb.Message
	}{{"MsgApp8", mApp}, {"MsgAppResp", mResp}} {
		enc, err := proto.Marshal(tc.m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name+"/encode/proto", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = proto.Marshal(tc.m)
			}
		})
		b.Run(tc.name+"/encode/codec", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Marshal(tc.m)
			}
		})
		b.Run(tc.name+"/decode/proto", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = proto.Unmarshal(enc, &raftpb.Message{})
			}
		})
		b.Run(tc.name+"/decode/codec", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Unmarshal(enc, &raftpb.Message{})
			}
		})
	}
}
