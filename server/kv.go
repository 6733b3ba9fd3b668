package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server/shard"
)

// kvService implements shalev1.KVServer on a Node.
type kvService struct {
	shalev1.UnimplementedKVServer
	n *Node
	// workers run the calls of KV.Calls streams.
	workers *callWorkers
	// flushes hands the streams whose writes finished to workers.
	flushes flushQueue
	// direct counts the writes of KV.Calls streams proposed from their
	// stream's goroutine (startWrite), for tests.
	direct atomic.Int64
}

// target is a request's shard on this node.
type target struct {
	r  *replication.Replica
	sm *shard.Shard
	// desc is the shard's descriptor when the request was routed, shared
	// with the shard (Shard.AppliedDescriptor): read only.
	desc *shalev1.ShardDescriptor
}

func contains(d *shalev1.ShardDescriptor, key []byte) bool {
	return bytes.Compare(key, d.GetStartKey()) >= 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(key, d.GetEndKey()) < 0)
}

// route finds the shard for a request: the addressed one (checked against
// the epoch and key), or the local shard holding key.
func (n *Node) route(ctx context.Context, h *shalev1.RequestHeader, key []byte) (target, error) {
	n.fg.request()
	if id := h.GetShardId(); id != 0 {
		r := n.store.Replica(id)
		sm := n.Shard(id)
		if r == nil || sm == nil {
			return target{}, n.shardNotFoundErr(id)
		}
		desc := sm.AppliedDescriptor()
		if desc == nil {
			return target{}, status.Errorf(codes.Unavailable, "shard %d: replica on node %d is still receiving its first snapshot", id, n.cfg.NodeID)
		}
		if desc.GetSystem() {
			return target{}, invalidArg("shard %d is the system shard; it holds no user keys", id)
		}
		if desc.GetMergingInto() != 0 {
			return target{}, status.Errorf(codes.Unavailable, "shard %d is being merged into shard %d; retry", id, desc.GetMergingInto())
		}
		if e := h.GetEpoch(); e != 0 && e != desc.GetEpoch() {
			return target{}, n.staleEpochErr(ctx, e, desc)
		}
		if key != nil && !contains(desc, key) {
			return target{}, keyOutsideErr(key, desc)
		}
		if len(key) > 0 {
			n.loadOf(id).record(key)
		}
		return target{r: r, sm: sm, desc: desc}, nil
	}
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil {
			continue
		}
		desc := sm.AppliedDescriptor()
		if desc == nil || desc.GetSystem() || desc.GetMergingInto() != 0 || !contains(desc, key) {
			continue
		}
		if e := h.GetEpoch(); e != 0 && e != desc.GetEpoch() {
			return target{}, n.staleEpochErr(ctx, e, desc)
		}
		if len(key) > 0 {
			n.loadOf(desc.GetShardId()).record(key)
		}
		return target{r: r, sm: sm, desc: desc}, nil
	}
	return target{}, status.Errorf(codes.NotFound, "no shard replica on node %d holds key %q; refresh routing", n.cfg.NodeID, key)
}

// limits are the node's bounds on a request's keys, values and size.
func (n *Node) limits() shard.Limits {
	return shard.Limits{MaxKeyBytes: n.cfg.MaxKeyBytes, MaxValueBytes: n.cfg.MaxValueBytes,
		MaxOps: n.cfg.MaxBatchOps, MaxBytes: n.cfg.MaxBatchBytes}
}

// checkKey checks a key a read or an admin request names, as the shard's
// validator checks the keys of writes.
func (n *Node) checkKey(key []byte) error {
	if inv := shard.CheckKey(key, n.limits()); inv != nil {
		return invalidErr(inv, 0)
	}
	return nil
}

// invalidErr is the status of a request the shard's validator refused: an
// InvalidArgument, which for a key outside the shard it was routed to
// (shardID) carries a CrossShardRequest naming the boundary crossed.
func invalidErr(inv *shard.Invalid, shardID uint64) error {
	if inv.Code == codes.OutOfRange {
		return crossShardErr(inv.Boundary, shardID)
	}
	return status.Error(codes.InvalidArgument, inv.Message)
}

