package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// TestCallsStream: calls carried by KV.Calls are served as their unary
// methods are: the same results, and for bad input, a misaddressed shard or
// a key the user may not write, the same status code and typed details;
// each call is authorized on its own (one refused call does not stop the
// others), and the stream serves batch after batch.
func TestCallsStream(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, TLS: true, Splits: [][]byte{[]byte("m")},
		Configure: func(cfg *server.Config) { cfg.ReplicationFactor = 1 }})
	cc := authConn(t, c, c.Endpoints()[0])
	kv, au := shalev1.NewKVClient(cc), shalev1.NewAuthClient(cc)
	setUpAuth(t, c, map[string][]*shalev1.Permission{
		"bob": {{Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Key: []byte("user/"), Prefix: true}},
	})
	bob := login(t, au, "bob", "bobpw")
	ctx, cancel := context.WithTimeout(as(bob), 30*time.Second)
	defer cancel()
	stream, err := kv.Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	exchange := func(calls ...*shalev1.Call) map[uint64]*shalev1.CallResult {
		t.Helper()
		return callsExchange(t, stream, calls...)
	}

	// Refusals, compared with the unary calls' statuses.
	type refusal struct {
		method string
		req    proto.Message
		unary  func() error
	}
	put := func(req *shalev1.PutRequest) func() error {
		return func() error { _, err := kv.Put(as(bob), req); return err }
	}
	refusals := []refusal{
		{"Put", &shalev1.PutRequest{Key: []byte("other"), Value: []byte("v")}, nil},
		{"Put", &shalev1.PutRequest{Value: []byte("v")}, nil},
		{"Put", &shalev1.PutRequest{Header: &shalev1.RequestHeader{ShardId: 9999}, Key: []byte("user/9"), Value: []byte("v")}, nil},
		{"Get", &shalev1.GetRequest{Key: []byte("other")}, nil},
		{"Scan", &shalev1.ScanRequest{StartKey: []byte("user/9"), EndKey: []byte("user/1")}, nil},
		{"Txn", &shalev1.TxnRequest{}, nil},
	}
	refusals[0].unary = put(refusals[0].req.(*shalev1.PutRequest))
	refusals[1].unary = put(refusals[1].req.(*shalev1.PutRequest))
	refusals[2].unary = put(refusals[2].req.(*shalev1.PutRequest))
	refusals[3].unary = func() error { _, err := kv.Get(as(bob), refusals[3].req.(*shalev1.GetRequest)); return err }
	refusals[4].unary = func() error { _, err := kv.Scan(as(bob), refusals[4].req.(*shalev1.ScanRequest)); return err }
	refusals[5].unary = func() error { _, err := kv.Txn(as(bob), refusals[5].req.(*shalev1.TxnRequest)); return err }

	calls := []*shalev1.Call{
		{Id: 1, Method: "Put", Request: enc(&shalev1.PutRequest{Key: []byte("user/1"), Value: []byte("v1")})},
		{Id: 2, Method: "Put", Request: enc(&shalev1.PutRequest{Key: []byte("user/2"), Value: []byte("v2")}), TimeoutMs: 5000},
		{Id: 3, Method: "Watch", Request: enc(&shalev1.WatchRequest{})},
		{Id: 4, Method: "NoSuchMethod"},
		{Id: 5, Method: "Put", Request: []byte{0xff, 0xff, 0xff}},
		{Id: 6, Method: "Get", TimeoutMs: -1, Request: enc(&shalev1.GetRequest{Key: []byte("user/1")})},
	}
	for i, r := range refusals {
		calls = append(calls, &shalev1.Call{Id: uint64(100 + i), Method: r.method, Request: enc(r.req)})
	}
	direct := server.CallsPutsDirect(c.Node(1))
	got := exchange(calls...)
	// The two puts that pass authorization and validation are proposed
	// from the stream's goroutine; the refused ones never reach a proposal.
	if d := server.CallsPutsDirect(c.Node(1)) - direct; d != 2 {
		t.Errorf("%d puts proposed without a call worker, want 2", d)
	}
	for _, id := range []uint64{1, 2} {
		r := got[id]
		var resp shalev1.PutResponse
		if r.GetCode() != 0 || proto.Unmarshal(r.GetResponse(), &resp) != nil || resp.GetHeader().GetRevision() == 0 {
			t.Fatalf("put %d over the stream: %v", id, r)
		}
	}
	for _, id := range []uint64{3, 4, 5, 6} {
		if r := got[id]; codes.Code(r.GetCode()) != codes.InvalidArgument || len(r.GetResponse()) != 0 {
			t.Errorf("call %d: %v, want InvalidArgument", id, r)
		}
	}
	for i, rf := range refusals {
		r := got[uint64(100+i)]
		want := status.Convert(rf.unary())
		if want.Code() == codes.OK {
			t.Fatalf("refusal %d (%s %v): the unary call succeeded", i, rf.method, rf.req)
		}
		if codes.Code(r.GetCode()) != want.Code() || !slices.EqualFunc(r.GetDetails(), want.Proto().GetDetails(), func(x, y *anypb.Any) bool { return proto.Equal(x, y) }) {
			t.Errorf("%s %v over the stream: %v %q %v; unary: %v", rf.method, rf.req, codes.Code(r.GetCode()), r.GetMessage(), r.GetDetails(), want)
		}
	}
	// A later batch on the same stream reads the writes of the first.
	got = exchange(&shalev1.Call{Id: 7, Method: "Get", Request: enc(&shalev1.GetRequest{Key: []byte("user/2")})})
	var gr shalev1.GetResponse
	if r := got[7]; r.GetCode() != 0 || proto.Unmarshal(r.GetResponse(), &gr) != nil || string(gr.GetKv().GetValue()) != "v2" {
		t.Fatalf("get over the stream: %v", got[7])
	}
	// Nothing refused was written.
	root := login(t, au, "root", "rootpw")
	if r, err := kv.Get(as(root), &shalev1.GetRequest{Key: []byte("other")}); err != nil || r.GetKv() != nil {
		t.Fatalf("the refused put: %v %v", r, err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the stream goes on after the client closed its side with nothing in flight")
	}
}

