package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// TestCallsStream: calls carried by KV.Calls are served as their unary
// methods are: the same results, and for bad input, a misaddressed shard or
// a key the user may not write, the same status code and typed details;
// each call is authorized on its own (one refused call does not stop the
// others), and the stream serves batch after batch. Every write method's
// admitted calls are proposed from the stream's goroutine, its refused
// ones (PermissionDenied, InvalidArgument) never reach a proposal.
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
	exchange := func(calls ...*shalev1.Call) map[uint64]*shalev1.CallResult {
		t.Helper()
		return callsExchange(t, stream, calls...)
	}

	// Refusals, compared with the unary calls' statuses; code, when set, is
	// the one both must have.
	type refusal struct {
		method string
		req    proto.Message
		code   codes.Code
	}
	long := "user/" + strings.Repeat("x", 5000) // over the 4 KiB key limit, inside bob's range
	putOp := func(key string) *shalev1.RequestOp {
		return &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte(key), Value: []byte("v")}}}
	}
	denied, invalid := codes.PermissionDenied, codes.InvalidArgument
	refusals := []refusal{
		{"Put", &shalev1.PutRequest{Key: []byte("other"), Value: []byte("v")}, denied},
		{"Put", &shalev1.PutRequest{Value: []byte("v")}, 0},
		{"Put", &shalev1.PutRequest{Header: &shalev1.RequestHeader{ShardId: 9999}, Key: []byte("user/9"), Value: []byte("v")}, 0},
		{"Put", &shalev1.PutRequest{Key: []byte("user/9"), Value: []byte("v"), TtlMs: -1}, invalid},
		{"Get", &shalev1.GetRequest{Key: []byte("other")}, 0},
		{"Scan", &shalev1.ScanRequest{StartKey: []byte("user/9"), EndKey: []byte("user/1")}, 0},
		{"Delete", &shalev1.DeleteRequest{Key: []byte("other")}, denied},
		{"Delete", &shalev1.DeleteRequest{Key: []byte(long)}, invalid},
		{"DeleteRange", &shalev1.DeleteRangeRequest{StartKey: []byte("other"), EndKey: []byte("otherz")}, denied},
		{"DeleteRange", &shalev1.DeleteRangeRequest{StartKey: []byte("user/a"), EndKey: []byte(long)}, invalid},
		{"Batch", &shalev1.BatchRequest{Ops: []*shalev1.RequestOp{putOp("user/9"), putOp("other")}}, denied},
		{"Batch", &shalev1.BatchRequest{Ops: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte("user/9")}}}}}, invalid},
		{"CompareAndSwap", &shalev1.CompareAndSwapRequest{Key: []byte("other"), ExpectAbsent: true, NewValue: []byte("v")}, denied},
		{"CompareAndSwap", &shalev1.CompareAndSwapRequest{Key: []byte("user/9"), ExpectAbsent: true, ExpectedValue: []byte("v"), NewValue: []byte("w")}, invalid},
		{"Txn", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("other")}}, denied},
		{"Txn", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("user/9"), Target: 99}}, Success: []*shalev1.RequestOp{putOp("user/9")}}, invalid},
		{"Txn", &shalev1.TxnRequest{}, 0},
	}

	// One admitted call of every write method, on keys of their own.
	writes := []*shalev1.Call{
		callOf(t, 1, "Put", &shalev1.PutRequest{Key: []byte("user/1"), Value: []byte("v1")}),
		callOf(t, 2, "Put", &shalev1.PutRequest{Key: []byte("user/2"), Value: []byte("v2")}),
		callOf(t, 10, "Delete", &shalev1.DeleteRequest{Key: []byte("user/d")}),
		callOf(t, 11, "DeleteRange", &shalev1.DeleteRangeRequest{StartKey: []byte("user/r0"), EndKey: []byte("user/r9")}),
		callOf(t, 12, "Batch", &shalev1.BatchRequest{Ops: []*shalev1.RequestOp{putOp("user/b1"), putOp("user/b2")}}),
		callOf(t, 13, "CompareAndSwap", &shalev1.CompareAndSwapRequest{Key: []byte("user/c"), ExpectAbsent: true, NewValue: []byte("c")}),
		callOf(t, 14, "Txn", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("user/t")}}),
	}
	writes[1].TimeoutMs = 5000
	calls := append(writes,
		callOf(t, 3, "Watch", &shalev1.WatchRequest{}),
		&shalev1.Call{Id: 4, Method: "NoSuchMethod"},
		&shalev1.Call{Id: 5, Method: "Put", Request: []byte{0xff, 0xff, 0xff}},
		&shalev1.Call{Id: 6, Method: "Get", TimeoutMs: -1, Request: callOf(t, 6, "Get", &shalev1.GetRequest{Key: []byte("user/1")}).GetRequest()},
		&shalev1.Call{Id: 7, Method: "Delete", TimeoutMs: -1, Request: callOf(t, 7, "Delete", &shalev1.DeleteRequest{Key: []byte("user/1")}).GetRequest()},
		&shalev1.Call{Id: 8, Method: "CompareAndSwap", Request: []byte{0xff, 0xff, 0xff}},
	)
	for i, r := range refusals {
		calls = append(calls, callOf(t, uint64(100+i), r.method, r.req))
	}
	direct := server.CallsWritesDirect(c.Node(1))
	got := exchange(calls...)
	// The writes that pass authorization and validation are proposed from
	// the stream's goroutine; the refused ones never reach a proposal.
	if d := server.CallsWritesDirect(c.Node(1)) - direct; d != int64(len(writes)) {
		t.Errorf("%d writes proposed without a call worker, want %d", d, len(writes))
	}
	for _, w := range writes {
		r := got[w.GetId()]
		resp := responseOf(t, w.GetMethod(), r)
		if r.GetCode() != 0 || resp == nil {
			t.Fatalf("%s %d over the stream: %v", w.GetMethod(), w.GetId(), r)
		}
		if h := headerOf(resp); h.GetRevision() == 0 || h.GetNodeId() != 1 {
			t.Errorf("%s %d over the stream: header %v", w.GetMethod(), w.GetId(), h)
		}
	}
	if cas := responseOf(t, "CompareAndSwap", got[13]).(*shalev1.CompareAndSwapResponse); !cas.GetSucceeded() {
		t.Errorf("CompareAndSwap of an absent key over the stream: %v", cas)
	}
	for _, id := range []uint64{3, 4, 5, 6, 7, 8} {
		if r := got[id]; codes.Code(r.GetCode()) != codes.InvalidArgument || len(r.GetResponse()) != 0 {
			t.Errorf("call %d: %v, want InvalidArgument", id, r)
		}
	}
	for i, rf := range refusals {
		r := got[uint64(100+i)]
		_, err := invokeKV(t, as(bob), cc, rf.method, rf.req)
		want := status.Convert(err)
		if want.Code() == codes.OK || rf.code != 0 && want.Code() != rf.code {
			t.Fatalf("refusal %d (%s %v): the unary call answered %v, want %v", i, rf.method, rf.req, want.Code(), rf.code)
		}
		if codes.Code(r.GetCode()) != want.Code() || !slices.EqualFunc(r.GetDetails(), want.Proto().GetDetails(), func(x, y *anypb.Any) bool { return proto.Equal(x, y) }) {
			t.Errorf("%s %v over the stream: %v %q %v; unary: %v", rf.method, rf.req, codes.Code(r.GetCode()), r.GetMessage(), r.GetDetails(), want)
		}
	}
	// A later batch on the same stream reads the writes of the first.
	got = exchange(callOf(t, 20, "Get", &shalev1.GetRequest{Key: []byte("user/2")}),
		callOf(t, 21, "Get", &shalev1.GetRequest{Key: []byte("user/b2")}),
		callOf(t, 22, "Get", &shalev1.GetRequest{Key: []byte("user/c")}))
	for id, want := range map[uint64]string{20: "v2", 21: "v", 22: "c"} {
		var gr shalev1.GetResponse
		if r := got[id]; r.GetCode() != 0 || proto.Unmarshal(r.GetResponse(), &gr) != nil || string(gr.GetKv().GetValue()) != want {
			t.Fatalf("get %d over the stream: %v, want %q", id, r, want)
		}
	}
	// Nothing refused was written.
	root := login(t, au, "root", "rootpw")
	for _, k := range []string{"other", "user/9"} {
		if r, err := kv.Get(as(root), &shalev1.GetRequest{Key: []byte(k)}); err != nil || r.GetKv() != nil {
			t.Fatalf("the refused writes of %q: %v %v", k, r, err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the stream goes on after the client closed its side with nothing in flight")
	}
}

// callOf is call id of the KV method with req.
func callOf(t *testing.T, id uint64, method string, req proto.Message) *shalev1.Call {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return &shalev1.Call{Id: id, Method: method, Request: b}
}

// newResponse returns a new response of the KV service's method.
func newResponse(t *testing.T, method string) proto.Message {
	t.Helper()
	d, err := protoregistry.GlobalFiles.FindDescriptorByName("shale.v1.KV")
	if err != nil {
		t.Fatal(err)
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method))
	if md == nil {
		t.Fatalf("the KV service has no method %s", method)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		t.Fatal(err)
	}
	return mt.New().Interface()
}

