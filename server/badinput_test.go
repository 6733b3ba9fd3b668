package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server"
)

// Small limits keep the oversized requests small.
const (
	biMaxKey      = 16
	biMaxValue    = 64
	biMaxOps      = 8
	biMaxBytes    = 300
	biPageKeys    = 3
	biSystemShard = server.SystemShardID
	biShardA      = 2 // ["", "m")
	biShardB      = 3 // ["m", "")
	biUnknown     = 999
)

// biHarness drives a test cluster through the raw generated gRPC clients,
// so that the server's own validation is what is tested (not the SDK's).
type biHarness struct {
	t     *testing.T
	c     *testcluster.Cluster
	conns map[uint64]*grpc.ClientConn
}

func newBIHarness(t *testing.T, c *testcluster.Cluster) *biHarness {
	h := &biHarness{t: t, c: c, conns: map[uint64]*grpc.ClientConn{}}
	for _, id := range c.NodeIDs() {
		cc, err := grpc.NewClient(c.Node(id).Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		h.conns[id] = cc
		t.Cleanup(func() { cc.Close() })
	}
	return h
}

func (h *biHarness) kv(node uint64) shalev1.KVClient { return shalev1.NewKVClient(h.conns[node]) }
func (h *biHarness) admin(node uint64) shalev1.AdminClient {
	return shalev1.NewAdminClient(h.conns[node])
}

// leader waits for shard's leader and returns its node.
func (h *biHarness) leader(shard uint64) uint64 {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if id := h.c.Leader(shard); id != 0 {
			return id
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("shard %d has no leader", shard)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// follower returns a node hosting a non-leader replica of shard.
func (h *biHarness) follower(shard uint64) uint64 {
	h.t.Helper()
	l := h.leader(shard)
	for _, id := range h.c.NodeIDs() {
		if id != l && h.c.Node(id).Store().Replica(shard) != nil {
			return id
		}
	}
	h.t.Fatalf("shard %d has no follower", shard)
	return 0
}

func biCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// biState is everything a bad request must leave untouched.
type biState struct {
	kvs       []*shalev1.KeyValue
	revisions map[uint64]uint64 // user shard → revision (ResponseHeader.revision)
	sysRev    uint64            // system shard revision on its leader
	epochs    map[uint64]uint64
	nodes     []string
}

// revisions reads every user shard's revision with a follower read (a
// linearizable read any replica serves), so it reflects every applied write.
func (h *biHarness) revisions() map[uint64]uint64 {
	h.t.Helper()
	out := map[uint64]uint64{}
	for shard, key := range map[uint64]string{biShardA: "a", biShardB: "m"} {
		ctx, cancel := biCtx()
		resp, err := h.kv(1).Get(ctx, &shalev1.GetRequest{
			Header: &shalev1.RequestHeader{ShardId: shard, Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER},
			Key:    []byte(key),
		})
		cancel()
		if err != nil {
			h.t.Fatalf("revision of shard %d: %v", shard, err)
		}
		if resp.GetHeader().GetShardId() != shard {
			h.t.Fatalf("revision of shard %d: answered by shard %d", shard, resp.GetHeader().GetShardId())
		}
		out[shard] = resp.GetHeader().GetRevision()
	}
	return out
}

// appliedRevisions returns, per shard (system, A, B), the highest revision
// any replica has applied: a write a bad request slipped through is applied
// on the leader before the leader answers.
func (h *biHarness) appliedRevisions() [3]uint64 {
	var out [3]uint64
	for _, id := range h.c.NodeIDs() {
		for i, s := range []uint64{biSystemShard, biShardA, biShardB} {
			if sm := h.c.Node(id).Shard(s); sm != nil {
				out[i] = max(out[i], sm.Revision())
			}
		}
	}
	return out
}

// scanAll reads the whole user key space page by page, following
// continuation tokens across the shards.
func (h *biHarness) scanAll() []*shalev1.KeyValue {
	h.t.Helper()
	var out []*shalev1.KeyValue
	var token []byte
	for pages := 0; ; pages++ {
		if pages > 1000 {
			h.t.Fatal("scan does not end")
		}
		ctx, cancel := biCtx()
		resp, err := h.kv(1).Scan(ctx, &shalev1.ScanRequest{
			Header:            &shalev1.RequestHeader{Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER},
			ContinuationToken: token,
		})
		cancel()
		if err != nil {
			h.t.Fatalf("scan: %v", err)
		}
		if len(resp.GetKvs()) > biPageKeys {
			h.t.Fatalf("scan page of %d keys, page limit %d", len(resp.GetKvs()), biPageKeys)
		}
		out = append(out, resp.GetKvs()...)
		token = resp.GetContinuationToken()
		if len(token) == 0 {
			return out
		}
	}
}

func (h *biHarness) snapshot() biState {
	h.t.Helper()
	st := biState{kvs: h.scanAll(), revisions: h.revisions(), epochs: map[uint64]uint64{}}
	sl := h.leader(biSystemShard)
	st.sysRev = h.c.Node(sl).Shard(biSystemShard).Revision()
	for _, id := range h.c.NodeIDs() {
		for _, s := range []uint64{biSystemShard, biShardA, biShardB} {
			sm := h.c.Node(id).Shard(s)
			if sm == nil {
				h.t.Fatalf("node %d has no replica of shard %d", id, s)
			}
			e := sm.Descriptor().GetEpoch()
			if prev, ok := st.epochs[s]; ok && prev != e {
				h.t.Fatalf("shard %d: replicas disagree on the epoch (%d, %d)", s, prev, e)
			}
			st.epochs[s] = e
		}
	}
	ctx, cancel := biCtx()
	defer cancel()
	resp, err := h.admin(1).ListNodes(ctx, &shalev1.ListNodesRequest{})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, n := range resp.GetNodes() {
		st.nodes = append(st.nodes, fmt.Sprintf("%d=%s removed=%v", n.GetNode().GetNodeId(), n.GetNode().GetAddress(), n.GetRemoved()))
	}
	return st
}

func (h *biHarness) compare(before, after biState, what string) {
	h.t.Helper()
	if len(before.kvs) != len(after.kvs) {
		h.t.Errorf("%s: %d keys before, %d after", what, len(before.kvs), len(after.kvs))
	}
	for i := 0; i < min(len(before.kvs), len(after.kvs)); i++ {
		if !proto.Equal(before.kvs[i], after.kvs[i]) {
			h.t.Errorf("%s: key %d changed:\nbefore %v\nafter  %v", what, i, before.kvs[i], after.kvs[i])
		}
	}
	for s, r := range before.revisions {
		if after.revisions[s] != r {
			h.t.Errorf("%s: shard %d revision moved from %d to %d", what, s, r, after.revisions[s])
		}
	}
	if before.sysRev != after.sysRev {
		h.t.Errorf("%s: system shard revision moved from %d to %d", what, before.sysRev, after.sysRev)
	}
	for s, e := range before.epochs {
		if after.epochs[s] != e {
			h.t.Errorf("%s: shard %d epoch moved from %d to %d", what, s, e, after.epochs[s])
		}
	}
	if strings.Join(before.nodes, ",") != strings.Join(after.nodes, ",") {
		h.t.Errorf("%s: node registry changed:\nbefore %v\nafter  %v", what, before.nodes, after.nodes)
	}
}

// seed writes the keys every bad request must leave alone, including a key
// and a value exactly at the limits (which must be accepted).
func (h *biHarness) seed() {
	h.t.Helper()
	keys := []string{"a", "b", "c", "d", strings.Repeat("k", biMaxKey), "m", "n", "o", "z"}
	for _, k := range keys {
		v := []byte("v-" + k)
		if k[0] == 'k' {
			v = bytes.Repeat([]byte{'V'}, biMaxValue)
		}
		shard := uint64(biShardA)
		if k >= "m" {
			shard = biShardB
		}
		h.retry(fmt.Sprintf("seed put %q", k), func() error {
			ctx, cancel := biCtx()
			defer cancel()
			_, err := h.kv(h.leader(shard)).Put(ctx, &shalev1.PutRequest{Key: []byte(k), Value: v})
			return err
		})
	}
}

// retry runs fn until it succeeds, resending while leadership is settling
// (NotLeader, Unavailable).
func (h *biHarness) retry(what string, fn func() error) {
	h.t.Helper()
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil {
			return
		}
		var nl *replication.NotLeaderError
		c := status.Code(err)
		if attempt < 100 && (errors.As(err, &nl) || c == codes.FailedPrecondition || c == codes.Unavailable) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		h.t.Fatalf("%s: %v", what, err)
	}
}

// waitRegistry waits until the founding nodes are registered in the system
// shard and recorded as started (the only system writes a quiet cluster
// makes).
func (h *biHarness) waitRegistry() {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l := h.c.Leader(biSystemShard)
		if l != 0 {
			nodes, err := h.c.Node(l).Shard(biSystemShard).Nodes()
			started := 0
			for _, d := range nodes {
				if d.GetStarted() {
					started++
				}
			}
			// Registered, and recorded as started (the placement leader
			// writes that after the first heartbeats; the test then expects
			// the system shard to stay unchanged).
			if err == nil && len(nodes) == len(h.c.NodeIDs()) && started == len(nodes) {
				return
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatal("founding nodes not registered and started")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDirectory waits until the system shard's directory records every
// shard at its current epoch: the nodes' background reports write the
// system shard, which the test then expects to stay unchanged.
func (h *biHarness) waitDirectory() {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l := h.c.Leader(biSystemShard)
		settled := l != 0
		if settled {
			dir, err := h.c.Node(l).Shard(biSystemShard).Shards()
			byID := map[uint64]uint64{}
			for _, d := range dir {
				byID[d.GetShardId()] = d.GetEpoch()
			}
			settled = err == nil
			for _, id := range []uint64{biSystemShard, biShardA, biShardB} {
				settled = settled && byID[id] == h.c.Node(l).Shard(id).Descriptor().GetEpoch()
			}
		}
		if settled {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatal("the shard directory did not catch up with the shards' epochs")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bumpEpoch makes shard's descriptor epoch move past 1 with a membership
// change that keeps the membership: re-adding an existing voter is a
// configuration change like any other (the epoch bumps on every applied
// change) without data movement. Clients holding epoch 1 are now stale.
func (h *biHarness) bumpEpoch(shard uint64) uint64 {
	h.t.Helper()
	var desc *shalev1.ShardDescriptor
	h.retry(fmt.Sprintf("bump epoch of shard %d", shard), func() error {
		l := h.leader(shard)
		r := h.c.Node(l).Store().Replica(shard)
		var voter uint64
		for _, rd := range r.Status().Descriptor.GetReplicas() {
			if rd.GetNodeId() != l {
				voter = rd.GetReplicaId()
			}
		}
		ctx, cancel := biCtx()
		defer cancel()
		var err error
		desc, err = r.ChangeReplicas(ctx, []replication.ReplicaChange{{Type: replication.PromoteLearner, ReplicaID: voter}})
		return err
	})
	if desc.GetEpoch() < 2 || len(desc.GetReplicas()) != 3 {
		h.t.Fatalf("bump epoch of shard %d: descriptor %v", shard, desc)
	}
	// Wait until every replica applied it.
	for deadline := time.Now().Add(20 * time.Second); ; {
		ok := true
		for _, id := range h.c.NodeIDs() {
			if h.c.Node(id).Shard(shard).Descriptor().GetEpoch() != desc.GetEpoch() {
				ok = false
			}
		}
		if ok {
			return desc.GetEpoch()
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("shard %d: replicas did not apply epoch %d", shard, desc.GetEpoch())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// --- the table ---

// biDest says which node a case is sent to.
type biDest struct {
	shard    uint64 // the leader of this shard receives the request...
	follower bool   // ...or a follower of it
}

type biCase struct {
	name string
	to   biDest
	call func(ctx context.Context, kv shalev1.KVClient, adm shalev1.AdminClient) error
	code codes.Code
	// detail checks the status details; nil means there must be none.
	detail func(t *testing.T, node uint64, details []any)
}

func oneDetail[T proto.Message](t *testing.T, details []any) T {
	t.Helper()
	var zero T
	if len(details) != 1 {
		t.Fatalf("want exactly one %T detail, got %d: %v", zero, len(details), details)
	}
	d, ok := details[0].(T)
	if !ok {
		t.Fatalf("want a %T detail, got %T (%v)", zero, details[0], details[0])
	}
	return d
}

func (h *biHarness) wantShardNotFound(shard uint64, nodeKnown bool) func(*testing.T, uint64, []any) {
	return func(t *testing.T, node uint64, ds []any) {
		d := oneDetail[*shalev1.ShardNotFound](t, ds)
		if d.GetShardId() != shard {
			t.Errorf("ShardNotFound.shard_id = %d, want %d", d.GetShardId(), shard)
		}
		if nodeKnown && d.GetNodeId() != node {
			t.Errorf("ShardNotFound.node_id = %d, want %d", d.GetNodeId(), node)
		}
	}
}

func (h *biHarness) wantEpochMismatch(requested, shard uint64) func(*testing.T, uint64, []any) {
	return func(t *testing.T, node uint64, ds []any) {
		d := oneDetail[*shalev1.EpochMismatch](t, ds)
		if d.GetRequestedEpoch() != requested {
			t.Errorf("EpochMismatch.requested_epoch = %d, want %d", d.GetRequestedEpoch(), requested)
		}
		cur := h.c.Node(node).Shard(shard).Descriptor()
		if !proto.Equal(d.GetCurrent(), cur) {
			t.Errorf("EpochMismatch.current = %v\nwant the replica's descriptor %v", d.GetCurrent(), cur)
		}
		if d.GetCurrent().GetEpoch() == requested {
			t.Errorf("EpochMismatch.current has the requested epoch %d", requested)
		}
	}
}

func (h *biHarness) wantKeyOutside(key string, shard uint64) func(*testing.T, uint64, []any) {
	return func(t *testing.T, node uint64, ds []any) {
		d := oneDetail[*shalev1.KeyOutsideShard](t, ds)
		if !bytes.Equal(d.GetKey(), []byte(key)) {
			t.Errorf("KeyOutsideShard.key = %q, want %q", d.GetKey(), key)
		}
		if cur := h.c.Node(node).Shard(shard).Descriptor(); !proto.Equal(d.GetShard(), cur) {
			t.Errorf("KeyOutsideShard.shard = %v\nwant %v", d.GetShard(), cur)
		}
	}
}

func wantCrossShard(split string, shard uint64) func(*testing.T, uint64, []any) {
	return func(t *testing.T, _ uint64, ds []any) {
		d := oneDetail[*shalev1.CrossShardRequest](t, ds)
		if want := (&shalev1.CrossShardRequest{SplitKey: []byte(split), ShardId: shard}); !proto.Equal(d, want) {
			t.Errorf("CrossShardRequest = %v, want %v", d, want)
		}
	}
}

func (h *biHarness) wantNotLeader(shard uint64) func(*testing.T, uint64, []any) {
	return func(t *testing.T, node uint64, ds []any) {
		d := oneDetail[*shalev1.NotLeader](t, ds)
		l := h.leader(shard)
		if d.GetShardId() != shard || d.GetLeaderNodeId() != l || d.GetLeaderAddress() != h.c.Node(l).Addr() {
			t.Errorf("NotLeader = %v, want shard %d, leader node %d at %s", d, shard, l, h.c.Node(l).Addr())
		}
	}
}

func scanStream(ctx context.Context, kv shalev1.KVClient, req *shalev1.ScanRequest) error {
	s, err := kv.ScanStream(ctx, req)
	if err != nil {
		return err
	}
	for {
		if _, err := s.Recv(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// run sends a case and checks its answer. A case sent to a leader that
// lost leadership in the meantime is resent.
func (h *biHarness) run(t *testing.T, c biCase) {
	for attempt := 0; ; attempt++ {
		node := h.leader(c.to.shard)
		if c.to.follower {
			node = h.follower(c.to.shard)
		}
		ctx, cancel := biCtx()
		err := c.call(ctx, h.kv(node), h.admin(node))
		cancel()
		st := status.Convert(err)
		var moved bool
		if c.to.follower {
			moved = h.c.Leader(c.to.shard) == node
		} else {
			for _, d := range st.Details() {
				if _, ok := d.(*shalev1.NotLeader); ok {
					moved = h.c.Leader(c.to.shard) != node
				}
			}
		}
		if moved && attempt < 3 {
			t.Logf("leadership of shard %d moved during the case; resending", c.to.shard)
			continue
		}
		if err == nil {
			t.Fatalf("node %d accepted the request; want %v", node, c.code)
		}
		if st.Code() != c.code {
			t.Fatalf("node %d: code %v (%s), want %v", node, st.Code(), st.Message(), c.code)
		}
		if c.detail == nil {
			if len(st.Details()) != 0 {
				t.Fatalf("node %d: unexpected details %v (%s)", node, st.Details(), st.Message())
			}
			return
		}
		c.detail(t, node, st.Details())
		return
	}
}

// Request builders.

func biHdr(shard, epoch uint64) *shalev1.RequestHeader {
	return &shalev1.RequestHeader{ShardId: shard, Epoch: epoch}
}

func biRID(n int) []byte { return bytes.Repeat([]byte{7}, n) }

func opPut(k, v string) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte(k), Value: []byte(v)}}}
}

func opDel(k string) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Delete{Delete: &shalev1.DeleteOp{Key: []byte(k)}}}
}

func opDelRange(s, e string) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeOp{StartKey: []byte(s), EndKey: []byte(e)}}}
}

func opGet(k string) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte(k)}}}
}

