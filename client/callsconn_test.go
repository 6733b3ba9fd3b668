package client

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// echoCalls is a KV service whose Calls answers each call with a response
// of the call's request repeated respRepeat times, and reports the
// metadata the stream arrived with on md. With fail set, Calls ends at
// once with that error.
type echoCalls struct {
	shalev1.UnimplementedKVServer
	respRepeat int
	md         chan metadata.MD
	fail       error
}

func (e *echoCalls) Calls(stream shalev1.KV_CallsServer) error {
	if e.md != nil {
		m, _ := metadata.FromIncomingContext(stream.Context())
		e.md <- m
	}
	if e.fail != nil {
		return e.fail
	}
	for {
		in, err := stream.Recv()
		if err != nil {
			return nil
		}
		out := &shalev1.ResultBatch{}
		for _, c := range in.GetCalls() {
			out.Results = append(out.Results, &shalev1.CallResult{Id: c.GetId(), Response: bytes.Repeat(c.GetRequest(), e.respRepeat)})
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// serveCalls serves kv on a local port with opts; it returns the address
// and the server (stopped at the test's end).
func serveCalls(t *testing.T, kv shalev1.KVServer, opts ...grpc.ServerOption) (string, *grpc.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(opts, codec.ServerOption())...)
	shalev1.RegisterKVServer(srv, kv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), srv
}

// dialCalls opens a callsConn to addr.
func dialCalls(t *testing.T, addr string, md metadata.MD, auth string, goAway func()) *callsConn {
	t.Helper()
	d := &callsDialer{target: addr, creds: insecure.NewCredentials(), clientCtx: context.Background()}
	c, err := d.dial(md, auth, goAway)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

// TestCallsConnFlowControl: batches and results larger than the windows
// and than a frame go through, the sender waiting for the node's window
// updates and the receiver returning its own; the stream's metadata and
// token arrive (binary values, an upper-case key and a header block over a
// frame too), the caller's reserved keys and stale token left out.
func TestCallsConnFlowControl(t *testing.T) {
	kv := &echoCalls{respRepeat: 3, md: make(chan metadata.MD, 1)}
	addr, _ := serveCalls(t, kv, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	big := strings.Repeat("b", 40<<10) // over a frame: HEADERS and CONTINUATION
	md := metadata.Pairs(shalev1.TargetNodeMetadataKey, "7", "x-trace-bin", "\x00\x01\xff", "x-big", big,
		"content-type", "text/plain", AuthorizationMetadataKey, "Bearer stale")
	md["X-Upper"] = []string{"u"}
	c := dialCalls(t, addr, md, "Bearer tok", nil)
	var got metadata.MD
	select {
	case got = <-kv.md:
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not take the stream")
	}
	if v := got.Get("x-big"); len(v) != 1 || v[0] != big {
		t.Errorf("large metadata: %d values", len(v))
	}
	if v := got.Get("x-upper"); len(v) != 1 || v[0] != "u" {
		t.Errorf("metadata under an upper-case key %q", v)
	}
	if v := got.Get("content-type"); len(v) != 1 || v[0] != "application/grpc" {
		t.Errorf("content-type %q", v)
	}
	if v := got.Get(shalev1.TargetNodeMetadataKey); len(v) != 1 || v[0] != "7" {
		t.Errorf("target node metadata %q", v)
	}
	if v := got.Get("x-trace-bin"); len(v) != 1 || v[0] != "\x00\x01\xff" {
		t.Errorf("binary metadata %q", v)
	}
	if v := got.Get(AuthorizationMetadataKey); len(v) != 1 || v[0] != "Bearer tok" {
		t.Errorf("authorization %q", v)
	}
	done := make(chan error, 1)
	const batches, perBatch, reqBytes = 12, 4, 100 << 10
	go func() {
		for b := range batches {
			cb := &shalev1.CallBatch{}
			for i := range perBatch {
				req := bytes.Repeat([]byte{byte(b*perBatch + i)}, reqBytes)
				cb.Calls = append(cb.Calls, &shalev1.Call{Id: uint64(b*perBatch + i + 1), Method: "Put", Request: req})
			}
			if err := c.Send(cb); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	seen := 0
	for seen < batches*perBatch {
		rb, err := c.Recv()
		if err != nil {
			t.Fatalf("after %d results: %v", seen, err)
		}
		for _, r := range rb.GetResults() {
			seen++
			id := r.GetId()
			want := bytes.Repeat([]byte{byte(id - 1)}, 3*reqBytes)
			if !bytes.Equal(r.GetResponse(), want) {
				t.Fatalf("result %d: %d bytes, not the request three times", id, len(r.GetResponse()))
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestCallsConnStreamStatus: a stream the node ends with a status (before
// any result: a trailers-only response) fails with that status, its
// message and its details.
func TestCallsConnStreamStatus(t *testing.T) {
	st, err := status.New(codes.FailedPrecondition, "not now: 100% busy").WithDetails(&shalev1.NotLeader{LeaderNodeId: 3})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveCalls(t, &echoCalls{fail: st.Err()})
	c := dialCalls(t, addr, nil, "", nil)
	_, err = c.Recv()
	got := status.Convert(err)
	if got.Code() != codes.FailedPrecondition || got.Message() != "not now: 100% busy" {
		t.Fatalf("status %v", got)
	}
	if d := got.Details(); len(d) != 1 || d[0].(*shalev1.NotLeader).GetLeaderNodeId() != 3 {
		t.Fatalf("details %v", d)
	}
	addr, _ = serveCalls(t, &shalev1.UnimplementedKVServer{})
	if _, err := dialCalls(t, addr, nil, "", nil).Recv(); status.Code(err) != codes.Unimplemented {
		t.Fatalf("a node without KV.Calls: %v", err)
	}
}

// TestCallsConnGoAway: a node stopping gracefully announces it, the
// stream is told (goAway) and its call in flight still answered.
func TestCallsConnGoAway(t *testing.T) {
	addr, srv := serveCalls(t, &echoCalls{respRepeat: 1})
	gone := make(chan struct{})
	c := dialCalls(t, addr, nil, "", func() { close(gone) })
	if err := c.Send(&shalev1.CallBatch{Calls: []*shalev1.Call{{Id: 1, Method: "Put", Request: []byte("a")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recv(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	recvd := make(chan error, 1)
	go func() {
		for {
			rb, err := c.Recv()
			if err != nil {
				recvd <- err
				return
			}
			if len(rb.GetResults()) > 0 {
				recvd <- nil
			}
		}
	}()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("no GOAWAY seen")
	}
	if err := c.Send(&shalev1.CallBatch{Calls: []*shalev1.Call{{Id: 2, Method: "Put", Request: []byte("b")}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-recvd; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	c.close()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not stop once the stream closed")
	}
}

// TestCallsConnKeepalive: a node that stops answering (its connection
// open, nothing read or sent) is found by the keepalive ping, and the
// stream fails Unavailable.
func TestCallsConnKeepalive(t *testing.T) {
	kt, kto := callsKeepaliveTime, callsKeepaliveTimeout
	callsKeepaliveTime, callsKeepaliveTimeout = 50*time.Millisecond, 100*time.Millisecond
	t.Cleanup(func() { callsKeepaliveTime, callsKeepaliveTimeout = kt, kto })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		// Settings, then silence: what it reads it discards.
		_ = http2.NewFramer(conn, nil).WriteSettings()
		_, _ = io.Copy(io.Discard, conn)
	}()
	c := dialCalls(t, lis.Addr().String(), nil, "", nil)
	start := time.Now()
	_, err = c.Recv()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "closed") && !strings.Contains(err.Error(), "keepalive") {
		t.Fatalf("err %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("found after %v", d)
	}
	if err := c.Send(&shalev1.CallBatch{Calls: []*shalev1.Call{{Id: 1}}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("send after the failure: %v", err)
	}
}

// streamOf returns the open KV.Calls stream of c's connection to the
// fake cluster's only node.
func streamOf(t *testing.T, c *Client) *callStream {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.muxes) != 1 {
		t.Fatalf("%d connections with KV.Calls multiplexers, want 1", len(c.muxes))
	}
	for _, m := range c.muxes {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.cur == nil {
			t.Fatal("no KV.Calls stream")
		}
		return m.cur
	}
	return nil
}

// TestCallsOnConnectionOfTheirOwn: a client that dials on its own sends
// its KV calls on a KV.Calls stream on a connection of its own; with dial
// options it sends them on the gRPC connection, and with WithUnaryCalls
// as unary calls. Closing the client closes the stream's connection.
func TestCallsOnConnectionOfTheirOwn(t *testing.T) {
	fc := newFakeClusterWith(t, 1, fakeServerSetup{
		kv: func(n *fakeNode) shalev1.KVServer { return &callsKV{fakeKVService{n: n}} },
	})
	ctx := context.Background()
	c := fc.client()
	if _, err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	s := streamOf(t, c)
	if _, ok := s.stream.(*callsConn); !ok {
		t.Fatalf("the stream is a %T, not a callsConn", s.stream)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		err := s.err
		s.mu.Unlock()
		if status.Code(err) == codes.Unavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream after Close: %v", err)
		}
	}
	g := fc.client(WithDialOptions(grpc.WithUserAgent("test")))
	if _, err := g.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	n := len(g.muxes)
	g.mu.Unlock()
	if n != 0 {
		t.Fatalf("with dial options %d direct-path multiplexers, want none", n)
	}
}