func checkRequestID(id []byte) error {
	if len(id) != 0 && (len(id) < 8 || len(id) > 32) {
		return invalidArg("request_id is %d bytes; want 8 to 32", len(id))
	}
	return nil
}

// requestCtx bounds a request without a deadline, and returns the context
// for the Raft round trip, which ends a little earlier (requestMargin) so
// that a missing quorum is answered with Unavailable rather than a
// client-side timeout. A context callBudget made is that earlier context
// already: it is returned as both, with nothing to cancel.
func (n *Node) requestCtx(ctx context.Context) (context.Context, context.Context, context.CancelFunc) {
	if _, ok := ctx.Value(callerDeadlineKey{}).(time.Time); ok {
		return ctx, ctx, func() {}
	}
	var cancel1 context.CancelFunc = func() {}
	if _, ok := ctx.Deadline(); !ok {
		ctx, cancel1 = context.WithTimeout(ctx, n.cfg.RequestTimeout)
	}
	dl, _ := ctx.Deadline()
	inner, cancel2 := context.WithDeadline(ctx, dl.Add(-requestMargin(dl)))
	return ctx, inner, func() { cancel2(); cancel1() }
}

// requestMargin is how long before the caller's deadline dl a request's
// Raft round trip ends: a tenth of the time left, within 5 to 500 ms.
func requestMargin(dl time.Time) time.Duration {
	return min(max(time.Until(dl)/10, 5*time.Millisecond), 500*time.Millisecond)
}

// callerDeadlineKey keys the caller's deadline in a context callBudget
// made.
type callerDeadlineKey struct{}

// callBudget returns the context of a call whose caller gives up at dl (a
// KV.Calls call's timeout_ms): it ends requestMargin before dl, as
// requestCtx's inner context does, and carries dl, so that requestCtx
// makes no further context and deadlinePassed tells the caller's deadline
// from the call's. One timer per call instead of two.
func callBudget(ctx context.Context, dl time.Time) (context.Context, context.CancelFunc) {
	return budgetCtx(ctx, dl, dl.Add(-requestMargin(dl)))
}

// budgetCtx returns a context that ends at budget and carries the
// caller's deadline dl, as callBudget's does.
func budgetCtx(ctx context.Context, dl, budget time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(ctx, budget)
	return context.WithValue(ctx, callerDeadlineKey{}, dl), cancel
}

// deadlinePassed reports whether the caller of a request served in ctx
// has given up: for a context callBudget made, whether the caller's
// deadline it carries has passed; otherwise whether ctx has ended.
func deadlinePassed(ctx context.Context) bool {
	if dl, ok := ctx.Value(callerDeadlineKey{}).(time.Time); ok {
		return !time.Now().Before(dl)
	}
	return ctx.Err() != nil
}

// txnCommand checks txn with the shard's validator (built from a client
// request of kind req) and routes it by its first key: the shard and the
// command to propose on its leader. It does not wait for anything.
func (n *Node) txnCommand(ctx context.Context, h *shalev1.RequestHeader, txn *shalev1.TxnRequest, req shard.Request) (target, *shalev1.RaftCommand, error) {
	if err := checkRequestID(h.GetRequestId()); err != nil {
		return target{}, nil, err
	}
	if inv := shard.CheckTxn(txn, n.limits(), req); inv != nil {
		return target{}, nil, invalidErr(inv, 0)
	}
	t, err := n.route(ctx, h, shard.TxnKey(txn))
	if err != nil {
		return target{}, nil, err
	}
	if inv := shard.TxnInShard(txn, t.desc); inv != nil {
		return target{}, nil, invalidErr(inv, t.desc.GetShardId())
	}
	n.traceRequest(ctx, t.desc.GetShardId(), len(txn.GetCompares())+len(txn.GetSuccess())+len(txn.GetFailure()))
	return t, &shalev1.RaftCommand{
		RequestId:    h.GetRequestId(),
		FirstAttempt: h.GetFirstAttempt(),
		Epoch:        t.desc.GetEpoch(),
		Command:      &shalev1.RaftCommand_Txn{Txn: txn},
	}, nil
}