func cmpEq(k, v string) *shalev1.Compare {
	return &shalev1.Compare{Key: []byte(k), Value: []byte(v)}
}

type biCall = func(ctx context.Context, kv shalev1.KVClient, adm shalev1.AdminClient) error

func callGet(req *shalev1.GetRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.Get(ctx, req)
		return err
	}
}

func callMultiGet(req *shalev1.MultiGetRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.MultiGet(ctx, req)
		return err
	}
}

func callPut(req *shalev1.PutRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.Put(ctx, req)
		return err
	}
}

func callDelete(req *shalev1.DeleteRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.Delete(ctx, req)
		return err
	}
}

func callDeleteRange(req *shalev1.DeleteRangeRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.DeleteRange(ctx, req)
		return err
	}
}

func callScan(req *shalev1.ScanRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.Scan(ctx, req)
		return err
	}
}

func callScanStream(req *shalev1.ScanRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		return scanStream(ctx, kv, req)
	}
}

func callBatch(req *shalev1.BatchRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.Batch(ctx, req)
		return err
	}
}

func callCAS(req *shalev1.CompareAndSwapRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.CompareAndSwap(ctx, req)
		return err
	}
}

func callTxn(req *shalev1.TxnRequest) biCall {
	return func(ctx context.Context, kv shalev1.KVClient, _ shalev1.AdminClient) error {
		_, err := kv.Txn(ctx, req)
		return err
	}
}

