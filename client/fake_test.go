package client

// An in-process fake Shale cluster for the client's tests: a few gRPC
// servers on 127.0.0.1:0 that implement the KV and Admin services over
// shards kept as in-memory maps shared by all "replicas" of a shard. It
// checks requests the way the real server does (shard ID, epoch, key
// ranges, leadership) and answers with the same typed error details, and
// tests can inject behaviours: a moved leader, hint-less NotLeader answers,
// splits that leave the client's routing stale, errors before or after a
// write applies (lost responses), and slow replicas.

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

type fakeKV struct {
	value                []byte
	create, mod, version uint64
	expireUnixNanos      int64
}

type fakeShard struct {
	id         uint64
	start, end []byte
	epoch      uint64
	replicas   []uint64
	leader     uint64
	data       map[string]*fakeKV
	revision   uint64
}

func (s *fakeShard) desc() *shalev1.ShardDescriptor {
	d := &shalev1.ShardDescriptor{ShardId: s.id, StartKey: s.start, EndKey: s.end, Epoch: s.epoch,
		NextReplicaId: uint64(len(s.replicas) + 1)}
	for i, n := range s.replicas {
		d.Replicas = append(d.Replicas, &shalev1.ReplicaDescriptor{NodeId: n, ReplicaId: uint64(i + 1)})
	}
	return d
}

func (s *fakeShard) hasReplica(node uint64) bool {
	for _, n := range s.replicas {
		if n == node {
			return true
		}
	}
	return false
}

// sortedKeys returns the shard's keys in [lo, hi) (hi empty: unbounded),
// sorted.
func (s *fakeShard) sortedKeys(lo, hi []byte) []string {
	var ks []string
	for k := range s.data {
		if bytes.Compare([]byte(k), lo) >= 0 && (len(hi) == 0 || bytes.Compare([]byte(k), hi) < 0) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

func (s *fakeShard) kv(key string, keysOnly bool) *shalev1.KeyValue {
	v, ok := s.data[key]
	if !ok {
		return nil
	}
	kv := &shalev1.KeyValue{Key: []byte(key), CreateRevision: v.create, ModRevision: v.mod, Version: v.version,
		ExpireUnixNanos: v.expireUnixNanos}
	if !keysOnly {
		kv.Value = bytes.Clone(v.value)
	}
	return kv
}

func (s *fakeShard) put(key, value []byte, ttlMs int64) {
	s.revision++
	v, ok := s.data[string(key)]
	if !ok {
		v = &fakeKV{create: s.revision}
		s.data[string(key)] = v
	}
	v.value = bytes.Clone(value)
	v.mod = s.revision
	v.version++
	v.expireUnixNanos = 0
	if ttlMs > 0 {
		v.expireUnixNanos = time.Now().Add(time.Duration(ttlMs) * time.Millisecond).UnixNano()
	}
}

// fakeCall records one KV request as a replica received it.
type fakeCall struct {
	node        uint64
	method      string
	shard       uint64
	epoch       uint64
	requestID   string
	first       bool // RequestHeader.first_attempt
	consistency shalev1.ReadConsistency
	key         []byte
}

type fakeCluster struct {
	t     testing.TB
	mu    sync.Mutex
	nodes []*fakeNode
	// shards sorted by start key.
	shards      []*fakeShard
	nextShardID uint64
	// pageSize caps the keys of a Scan page.
	pageSize int
	// streams counts the ScanStream calls.
	streams int
	// hintless answers NotLeader without a leader hint.
	hintless bool
	// omitNext answers EpochMismatch without the next shard (as servers
	// before it did).
	omitNext bool
	// adminLeader, when non-zero, is the only node that answers Admin
	// mutations; the others answer NotLeader with its address.
	adminLeader uint64
	// dedup holds the response of each applied write by request ID;
	// applies counts the applications.
	dedup   map[string]proto.Message
	applies map[string]int
	calls   []fakeCall
	routing int // GetRouting calls
	// before runs before a KV request is handled and after runs after a
	// write applied; a non-nil error is returned instead of the response.
	before func(ctx context.Context, c fakeCall) error
	after  func(ctx context.Context, c fakeCall) error
	// removed nodes.
	removed map[uint64]bool
	// decommissioning nodes; placementOps is the placement history (the
	// running operations have state "running"); stuck the stuck replicas
	// PlacementStatus reports.
	decommissioning map[uint64]bool
	placementOps    []*shalev1.PlacementOperation
	stuck           []*shalev1.StuckReplica
	// adminReqs records the placement-related Admin requests the nodes
	// received (TransferLeader, MoveReplica, PlacementHistory,
	// DecommissionNode, RecommissionNode), NotLeader answers included.
	adminReqs []proto.Message
}

type fakeNode struct {
	id   uint64
	addr string
	zone string
	srv  *grpc.Server
	c    *fakeCluster
}

type fakeKVService struct {
	shalev1.UnimplementedKVServer
	n *fakeNode
}

type fakeAdminService struct {
	shalev1.UnimplementedAdminServer
	n *fakeNode
}

// newFakeCluster starts nodes servers and shards split at splits (sorted),
// each shard replicated on every node, leaders spread round robin.
func newFakeCluster(t *testing.T, nodes int, splits ...string) *fakeCluster {
	t.Helper()
	return newFakeClusterWith(t, nodes, fakeServerSetup{}, splits...)
}

// fakeServerSetup adds to every node of a fake cluster: server options
// (interceptors), a KV service in place of fakeKVService, more services.
type fakeServerSetup struct {
	opts     func(n *fakeNode) []grpc.ServerOption
	kv       func(n *fakeNode) shalev1.KVServer
	register func(srv *grpc.Server, n *fakeNode)
}

// newFakeClusterWith is newFakeCluster with setup's additions.
func newFakeClusterWith(t testing.TB, nodes int, setup fakeServerSetup, splits ...string) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{t: t, pageSize: 3, dedup: map[string]proto.Message{}, applies: map[string]int{},
		removed: map[uint64]bool{}, decommissioning: map[uint64]bool{}}
	var all []uint64
	for i := 1; i <= nodes; i++ {
		all = append(all, uint64(i))
	}
	bounds := append([]string{""}, splits...)
	for i, b := range bounds {
		var end []byte
		if i+1 < len(bounds) {
			end = []byte(bounds[i+1])
		}
		fc.nextShardID++
		fc.shards = append(fc.shards, &fakeShard{id: fc.nextShardID, start: []byte(b), end: end, epoch: 1,
			replicas: append([]uint64(nil), all...), leader: all[i%len(all)], data: map[string]*fakeKV{}})
	}
	for _, id := range all {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n := &fakeNode{id: id, addr: lis.Addr().String(), zone: "z" + string(rune('a'+id-1)), c: fc}
		var sopts []grpc.ServerOption
		if setup.opts != nil {
			sopts = setup.opts(n)
		}
		n.srv = grpc.NewServer(sopts...)
		var kv shalev1.KVServer = &fakeKVService{n: n}
		if setup.kv != nil {
			kv = setup.kv(n)
		}
		shalev1.RegisterKVServer(n.srv, kv)
		shalev1.RegisterAdminServer(n.srv, &fakeAdminService{n: n})
		if setup.register != nil {
			setup.register(n.srv, n)
		}
		go n.srv.Serve(lis)
		fc.nodes = append(fc.nodes, n)
	}
	t.Cleanup(fc.stop)
	return fc
}

func (fc *fakeCluster) stop() {
	for _, n := range fc.nodes {
		n.srv.Stop()
	}
}

// stopNode stops one node's server (its address then refuses connections).
func (fc *fakeCluster) stopNode(id uint64) { fc.nodes[id-1].srv.Stop() }

func (fc *fakeCluster) addrs() []string {
	var a []string
	for _, n := range fc.nodes {
		a = append(a, n.addr)
	}
	return a
}

// client connects a Client with fast backoffs and no log output.
func (fc *fakeCluster) client(opts ...Option) *Client {
	fc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	base := []Option{WithBackoff(time.Millisecond, 20*time.Millisecond), WithLogger(discardLogger())}
	c, err := New(ctx, fc.addrs(), append(base, opts...)...)
	if err != nil {
		fc.t.Fatal(err)
	}
	fc.t.Cleanup(func() { c.Close() })
	return c
}

func (fc *fakeCluster) shardByID(id uint64) *fakeShard {
	for _, s := range fc.shards {
		if s.id == id {
			return s
		}
	}
	return nil
}

func (fc *fakeCluster) shardFor(key []byte) *fakeShard {
	for _, s := range fc.shards {
		if containsKey(s.desc(), key) {
			return s
		}
	}
	return nil
}

// setLeader moves a shard's leadership (the client is not told).
func (fc *fakeCluster) setLeader(shard, node uint64) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.shardByID(shard).leader = node
}