// proposeRouted replicates a transaction's command (txnCommand's) on its
// shard t, whose leader this node must be, and returns its response.
func (n *Node) proposeRouted(ctx context.Context, t target, cmd *shalev1.RaftCommand) (*shalev1.TxnResponse, error) {
	if !t.r.IsLeader() {
		// A split's new shard may be electing its first leader: answer
		// once it is known (or serve the request, on it).
		if st := n.firstLeader(ctx, t.r); !st.Leader {
			return nil, n.notLeaderErr(t.desc.GetShardId(), st.LeaderNodeID)
		}
	}
	ctx, inner, cancel := n.requestCtx(ctx)
	defer cancel()
	cr, err := n.proposeCmd(ctx, inner, t.r, cmd)
	if err != nil {
		return nil, err
	}
	return n.txnResponse(t, cr), nil
}

// txnResponse is the response of a transaction on shard t from its
// command's result.
func (n *Node) txnResponse(t target, cr *shalev1.CommandResult) *shalev1.TxnResponse {
	resp := cr.GetTxn()
	if resp.GetHeader() == nil {
		resp.Header = &shalev1.ResponseHeader{}
	}
	resp.Header.NodeId = n.cfg.NodeID
	resp.Header.ShardId = t.desc.GetShardId()
	resp.Header.Epoch = t.desc.GetEpoch()
	return resp
}

// readBarrier makes a read at the requested consistency safe to serve from
// the local state machine.
func (n *Node) readBarrier(ctx context.Context, h *shalev1.RequestHeader, t target) (context.CancelFunc, error) {
	ctx, inner, cancel := n.requestCtx(ctx)
	switch h.GetConsistency() {
	case shalev1.ReadConsistency_READ_CONSISTENCY_STALE:
		return cancel, nil
	case shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER:
	default:
		if !t.r.IsLeader() {
			if st := n.firstLeader(ctx, t.r); !st.Leader {
				cancel()
				return func() {}, n.notLeaderErr(t.desc.GetShardId(), st.LeaderNodeID)
			}
		}
	}
	if err := t.r.ReadIndex(inner); err != nil {
		cancel()
		return func() {}, n.replicationErr(ctx, t.desc.GetShardId(), err)
	}
	return cancel, nil
}

func (n *Node) readHeader(t target, rev uint64) *shalev1.ResponseHeader {
	return &shalev1.ResponseHeader{ShardId: t.desc.GetShardId(), Revision: rev, NodeId: n.cfg.NodeID, Epoch: t.desc.GetEpoch()}
}

func (n *Node) shardErr(ctx context.Context, t target, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, shard.ErrKeyOutsideShard) {
		// The request was routed on t.desc and checked against it: the
		// shard's range changed since (a split applied in between).
		return n.staleEpochErr(ctx, t.desc.GetEpoch(), t.sm.Descriptor())
	}
	return status.Errorf(codes.Internal, "shard %d: %v", t.desc.GetShardId(), err)
}

func (s *kvService) Get(ctx context.Context, req *shalev1.GetRequest) (*shalev1.GetResponse, error) {
	n := s.n
	if err := n.checkKey(req.GetKey()); err != nil {
		return nil, err
	}
	t, err := n.route(ctx, req.GetHeader(), req.GetKey())
	if err != nil {
		return nil, err
	}
	cancel, err := n.readBarrier(ctx, req.GetHeader(), t)
	defer cancel()
	if err != nil {
		return nil, err
	}
	kv, rev, err := t.sm.Get(req.GetKey(), n.wallNanos())
	if err != nil {
		return nil, n.shardErr(ctx, t, err)
	}
	return &shalev1.GetResponse{Header: n.readHeader(t, rev), Kv: kv}, nil
}

