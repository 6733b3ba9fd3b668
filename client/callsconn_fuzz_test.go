package client

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// callsFrames writes the frames a node sends on a KV.Calls stream, for the
// fuzz test's seeds.
type callsFrames struct {
	buf bytes.Buffer
	fr  *http2.Framer
}

func newCallsFrames() *callsFrames {
	f := &callsFrames{}
	f.fr = http2.NewFramer(&f.buf, nil)
	return f
}

// headers writes a header block of fields on the stream.
func (f *callsFrames) headers(end bool, fields ...string) *callsFrames {
	var hb bytes.Buffer
	he := hpack.NewEncoder(&hb)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = he.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: callsStreamID, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: end})
	return f
}

// message writes rb as one gRPC message split over DATA frames of at most
// split bytes.
func (f *callsFrames) message(rb *shalev1.ResultBatch, split int) *callsFrames {
	b, _ := rb.MarshalVT()
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
	msg = append(msg, b...)
	for len(msg) > 0 {
		k := min(split, len(msg))
		_ = f.fr.WriteData(callsStreamID, false, msg[:k])
		msg = msg[k:]
	}
	return f
}

// FuzzCallsConnRecv feeds a callsConn arbitrary bytes as the node's side
// of the connection: Recv never panics, returns a batch or an error, and
// every error is a gRPC status (what the stream's callers are answered
// with). The seeds are well-formed exchanges (results split over frames,
// control frames between them, a status with details, a reset, the node
// going away) for the fuzzer to mutate.
func FuzzCallsConnRecv(f *testing.F) {
	rb := &shalev1.ResultBatch{Results: []*shalev1.CallResult{{Id: 1, Response: []byte("one")}, {Id: 2, Response: bytes.Repeat([]byte("r"), 300)}}}
	ok := newCallsFrames()
	_ = ok.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 15})
	ok.headers(false, ":status", "200", "content-type", "application/grpc")
	ok.message(rb, 7)
	_ = ok.fr.WritePing(false, [8]byte{1})
	_ = ok.fr.WriteWindowUpdate(0, 1000)
	_ = ok.fr.WriteWindowUpdate(callsStreamID, 1000)
	ok.message(rb, 1<<14)
	ok.headers(true, "grpc-status", "0")
	f.Add(ok.buf.Bytes())

	sp, _ := proto.Marshal(&spb.Status{Code: 14, Message: "not the leader"})
	failed := newCallsFrames().headers(false, ":status", "200").message(rb, 3).
		headers(true, "grpc-status", "14", "grpc-message", "not%20the%20leader", "grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(sp))
	f.Add(failed.buf.Bytes())
	f.Add(newCallsFrames().headers(true, ":status", "200", "grpc-status", "12", "grpc-message", "unknown method").buf.Bytes())
	f.Add(newCallsFrames().headers(false, ":status", "503").buf.Bytes())

	reset := newCallsFrames().headers(false, ":status", "200")
	_ = reset.fr.WriteRSTStream(callsStreamID, http2.ErrCodeCancel)
	f.Add(reset.buf.Bytes())
	away := newCallsFrames().headers(false, ":status", "200")
	_ = away.fr.WriteGoAway(callsStreamID, http2.ErrCodeNo, nil)
	away.message(rb, 100)
	f.Add(away.buf.Bytes())

	f.Fuzz(func(t *testing.T, data []byte) {
		recvAll(t, data, func() {})
	})
}

// recvAll has a callsConn receive data as the node's side of the
// connection until Recv fails; it returns the batches received and the
// error, failing t when Recv returns neither or an error that is no gRPC
// status.
func recvAll(t *testing.T, data []byte, goAway func()) ([]*shalev1.ResultBatch, *status.Status) {
	client, node := net.Pipe()
	c := newCallsConn(client, goAway)
	defer c.close()
	go func() { _, _ = io.Copy(io.Discard, node) }() // the client's acknowledgements and window updates
	go func() {
		_, _ = node.Write(data)
		_ = node.Close()
	}()
	var got []*shalev1.ResultBatch
	for range 10_000 {
		rb, err := c.Recv()
		if err != nil {
			st, isStatus := status.FromError(err)
			if !isStatus {
				t.Fatalf("Recv failed with %v (%T), not a gRPC status", err, err)
			}
			return got, st
		}
		if rb == nil {
			t.Fatal("Recv returned neither results nor an error")
		}
		got = append(got, rb)
	}
	t.Fatal("Recv did not end on a finite input")
	return nil, nil
}

// TestCallsConnRecvFrames checks what a callsConn makes of a node's
// frames: results split over frames and interleaved with control frames,
// the status of the trailers with its details, an HTTP error, a reset,
// and the node going away with results still to come.
func TestCallsConnRecvFrames(t *testing.T) {
	rb := &shalev1.ResultBatch{Results: []*shalev1.CallResult{{Id: 7, Response: bytes.Repeat([]byte("v"), 500)}}}
	sp, _ := proto.Marshal(&spb.Status{Code: 14, Message: "not the leader"})
	ok := newCallsFrames().headers(false, ":status", "200")
	_ = ok.fr.WritePing(false, [8]byte{1})
	ok.message(rb, 9)
	_ = ok.fr.WriteWindowUpdate(0, 1000)
	ok.message(rb, 1<<14)
	away := newCallsFrames().headers(false, ":status", "200")
	_ = away.fr.WriteGoAway(callsStreamID, http2.ErrCodeNo, nil)
	away.message(rb, 100)
	reset := newCallsFrames().headers(false, ":status", "200")
	_ = reset.fr.WriteRSTStream(callsStreamID, http2.ErrCodeCancel)
	for _, tc := range []struct {
		name     string
		data     []byte
		batches  int
		code     codes.Code
		msg      string
		goneAway bool
	}{
		{"results then the connection's end", ok.buf.Bytes(), 2, codes.Unavailable, "", false},
		{"status with details", newCallsFrames().headers(false, ":status", "200").message(rb, 3).
			headers(true, "grpc-status", "14", "grpc-message", "ignored", "grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(sp)).buf.Bytes(),
			1, codes.Unavailable, "not the leader", false},
		{"trailers only", newCallsFrames().headers(true, ":status", "200", "grpc-status", "12", "grpc-message", "no%20Calls").buf.Bytes(), 0, codes.Unimplemented, "no Calls", false},
		{"HTTP error", newCallsFrames().headers(false, ":status", "503").buf.Bytes(), 0, codes.Unavailable, "", false},
		{"reset", reset.buf.Bytes(), 0, codes.Canceled, "", false},
		{"going away", away.buf.Bytes(), 1, codes.Unavailable, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goneAway := false
			got, st := recvAll(t, tc.data, func() { goneAway = true })
			if len(got) != tc.batches || st.Code() != tc.code || (tc.msg != "" && st.Message() != tc.msg) || goneAway != tc.goneAway {
				t.Fatalf("%d batches, status %v, gone away %v; want %d, %v %q, %v", len(got), st, goneAway, tc.batches, tc.code, tc.msg, tc.goneAway)
			}
			for _, b := range got {
				if !proto.Equal(b, rb) {
					t.Fatalf("received %v, sent %v", b, rb)
				}
			}
		})
	}
}