// biRPC builds a well-formed request of one KV RPC for key, under header h.
type biRPC struct {
	name  string
	build func(h *shalev1.RequestHeader, key string) biCall
}

func biRPCs() []biRPC {
	return []biRPC{
		{"Get", func(h *shalev1.RequestHeader, k string) biCall {
			return callGet(&shalev1.GetRequest{Header: h, Key: []byte(k)})
		}},
		{"MultiGet", func(h *shalev1.RequestHeader, k string) biCall {
			return callMultiGet(&shalev1.MultiGetRequest{Header: h, Keys: [][]byte{[]byte(k)}})
		}},
		{"Put", func(h *shalev1.RequestHeader, k string) biCall {
			return callPut(&shalev1.PutRequest{Header: h, Key: []byte(k), Value: []byte("bad")})
		}},
		{"Delete", func(h *shalev1.RequestHeader, k string) biCall {
			return callDelete(&shalev1.DeleteRequest{Header: h, Key: []byte(k)})
		}},
		{"DeleteRange", func(h *shalev1.RequestHeader, k string) biCall {
			return callDeleteRange(&shalev1.DeleteRangeRequest{Header: h, StartKey: []byte(k), EndKey: []byte(k + "\x00")})
		}},
		{"Scan", func(h *shalev1.RequestHeader, k string) biCall {
			return callScan(&shalev1.ScanRequest{Header: h, StartKey: []byte(k), EndKey: []byte(k + "\x00")})
		}},
		{"ScanStream", func(h *shalev1.RequestHeader, k string) biCall {
			return callScanStream(&shalev1.ScanRequest{Header: h, StartKey: []byte(k), EndKey: []byte(k + "\x00")})
		}},
		{"Batch", func(h *shalev1.RequestHeader, k string) biCall {
			return callBatch(&shalev1.BatchRequest{Header: h, Ops: []*shalev1.RequestOp{opPut(k, "bad")}})
		}},
		{"CompareAndSwap", func(h *shalev1.RequestHeader, k string) biCall {
			return callCAS(&shalev1.CompareAndSwapRequest{Header: h, Key: []byte(k), ExpectedValue: []byte("no such value"), NewValue: []byte("bad")})
		}},
		{"Txn", func(h *shalev1.RequestHeader, k string) biCall {
			return callTxn(&shalev1.TxnRequest{Header: h, Compares: []*shalev1.Compare{cmpEq(k, "no such value")}, Success: []*shalev1.RequestOp{opPut(k, "bad")}})
		}},
	}
}