func (s *kvService) MultiGet(ctx context.Context, req *shalev1.MultiGetRequest) (*shalev1.MultiGetResponse, error) {
	n := s.n
	keys := req.GetKeys()
	if len(keys) == 0 {
		return nil, invalidArg("no keys")
	}
	if len(keys) > n.cfg.MaxBatchOps {
		return nil, invalidArg("%d keys, limit %d", len(keys), n.cfg.MaxBatchOps)
	}
	for _, k := range keys {
		if err := n.checkKey(k); err != nil {
			return nil, err
		}
	}
	t, err := n.route(ctx, req.GetHeader(), keys[0])
	if err != nil {
		return nil, err
	}
	if inv := shard.KeysInShard(keys, t.desc); inv != nil {
		return nil, invalidErr(inv, t.desc.GetShardId())
	}
	cancel, err := n.readBarrier(ctx, req.GetHeader(), t)
	defer cancel()
	if err != nil {
		return nil, err
	}
	kvs, rev, err := t.sm.MultiGet(keys, n.wallNanos())
	if err != nil {
		return nil, n.shardErr(ctx, t, err)
	}
	resp := &shalev1.MultiGetResponse{Header: n.readHeader(t, rev)}
	for i, k := range keys {
		resp.Results = append(resp.Results, &shalev1.MultiGetResult{Key: k, Kv: kvs[i]})
	}
	return resp, nil
}

// --- writes ---

// writeRequest is the request of a KV write method.
type writeRequest interface {
	proto.Message
	GetHeader() *shalev1.RequestHeader
}

// writeMethod describes a KV write method, which this node serves as a
// transaction on the shard's leader: txn makes the transaction from the
// method's request, with the kind of client request the shard's validator
// checks it as (or an InvalidArgument status for a request no transaction
// stands for), and response makes the method's response from the
// transaction's. The unary handler (serve) and a KV.Calls stream
// (startWrite, through callWrite) both serve the method by it.
type writeMethod[Req writeRequest, Resp proto.Message] struct {
	// method is the method's name in the KV service, fullMethod its full
	// name (what authorization checks).
	method, fullMethod string
	newRequest         func() Req
	txn                func(Req) (*shalev1.TxnRequest, shard.Request, error)
	response           func(*shalev1.TxnResponse) Resp
}

// command checks req's transaction with the shard's validator and routes
// it (txnCommand): the shard and the command to propose on its leader. It
// does not wait for anything.
func (m *writeMethod[Req, Resp]) command(ctx context.Context, n *Node, req Req) (target, *shalev1.RaftCommand, error) {
	txn, kind, err := m.txn(req)
	if err != nil {
		return target{}, nil, err
	}
	return n.txnCommand(ctx, req.GetHeader(), txn, kind)
}

// serve is the method's unary handler: it replicates req's transaction on
// its shard's leader and returns the method's response.
func (m *writeMethod[Req, Resp]) serve(ctx context.Context, n *Node, req Req) (Resp, error) {
	var none Resp
	t, cmd, err := m.command(ctx, n, req)
	if err != nil {
		return none, err
	}
	resp, err := n.proposeRouted(ctx, t, cmd)
	if err != nil {
		return none, err
	}
	return m.response(resp), nil
}

// callWrite is a write method as a KV.Calls stream serves it: writeMethod
// for a request and response of any type.
type callWrite interface {
	// names returns the method's name and full name.
	names() (method, fullMethod string)
	// decodeCall decodes the request of call c.
	decodeCall(c *shalev1.Call) (writeRequest, error)
	// commandOf is command for req, which decodeCall returned.
	commandOf(ctx context.Context, n *Node, req writeRequest) (target, *shalev1.RaftCommand, error)
	// responseOf is the method's response from its transaction's.
	responseOf(resp *shalev1.TxnResponse) proto.Message
}

func (m *writeMethod[Req, Resp]) names() (string, string) { return m.method, m.fullMethod }

func (m *writeMethod[Req, Resp]) decodeCall(c *shalev1.Call) (writeRequest, error) {
	req := m.newRequest()
	if err := decodeCall(c, m.method, req); err != nil {
		return nil, err
	}
	return req, nil
}

func (m *writeMethod[Req, Resp]) commandOf(ctx context.Context, n *Node, req writeRequest) (target, *shalev1.RaftCommand, error) {
	return m.command(ctx, n, req.(Req))
}

func (m *writeMethod[Req, Resp]) responseOf(resp *shalev1.TxnResponse) proto.Message {
	return m.response(resp)
}