// split cuts the shard holding key at key: the left part keeps the ID with
// a bumped epoch, the right part is a new shard with the same replicas and
// leader. It returns the new shard's ID.
func (fc *fakeCluster) split(key string) uint64 {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	k := []byte(key)
	for i, s := range fc.shards {
		if !containsKey(s.desc(), k) {
			continue
		}
		fc.nextShardID++
		right := &fakeShard{id: fc.nextShardID, start: k, end: s.end, epoch: 1,
			replicas: append([]uint64(nil), s.replicas...), leader: s.leader, data: map[string]*fakeKV{},
			revision: s.revision}
		for dk, v := range s.data {
			if dk >= key {
				right.data[dk] = v
				delete(s.data, dk)
			}
		}
		s.end = k
		s.epoch++
		fc.shards = append(fc.shards[:i+1], append([]*fakeShard{right}, fc.shards[i+1:]...)...)
		return right.id
	}
	fc.t.Fatalf("split: no shard for %q", key)
	return 0
}

// load writes keys directly into their shards.
func (fc *fakeCluster) load(kvs map[string]string) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for k, v := range kvs {
		fc.shardFor([]byte(k)).put([]byte(k), []byte(v), 0)
	}
}

func (fc *fakeCluster) callsOf(method string) []fakeCall {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	var out []fakeCall
	for _, c := range fc.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func (fc *fakeCluster) resetCalls() {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.calls = nil
	fc.routing = 0
}

func (fc *fakeCluster) routingCalls() int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.routing
}

func (fc *fakeCluster) setHooks(before, after func(ctx context.Context, c fakeCall) error) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.before, fc.after = before, after
}

