package main

// A reduced in-process fake of a Shale cluster for the cluster commands'
// tests (the client package has the full one): two gRPC servers on
// 127.0.0.1:0 sharing two shards, [, m) led by node 1 and [m, ) led by
// node 2, kept in one in-memory map. Requests are checked for the right
// shard and leader, scans are paged with continuation tokens, and the
// Admin service reports the layout.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

type fakeEntry struct {
	value                []byte
	create, mod, version uint64
	expire               int64
}

type fakeShard struct {
	desc     *shalev1.ShardDescriptor
	leader   uint64
	quiesced bool
	stopped  string
}

type fakeCluster struct {
	mu       sync.Mutex
	data     map[string]*fakeEntry
	revision uint64
	shards   []*fakeShard
	nodes    []*shalev1.NodeDescriptor
	removed  map[uint64]bool
	servers  []*grpc.Server
	pageSize int
	// The placement fake: decommissioning nodes, the operations (history;
	// those "running" are reported as running), the stuck replicas, and the
	// pin_seconds and limits the requests carried.
	decommissioning map[uint64]bool
	ops             []*shalev1.PlacementOperation
	stuck           []*shalev1.StuckReplica
	transferPins    []int64
	movePins        []int64
	historyLimits   []uint32
	checksums       map[uint64]uint64 // node → replica checksum reported
}

type fakeKV struct {
	shalev1.UnimplementedKVServer
	c    *fakeCluster
	node uint64
}

type fakeAdmin struct {
	shalev1.UnimplementedAdminServer
	c    *fakeCluster
	node uint64
}

// ReplicaChecksum reports every replica at index 41 with checksum 0xabc,
// or the node's entry in checksums.
func (a *fakeAdmin) ReplicaChecksum(_ context.Context, req *shalev1.ReplicaChecksumRequest) (*shalev1.ReplicaChecksumResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	sum, ok := a.c.checksums[a.node]
	if !ok {
		sum = 0xabc
	}
	return &shalev1.ReplicaChecksumResponse{NodeId: a.node, ShardId: req.GetShardId(), AppliedIndex: 41, Checksum: sum}, nil
}

func newFakeCluster(t *testing.T) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{data: map[string]*fakeEntry{}, removed: map[uint64]bool{}, pageSize: 2,
		decommissioning: map[uint64]bool{}}
	reps := []*shalev1.ReplicaDescriptor{{NodeId: 1, ReplicaId: 1}, {NodeId: 2, ReplicaId: 2}}
	fc.shards = []*fakeShard{
		{desc: &shalev1.ShardDescriptor{ShardId: 1, EndKey: []byte("m"), Epoch: 3, Replicas: reps}, leader: 1},
		{desc: &shalev1.ShardDescriptor{ShardId: 2, StartKey: []byte("m"), Epoch: 1, Replicas: reps}, leader: 2},
	}
	for id := uint64(1); id <= 2; id++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		shalev1.RegisterKVServer(srv, &fakeKV{c: fc, node: id})
		shalev1.RegisterAdminServer(srv, &fakeAdmin{c: fc, node: id})
		go srv.Serve(lis)
		fc.servers = append(fc.servers, srv)
		fc.nodes = append(fc.nodes, &shalev1.NodeDescriptor{NodeId: id, Address: lis.Addr().String(), Zone: "zone-" + string(rune('a'+id-1))})
	}
	t.Cleanup(func() {
		for _, s := range fc.servers {
			s.Stop()
		}
	})
	return fc
}

func (fc *fakeCluster) endpoints() string {
	var a []string
	for _, n := range fc.nodes {
		a = append(a, n.GetAddress())
	}
	return strings.Join(a, ",")
}

func inShard(d *shalev1.ShardDescriptor, key []byte) bool {
	return bytes.Compare(d.GetStartKey(), key) <= 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(key, d.GetEndKey()) < 0)
}