// routingCases are, for every KV RPC, the requests that are well formed
// but addressed wrongly.
func (h *biHarness) routingCases(staleEpoch uint64) []biCase {
	var cs []biCase
	for _, rpc := range biRPCs() {
		cs = append(cs,
			biCase{
				name: rpc.name + "/unknown shard", to: biDest{shard: biShardA},
				call: rpc.build(biHdr(biUnknown, 0), "a"),
				code: codes.NotFound, detail: h.wantShardNotFound(biUnknown, true),
			},
			biCase{
				name: rpc.name + "/stale epoch", to: biDest{shard: biShardB},
				call: rpc.build(biHdr(biShardB, staleEpoch), "n"),
				code: codes.FailedPrecondition, detail: h.wantEpochMismatch(staleEpoch, biShardB),
			},
			biCase{
				name: rpc.name + "/future epoch", to: biDest{shard: biShardA},
				call: rpc.build(biHdr(biShardA, 7), "a"),
				code: codes.FailedPrecondition, detail: h.wantEpochMismatch(7, biShardA),
			},
			biCase{
				name: rpc.name + "/key outside addressed shard", to: biDest{shard: biShardA},
				call: rpc.build(biHdr(biShardA, 0), "n"),
				code: codes.OutOfRange, detail: h.wantKeyOutside("n", biShardA),
			},
			biCase{
				name: rpc.name + "/key below addressed shard", to: biDest{shard: biShardB},
				call: rpc.build(biHdr(biShardB, 0), "a"),
				code: codes.OutOfRange, detail: h.wantKeyOutside("a", biShardB),
			},
			biCase{
				name: rpc.name + "/system shard", to: biDest{shard: biShardA},
				call: rpc.build(biHdr(biSystemShard, 0), "a"),
				code: codes.InvalidArgument,
			},
			biCase{
				name: rpc.name + "/follower", to: biDest{shard: biShardA, follower: true},
				call: rpc.build(biHdr(biShardA, 0), "a"),
				code: codes.FailedPrecondition, detail: h.wantNotLeader(biShardA),
			},
			biCase{
				name: rpc.name + "/follower by key", to: biDest{shard: biShardB, follower: true},
				call: rpc.build(nil, "n"),
				code: codes.FailedPrecondition, detail: h.wantNotLeader(biShardB),
			},
		)
	}
	return cs
}