// statusWith builds a status error with a typed detail.
func statusWith(code codes.Code, msg string, detail proto.Message) error {
	st := status.New(code, msg)
	if detail != nil {
		d, err := st.WithDetails(protoadapt.MessageV1Of(detail))
		if err != nil {
			panic(err)
		}
		st = d
	}
	return st.Err()
}

// fakeSpan is a key or range a request touches.
type fakeSpan struct {
	start, end []byte
	isRange    bool
}

// reqKind says how the fake checks a request.
type reqKind struct {
	method string
	write  bool
	// multi requests (MultiGet, Batch, Txn) answer CrossShardRequest for
	// keys outside the shard instead of KeyOutsideShard.
	multi bool
}

// serve runs one KV request: hooks, shard lookup, epoch, range and
// leadership checks, deduplication, then fn under the cluster lock.
func (n *fakeNode) serve(ctx context.Context, k reqKind, hdr *shalev1.RequestHeader, spans []fakeSpan,
	fn func(s *fakeShard) (proto.Message, error)) (proto.Message, error) {
	fc := n.c
	call := fakeCall{node: n.id, method: k.method, shard: hdr.GetShardId(), epoch: hdr.GetEpoch(),
		requestID: string(hdr.GetRequestId()), first: hdr.GetFirstAttempt(), consistency: hdr.GetConsistency()}
	if len(spans) > 0 {
		call.key = spans[0].start
	}
	fc.mu.Lock()
	fc.calls = append(fc.calls, call)
	before, after := fc.before, fc.after
	fc.mu.Unlock()
	if before != nil {
		if err := before(ctx, call); err != nil {
			return nil, err
		}
	}
	resp, err := func() (proto.Message, error) {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		var s *fakeShard
		if hdr.GetShardId() != 0 {
			s = fc.shardByID(hdr.GetShardId())
		} else if len(spans) > 0 {
			s = fc.shardFor(spans[0].start)
		}
		if s == nil || !s.hasReplica(n.id) {
			return nil, statusWith(codes.NotFound, "shard not found", &shalev1.ShardNotFound{ShardId: hdr.GetShardId(), NodeId: n.id})
		}
		if hdr.GetEpoch() != 0 && hdr.GetEpoch() != s.epoch {
			em := &shalev1.EpochMismatch{RequestedEpoch: hdr.GetEpoch(), Current: s.desc()}
			if nx := fc.shardFor(s.end); len(s.end) > 0 && nx != nil && !fc.omitNext {
				em.Next = &shalev1.RoutedShard{Descriptor_: nx.desc(), LeaderNodeId: nx.leader}
			}
			return nil, statusWith(codes.FailedPrecondition, "epoch mismatch", em)
		}
		d := s.desc()
		for _, sp := range spans {
			inside := containsKey(d, sp.start) && (!sp.isRange ||
				len(d.GetEndKey()) == 0 || (len(sp.end) > 0 && bytes.Compare(sp.end, d.GetEndKey()) <= 0))
			if inside {
				continue
			}
			if k.multi {
				split := s.end
				if bytes.Compare(sp.start, s.start) < 0 {
					split = s.start
				}
				return nil, statusWith(codes.InvalidArgument, "cross-shard request",
					&shalev1.CrossShardRequest{SplitKey: split, ShardId: s.id})
			}
			return nil, statusWith(codes.OutOfRange, "key outside shard", &shalev1.KeyOutsideShard{Key: sp.start, Shard: d})
		}
		needLeader := k.write || hdr.GetConsistency() == shalev1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE_UNSPECIFIED
		if needLeader && s.leader != n.id {
			nl := &shalev1.NotLeader{ShardId: s.id}
			if !fc.hintless {
				nl.LeaderNodeId = s.leader
				nl.LeaderAddress = fc.nodes[s.leader-1].addr
			}
			return nil, statusWith(codes.FailedPrecondition, "not leader", nl)
		}
		id := string(hdr.GetRequestId())
		if k.write && id != "" {
			if r, ok := fc.dedup[id]; ok {
				return r, nil
			}
		}
		r, err := fn(s)
		if err != nil {
			return nil, err
		}
		if k.write && id != "" {
			fc.dedup[id] = r
			fc.applies[id]++
		}
		return r, nil
	}()
	if err != nil {
		return nil, err
	}
	if after != nil && k.write {
		if err := after(ctx, call); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

func respHeader(s *fakeShard, node uint64) *shalev1.ResponseHeader {
	return &shalev1.ResponseHeader{ShardId: s.id, Revision: s.revision, NodeId: node, Epoch: s.epoch}
}

func keySpans(keys ...[]byte) []fakeSpan {
	out := make([]fakeSpan, len(keys))
	for i, k := range keys {
		out[i] = fakeSpan{start: k}
	}
	return out
}

func (k *fakeKVService) Get(ctx context.Context, req *shalev1.GetRequest) (*shalev1.GetResponse, error) {
	r, err := k.n.serve(ctx, reqKind{method: "Get"}, req.GetHeader(), keySpans(req.GetKey()),
		func(s *fakeShard) (proto.Message, error) {
			return &shalev1.GetResponse{Header: respHeader(s, k.n.id), Kv: s.kv(string(req.GetKey()), false)}, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.GetResponse), nil
}

func (k *fakeKVService) MultiGet(ctx context.Context, req *shalev1.MultiGetRequest) (*shalev1.MultiGetResponse, error) {
	r, err := k.n.serve(ctx, reqKind{method: "MultiGet", multi: true}, req.GetHeader(), keySpans(req.GetKeys()...),
		func(s *fakeShard) (proto.Message, error) {
			resp := &shalev1.MultiGetResponse{Header: respHeader(s, k.n.id)}
			for _, key := range req.GetKeys() {
				resp.Results = append(resp.Results, &shalev1.MultiGetResult{Key: key, Kv: s.kv(string(key), false)})
			}
			return resp, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.MultiGetResponse), nil
}

func (k *fakeKVService) Put(ctx context.Context, req *shalev1.PutRequest) (*shalev1.PutResponse, error) {
	r, err := k.n.serve(ctx, reqKind{method: "Put", write: true}, req.GetHeader(), keySpans(req.GetKey()),
		func(s *fakeShard) (proto.Message, error) {
			resp := &shalev1.PutResponse{}
			if req.GetPrevKv() {
				resp.PrevKv = s.kv(string(req.GetKey()), false)
			}
			s.put(req.GetKey(), req.GetValue(), req.GetTtlMs())
			resp.Header = respHeader(s, k.n.id)
			return resp, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.PutResponse), nil
}

func (s *fakeShard) del(key []byte, prev bool) *shalev1.DeleteResponse {
	resp := &shalev1.DeleteResponse{}
	if kv := s.kv(string(key), false); kv != nil {
		s.revision++
		resp.Deleted = 1
		if prev {
			resp.PrevKv = kv
		}
		delete(s.data, string(key))
	}
	return resp
}

func (k *fakeKVService) Delete(ctx context.Context, req *shalev1.DeleteRequest) (*shalev1.DeleteResponse, error) {
	r, err := k.n.serve(ctx, reqKind{method: "Delete", write: true}, req.GetHeader(), keySpans(req.GetKey()),
		func(s *fakeShard) (proto.Message, error) {
			resp := s.del(req.GetKey(), req.GetPrevKv())
			resp.Header = respHeader(s, k.n.id)
			return resp, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.DeleteResponse), nil
}

func (s *fakeShard) delRange(start, end []byte) {
	s.revision++
	for _, key := range s.sortedKeys(start, end) {
		delete(s.data, key)
	}
}

func (k *fakeKVService) DeleteRange(ctx context.Context, req *shalev1.DeleteRangeRequest) (*shalev1.DeleteRangeResponse, error) {
	sp := []fakeSpan{{start: req.GetStartKey(), end: req.GetEndKey(), isRange: true}}
	r, err := k.n.serve(ctx, reqKind{method: "DeleteRange", write: true}, req.GetHeader(), sp,
		func(s *fakeShard) (proto.Message, error) {
			s.delRange(req.GetStartKey(), req.GetEndKey())
			return &shalev1.DeleteRangeResponse{Header: respHeader(s, k.n.id)}, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.DeleteRangeResponse), nil
}

// Scan tokens: resume key, remaining, and a checksum.
func encodeToken(resume []byte, remaining uint32) []byte {
	t := &shalev1.ScanToken{ResumeKey: resume, Remaining: remaining, Checksum: tokenSum(resume, remaining)}
	b, _ := proto.Marshal(t)
	return b
}

func tokenSum(resume []byte, remaining uint32) uint32 {
	var r [4]byte
	binary.LittleEndian.PutUint32(r[:], remaining)
	return crc32.ChecksumIEEE(append(append([]byte(nil), resume...), r[:]...))
}

func (k *fakeKVService) Scan(ctx context.Context, req *shalev1.ScanRequest) (*shalev1.ScanResponse, error) {
	return k.scanPage(ctx, "Scan", req)
}

// ScanStream sends the pages of the range in the addressed shard back to
// back (each page a call of method "ScanStream", seen by the hooks); only
// the last carries the token, when the range goes on in another shard.
func (k *fakeKVService) ScanStream(req *shalev1.ScanRequest, stream shalev1.KV_ScanStreamServer) error {
	k.n.c.mu.Lock()
	k.n.c.streams++
	k.n.c.mu.Unlock()
	req = proto.CloneOf(req)
	for {
		resp, err := k.scanPage(stream.Context(), "ScanStream", req)
		if err != nil {
			return err
		}
		tok, resume := resp.GetContinuationToken(), resp.GetResumeKey()
		inShard := false
		if len(tok) > 0 {
			k.n.c.mu.Lock()
			if s := k.n.c.shardByID(resp.GetHeader().GetShardId()); s != nil {
				if req.GetReverse() {
					inShard = bytes.Compare(resume, s.start) > 0
				} else {
					inShard = len(s.end) == 0 || bytes.Compare(resume, s.end) < 0
				}
			}
			k.n.c.mu.Unlock()
		}
		if inShard {
			resp.ContinuationToken, resp.ResumeKey = nil, nil
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

func (k *fakeKVService) scanPage(ctx context.Context, method string, req *shalev1.ScanRequest) (*shalev1.ScanResponse, error) {
	lo, hi := req.GetStartKey(), req.GetEndKey()
	if len(req.GetPrefix()) > 0 {
		if len(lo) > 0 || len(hi) > 0 {
			return nil, status.Error(codes.InvalidArgument, "prefix with range")
		}
		lo, hi = req.GetPrefix(), prefixEnd(req.GetPrefix())
	}
	remaining := req.GetLimit()
	if tok := req.GetContinuationToken(); len(tok) > 0 {
		var t shalev1.ScanToken
		if err := proto.Unmarshal(tok, &t); err != nil || t.GetChecksum() != tokenSum(t.GetResumeKey(), t.GetRemaining()) {
			return nil, status.Error(codes.InvalidArgument, "bad continuation token")
		}
		if req.GetReverse() {
			hi = t.GetResumeKey()
		} else {
			lo = t.GetResumeKey()
		}
		remaining = t.GetRemaining()
	}
	// The routing check: the scan position must be in the shard.
	var spans []fakeSpan
	if !req.GetReverse() {
		spans = keySpans(lo)
	}
	r, err := k.n.serve(ctx, reqKind{method: method}, req.GetHeader(), spans,
		func(s *fakeShard) (proto.Message, error) {
			if req.GetReverse() && !containsBefore(s.desc(), hi) {
				return nil, statusWith(codes.OutOfRange, "key outside shard", &shalev1.KeyOutsideShard{Key: hi, Shard: s.desc()})
			}
			clo, chi := lo, hi
			if bytes.Compare(clo, s.start) < 0 {
				clo = s.start
			}
			if len(s.end) > 0 && (len(chi) == 0 || bytes.Compare(s.end, chi) < 0) {
				chi = s.end
			}
			keys := s.sortedKeys(clo, chi)
			if req.GetReverse() {
				for i, j := 0, len(keys)-1; i < j; i, j = i+1, j-1 {
					keys[i], keys[j] = keys[j], keys[i]
				}
			}
			n := k.n.c.pageSize
			if req.GetLimit() > 0 && int(remaining) < n {
				n = int(remaining)
			}
			n = min(n, len(keys))
			resp := &shalev1.ScanResponse{Header: respHeader(s, k.n.id)}
			for _, key := range keys[:n] {
				resp.Kvs = append(resp.Kvs, s.kv(key, req.GetKeysOnly()))
			}
			if req.GetLimit() > 0 {
				remaining -= uint32(n)
				if remaining == 0 {
					return resp, nil
				}
			}
			var resume []byte
			switch {
			case n < len(keys) && req.GetReverse():
				resume = []byte(keys[n-1])
			case n < len(keys):
				resume = append([]byte(keys[n-1]), 0)
			case req.GetReverse() && bytes.Compare(lo, s.start) < 0:
				resume = s.start
			case !req.GetReverse() && len(s.end) > 0 && (len(hi) == 0 || bytes.Compare(s.end, hi) < 0):
				resume = s.end
			}
			if resume != nil {
				resp.ResumeKey = resume
				resp.ContinuationToken = encodeToken(resume, remaining)
			}
			return resp, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.ScanResponse), nil
}

func opSpans(ops []*shalev1.RequestOp) []fakeSpan {
	var out []fakeSpan
	for _, op := range ops {
		switch v := op.GetOp().(type) {
		case *shalev1.RequestOp_Put:
			out = append(out, fakeSpan{start: v.Put.GetKey()})
		case *shalev1.RequestOp_Delete:
			out = append(out, fakeSpan{start: v.Delete.GetKey()})
		case *shalev1.RequestOp_DeleteRange:
			out = append(out, fakeSpan{start: v.DeleteRange.GetStartKey(), end: v.DeleteRange.GetEndKey(), isRange: true})
		case *shalev1.RequestOp_Get:
			out = append(out, fakeSpan{start: v.Get.GetKey()})
		}
	}
	return out
}

func (s *fakeShard) apply(ops []*shalev1.RequestOp, node uint64) []*shalev1.ResponseOp {
	var out []*shalev1.ResponseOp
	for _, op := range ops {
		switch v := op.GetOp().(type) {
		case *shalev1.RequestOp_Put:
			r := &shalev1.PutResponse{}
			if v.Put.GetPrevKv() {
				r.PrevKv = s.kv(string(v.Put.GetKey()), false)
			}
			s.put(v.Put.GetKey(), v.Put.GetValue(), v.Put.GetTtlMs())
			r.Header = respHeader(s, node)
			out = append(out, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Put{Put: r}})
		case *shalev1.RequestOp_Delete:
			r := s.del(v.Delete.GetKey(), v.Delete.GetPrevKv())
			r.Header = respHeader(s, node)
			out = append(out, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Delete{Delete: r}})
		case *shalev1.RequestOp_DeleteRange:
			s.delRange(v.DeleteRange.GetStartKey(), v.DeleteRange.GetEndKey())
			out = append(out, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_DeleteRange{
				DeleteRange: &shalev1.DeleteRangeResponse{Header: respHeader(s, node)}}})
		case *shalev1.RequestOp_Get:
			out = append(out, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Get{Get: &shalev1.GetResponse{
				Header: respHeader(s, node), Kv: s.kv(string(v.Get.GetKey()), false)}}})
		}
	}
	return out
}

func (k *fakeKVService) Batch(ctx context.Context, req *shalev1.BatchRequest) (*shalev1.BatchResponse, error) {
	r, err := k.n.serve(ctx, reqKind{method: "Batch", write: true, multi: true}, req.GetHeader(), opSpans(req.GetOps()),
		func(s *fakeShard) (proto.Message, error) {
			res := s.apply(req.GetOps(), k.n.id)
			return &shalev1.BatchResponse{Header: respHeader(s, k.n.id), Results: res}, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.BatchResponse), nil
}

func (k *fakeKVService) CompareAndSwap(ctx context.Context, req *shalev1.CompareAndSwapRequest) (*shalev1.CompareAndSwapResponse, error) {
	r, err := k.n.serve(ctx, reqKind{method: "CompareAndSwap", write: true}, req.GetHeader(), keySpans(req.GetKey()),
		func(s *fakeShard) (proto.Message, error) {
			cur := s.kv(string(req.GetKey()), false)
			ok := (req.GetExpectAbsent() && cur == nil) ||
				(!req.GetExpectAbsent() && cur != nil && bytes.Equal(cur.GetValue(), req.GetExpectedValue()))
			if ok {
				s.put(req.GetKey(), req.GetNewValue(), req.GetTtlMs())
			}
			return &shalev1.CompareAndSwapResponse{Header: respHeader(s, k.n.id), Succeeded: ok, Current: cur}, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.CompareAndSwapResponse), nil
}

func compareHolds(s *fakeShard, c *shalev1.Compare) bool {
	kv := s.kv(string(c.GetKey()), false)
	var r int
	if c.GetTarget() == shalev1.Compare_TARGET_VALUE_UNSPECIFIED {
		if kv == nil {
			return false
		}
		r = bytes.Compare(kv.GetValue(), c.GetValue())
	} else {
		var n uint64
		switch c.GetTarget() {
		case shalev1.Compare_TARGET_VERSION:
			n = kv.GetVersion()
		case shalev1.Compare_TARGET_CREATE_REVISION:
			n = kv.GetCreateRevision()
		case shalev1.Compare_TARGET_MOD_REVISION:
			n = kv.GetModRevision()
		case shalev1.Compare_TARGET_EXISTS:
			if kv != nil {
				n = 1
			}
		}
		switch {
		case n < c.GetNumber():
			r = -1
		case n > c.GetNumber():
			r = 1
		}
	}
	switch c.GetResult() {
	case shalev1.Compare_RESULT_NOT_EQUAL:
		return r != 0
	case shalev1.Compare_RESULT_GREATER:
		return r > 0
	case shalev1.Compare_RESULT_LESS:
		return r < 0
	}
	return r == 0
}

func (k *fakeKVService) Txn(ctx context.Context, req *shalev1.TxnRequest) (*shalev1.TxnResponse, error) {
	spans := opSpans(append(append([]*shalev1.RequestOp(nil), req.GetSuccess()...), req.GetFailure()...))
	for _, c := range req.GetCompares() {
		spans = append(spans, fakeSpan{start: c.GetKey()})
	}
	r, err := k.n.serve(ctx, reqKind{method: "Txn", write: true, multi: true}, req.GetHeader(), spans,
		func(s *fakeShard) (proto.Message, error) {
			ok := true
			for _, c := range req.GetCompares() {
				ok = ok && compareHolds(s, c)
			}
			ops := req.GetFailure()
			if ok {
				ops = req.GetSuccess()
			}
			res := s.apply(ops, k.n.id)
			return &shalev1.TxnResponse{Header: respHeader(s, k.n.id), Succeeded: ok, Results: res}, nil
		})
	if err != nil {
		return nil, err
	}
	return r.(*shalev1.TxnResponse), nil
}

// Admin.

func (a *fakeAdminService) nodes() []*shalev1.NodeDescriptor {
	var out []*shalev1.NodeDescriptor
	for _, n := range a.n.c.nodes {
		if !a.n.c.removed[n.id] {
			out = append(out, &shalev1.NodeDescriptor{NodeId: n.id, Address: n.addr, Zone: n.zone})
		}
	}
	return out
}

func (a *fakeAdminService) shardStatus(s *fakeShard) *shalev1.ShardStatus {
	st := &shalev1.ShardStatus{Descriptor_: s.desc(), LeaderNodeId: s.leader, Term: 2, CommitIndex: 10 + s.revision,
		AppliedIndex: 10 + s.revision, Revision: s.revision, SizeBytes: uint64(len(s.data)) * 1500, ReportedBy: s.leader}
	for i, n := range s.replicas {
		st.Replicas = append(st.Replicas, &shalev1.ReplicaStatus{NodeId: n, ReplicaId: uint64(i + 1),
			MatchIndex: 10 + s.revision, Leader: n == s.leader})
	}
	return st
}

func (a *fakeAdminService) nodeStatus() []*shalev1.NodeStatus {
	var out []*shalev1.NodeStatus
	for _, n := range a.nodes() {
		ns := &shalev1.NodeStatus{Node: n, Live: true, LastSeenUnixNanos: time.Now().UnixNano(), UsedBytes: 3 << 20}
		for _, s := range a.n.c.shards {
			if s.hasReplica(n.GetNodeId()) {
				ns.ReplicaCount++
			}
			if s.leader == n.GetNodeId() {
				ns.LeaderCount++
			}
		}
		out = append(out, ns)
	}
	return out
}

// mutation answers NotLeader when this node is not the admin leader.
func (a *fakeAdminService) mutation() error {
	fc := a.n.c
	if fc.adminLeader != 0 && fc.adminLeader != a.n.id {
		return statusWith(codes.FailedPrecondition, "not the system shard leader",
			&shalev1.NotLeader{LeaderNodeId: fc.adminLeader, LeaderAddress: fc.nodes[fc.adminLeader-1].addr})
	}
	return nil
}

func (a *fakeAdminService) GetRouting(ctx context.Context, _ *shalev1.GetRoutingRequest) (*shalev1.GetRoutingResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.routing++
	resp := &shalev1.GetRoutingResponse{ClusterId: "fake-cluster", Nodes: a.nodes()}
	for _, s := range fc.shards {
		resp.Shards = append(resp.Shards, &shalev1.RoutedShard{Descriptor_: s.desc(), LeaderNodeId: s.leader})
	}
	// The system shard is omitted by the real server; include one to
	// check that the client skips it.
	resp.Shards = append(resp.Shards, &shalev1.RoutedShard{Descriptor_: &shalev1.ShardDescriptor{ShardId: 999, System: true,
		StartKey: []byte("\xff\xff"), Epoch: 1}})
	return resp, nil
}

func (a *fakeAdminService) ClusterStatus(ctx context.Context, _ *shalev1.ClusterStatusRequest) (*shalev1.ClusterStatusResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	resp := &shalev1.ClusterStatusResponse{ClusterId: "fake-cluster", Nodes: a.nodeStatus()}
	for _, s := range fc.shards {
		resp.Shards = append(resp.Shards, a.shardStatus(s))
	}
	return resp, nil
}

func (a *fakeAdminService) ListNodes(ctx context.Context, _ *shalev1.ListNodesRequest) (*shalev1.ListNodesResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return &shalev1.ListNodesResponse{Nodes: a.nodeStatus()}, nil
}

func (a *fakeAdminService) AddNode(ctx context.Context, req *shalev1.AddNodeRequest) (*shalev1.AddNodeResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if err := a.mutation(); err != nil {
		return nil, err
	}
	if req.GetAddress() == "" {
		return nil, status.Error(codes.InvalidArgument, "address required")
	}
	id := uint64(len(fc.nodes) + 1)
	n := &fakeNode{id: id, addr: req.GetAddress(), zone: req.GetZone(), c: fc, srv: grpc.NewServer()}
	fc.nodes = append(fc.nodes, n)
	return &shalev1.AddNodeResponse{Node: &shalev1.NodeDescriptor{NodeId: id, Address: n.addr, Zone: n.zone},
		ClusterId: "fake-cluster", Peers: a.nodes()}, nil
}

func (a *fakeAdminService) RemoveNode(ctx context.Context, req *shalev1.RemoveNodeRequest) (*shalev1.RemoveNodeResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if err := a.mutation(); err != nil {
		return nil, err
	}
	if req.GetNodeId() == 0 || req.GetNodeId() > uint64(len(fc.nodes)) {
		return nil, status.Errorf(codes.NotFound, "node %d not found", req.GetNodeId())
	}
	fc.removed[req.GetNodeId()] = true
	return &shalev1.RemoveNodeResponse{}, nil
}

func (a *fakeAdminService) ListShards(ctx context.Context, _ *shalev1.ListShardsRequest) (*shalev1.ListShardsResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	resp := &shalev1.ListShardsResponse{}
	for _, s := range fc.shards {
		resp.Shards = append(resp.Shards, a.shardStatus(s))
	}
	return resp, nil
}

func (a *fakeAdminService) ShardInfo(ctx context.Context, req *shalev1.ShardInfoRequest) (*shalev1.ShardInfoResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	s := fc.shardByID(req.GetShardId())
	if s == nil {
		return nil, status.Errorf(codes.NotFound, "shard %d not found", req.GetShardId())
	}
	return &shalev1.ShardInfoResponse{Shard: a.shardStatus(s)}, nil
}

func (a *fakeAdminService) TransferLeader(ctx context.Context, req *shalev1.TransferLeaderRequest) (*shalev1.TransferLeaderResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.adminReqs = append(fc.adminReqs, req)
	if err := a.mutation(); err != nil {
		return nil, err
	}
	s := fc.shardByID(req.GetShardId())
	if s == nil {
		return nil, status.Errorf(codes.NotFound, "shard %d not found", req.GetShardId())
	}
	if !s.hasReplica(req.GetTargetNodeId()) {
		return nil, status.Errorf(codes.FailedPrecondition, "node %d has no replica of shard %d", req.GetTargetNodeId(), s.id)
	}
	s.leader = req.GetTargetNodeId()
	return &shalev1.TransferLeaderResponse{LeaderNodeId: s.leader}, nil
}

// adminRequests returns the recorded Admin requests of type T.
func adminRequests[T proto.Message](fc *fakeCluster) []T {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	var out []T
	for _, m := range fc.adminReqs {
		if r, ok := m.(T); ok {
			out = append(out, r)
		}
	}
	return out
}

// knownNode returns whether id is a registered node (removed or not).
func (fc *fakeCluster) knownNode(id uint64) bool { return id >= 1 && id <= uint64(len(fc.nodes)) }

// PlacementStatus answers from any node (the real one forwards it to the
// placement leader): node 1 leads placement; replicas, leaders and bytes
// come from the shards, the running operations from placementOps.
func (a *fakeAdminService) PlacementStatus(ctx context.Context, _ *shalev1.PlacementStatusRequest) (*shalev1.PlacementStatusResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	resp := &shalev1.PlacementStatusResponse{PlacementLeaderNodeId: 1, Stuck: fc.stuck}
	for _, n := range fc.nodes {
		np := &shalev1.NodePlacement{Node: &shalev1.NodeDescriptor{NodeId: n.id, Address: n.addr, Zone: n.zone,
			Removed: fc.removed[n.id], Decommissioning: fc.decommissioning[n.id]},
			State: "live", LastHeartbeatUnixNanos: time.Now().UnixNano()}
		if fc.removed[n.id] {
			np.State = "removed"
		}
		for _, s := range fc.shards {
			if s.hasReplica(n.id) {
				np.Replicas++
				np.Bytes += uint64(len(s.data)) * 1500
			}
			if s.leader == n.id {
				np.Leaders++
			}
		}
		for _, st := range fc.stuck {
			if st.GetNodeId() == n.id {
				np.Stuck = append(np.Stuck, st)
			}
		}
		resp.Nodes = append(resp.Nodes, np)
	}
	for _, op := range fc.placementOps {
		if op.GetState() == "running" {
			resp.Running = append(resp.Running, op)
		}
	}
	resp.Balanced = len(resp.Running) == 0 && len(resp.Stuck) == 0
	return resp, nil
}

func (a *fakeAdminService) PlacementHistory(ctx context.Context, req *shalev1.PlacementHistoryRequest) (*shalev1.PlacementHistoryResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.adminReqs = append(fc.adminReqs, req)
	ops := fc.placementOps
	if l := int(req.GetLimit()); l > 0 && l < len(ops) {
		ops = ops[len(ops)-l:]
	}
	return &shalev1.PlacementHistoryResponse{Operations: ops}, nil
}

// setDecommissioning is DecommissionNode and RecommissionNode.
func (a *fakeAdminService) setDecommissioning(req proto.Message, id uint64, on bool) error {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.adminReqs = append(fc.adminReqs, req)
	if err := a.mutation(); err != nil {
		return err
	}
	if id == 0 {
		return status.Error(codes.InvalidArgument, "node_id required")
	}
	if !fc.knownNode(id) {
		return status.Errorf(codes.NotFound, "node %d not found", id)
	}
	fc.decommissioning[id] = on
	return nil
}

func (a *fakeAdminService) DecommissionNode(ctx context.Context, req *shalev1.DecommissionNodeRequest) (*shalev1.DecommissionNodeResponse, error) {
	if err := a.setDecommissioning(req, req.GetNodeId(), true); err != nil {
		return nil, err
	}
	return &shalev1.DecommissionNodeResponse{}, nil
}

func (a *fakeAdminService) RecommissionNode(ctx context.Context, req *shalev1.RecommissionNodeRequest) (*shalev1.RecommissionNodeResponse, error) {
	if err := a.setDecommissioning(req, req.GetNodeId(), false); err != nil {
		return nil, err
	}
	return &shalev1.RecommissionNodeResponse{}, nil
}

// MoveReplica checks the shard and both nodes and, as the server does,
// records the accepted move (kind "move", done) and its first step, a
// running add-learner operation; the shard's replicas do not change.
func (a *fakeAdminService) MoveReplica(ctx context.Context, req *shalev1.MoveReplicaRequest) (*shalev1.MoveReplicaResponse, error) {
	fc := a.n.c
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.adminReqs = append(fc.adminReqs, req)
	if err := a.mutation(); err != nil {
		return nil, err
	}
	s := fc.shardByID(req.GetShardId())
	if s == nil {
		return nil, status.Errorf(codes.NotFound, "shard %d not found", req.GetShardId())
	}
	if !fc.knownNode(req.GetToNodeId()) {
		return nil, status.Errorf(codes.NotFound, "node %d not found", req.GetToNodeId())
	}
	if !s.hasReplica(req.GetFromNodeId()) {
		return nil, status.Errorf(codes.FailedPrecondition, "node %d has no replica of shard %d", req.GetFromNodeId(), s.id)
	}
	if s.hasReplica(req.GetToNodeId()) {
		return nil, status.Errorf(codes.FailedPrecondition, "node %d already has a replica of shard %d", req.GetToNodeId(), s.id)
	}
	now := time.Now().UnixNano()
	op := &shalev1.PlacementOperation{ShardId: s.id, Kind: "move", NodeId: req.GetToNodeId(),
		FromNodeId: req.GetFromNodeId(), Reason: "manual move", StartedUnixNanos: now, FinishedUnixNanos: now, State: "done"}
	step := &shalev1.PlacementOperation{ShardId: s.id, Kind: "add-learner", NodeId: req.GetToNodeId(),
		FromNodeId: s.leader, Reason: "manual move", StartedUnixNanos: now, State: "running"}
	fc.placementOps = append(fc.placementOps, op, step)
	return &shalev1.MoveReplicaResponse{Operation: op}, nil
}