// check finds the addressed shard and verifies the key, epoch and
// leadership, the way the server does.
func (k *fakeKV) check(hdr *shalev1.RequestHeader, key []byte, needLeader bool) (*fakeShard, error) {
	var s *fakeShard
	for _, x := range k.c.shards {
		if x.desc.GetShardId() == hdr.GetShardId() {
			s = x
		}
	}
	if s == nil {
		return nil, status.Error(codes.NotFound, "shard not found")
	}
	if hdr.GetEpoch() != s.desc.GetEpoch() {
		return nil, status.Error(codes.FailedPrecondition, "epoch mismatch")
	}
	if key != nil && !inShard(s.desc, key) {
		return nil, status.Error(codes.OutOfRange, "key outside shard")
	}
	if needLeader && s.leader != k.node {
		st, _ := status.New(codes.FailedPrecondition, "not leader").WithDetails(&shalev1.NotLeader{
			ShardId: s.desc.GetShardId(), LeaderNodeId: s.leader, LeaderAddress: k.c.nodes[s.leader-1].GetAddress()})
		return nil, st.Err()
	}
	return s, nil
}

func isLinearizable(hdr *shalev1.RequestHeader) bool {
	return hdr.GetConsistency() == shalev1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE_UNSPECIFIED
}

func (k *fakeKV) kv(key string, keysOnly bool) *shalev1.KeyValue {
	e, ok := k.c.data[key]
	if !ok {
		return nil
	}
	kv := &shalev1.KeyValue{Key: []byte(key), CreateRevision: e.create, ModRevision: e.mod, Version: e.version, ExpireUnixNanos: e.expire}
	if !keysOnly {
		kv.Value = e.value
	}
	return kv
}

func (k *fakeKV) header(s *fakeShard) *shalev1.ResponseHeader {
	return &shalev1.ResponseHeader{ShardId: s.desc.GetShardId(), Revision: k.c.revision, NodeId: k.node, Epoch: s.desc.GetEpoch()}
}

func (k *fakeKV) put(key, value []byte, ttlMs int64) {
	k.c.revision++
	e, ok := k.c.data[string(key)]
	if !ok {
		e = &fakeEntry{create: k.c.revision}
		k.c.data[string(key)] = e
	}
	e.value, e.mod, e.expire = bytes.Clone(value), k.c.revision, 0
	e.version++
	if ttlMs > 0 {
		e.expire = time.Now().Add(time.Duration(ttlMs) * time.Millisecond).UnixNano()
	}
}

func (k *fakeKV) Get(ctx context.Context, req *shalev1.GetRequest) (*shalev1.GetResponse, error) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	s, err := k.check(req.GetHeader(), req.GetKey(), isLinearizable(req.GetHeader()))
	if err != nil {
		return nil, err
	}
	return &shalev1.GetResponse{Header: k.header(s), Kv: k.kv(string(req.GetKey()), false)}, nil
}

func (k *fakeKV) Put(ctx context.Context, req *shalev1.PutRequest) (*shalev1.PutResponse, error) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	s, err := k.check(req.GetHeader(), req.GetKey(), true)
	if err != nil {
		return nil, err
	}
	resp := &shalev1.PutResponse{}
	if req.GetPrevKv() {
		resp.PrevKv = k.kv(string(req.GetKey()), false)
	}
	k.put(req.GetKey(), req.GetValue(), req.GetTtlMs())
	resp.Header = k.header(s)
	return resp, nil
}

func (k *fakeKV) Delete(ctx context.Context, req *shalev1.DeleteRequest) (*shalev1.DeleteResponse, error) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	s, err := k.check(req.GetHeader(), req.GetKey(), true)
	if err != nil {
		return nil, err
	}
	resp := &shalev1.DeleteResponse{}
	if kv := k.kv(string(req.GetKey()), false); kv != nil {
		k.c.revision++
		resp.Deleted = 1
		if req.GetPrevKv() {
			resp.PrevKv = kv
		}
		delete(k.c.data, string(req.GetKey()))
	}
	resp.Header = k.header(s)
	return resp, nil
}