// The KV write methods.
var (
	putWrite = &writeMethod[*shalev1.PutRequest, *shalev1.PutResponse]{
		method: "Put", fullMethod: shalev1.KV_Put_FullMethodName,
		newRequest: func() *shalev1.PutRequest { return new(shalev1.PutRequest) },
		txn: func(req *shalev1.PutRequest) (*shalev1.TxnRequest, shard.Request, error) {
			return &shalev1.TxnRequest{Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{
				Key: req.GetKey(), Value: req.GetValue(), TtlMs: req.GetTtlMs(), PrevKv: req.GetPrevKv(),
			}}}}}, shard.RequestSingle, nil
		},
		response: func(resp *shalev1.TxnResponse) *shalev1.PutResponse {
			out := &shalev1.PutResponse{Header: resp.GetHeader()}
			if rs := resp.GetResults(); len(rs) == 1 {
				out.PrevKv = rs[0].GetPut().GetPrevKv()
			}
			return out
		},
	}
	deleteWrite = &writeMethod[*shalev1.DeleteRequest, *shalev1.DeleteResponse]{
		method: "Delete", fullMethod: shalev1.KV_Delete_FullMethodName,
		newRequest: func() *shalev1.DeleteRequest { return new(shalev1.DeleteRequest) },
		txn: func(req *shalev1.DeleteRequest) (*shalev1.TxnRequest, shard.Request, error) {
			return &shalev1.TxnRequest{Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Delete{Delete: &shalev1.DeleteOp{
				Key: req.GetKey(), PrevKv: req.GetPrevKv(),
			}}}}}, shard.RequestSingle, nil
		},
		response: func(resp *shalev1.TxnResponse) *shalev1.DeleteResponse {
			out := &shalev1.DeleteResponse{Header: resp.GetHeader()}
			if rs := resp.GetResults(); len(rs) == 1 {
				out.Deleted = rs[0].GetDelete().GetDeleted()
				out.PrevKv = rs[0].GetDelete().GetPrevKv()
			}
			return out
		},
	}
	deleteRangeWrite = &writeMethod[*shalev1.DeleteRangeRequest, *shalev1.DeleteRangeResponse]{
		method: "DeleteRange", fullMethod: shalev1.KV_DeleteRange_FullMethodName,
		newRequest: func() *shalev1.DeleteRangeRequest { return new(shalev1.DeleteRangeRequest) },
		txn: func(req *shalev1.DeleteRangeRequest) (*shalev1.TxnRequest, shard.Request, error) {
			return &shalev1.TxnRequest{Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeOp{
				StartKey: req.GetStartKey(), EndKey: req.GetEndKey(),
			}}}}}, shard.RequestSingle, nil
		},
		response: func(resp *shalev1.TxnResponse) *shalev1.DeleteRangeResponse {
			return &shalev1.DeleteRangeResponse{Header: resp.GetHeader()}
		},
	}
	batchWrite = &writeMethod[*shalev1.BatchRequest, *shalev1.BatchResponse]{
		method: "Batch", fullMethod: shalev1.KV_Batch_FullMethodName,
		newRequest: func() *shalev1.BatchRequest { return new(shalev1.BatchRequest) },
		txn: func(req *shalev1.BatchRequest) (*shalev1.TxnRequest, shard.Request, error) {
			return &shalev1.TxnRequest{Success: req.GetOps()}, shard.RequestBatch, nil
		},
		response: func(resp *shalev1.TxnResponse) *shalev1.BatchResponse {
			return &shalev1.BatchResponse{Header: resp.GetHeader(), Results: resp.GetResults()}
		},
	}
	casWrite = &writeMethod[*shalev1.CompareAndSwapRequest, *shalev1.CompareAndSwapResponse]{
		method: "CompareAndSwap", fullMethod: shalev1.KV_CompareAndSwap_FullMethodName,
		newRequest: func() *shalev1.CompareAndSwapRequest { return new(shalev1.CompareAndSwapRequest) },
		txn: func(req *shalev1.CompareAndSwapRequest) (*shalev1.TxnRequest, shard.Request, error) {
			if req.GetExpectAbsent() && len(req.GetExpectedValue()) > 0 {
				return nil, 0, invalidArg("expect_absent and expected_value are exclusive")
			}
			cmp := &shalev1.Compare{Key: req.GetKey(), Target: shalev1.Compare_TARGET_VALUE_UNSPECIFIED, Value: req.GetExpectedValue()}
			if req.GetExpectAbsent() {
				cmp = &shalev1.Compare{Key: req.GetKey(), Target: shalev1.Compare_TARGET_EXISTS, Number: 0}
			}
			return &shalev1.TxnRequest{
				Compares: []*shalev1.Compare{cmp},
				Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{
					Key: req.GetKey(), Value: req.GetNewValue(), TtlMs: req.GetTtlMs(), PrevKv: true,
				}}}},
				Failure: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: req.GetKey()}}}},
			}, shard.RequestSingle, nil
		},
		response: func(resp *shalev1.TxnResponse) *shalev1.CompareAndSwapResponse {
			out := &shalev1.CompareAndSwapResponse{Header: resp.GetHeader(), Succeeded: resp.GetSucceeded()}
			if rs := resp.GetResults(); len(rs) == 1 {
				if resp.GetSucceeded() {
					out.Current = rs[0].GetPut().GetPrevKv()
				} else {
					out.Current = rs[0].GetGet().GetKv()
				}
			}
			return out
		},
	}
	txnWrite = &writeMethod[*shalev1.TxnRequest, *shalev1.TxnResponse]{
		method: "Txn", fullMethod: shalev1.KV_Txn_FullMethodName,
		newRequest: func() *shalev1.TxnRequest { return new(shalev1.TxnRequest) },
		txn: func(req *shalev1.TxnRequest) (*shalev1.TxnRequest, shard.Request, error) {
			return &shalev1.TxnRequest{Compares: req.GetCompares(), Success: req.GetSuccess(), Failure: req.GetFailure()}, shard.RequestTxn, nil
		},
		response: func(resp *shalev1.TxnResponse) *shalev1.TxnResponse { return resp },
	}
)