// validationCases are malformed requests, RPC by RPC.
func (h *biHarness) validationCases(token []byte) []biCase {
	long := strings.Repeat("k", biMaxKey+1) // inside shard A
	bigVal := strings.Repeat("v", biMaxValue+1)
	A := biDest{shard: biShardA}
	B := biDest{shard: biShardB}
	IA := codes.InvalidArgument
	bigOps := func(n int) []*shalev1.RequestOp {
		var ops []*shalev1.RequestOp
		for i := 0; i < n; i++ {
			ops = append(ops, opPut(fmt.Sprintf("a%02d", i), "x"))
		}
		return ops
	}
	// Within the op and key/value limits, over the byte limit.
	heavyOps := func() []*shalev1.RequestOp {
		var ops []*shalev1.RequestOp
		for i := 0; i < biMaxOps-2; i++ {
			ops = append(ops, opPut(fmt.Sprintf("a%02d", i), strings.Repeat("h", biMaxValue)))
		}
		return ops
	}
	keys := func(n int) [][]byte {
		var ks [][]byte
		for i := 0; i < n; i++ {
			ks = append(ks, []byte(fmt.Sprintf("a%02d", i)))
		}
		return ks
	}
	badToken, _ := proto.Marshal(&shalev1.ScanToken{ResumeKey: []byte("b"), Remaining: 0, Checksum: 12345})
	scan := func(name string, req *shalev1.ScanRequest, to biDest, code codes.Code, detail func(*testing.T, uint64, []any)) []biCase {
		rev := proto.CloneOf(req)
		return []biCase{
			{name: "Scan/" + name, to: to, call: callScan(req), code: code, detail: detail},
			{name: "ScanStream/" + name, to: to, call: callScanStream(rev), code: code, detail: detail},
		}
	}
	sr := func(start, end, prefix string) *shalev1.ScanRequest {
		return &shalev1.ScanRequest{StartKey: []byte(start), EndKey: []byte(end), Prefix: []byte(prefix)}
	}
	withShard := func(req *shalev1.ScanRequest, shard uint64, reverse bool) *shalev1.ScanRequest {
		req.Header = biHdr(shard, 0)
		req.Reverse = reverse
		return req
	}
	withToken := func(req *shalev1.ScanRequest, tok []byte) *shalev1.ScanRequest {
		req.ContinuationToken = tok
		return req
	}

	cs := []biCase{
		// Get
		{name: "Get/empty key", to: A, call: callGet(&shalev1.GetRequest{}), code: IA},
		{name: "Get/key over limit", to: A, call: callGet(&shalev1.GetRequest{Key: []byte(long)}), code: IA},

		// MultiGet
		{name: "MultiGet/no keys", to: A, call: callMultiGet(&shalev1.MultiGetRequest{}), code: IA},
		{name: "MultiGet/empty key", to: A, call: callMultiGet(&shalev1.MultiGetRequest{Keys: [][]byte{[]byte("a"), nil}}), code: IA},
		{name: "MultiGet/key over limit", to: A, call: callMultiGet(&shalev1.MultiGetRequest{Keys: [][]byte{[]byte("a"), []byte(long)}}), code: IA},
		{name: "MultiGet/too many keys", to: A, call: callMultiGet(&shalev1.MultiGetRequest{Keys: keys(biMaxOps + 1)}), code: IA},
		{name: "MultiGet/spans shards", to: A, call: callMultiGet(&shalev1.MultiGetRequest{Keys: [][]byte{[]byte("a"), []byte("n")}}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "MultiGet/spans shards down", to: B, call: callMultiGet(&shalev1.MultiGetRequest{Keys: [][]byte{[]byte("n"), []byte("a")}}), code: IA, detail: wantCrossShard("m", biShardB)},

		// Put
		{name: "Put/empty key", to: A, call: callPut(&shalev1.PutRequest{Value: []byte("x")}), code: IA},
		{name: "Put/key over limit", to: A, call: callPut(&shalev1.PutRequest{Key: []byte(long), Value: []byte("x")}), code: IA},
		{name: "Put/value over limit", to: A, call: callPut(&shalev1.PutRequest{Key: []byte("a"), Value: []byte(bigVal)}), code: IA},
		{name: "Put/negative ttl", to: A, call: callPut(&shalev1.PutRequest{Key: []byte("a"), Value: []byte("x"), TtlMs: -1}), code: IA},
		{name: "Put/request id too short", to: A, call: callPut(&shalev1.PutRequest{Header: &shalev1.RequestHeader{RequestId: biRID(7)}, Key: []byte("a"), Value: []byte("x")}), code: IA},
		{name: "Put/request id too long", to: A, call: callPut(&shalev1.PutRequest{Header: &shalev1.RequestHeader{RequestId: biRID(33)}, Key: []byte("a"), Value: []byte("x")}), code: IA},

		// Delete
		{name: "Delete/empty key", to: A, call: callDelete(&shalev1.DeleteRequest{}), code: IA},
		{name: "Delete/key over limit", to: A, call: callDelete(&shalev1.DeleteRequest{Key: []byte(long)}), code: IA},
		{name: "Delete/request id too short", to: A, call: callDelete(&shalev1.DeleteRequest{Header: &shalev1.RequestHeader{RequestId: biRID(1)}, Key: []byte("a")}), code: IA},
		{name: "Delete/request id too long", to: A, call: callDelete(&shalev1.DeleteRequest{Header: &shalev1.RequestHeader{RequestId: biRID(64)}, Key: []byte("a")}), code: IA},

		// DeleteRange
		{name: "DeleteRange/empty start", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{EndKey: []byte("c")}), code: IA},
		{name: "DeleteRange/empty start and end", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{}), code: IA},
		{name: "DeleteRange/inverted", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{StartKey: []byte("c"), EndKey: []byte("b")}), code: IA},
		{name: "DeleteRange/empty range", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{StartKey: []byte("b"), EndKey: []byte("b")}), code: IA},
		{name: "DeleteRange/start over limit", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{StartKey: []byte(long)}), code: IA},
		{name: "DeleteRange/end over limit", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{StartKey: []byte("a"), EndKey: []byte(long + "z")}), code: IA},
		{name: "DeleteRange/spans shards", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{StartKey: []byte("a"), EndKey: []byte("z")}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "DeleteRange/spans shards, addressed", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{Header: biHdr(biShardA, 0), StartKey: []byte("b"), EndKey: []byte("n")}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "DeleteRange/request id too short", to: A, call: callDeleteRange(&shalev1.DeleteRangeRequest{Header: &shalev1.RequestHeader{RequestId: biRID(7)}, StartKey: []byte("a"), EndKey: []byte("b")}), code: IA},

		// Batch
		{name: "Batch/no ops", to: A, call: callBatch(&shalev1.BatchRequest{}), code: IA},
		{name: "Batch/too many ops", to: A, call: callBatch(&shalev1.BatchRequest{Ops: bigOps(biMaxOps + 1)}), code: IA},
		{name: "Batch/too many bytes", to: A, call: callBatch(&shalev1.BatchRequest{Ops: heavyOps()}), code: IA},
		{name: "Batch/first key empty", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("", "x")}}), code: IA},
		{name: "Batch/put empty key", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opPut("", "x")}}), code: IA},
		{name: "Batch/delete empty key", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opDel("")}}), code: IA},
		{name: "Batch/put key over limit", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opPut(long, "x")}}), code: IA},
		{name: "Batch/first key over limit", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opDel(long)}}), code: IA},
		{name: "Batch/value over limit", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opPut("b", bigVal)}}), code: IA},
		{name: "Batch/negative ttl", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte("a"), Value: []byte("x"), TtlMs: -5}}}}}), code: IA},
		{name: "Batch/empty op", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), {}}}), code: IA},
		{name: "Batch/get op", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opGet("b")}}), code: IA},
		{name: "Batch/delete range inverted", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opDelRange("c", "b")}}), code: IA},
		{name: "Batch/delete range empty", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opDelRange("c", "c")}}), code: IA},
		{name: "Batch/delete range empty start", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opDelRange("", "c")}}), code: IA},
		{name: "Batch/delete range bound over limit", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opDelRange("b", long+"z")}}), code: IA},
		{name: "Batch/request id too short", to: A, call: callBatch(&shalev1.BatchRequest{Header: &shalev1.RequestHeader{RequestId: biRID(7)}, Ops: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA},
		{name: "Batch/request id too long", to: A, call: callBatch(&shalev1.BatchRequest{Header: &shalev1.RequestHeader{RequestId: biRID(33)}, Ops: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA},
		{name: "Batch/spans shards", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opPut("n", "x")}}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "Batch/spans shards down", to: B, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("n", "x"), opDel("a")}}), code: IA, detail: wantCrossShard("m", biShardB)},
		{name: "Batch/spans shards, addressed", to: B, call: callBatch(&shalev1.BatchRequest{Header: biHdr(biShardB, 0), Ops: []*shalev1.RequestOp{opPut("n", "x"), opPut("a", "x")}}), code: IA, detail: wantCrossShard("m", biShardB)},
		{name: "Batch/delete range spans shards", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opDelRange("b", "z")}}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "Batch/delete range in next shard", to: A, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("a", "x"), opDelRange("n", "z")}}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "Batch/delete range in previous shard", to: B, call: callBatch(&shalev1.BatchRequest{Ops: []*shalev1.RequestOp{opPut("n", "x"), opDelRange("a", "c")}}), code: IA, detail: wantCrossShard("m", biShardB)},

		// CompareAndSwap
		{name: "CompareAndSwap/empty key", to: A, call: callCAS(&shalev1.CompareAndSwapRequest{NewValue: []byte("x")}), code: IA},
		{name: "CompareAndSwap/key over limit", to: A, call: callCAS(&shalev1.CompareAndSwapRequest{Key: []byte(long), NewValue: []byte("x")}), code: IA},
		{name: "CompareAndSwap/value over limit", to: A, call: callCAS(&shalev1.CompareAndSwapRequest{Key: []byte("a"), ExpectedValue: []byte("v-a"), NewValue: []byte(bigVal)}), code: IA},
		{name: "CompareAndSwap/negative ttl", to: A, call: callCAS(&shalev1.CompareAndSwapRequest{Key: []byte("a"), ExpectedValue: []byte("v-a"), NewValue: []byte("x"), TtlMs: -1}), code: IA},
		{name: "CompareAndSwap/expect absent and value", to: A, call: callCAS(&shalev1.CompareAndSwapRequest{Key: []byte("zz-absent"), ExpectAbsent: true, ExpectedValue: []byte("v"), NewValue: []byte("x")}), code: IA},
		{name: "CompareAndSwap/request id too short", to: A, call: callCAS(&shalev1.CompareAndSwapRequest{Header: &shalev1.RequestHeader{RequestId: biRID(7)}, Key: []byte("a"), ExpectedValue: []byte("v-a"), NewValue: []byte("x")}), code: IA},
		{name: "CompareAndSwap/request id too long", to: A, call: callCAS(&shalev1.CompareAndSwapRequest{Header: &shalev1.RequestHeader{RequestId: biRID(33)}, Key: []byte("a"), ExpectedValue: []byte("v-a"), NewValue: []byte("x")}), code: IA},

		// Txn
		{name: "Txn/empty", to: A, call: callTxn(&shalev1.TxnRequest{}), code: IA},
		{name: "Txn/too many ops", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "v-a")}, Success: bigOps(biMaxOps / 2), Failure: bigOps(biMaxOps / 2)}), code: IA},
		{name: "Txn/too many bytes", to: A, call: callTxn(&shalev1.TxnRequest{Success: heavyOps()}), code: IA},
		{name: "Txn/compare empty key", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("", "x")}, Success: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA},
		{name: "Txn/compare key over limit", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq(long, "x")}, Success: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA},
		{name: "Txn/success put empty key", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "v-a")}, Success: []*shalev1.RequestOp{opPut("", "x")}}), code: IA},
		{name: "Txn/success value over limit", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "v-a")}, Success: []*shalev1.RequestOp{opPut("a", bigVal)}}), code: IA},
		{name: "Txn/failure key over limit", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "v-a")}, Failure: []*shalev1.RequestOp{opDel(long)}}), code: IA},
		{name: "Txn/failure get empty key", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "v-a")}, Failure: []*shalev1.RequestOp{opGet("")}}), code: IA},
		{name: "Txn/negative ttl", to: A, call: callTxn(&shalev1.TxnRequest{Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte("a"), Value: []byte("x"), TtlMs: -1}}}}}), code: IA},
		{name: "Txn/empty op", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "v-a")}, Success: []*shalev1.RequestOp{{}}}), code: IA},
		{name: "Txn/only empty ops", to: A, call: callTxn(&shalev1.TxnRequest{Success: []*shalev1.RequestOp{{}}}), code: IA},
		{name: "Txn/delete range inverted", to: A, call: callTxn(&shalev1.TxnRequest{Success: []*shalev1.RequestOp{opDelRange("c", "b")}}), code: IA},
		{name: "Txn/unknown compare target", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("a"), Target: 99}}, Success: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA},
		{name: "Txn/unknown compare result", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("a"), Result: 99}}, Success: []*shalev1.RequestOp{opPut("a", "x")}, Failure: []*shalev1.RequestOp{opDel("a")}}), code: IA},
		{name: "Txn/request id too short", to: A, call: callTxn(&shalev1.TxnRequest{Header: &shalev1.RequestHeader{RequestId: biRID(7)}, Success: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA},
		{name: "Txn/request id too long", to: A, call: callTxn(&shalev1.TxnRequest{Header: &shalev1.RequestHeader{RequestId: biRID(33)}, Success: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA},
		{name: "Txn/compares span shards", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "x"), cmpEq("n", "x")}, Success: []*shalev1.RequestOp{opPut("a", "x")}}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "Txn/success spans shards", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "x")}, Success: []*shalev1.RequestOp{opPut("n", "x")}}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "Txn/failure spans shards", to: B, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("n", "x")}, Failure: []*shalev1.RequestOp{opGet("a")}}), code: IA, detail: wantCrossShard("m", biShardB)},
		{name: "Txn/delete range spans shards", to: A, call: callTxn(&shalev1.TxnRequest{Success: []*shalev1.RequestOp{opDelRange("b", "n")}}), code: IA, detail: wantCrossShard("m", biShardA)},
		{name: "Txn/delete range in next shard", to: A, call: callTxn(&shalev1.TxnRequest{Compares: []*shalev1.Compare{cmpEq("a", "x")}, Failure: []*shalev1.RequestOp{opDelRange("n", "z")}}), code: IA, detail: wantCrossShard("m", biShardA)},
	}

	// Scan and ScanStream
	for _, sc := range [][]biCase{
		scan("inverted range", sr("c", "b", ""), A, IA, nil),
		scan("empty range", sr("b", "b", ""), A, IA, nil),
		scan("inverted reverse range", func() *shalev1.ScanRequest { r := sr("c", "b", ""); r.Reverse = true; return r }(), A, IA, nil),
		scan("prefix with start", sr("a", "", "a"), A, IA, nil),
		scan("prefix with end", sr("", "c", "a"), A, IA, nil),
		scan("start over limit", sr(long, "", ""), A, IA, nil),
		scan("end over limit", sr("a", long+"z", ""), A, IA, nil),
		scan("prefix over limit", sr("", "", long), A, IA, nil),
		scan("garbage token", withToken(sr("a", "", ""), []byte{0xff, 0xfe, 0x01, 0x02}), A, IA, nil),
		scan("token with bad checksum", withToken(sr("a", "", ""), badToken), A, IA, nil),
		scan("token of another range", withToken(sr("x", "z", ""), token), B, IA, nil),
		scan("token of another reverse range", withToken(func() *shalev1.ScanRequest { r := sr("x", "z", ""); r.Reverse = true; return r }(), token), B, IA, nil),
		scan("empty start outside addressed shard", withShard(sr("", "z", ""), biShardB, false), B, codes.OutOfRange, h.wantKeyOutside("", biShardB)),
		scan("reverse end beyond addressed shard", withShard(sr("a", "z", ""), biShardA, true), A, codes.OutOfRange, h.wantKeyOutside("z", biShardA)),
		scan("reverse open end beyond addressed shard", withShard(sr("a", "", ""), biShardA, true), A, codes.OutOfRange, h.wantKeyOutside("", biShardA)),
		scan("reverse end below addressed shard", withShard(sr("a", "c", ""), biShardB, true), B, codes.OutOfRange, h.wantKeyOutside("c", biShardB)),
		scan("reverse system shard", withShard(sr("a", "c", ""), biSystemShard, true), A, IA, nil),
		scan("reverse unknown shard", withShard(sr("a", "c", ""), biUnknown, true), A, codes.NotFound, h.wantShardNotFound(biUnknown, true)),
		scan("reverse follower", func() *shalev1.ScanRequest { r := sr("a", "c", ""); r.Reverse = true; return r }(), biDest{shard: biShardA, follower: true}, codes.FailedPrecondition, h.wantNotLeader(biShardA)),
	} {
		cs = append(cs, sc...)
	}
	return cs
}