func (k *fakeKV) CompareAndSwap(ctx context.Context, req *shalev1.CompareAndSwapRequest) (*shalev1.CompareAndSwapResponse, error) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	s, err := k.check(req.GetHeader(), req.GetKey(), true)
	if err != nil {
		return nil, err
	}
	cur := k.kv(string(req.GetKey()), false)
	ok := (req.GetExpectAbsent() && cur == nil) || (!req.GetExpectAbsent() && cur != nil && bytes.Equal(cur.GetValue(), req.GetExpectedValue()))
	if ok {
		k.put(req.GetKey(), req.GetNewValue(), req.GetTtlMs())
	}
	return &shalev1.CompareAndSwapResponse{Header: k.header(s), Succeeded: ok, Current: cur}, nil
}

// Scan pages within the addressed shard; its continuation token is simply
// the resume key (the real server's is checksummed).
func (k *fakeKV) Scan(ctx context.Context, req *shalev1.ScanRequest) (*shalev1.ScanResponse, error) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	lo, hi, rev := req.GetStartKey(), req.GetEndKey(), req.GetReverse()
	if p := req.GetPrefix(); len(p) > 0 {
		return nil, status.Error(codes.Unimplemented, "the fake takes ranges only")
	}
	if tok := req.GetContinuationToken(); len(tok) > 0 {
		if rev {
			hi = tok
		} else {
			lo = tok
		}
	}
	var s *fakeShard
	var err error
	if rev {
		s, err = k.check(req.GetHeader(), nil, isLinearizable(req.GetHeader()))
	} else {
		s, err = k.check(req.GetHeader(), lo, isLinearizable(req.GetHeader()))
	}
	if err != nil {
		return nil, err
	}
	d := s.desc
	if bytes.Compare(lo, d.GetStartKey()) < 0 {
		lo = d.GetStartKey()
	}
	if len(d.GetEndKey()) > 0 && (len(hi) == 0 || bytes.Compare(d.GetEndKey(), hi) < 0) {
		hi = d.GetEndKey()
	}
	var keys []string
	for key := range k.c.data {
		if key >= string(lo) && (len(hi) == 0 || key < string(hi)) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	if rev {
		for i, j := 0, len(keys)-1; i < j; i, j = i+1, j-1 {
			keys[i], keys[j] = keys[j], keys[i]
		}
	}
	n := min(k.c.pageSize, len(keys))
	if req.GetLimit() > 0 {
		n = min(n, int(req.GetLimit()))
	}
	resp := &shalev1.ScanResponse{Header: k.header(s)}
	for _, key := range keys[:n] {
		resp.Kvs = append(resp.Kvs, k.kv(key, req.GetKeysOnly()))
	}
	var resume []byte
	switch {
	case req.GetLimit() > 0 && n == int(req.GetLimit()):
		// A page limit reached (the client pages with limits); a real
		// server tracks the limit across pages in the token.
	case n < len(keys) && rev:
		resume = []byte(keys[n-1])
	case n < len(keys):
		resume = append([]byte(keys[n-1]), 0)
	case rev && bytes.Compare(req.GetStartKey(), d.GetStartKey()) < 0:
		resume = d.GetStartKey()
	case !rev && len(d.GetEndKey()) > 0 && (len(req.GetEndKey()) == 0 || bytes.Compare(d.GetEndKey(), req.GetEndKey()) < 0):
		resume = d.GetEndKey()
	}
	if resume != nil {
		resp.ResumeKey, resp.ContinuationToken = resume, resume
	}
	return resp, nil
}