// kvWrites are the KV write methods by name, as a KV.Calls call names
// them.
var kvWrites = func() map[string]callWrite {
	m := map[string]callWrite{}
	for _, w := range []callWrite{putWrite, deleteWrite, deleteRangeWrite, batchWrite, casWrite, txnWrite} {
		name, _ := w.names()
		m[name] = w
	}
	return m
}()

func (s *kvService) Put(ctx context.Context, req *shalev1.PutRequest) (*shalev1.PutResponse, error) {
	return putWrite.serve(ctx, s.n, req)
}

func (s *kvService) Delete(ctx context.Context, req *shalev1.DeleteRequest) (*shalev1.DeleteResponse, error) {
	return deleteWrite.serve(ctx, s.n, req)
}

func (s *kvService) DeleteRange(ctx context.Context, req *shalev1.DeleteRangeRequest) (*shalev1.DeleteRangeResponse, error) {
	return deleteRangeWrite.serve(ctx, s.n, req)
}

func (s *kvService) Batch(ctx context.Context, req *shalev1.BatchRequest) (*shalev1.BatchResponse, error) {
	return batchWrite.serve(ctx, s.n, req)
}

func (s *kvService) CompareAndSwap(ctx context.Context, req *shalev1.CompareAndSwapRequest) (*shalev1.CompareAndSwapResponse, error) {
	return casWrite.serve(ctx, s.n, req)
}

func (s *kvService) Txn(ctx context.Context, req *shalev1.TxnRequest) (*shalev1.TxnResponse, error) {
	return txnWrite.serve(ctx, s.n, req)
}

// --- scans ---

// scanPlan is a validated scan: its range, direction and remaining limit.
type scanPlan struct {
	start, end []byte
	reverse    bool
	remaining  uint32 // 0 = unlimited
	keysOnly   bool
}

func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func tokenChecksum(resume []byte, remaining uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], remaining)
	return crc32.Update(crc32.Checksum(resume, castagnoli), castagnoli, b[:])
}

func encodeToken(resume []byte, remaining uint32) []byte {
	b, _ := proto.Marshal(&shalev1.ScanToken{ResumeKey: resume, Remaining: remaining, Checksum: tokenChecksum(resume, remaining)})
	return b
}