func (h *biHarness) adminCases() []biCase {
	A := biDest{shard: biShardA}
	F := biDest{shard: biSystemShard, follower: true}
	adm := func(fn func(ctx context.Context, a shalev1.AdminClient) error) biCall {
		return func(ctx context.Context, _ shalev1.KVClient, a shalev1.AdminClient) error { return fn(ctx, a) }
	}
	shardInfo := func(id uint64) biCall {
		return adm(func(ctx context.Context, a shalev1.AdminClient) error {
			_, err := a.ShardInfo(ctx, &shalev1.ShardInfoRequest{ShardId: id})
			return err
		})
	}
	transfer := func(shard, target uint64) biCall {
		return adm(func(ctx context.Context, a shalev1.AdminClient) error {
			_, err := a.TransferLeader(ctx, &shalev1.TransferLeaderRequest{ShardId: shard, TargetNodeId: target})
			return err
		})
	}
	addNode := func(addr string) biCall {
		return adm(func(ctx context.Context, a shalev1.AdminClient) error {
			_, err := a.AddNode(ctx, &shalev1.AddNodeRequest{Address: addr})
			return err
		})
	}
	removeNode := func(id uint64) biCall {
		return adm(func(ctx context.Context, a shalev1.AdminClient) error {
			_, err := a.RemoveNode(ctx, &shalev1.RemoveNodeRequest{NodeId: id})
			return err
		})
	}
	call := func(fn func(ctx context.Context, a shalev1.AdminClient) (any, error)) biCall {
		return adm(func(ctx context.Context, a shalev1.AdminClient) error { _, err := fn(ctx, a); return err })
	}
	changeReplicas := func(req *shalev1.ChangeReplicasRequest) biCall {
		return call(func(ctx context.Context, a shalev1.AdminClient) (any, error) { return a.ChangeReplicas(ctx, req) })
	}
	move := func(shard, from, to uint64) biCall {
		return call(func(ctx context.Context, a shalev1.AdminClient) (any, error) {
			return a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: shard, FromNodeId: from, ToNodeId: to})
		})
	}
	addLearner := []*shalev1.ReplicaChange{{Type: shalev1.ReplicaChange_TYPE_ADD_LEARNER, NodeId: 1}}
	return []biCase{
		{name: "ChangeReplicas/no epoch", to: A, call: changeReplicas(&shalev1.ChangeReplicasRequest{ShardId: biShardA, Changes: addLearner}), code: codes.InvalidArgument},
		{name: "ChangeReplicas/no changes", to: A, call: changeReplicas(&shalev1.ChangeReplicasRequest{ShardId: biShardA, Epoch: 1}), code: codes.InvalidArgument},
		{name: "ChangeReplicas/unknown type", to: A, call: changeReplicas(&shalev1.ChangeReplicasRequest{ShardId: biShardA, Epoch: 1, Changes: []*shalev1.ReplicaChange{{NodeId: 1}}}), code: codes.InvalidArgument},
		{name: "ChangeReplicas/learner without node", to: A, call: changeReplicas(&shalev1.ChangeReplicasRequest{ShardId: biShardA, Epoch: 1, Changes: []*shalev1.ReplicaChange{{Type: shalev1.ReplicaChange_TYPE_ADD_LEARNER}}}), code: codes.InvalidArgument},
		{name: "ChangeReplicas/remove without replica", to: A, call: changeReplicas(&shalev1.ChangeReplicasRequest{ShardId: biShardA, Epoch: 1, Changes: []*shalev1.ReplicaChange{{Type: shalev1.ReplicaChange_TYPE_REMOVE_REPLICA}}}), code: codes.InvalidArgument},
		{name: "ChangeReplicas/stale epoch", to: A, call: changeReplicas(&shalev1.ChangeReplicasRequest{ShardId: biShardA, Epoch: 99, Changes: addLearner}), code: codes.FailedPrecondition},
		{name: "ChangeReplicas/unknown shard", to: A, call: changeReplicas(&shalev1.ChangeReplicasRequest{ShardId: biUnknown, Epoch: 1, Changes: addLearner}), code: codes.NotFound, detail: h.wantShardNotFound(biUnknown, false)},
		{name: "MoveReplica/no shard", to: A, call: move(0, 1, 2), code: codes.InvalidArgument},
		{name: "MoveReplica/same node", to: A, call: move(biShardA, 1, 1), code: codes.InvalidArgument},
		{name: "MoveReplica/unknown shard", to: A, call: move(biUnknown, 1, 2), code: codes.NotFound, detail: h.wantShardNotFound(biUnknown, false)},
		{name: "MoveReplica/unknown target, follower", to: F, call: move(biShardA, 1, biUnknown), code: codes.NotFound},
		{name: "DecommissionNode/no node id", to: A, call: call(func(ctx context.Context, a shalev1.AdminClient) (any, error) {
			return a.DecommissionNode(ctx, &shalev1.DecommissionNodeRequest{})
		}), code: codes.InvalidArgument},
		{name: "DecommissionNode/unknown node", to: F, call: call(func(ctx context.Context, a shalev1.AdminClient) (any, error) {
			return a.DecommissionNode(ctx, &shalev1.DecommissionNodeRequest{NodeId: biUnknown})
		}), code: codes.NotFound},
		{name: "RecommissionNode/no node id", to: A, call: call(func(ctx context.Context, a shalev1.AdminClient) (any, error) {
			return a.RecommissionNode(ctx, &shalev1.RecommissionNodeRequest{})
		}), code: codes.InvalidArgument},
		{name: "Heartbeat/no node", to: A, call: call(func(ctx context.Context, a shalev1.AdminClient) (any, error) {
			return a.Heartbeat(ctx, &shalev1.HeartbeatRequest{})
		}), code: codes.InvalidArgument},
		{name: "MergeShards/no key", to: A, call: call(func(ctx context.Context, a shalev1.AdminClient) (any, error) {
			return a.MergeShards(ctx, &shalev1.MergeShardsRequest{})
		}), code: codes.InvalidArgument},
		{name: "ReportShards/removed system shard", to: A, call: call(func(ctx context.Context, a shalev1.AdminClient) (any, error) {
			return a.ReportShards(ctx, &shalev1.ReportShardsRequest{RemovedShardIds: []uint64{1}})
		}), code: codes.InvalidArgument},
		{name: "ShardInfo/no shard id", to: A, call: shardInfo(0), code: codes.InvalidArgument},
		{name: "ShardInfo/unknown shard", to: A, call: shardInfo(biUnknown), code: codes.NotFound, detail: h.wantShardNotFound(biUnknown, false)},
		{name: "TransferLeader/no shard id", to: A, call: transfer(0, 1), code: codes.InvalidArgument},
		{name: "TransferLeader/no target", to: A, call: transfer(biShardA, 0), code: codes.InvalidArgument},
		{name: "TransferLeader/unknown shard", to: A, call: transfer(biUnknown, 1), code: codes.NotFound, detail: h.wantShardNotFound(biUnknown, false)},
		{name: "TransferLeader/target without replica", to: A, call: transfer(biShardA, biUnknown), code: codes.FailedPrecondition},
		{name: "TransferLeader/target without replica, forwarded", to: biDest{shard: biShardA, follower: true}, call: transfer(biShardA, biUnknown), code: codes.FailedPrecondition},
		{name: "AddNode/no address", to: A, call: addNode(""), code: codes.InvalidArgument},
		{name: "AddNode/no address, follower", to: F, call: addNode(""), code: codes.InvalidArgument},
		{name: "RemoveNode/no node id", to: A, call: removeNode(0), code: codes.InvalidArgument},
		{name: "RemoveNode/unknown node", to: A, call: removeNode(biUnknown), code: codes.NotFound},
		{name: "RemoveNode/unknown node, follower", to: F, call: removeNode(biUnknown), code: codes.NotFound},
	}
}