// ScanStream sends the pages of the range in the addressed shard back to
// back, the last with the token when the range goes on; it keeps the
// remaining limit across pages, as the server does.
func (k *fakeKV) ScanStream(req *shalev1.ScanRequest, stream shalev1.KV_ScanStreamServer) error {
	req = proto.CloneOf(req)
	for {
		resp, err := k.Scan(stream.Context(), req)
		if err != nil {
			return err
		}
		if req.GetLimit() > 0 {
			req.Limit -= uint32(len(resp.GetKvs()))
			if req.Limit == 0 {
				resp.ResumeKey, resp.ContinuationToken = nil, nil
			}
		}
		inShard := false
		if resume := resp.GetResumeKey(); resume != nil {
			k.c.mu.Lock()
			for _, s := range k.c.shards {
				if s.desc.GetShardId() != resp.GetHeader().GetShardId() {
					continue
				}
				if req.GetReverse() {
					inShard = bytes.Compare(resume, s.desc.GetStartKey()) > 0
				} else {
					inShard = len(s.desc.GetEndKey()) == 0 || bytes.Compare(resume, s.desc.GetEndKey()) < 0
				}
			}
			k.c.mu.Unlock()
		}
		tok := resp.GetContinuationToken()
		if inShard {
			resp.ResumeKey, resp.ContinuationToken = nil, nil
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		if !inShard {
			return nil
		}
		req.ContinuationToken = tok
	}
}

func (a *fakeAdmin) shardStatus(s *fakeShard) *shalev1.ShardStatus {
	st := &shalev1.ShardStatus{Descriptor_: s.desc, LeaderNodeId: s.leader, Term: 5, CommitIndex: 42, AppliedIndex: 41,
		Revision: a.c.revision, SizeBytes: 3 << 20, ReportedBy: s.leader, Quiesced: s.quiesced, Stopped: s.stopped}
	for _, r := range s.desc.GetReplicas() {
		st.Replicas = append(st.Replicas, &shalev1.ReplicaStatus{NodeId: r.GetNodeId(), ReplicaId: r.GetReplicaId(),
			MatchIndex: 42, Leader: r.GetNodeId() == s.leader})
	}
	return st
}

func (a *fakeAdmin) nodeStatus() []*shalev1.NodeStatus {
	var out []*shalev1.NodeStatus
	for _, n := range a.c.nodes {
		ns := &shalev1.NodeStatus{Node: n, Live: !a.c.removed[n.GetNodeId()], Removed: a.c.removed[n.GetNodeId()],
			LastSeenUnixNanos: time.Now().UnixNano(), UsedBytes: 1536, ReplicaCount: 2}
		for _, s := range a.c.shards {
			if s.leader == n.GetNodeId() {
				ns.LeaderCount++
			}
		}
		out = append(out, ns)
	}
	return out
}

func (a *fakeAdmin) GetRouting(ctx context.Context, _ *shalev1.GetRoutingRequest) (*shalev1.GetRoutingResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	resp := &shalev1.GetRoutingResponse{ClusterId: "test-cluster", Nodes: a.c.nodes}
	for _, s := range a.c.shards {
		resp.Shards = append(resp.Shards, &shalev1.RoutedShard{Descriptor_: s.desc, LeaderNodeId: s.leader})
	}
	return resp, nil
}

func (a *fakeAdmin) ClusterStatus(ctx context.Context, _ *shalev1.ClusterStatusRequest) (*shalev1.ClusterStatusResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	resp := &shalev1.ClusterStatusResponse{ClusterId: "test-cluster", Nodes: a.nodeStatus()}
	for _, s := range a.c.shards {
		resp.Shards = append(resp.Shards, a.shardStatus(s))
	}
	return resp, nil
}

func (a *fakeAdmin) ListNodes(ctx context.Context, _ *shalev1.ListNodesRequest) (*shalev1.ListNodesResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	return &shalev1.ListNodesResponse{Nodes: a.nodeStatus()}, nil
}

func (a *fakeAdmin) AddNode(ctx context.Context, req *shalev1.AddNodeRequest) (*shalev1.AddNodeResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	n := &shalev1.NodeDescriptor{NodeId: uint64(len(a.c.nodes) + 1), Address: req.GetAddress(), Zone: req.GetZone()}
	a.c.nodes = append(a.c.nodes, n)
	return &shalev1.AddNodeResponse{Node: n, ClusterId: "test-cluster", Peers: a.c.nodes}, nil
}

func (a *fakeAdmin) RemoveNode(ctx context.Context, req *shalev1.RemoveNodeRequest) (*shalev1.RemoveNodeResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	if req.GetNodeId() > uint64(len(a.c.nodes)) {
		return nil, status.Errorf(codes.NotFound, "node %d not found", req.GetNodeId())
	}
	a.c.removed[req.GetNodeId()] = true
	return &shalev1.RemoveNodeResponse{}, nil
}

func (a *fakeAdmin) ListShards(ctx context.Context, _ *shalev1.ListShardsRequest) (*shalev1.ListShardsResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	resp := &shalev1.ListShardsResponse{}
	for _, s := range a.c.shards {
		resp.Shards = append(resp.Shards, a.shardStatus(s))
	}
	return resp, nil
}

func (a *fakeAdmin) ShardInfo(ctx context.Context, req *shalev1.ShardInfoRequest) (*shalev1.ShardInfoResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	for _, s := range a.c.shards {
		if s.desc.GetShardId() == req.GetShardId() {
			return &shalev1.ShardInfoResponse{Shard: a.shardStatus(s)}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "shard %d not found", req.GetShardId())
}

func (a *fakeAdmin) TransferLeader(ctx context.Context, req *shalev1.TransferLeaderRequest) (*shalev1.TransferLeaderResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	a.c.transferPins = append(a.c.transferPins, req.GetPinSeconds())
	for _, s := range a.c.shards {
		if s.desc.GetShardId() == req.GetShardId() {
			if req.GetTargetNodeId() < 1 || req.GetTargetNodeId() > 2 {
				return nil, status.Errorf(codes.FailedPrecondition, "node %d has no replica of shard %d", req.GetTargetNodeId(), req.GetShardId())
			}
			s.leader = req.GetTargetNodeId()
			return &shalev1.TransferLeaderResponse{LeaderNodeId: s.leader}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "shard %d not found", req.GetShardId())
}

// hasReplica returns whether node holds a replica of s.
func (s *fakeShard) hasReplica(node uint64) bool {
	for _, r := range s.desc.GetReplicas() {
		if r.GetNodeId() == node {
			return true
		}
	}
	return false
}

// PlacementStatus reports node 1 as the placement leader; nodes 1 and 2
// hold both shards (3 MiB each), added nodes none.
func (a *fakeAdmin) PlacementStatus(ctx context.Context, _ *shalev1.PlacementStatusRequest) (*shalev1.PlacementStatusResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	resp := &shalev1.PlacementStatusResponse{PlacementLeaderNodeId: 1, Stuck: a.c.stuck, ReplicaSpread: 2,
		LeaderSpread: 1, BytesSpreadPercent: 100}
	for _, n := range a.c.nodes {
		id := n.GetNodeId()
		d := proto.Clone(n).(*shalev1.NodeDescriptor)
		d.Removed, d.Decommissioning = a.c.removed[id], a.c.decommissioning[id]
		np := &shalev1.NodePlacement{Node: d, State: "live", LastHeartbeatUnixNanos: time.Now().Add(-2 * time.Second).UnixNano(),
			Stats: &shalev1.NodeStats{Node: d, CapacityBytes: 100 << 30, AvailableBytes: 60 << 30}}
		if d.Removed {
			np.State = "removed"
		}
		for _, s := range a.c.shards {
			if s.hasReplica(id) {
				np.Replicas++
				np.Bytes += 3 << 20
			}
			if s.leader == id {
				np.Leaders++
			}
		}
		for _, st := range a.c.stuck {
			if st.GetNodeId() == id {
				np.Stuck = append(np.Stuck, st)
			}
		}
		resp.Nodes = append(resp.Nodes, np)
	}
	for _, op := range a.c.ops {
		if op.GetState() == "running" {
			resp.Running = append(resp.Running, op)
		}
	}
	return resp, nil
}

func (a *fakeAdmin) PlacementHistory(ctx context.Context, req *shalev1.PlacementHistoryRequest) (*shalev1.PlacementHistoryResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	a.c.historyLimits = append(a.c.historyLimits, req.GetLimit())
	ops := a.c.ops
	if l := int(req.GetLimit()); l > 0 && l < len(ops) {
		ops = ops[len(ops)-l:]
	}
	return &shalev1.PlacementHistoryResponse{Operations: ops}, nil
}

func (a *fakeAdmin) setDecommissioning(id uint64, on bool) error {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	if id == 0 || id > uint64(len(a.c.nodes)) {
		return status.Errorf(codes.NotFound, "node %d not found", id)
	}
	a.c.decommissioning[id] = on
	return nil
}

func (a *fakeAdmin) DecommissionNode(ctx context.Context, req *shalev1.DecommissionNodeRequest) (*shalev1.DecommissionNodeResponse, error) {
	if err := a.setDecommissioning(req.GetNodeId(), true); err != nil {
		return nil, err
	}
	return &shalev1.DecommissionNodeResponse{}, nil
}

func (a *fakeAdmin) RecommissionNode(ctx context.Context, req *shalev1.RecommissionNodeRequest) (*shalev1.RecommissionNodeResponse, error) {
	if err := a.setDecommissioning(req.GetNodeId(), false); err != nil {
		return nil, err
	}
	return &shalev1.RecommissionNodeResponse{}, nil
}

// MoveReplica records the accepted move and its first step, a running
// add-learner operation, as the server does (the shard's replicas do not
// change).
func (a *fakeAdmin) MoveReplica(ctx context.Context, req *shalev1.MoveReplicaRequest) (*shalev1.MoveReplicaResponse, error) {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	a.c.movePins = append(a.c.movePins, req.GetPinSeconds())
	var s *fakeShard
	for _, x := range a.c.shards {
		if x.desc.GetShardId() == req.GetShardId() {
			s = x
		}
	}
	switch {
	case s == nil:
		return nil, status.Errorf(codes.NotFound, "shard %d not found", req.GetShardId())
	case req.GetToNodeId() > uint64(len(a.c.nodes)):
		return nil, status.Errorf(codes.NotFound, "node %d not found", req.GetToNodeId())
	case !s.hasReplica(req.GetFromNodeId()):
		return nil, status.Errorf(codes.FailedPrecondition, "node %d has no replica of shard %d", req.GetFromNodeId(), req.GetShardId())
	case s.hasReplica(req.GetToNodeId()):
		return nil, status.Errorf(codes.FailedPrecondition, "node %d already has a replica of shard %d", req.GetToNodeId(), req.GetShardId())
	}
	reason := fmt.Sprintf("manual move from node %d to node %d", req.GetFromNodeId(), req.GetToNodeId())
	now := time.Now()
	op := &shalev1.PlacementOperation{ShardId: req.GetShardId(), Kind: "move", NodeId: req.GetToNodeId(),
		FromNodeId: req.GetFromNodeId(), Reason: reason, StartedUnixNanos: now.UnixNano(), FinishedUnixNanos: now.UnixNano(),
		State: "done"}
	step := &shalev1.PlacementOperation{ShardId: req.GetShardId(), Kind: "add-learner", NodeId: req.GetToNodeId(),
		FromNodeId: s.leader, Reason: reason, StartedUnixNanos: now.Add(-5 * time.Second).UnixNano(), State: "running"}
	a.c.ops = append(a.c.ops, op, step)
	return &shalev1.MoveReplicaResponse{Operation: op}, nil
}