func (n *Node) planScan(req *shalev1.ScanRequest) (scanPlan, error) {
	p := scanPlan{start: req.GetStartKey(), end: req.GetEndKey(), reverse: req.GetReverse(), remaining: req.GetLimit(), keysOnly: req.GetKeysOnly()}
	if pre := req.GetPrefix(); len(pre) > 0 {
		if len(p.start) > 0 || len(p.end) > 0 {
			return p, invalidArg("prefix excludes start_key and end_key")
		}
		p.start, p.end = pre, prefixEnd(pre)
	}
	if len(p.start) > n.cfg.MaxKeyBytes || len(p.end) > n.cfg.MaxKeyBytes {
		return p, invalidArg("scan bound over %d bytes", n.cfg.MaxKeyBytes)
	}
	if len(p.end) > 0 && bytes.Compare(p.start, p.end) >= 0 {
		return p, invalidArg("scan range [%q, %q) is empty or inverted", p.start, p.end)
	}
	if tok := req.GetContinuationToken(); len(tok) > 0 {
		var t shalev1.ScanToken
		if err := proto.Unmarshal(tok, &t); err != nil || t.GetChecksum() != tokenChecksum(t.GetResumeKey(), t.GetRemaining()) {
			return p, invalidArg("continuation_token is malformed")
		}
		r := t.GetResumeKey()
		if p.reverse {
			if bytes.Compare(r, p.start) < 0 || (len(p.end) > 0 && bytes.Compare(r, p.end) > 0) {
				return p, invalidArg("continuation_token does not belong to this range")
			}
			p.end = r
		} else {
			if bytes.Compare(r, p.start) < 0 || (len(p.end) > 0 && bytes.Compare(r, p.end) > 0) {
				return p, invalidArg("continuation_token does not belong to this range")
			}
			p.start = r
		}
		p.remaining = t.GetRemaining()
		if req.GetLimit() == 0 {
			p.remaining = 0
		}
	}
	return p, nil
}

// routeScan finds the shard serving the next page: the one holding start
// (forward) or the key just below end (reverse).
func (n *Node) routeScan(ctx context.Context, h *shalev1.RequestHeader, p scanPlan) (target, error) {
	if !p.reverse {
		return n.route(ctx, h, append([]byte{}, p.start...)) // non-nil: an empty start must be in the shard too
	}
	if h.GetShardId() != 0 {
		t, err := n.route(ctx, h, nil)
		if err != nil {
			return t, err
		}
		// The page's end must fall inside (start, end] of the shard.
		if len(p.end) > 0 && bytes.Compare(p.end, t.desc.GetStartKey()) <= 0 {
			return t, keyOutsideErr(p.end, t.desc)
		}
		if len(p.end) == 0 && len(t.desc.GetEndKey()) != 0 {
			return t, keyOutsideErr(p.end, t.desc)
		}
		if len(p.end) > 0 && len(t.desc.GetEndKey()) > 0 && bytes.Compare(p.end, t.desc.GetEndKey()) > 0 {
			return t, keyOutsideErr(p.end, t.desc)
		}
		return t, nil
	}
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil {
			continue
		}
		d := sm.Descriptor()
		if d == nil || d.GetSystem() || d.GetMergingInto() != 0 {
			continue
		}
		if len(p.end) == 0 {
			if len(d.GetEndKey()) == 0 {
				return target{r: r, sm: sm, desc: d}, nil
			}
			continue
		}
		if bytes.Compare(p.end, d.GetStartKey()) > 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(p.end, d.GetEndKey()) <= 0) {
			return target{r: r, sm: sm, desc: d}, nil
		}
	}
	return target{}, status.Errorf(codes.NotFound, "no shard replica on node %d holds the scan's range; refresh routing", n.cfg.NodeID)
}