// invokeKV calls the KV service's unary method with req on cc and returns
// its response and error.
func invokeKV(t *testing.T, ctx context.Context, cc grpc.ClientConnInterface, method string, req proto.Message) (proto.Message, error) {
	t.Helper()
	out := newResponse(t, method)
	if err := cc.Invoke(ctx, "/shale.v1.KV/"+method, req, out); err != nil {
		return nil, err
	}
	return out, nil
}

// responseOf decodes r, a result of a call of the KV method, into the
// method's response; nil when r is an error.
func responseOf(t *testing.T, method string, r *shalev1.CallResult) proto.Message {
	t.Helper()
	if r == nil || r.GetCode() != 0 {
		return nil
	}
	m := newResponse(t, method)
	if err := proto.Unmarshal(r.GetResponse(), m); err != nil {
		t.Fatalf("%s result %d: %v", method, r.GetId(), err)
	}
	return m
}

// headerOf is the header of a KV response.
func headerOf(m proto.Message) *shalev1.ResponseHeader {
	h, _ := m.(interface {
		GetHeader() *shalev1.ResponseHeader
	})
	if h == nil {
		return nil
	}
	return h.GetHeader()
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

// TestCallsWritesWithoutWorker: writes over KV.Calls (every write method)
// on their shard's leader are proposed from the stream's goroutine and
// answered from the goroutine that finishes the proposal, with the results
// the unary method gives (a compare that fails answers the failure
// branch); a write on a follower goes to a call worker and gets NotLeader
// (naming the leader), as the unary call does; and one whose shard has
// lost its quorum runs out of its budget: Unavailable, or DeadlineExceeded
// once the caller's deadline has passed, as for the unary call.
func TestCallsWritesWithoutWorker(t *testing.T) {
	// A 100-ms tick: an isolated leader keeps leading for a second or more
	// (CheckQuorum), past the puts made while it is isolated.
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, TickInterval: 100 * time.Millisecond})
	c.WaitLeaders(30 * time.Second)
	shardID := c.ShardIDs()[1] // the user shard
	leader := c.Leader(shardID)
	follower := leader%3 + 1
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	conns := map[uint64]*grpc.ClientConn{leader: rawConn(t, c.Endpoints()[leader-1]), follower: rawConn(t, c.Endpoints()[follower-1])}
	streams := map[uint64]shalev1.KV_CallsClient{}
	for id, cc := range conns {
		s, err := shalev1.NewKVClient(cc).Calls(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams[id] = s
	}
	put := func(id uint64, key string, timeoutMs int64, h *shalev1.RequestHeader) *shalev1.Call {
		call := callOf(t, id, "Put", &shalev1.PutRequest{Header: h, Key: []byte(key), Value: []byte("v")})
		call.TimeoutMs = timeoutMs
		return call
	}
	sameAsUnary := func(what string, r *shalev1.CallResult, unary error) {
		t.Helper()
		want := status.Convert(unary)
		if codes.Code(r.GetCode()) != want.Code() || !slices.EqualFunc(r.GetDetails(), want.Proto().GetDetails(), func(x, y *anypb.Any) bool { return proto.Equal(x, y) }) {
			t.Errorf("%s over the stream: %v %q %v; unary: %v", what, codes.Code(r.GetCode()), r.GetMessage(), r.GetDetails(), want)
		}
	}
	key := func(format string, i int) []byte { return fmt.Appendf(nil, format, i) }
	putOp := func(k []byte, v string) *shalev1.RequestOp {
		return &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: k, Value: []byte(v)}}}
	}
	// writes makes the i-th request of every write method, addressed by h.
	writes := []struct {
		method string
		req    func(h *shalev1.RequestHeader, i int) proto.Message
	}{
		{"Put", func(h *shalev1.RequestHeader, i int) proto.Message {
			return &shalev1.PutRequest{Header: h, Key: key("direct/%02d", i), Value: []byte("v")}
		}},
		{"Delete", func(h *shalev1.RequestHeader, i int) proto.Message {
			return &shalev1.DeleteRequest{Header: h, Key: key("direct/%02d", i), PrevKv: true}
		}},
		{"DeleteRange", func(h *shalev1.RequestHeader, i int) proto.Message {
			return &shalev1.DeleteRangeRequest{Header: h, StartKey: key("direct/%02d", i+10), EndKey: key("direct/%02d~", i+10)}
		}},
		{"Batch", func(h *shalev1.RequestHeader, i int) proto.Message {
			return &shalev1.BatchRequest{Header: h, Ops: []*shalev1.RequestOp{putOp(key("batch/%02d/a", i), "b"), putOp(key("batch/%02d/b", i), "b")}}
		}},
		{"CompareAndSwap", func(h *shalev1.RequestHeader, i int) proto.Message {
			return &shalev1.CompareAndSwapRequest{Header: h, Key: key("direct/%02d", i+20), ExpectedValue: []byte("v"), NewValue: []byte("cas")}
		}},
		{"Txn", func(h *shalev1.RequestHeader, i int) proto.Message {
			return &shalev1.TxnRequest{Header: h,
				Compares: []*shalev1.Compare{{Key: key("direct/%02d", i+30), Value: []byte("v")}},
				Success:  []*shalev1.RequestOp{putOp(key("direct/%02d", i+30), "txn")}}
		}},
	}
	const perMethod = 10

	// Writes on the leader, one batch per method: each proposed without a
	// worker. The puts go first: the others change the keys they wrote
	// (direct/00-09 deleted, 10-19 deleted by range, 20-29 swapped, 30-39
	// written by a Txn).
	for _, w := range writes {
		before := server.CallsWritesDirect(c.Node(leader))
		n := perMethod
		if w.method == "Put" {
			n = 50 // direct/00 to direct/49
		}
		var calls []*shalev1.Call
		for i := range n {
			call := callOf(t, uint64(i+1), w.method, w.req(nil, i))
			call.TimeoutMs = int64(5000 * (i % 2))
			calls = append(calls, call)
		}
		for id, r := range callsExchange(t, streams[leader], calls...) {
			resp := responseOf(t, w.method, r)
			h := headerOf(resp)
			if resp == nil || h.GetRevision() == 0 || h.GetShardId() != shardID || h.GetNodeId() != leader {
				t.Fatalf("%s %d on the leader: %v", w.method, id, r)
			}
			switch resp := resp.(type) {
			case *shalev1.DeleteResponse:
				if resp.GetDeleted() != 1 || string(resp.GetPrevKv().GetValue()) != "v" {
					t.Errorf("delete %d: %v", id, resp)
				}
			case *shalev1.CompareAndSwapResponse:
				if !resp.GetSucceeded() || string(resp.GetCurrent().GetValue()) != "v" {
					t.Errorf("compare-and-swap %d: %v", id, resp)
				}
			case *shalev1.TxnResponse:
				if !resp.GetSucceeded() {
					t.Errorf("txn %d: %v", id, resp)
				}
			}
		}
		if d := server.CallsWritesDirect(c.Node(leader)) - before; d != int64(len(calls)) {
			t.Fatalf("%d of %d %s calls on the leader proposed without a call worker", d, len(calls), w.method)
		}
	}
	// What they wrote, and a compare that fails: a Txn answers its failure
	// branch, a CompareAndSwap the current value, both proposed without a
	// worker.
	before := server.CallsWritesDirect(c.Node(leader))
	cmp := []*shalev1.Compare{{Key: []byte("direct/45"), Value: []byte("nope")}}
	got := callsExchange(t, streams[leader],
		callOf(t, 1, "Txn", &shalev1.TxnRequest{Compares: cmp,
			Success: []*shalev1.RequestOp{putOp([]byte("direct/45"), "no")},
			Failure: []*shalev1.RequestOp{
				{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte("direct/00")}}}, // deleted
				{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte("direct/11")}}}, // deleted by its range
				{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte("direct/21")}}}, // swapped
				{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte("direct/31")}}}, // the txn's
				{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte("batch/03/b")}}},
				{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte("direct/45")}}}, // untouched
			}}),
		callOf(t, 2, "CompareAndSwap", &shalev1.CompareAndSwapRequest{Key: []byte("direct/21"), ExpectedValue: []byte("v"), NewValue: []byte("no")}),
	)
	if d := server.CallsWritesDirect(c.Node(leader)) - before; d != 2 {
		t.Errorf("%d of 2 writes whose compare fails proposed without a call worker", d)
	}
	txn, _ := responseOf(t, "Txn", got[1]).(*shalev1.TxnResponse)
	var values []string
	for _, r := range txn.GetResults() {
		values = append(values, string(r.GetGet().GetKv().GetValue()))
	}
	if txn == nil || txn.GetSucceeded() || !slices.Equal(values, []string{"", "", "cas", "txn", "b", "v"}) {
		t.Errorf("txn whose compare fails: %v (values %q), want its failure branch's reads \"\", \"\", cas, txn, b, v", got[1], values)
	}
	if cas, _ := responseOf(t, "CompareAndSwap", got[2]).(*shalev1.CompareAndSwapResponse); cas == nil || cas.GetSucceeded() || string(cas.GetCurrent().GetValue()) != "cas" {
		t.Errorf("compare-and-swap whose compare fails: %v", got[2])
	}

	// Every write addressed to the shard on a follower: NotLeader, from a
	// call worker.
	h := &shalev1.RequestHeader{ShardId: shardID}
	before = server.CallsWritesDirect(c.Node(follower))
	for i, w := range writes {
		r := callsExchange(t, streams[follower], callOf(t, uint64(100+i), w.method, w.req(h, 90)))[uint64(100+i)]
		_, unary := invokeKV(t, ctx, conns[follower], w.method, w.req(h, 90))
		if status.Code(unary) != codes.FailedPrecondition {
			t.Fatalf("unary %s on a follower: %v, want NotLeader", w.method, unary)
		}
		sameAsUnary(w.method+" on a follower", r, unary)
	}
	if d := server.CallsWritesDirect(c.Node(follower)) - before; d != 0 {
		t.Errorf("%d writes on a follower proposed without a call worker", d)
	}

	// The leader cut off from its followers: a put runs out of its budget.
	c.Isolate(leader)
	before = server.CallsWritesDirect(c.Node(leader))
	r := callsExchange(t, streams[leader], put(200, "direct/q", 300, nil))[200]
	if server.CallsWritesDirect(c.Node(leader)) == before {
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
	_, unary := shalev1.NewKVClient(conns[leader]).Put(uctx, &shalev1.PutRequest{Key: []byte("direct/q2"), Value: []byte("v")})
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