// callsExchange sends calls on stream as one batch and returns their
// results by ID.
func callsExchange(t *testing.T, stream shalev1.KV_CallsClient, calls ...*shalev1.Call) map[uint64]*shalev1.CallResult {
	t.Helper()
	if err := stream.Send(&shalev1.CallBatch{Calls: calls}); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]*shalev1.CallResult{}
	for len(got) < len(calls) {
		rb, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rb.GetResults() {
			if got[r.GetId()] != nil {
				t.Fatalf("two results for call %d", r.GetId())
			}
			got[r.GetId()] = r
		}
	}
	return got
}

// TestCallsPutsWithoutWorker: puts over KV.Calls on their shard's leader
// are proposed from the stream's goroutine and answered from the goroutine
// that finishes the proposal, with the results the unary Put gives: a put
// on a follower gets NotLeader (naming the leader), and one whose shard
// has lost its quorum runs out of its budget: Unavailable, or
// DeadlineExceeded once the caller's deadline has passed, as for the
// unary call.
func TestCallsPutsWithoutWorker(t *testing.T) {
	// A 100-ms tick: an isolated leader keeps leading for a second or more
	// (CheckQuorum), past the puts made while it is isolated.
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, TickInterval: 100 * time.Millisecond})
	c.WaitLeaders(30 * time.Second)
	shardID := c.ShardIDs()[1] // the user shard
	leader := c.Leader(shardID)
	follower := leader%3 + 1
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	kvs := map[uint64]shalev1.KVClient{leader: rawKV(t, c.Endpoints()[leader-1]), follower: rawKV(t, c.Endpoints()[follower-1])}
	streams := map[uint64]shalev1.KV_CallsClient{}
	for id, kv := range kvs {
		s, err := kv.Calls(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams[id] = s
	}
	put := func(id uint64, key string, timeoutMs int64, h *shalev1.RequestHeader) *shalev1.Call {
		b, err := proto.Marshal(&shalev1.PutRequest{Header: h, Key: []byte(key), Value: []byte("v")})
		if err != nil {
			t.Fatal(err)
		}
		return &shalev1.Call{Id: id, Method: "Put", Request: b, TimeoutMs: timeoutMs}
	}
	sameAsUnary := func(what string, r *shalev1.CallResult, unary error) {
		t.Helper()
		want := status.Convert(unary)
		if codes.Code(r.GetCode()) != want.Code() || !slices.EqualFunc(r.GetDetails(), want.Proto().GetDetails(), func(x, y *anypb.Any) bool { return proto.Equal(x, y) }) {
			t.Errorf("%s over the stream: %v %q %v; unary: %v", what, codes.Code(r.GetCode()), r.GetMessage(), r.GetDetails(), want)
		}
	}

	// Puts on the leader, in one batch: each proposed without a worker.
	before := server.CallsPutsDirect(c.Node(leader))
	var calls []*shalev1.Call
	for i := range 50 {
		calls = append(calls, put(uint64(i+1), fmt.Sprintf("direct/%02d", i), int64(5000*(i%2)), nil))
	}
	for id, r := range callsExchange(t, streams[leader], calls...) {
		var resp shalev1.PutResponse
		if r.GetCode() != 0 || proto.Unmarshal(r.GetResponse(), &resp) != nil || resp.GetHeader().GetRevision() == 0 ||
			resp.GetHeader().GetShardId() != shardID || resp.GetHeader().GetNodeId() != leader {
			t.Fatalf("put %d: %v", id, r)
		}
	}
	if d := server.CallsPutsDirect(c.Node(leader)) - before; d != 50 {
		t.Fatalf("%d of 50 puts on the leader proposed without a call worker", d)
	}

	// A put addressed to the shard on a follower: NotLeader.
	h := &shalev1.RequestHeader{ShardId: shardID}
	r := callsExchange(t, streams[follower], put(100, "direct/f", 5000, h))[100]
	_, unary := kvs[follower].Put(ctx, &shalev1.PutRequest{Header: h, Key: []byte("direct/f"), Value: []byte("v")})
	if status.Code(unary) != codes.FailedPrecondition {
		t.Fatalf("unary put on a follower: %v, want NotLeader", unary)
	}
	sameAsUnary("put on a follower", r, unary)

	// The leader cut off from its followers: a put runs out of its budget.
	c.Isolate(leader)
	before = server.CallsPutsDirect(c.Node(leader))
	r = callsExchange(t, streams[leader], put(200, "direct/q", 300, nil))[200]
	if server.CallsPutsDirect(c.Node(leader)) == before {
		t.Fatal("the put without a quorum was not proposed from the stream's goroutine (leadership lost too early?)")
	}
	// Unavailable when answered at the budget's end, before the caller's
	// deadline; DeadlineExceeded when answered after it (a loaded machine
	// may take the 30 ms between them to run the answer).
	if code := codes.Code(r.GetCode()); code != codes.Unavailable && code != codes.DeadlineExceeded || !strings.Contains(r.GetMessage(), "no quorum") {
		t.Errorf("put without a quorum over the stream: %v %q, want Unavailable or DeadlineExceeded (no quorum)", code, r.GetMessage())
	}
	uctx, ucancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ucancel()
	_, unary = kvs[leader].Put(uctx, &shalev1.PutRequest{Key: []byte("direct/q2"), Value: []byte("v")})
	if code := status.Code(unary); code != codes.Unavailable && code != codes.DeadlineExceeded {
		t.Fatalf("unary put without a quorum: %v, want Unavailable or DeadlineExceeded", unary)
	}
	c.Heal()
	for _, s := range streams {
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
	}
}