// scanPage reads one page of p within t's shard and returns it with the
// plan of the rest (done when nothing is left anywhere). The rest continues
// from the shard's range at the read, not from t's descriptor: a split or
// merge applied since the scan was routed moved the boundary, and what lies
// beyond the shard's range then is for the next page to find; a page whose
// start the shard no longer holds fails as a stale epoch, for the client to
// route again. leaving says the rest starts beyond that range, in another
// shard.
func (n *Node) scanPage(ctx context.Context, t target, p scanPlan) (kvs []*shalev1.KeyValue, rev uint64, rest scanPlan, done, leaving bool, err error) {
	limit := n.cfg.MaxScanPageKeys
	if p.remaining > 0 && int(p.remaining) < limit {
		limit = int(p.remaining)
	}
	page, err := t.sm.Scan(shard.ScanParams{
		Start: p.start, End: p.end, Reverse: p.reverse, Limit: limit,
		KeysOnly: p.keysOnly, MaxBytes: n.cfg.MaxScanPageBytes, Now: n.wallNanos(),
	})
	if err != nil {
		return nil, 0, p, true, false, n.shardErr(ctx, t, err)
	}
	// Scan clips the range to the shard's: the near end (where the page
	// starts) must be in it, or the keys between it and the shard's
	// boundary would be skipped (a reverse scan routed before a split that
	// moved the shard's end down).
	if (!p.reverse && bytes.Compare(p.start, page.Start) < 0) ||
		(p.reverse && len(page.End) > 0 && (len(p.end) == 0 || bytes.Compare(p.end, page.End) > 0)) {
		return nil, 0, p, true, false, n.shardErr(ctx, t, fmt.Errorf("%w: scan from %q (reverse %v), shard [%q, %q)",
			shard.ErrKeyOutsideShard, p.resumeKey(), p.reverse, page.Start, page.End))
	}
	kvs, rev = page.KVs, page.Revision
	rest = p
	if p.remaining > 0 {
		rest.remaining -= uint32(min(len(kvs), int(p.remaining)))
		if rest.remaining == 0 {
			return kvs, rev, rest, true, false, nil
		}
	}
	switch {
	case page.More && !p.reverse:
		rest.start = page.ResumeKey
	case page.More && p.reverse:
		rest.end = page.ResumeKey
	case !p.reverse && len(page.End) > 0 && (len(p.end) == 0 || bytes.Compare(p.end, page.End) > 0):
		rest.start = page.End
		leaving = true
	case p.reverse && len(page.Start) > 0 && bytes.Compare(p.start, page.Start) < 0:
		rest.end = page.Start
		leaving = true
	default:
		return kvs, rev, rest, true, false, nil
	}
	return kvs, rev, rest, false, leaving, nil
}

func (p scanPlan) resumeKey() []byte {
	if p.reverse {
		return p.end
	}
	return p.start
}

func (s *kvService) Scan(ctx context.Context, req *shalev1.ScanRequest) (*shalev1.ScanResponse, error) {
	n := s.n
	p, err := n.planScan(req)
	if err != nil {
		return nil, err
	}
	t, err := n.routeScan(ctx, req.GetHeader(), p)
	if err != nil {
		return nil, err
	}
	cancel, err := n.readBarrier(ctx, req.GetHeader(), t)
	defer cancel()
	if err != nil {
		return nil, err
	}
	kvs, rev, rest, done, _, err := n.scanPage(ctx, t, p)
	if err != nil {
		return nil, err
	}
	resp := &shalev1.ScanResponse{Header: n.readHeader(t, rev), Kvs: kvs}
	if !done {
		resp.ResumeKey = rest.resumeKey()
		resp.ContinuationToken = encodeToken(resp.ResumeKey, rest.remaining)
	}
	return resp, nil
}

func (s *kvService) ScanStream(req *shalev1.ScanRequest, stream shalev1.KV_ScanStreamServer) error {
	n := s.n
	ctx := stream.Context()
	p, err := n.planScan(req)
	if err != nil {
		return err
	}
	t, err := n.routeScan(ctx, req.GetHeader(), p)
	if err != nil {
		return err
	}
	cancel, err := n.readBarrier(ctx, req.GetHeader(), t)
	defer cancel()
	if err != nil {
		return err
	}
	for {
		kvs, rev, rest, done, leaving, err := n.scanPage(ctx, t, p)
		if err != nil {
			return err
		}
		resp := &shalev1.ScanResponse{Header: n.readHeader(t, rev), Kvs: kvs}
		// Stay within the shard; the last message hands over to the next one.
		if leaving {
			resp.ResumeKey = rest.resumeKey()
			resp.ContinuationToken = encodeToken(resp.ResumeKey, rest.remaining)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		if done || leaving {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		p = rest
	}
}