// TestBadInput sends every KV RPC (and the Admin RPCs that take input)
// malformed or misaddressed requests through the raw gRPC API and checks
// that each gets its documented code and typed detail and writes nothing.
func TestBadInput(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{
		Splits: [][]byte{[]byte("m")},
		Configure: func(cfg *server.Config) {
			cfg.MaxKeyBytes = biMaxKey
			cfg.MaxValueBytes = biMaxValue
			cfg.MaxBatchOps = biMaxOps
			cfg.MaxBatchBytes = biMaxBytes
			cfg.MaxScanPageKeys = biPageKeys
		},
	})
	h := newBIHarness(t, c)
	for _, want := range []struct {
		id         uint64
		start, end string
	}{{biShardA, "", "m"}, {biShardB, "m", ""}} {
		d := c.Node(1).Shard(want.id).Descriptor()
		if string(d.GetStartKey()) != want.start || string(d.GetEndKey()) != want.end || d.GetSystem() {
			t.Fatalf("shard %d is %v, want [%q, %q)", want.id, d, want.start, want.end)
		}
	}
	h.waitRegistry()
	h.seed()
	staleEpoch := h.bumpEpoch(biShardB) - 1
	h.waitDirectory()

	// A genuine continuation token of range [a, m) (resuming inside it).
	ctx, cancel := biCtx()
	page, err := h.kv(h.leader(biShardA)).Scan(ctx, &shalev1.ScanRequest{StartKey: []byte("a"), EndKey: []byte("m")})
	cancel()
	if err != nil || len(page.GetContinuationToken()) == 0 {
		t.Fatalf("scan for a token: %v, %v", page, err)
	}
	// Positive controls: a follower serves follower reads.
	ctx, cancel = biCtx()
	_, err = h.kv(h.follower(biShardA)).Get(ctx, &shalev1.GetRequest{
		Header: &shalev1.RequestHeader{Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER}, Key: []byte("a")})
	cancel()
	if err != nil {
		t.Fatalf("follower read: %v", err)
	}

	before := h.snapshot()
	if len(before.kvs) != 9 {
		t.Fatalf("snapshot holds %d keys, want the 9 seeded", len(before.kvs))
	}
	cases := append(h.routingCases(staleEpoch), h.validationCases(page.GetContinuationToken())...)
	cases = append(cases, h.adminCases()...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			revs := h.appliedRevisions()
			h.run(t, tc)
			if after := h.appliedRevisions(); after != revs {
				t.Errorf("shard revisions moved: %v → %v", revs, after)
			}
		})
	}
	after := h.snapshot()
	h.compare(before, after, "after all bad requests")
}
