package server

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// adminService implements shalev1.AdminServer on a Node.
type adminService struct {
	shalev1.UnimplementedAdminServer
	n *Node
}

// localStatus reports this node's replicas.
func (n *Node) localStatus(ctx context.Context) *shalev1.NodeInfoResponse {
	resp := &shalev1.NodeInfoResponse{Node: &shalev1.NodeDescriptor{NodeId: n.cfg.NodeID, Address: n.cfg.AdvertiseAddr, Zone: n.cfg.Zone}}
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil {
			continue
		}
		st := r.Status()
		if st.Leader {
			cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			if ps, err := r.ProgressStatus(cctx); err == nil {
				st = ps
			}
			cancel()
		}
		ss := &shalev1.ShardStatus{
			Descriptor_:  sm.Descriptor(),
			LeaderNodeId: st.LeaderNodeID,
			Term:         st.Term,
			CommitIndex:  st.Commit,
			AppliedIndex: st.Applied,
			Revision:     sm.Revision(),
			SizeBytes:    sm.SizeBytes(),
			ReportedBy:   n.cfg.NodeID,
			Quiesced:     st.Quiesced,
			Stopped:      st.Stopped,

			RequestsPerSecond: n.recentQPS(r.ShardID()),
		}
		rep := n.loadReport(r)
		ss.LedLoadTicks, ss.PeakRequestsPerSecond = uint32(rep.ticks), rep.peak
		for _, rd := range ss.GetDescriptor_().GetReplicas() {
			rs := &shalev1.ReplicaStatus{NodeId: rd.GetNodeId(), ReplicaId: rd.GetReplicaId(), Role: rd.GetRole(), Leader: rd.GetReplicaId() == st.LeaderReplicaID}
			if pr, ok := st.Progress[rd.GetReplicaId()]; ok {
				rs.MatchIndex = pr.Match
			}
			ss.Replicas = append(ss.Replicas, rs)
		}
		resp.UsedBytes += ss.GetSizeBytes()
		resp.Shards = append(resp.Shards, ss)
	}
	return resp
}

// gather asks every known node for its NodeInfo (this node answers
// locally); unreachable nodes are missing from the result.
func (n *Node) gather(ctx context.Context) map[uint64]*shalev1.NodeInfoResponse {
	out := map[uint64]*shalev1.NodeInfoResponse{n.cfg.NodeID: n.localStatus(ctx)}
	n.mu.Lock()
	peers := map[uint64]string{}
	for id, a := range n.addrs {
		if id != n.cfg.NodeID {
			peers[id] = a
		}
	}
	n.mu.Unlock()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, addr := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			resp, err := shalev1.NewAdminClient(n.conn(addr)).NodeInfo(cctx, &shalev1.NodeInfoRequest{})
			if err != nil || resp.GetNode().GetNodeId() != id {
				return
			}
			mu.Lock()
			out[id] = resp
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// mergeShards keeps, per shard, the newest descriptor and the status from
// its leader (or, without one, the most advanced replica).
func mergeShards(infos map[uint64]*shalev1.NodeInfoResponse) []*shalev1.ShardStatus {
	best := map[uint64]*shalev1.ShardStatus{}
	for _, info := range infos {
		for _, ss := range info.GetShards() {
			id := ss.GetDescriptor_().GetShardId()
			if id == 0 {
				continue
			}
			cur, ok := best[id]
			isLeader := ss.GetLeaderNodeId() == ss.GetReportedBy()
			curLeader := ok && cur.GetLeaderNodeId() == cur.GetReportedBy()
			switch {
			case !ok,
				ss.GetDescriptor_().GetEpoch() > cur.GetDescriptor_().GetEpoch(),
				isLeader && !curLeader && ss.GetTerm() >= cur.GetTerm(),
				isLeader == curLeader && ss.GetTerm() > cur.GetTerm(),
				isLeader == curLeader && ss.GetTerm() == cur.GetTerm() && ss.GetAppliedIndex() > cur.GetAppliedIndex():
				best[id] = ss
			}
		}
	}
	out := make([]*shalev1.ShardStatus, 0, len(best))
	for _, ss := range best {
		out = append(out, ss)
	}
	sortShards(out)
	return out
}

// sortShards orders statuses as listings show them: the system shard
// first, then by start key.
func sortShards(out []*shalev1.ShardStatus) {
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].GetDescriptor_(), out[j].GetDescriptor_()
		if a.GetSystem() != b.GetSystem() {
			return a.GetSystem()
		}
		return bytes.Compare(a.GetStartKey(), b.GetStartKey()) < 0
	})
}

// shardStatuses is every shard: the live nodes' reports merged, plus the
// shards of the shard directory that no live node reported (with their
// descriptor only: no leader, no Raft state). Without a readable directory
// it is the reports alone.
func (n *Node) shardStatuses(ctx context.Context, infos map[uint64]*shalev1.NodeInfoResponse) []*shalev1.ShardStatus {
	out := mergeShards(infos)
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	dir, err := (&adminService{n: n}).ShardDirectory(dctx, &shalev1.ShardDirectoryRequest{})
	if err != nil {
		return out
	}
	listed := make(map[uint64]bool, len(dir.GetShards()))
	for _, d := range dir.GetShards() {
		listed[d.GetShardId()] = true
	}
	out = dropStrays(out, listed)
	seen := make(map[uint64]bool, len(out))
	for _, ss := range out {
		seen[ss.GetDescriptor_().GetShardId()] = true
	}
	added := false
	for _, d := range dir.GetShards() {
		if !seen[d.GetShardId()] {
			out = append(out, &shalev1.ShardStatus{Descriptor_: d})
			added = true
		}
	}
	if added {
		sortShards(out)
	}
	return out
}

// dropStrays removes from out, the shards the nodes report, those that are
// no shard any more although a replica still reports them, by the
// directory's list (listed).
//
// A frozen replica of a shard merged away (its node was down when the
// merge retired it) is one; so is a leaderless one the directory no longer
// lists whose range a listed shard now covers (a follower that lagged
// behind the merge's freeze while the others retired). A shard just split
// off is not listed for a moment either, but has a leader, and no listed
// shard covers its range.
func dropStrays(out []*shalev1.ShardStatus, listed map[uint64]bool) []*shalev1.ShardStatus {
	all := slices.Clone(out)
	kept := out[:0]
	for _, ss := range all {
		d := ss.GetDescriptor_()
		switch {
		case listed[d.GetShardId()]:
		case d.GetMergingInto() != 0:
			continue
		case ss.GetLeaderNodeId() == 0 && coveredByListed(d, all, listed):
			continue
		}
		kept = append(kept, ss)
	}
	return kept
}

// coveredByListed reports whether a shard the directory lists (in its
// reported state, among all) overlaps d's range.
func coveredByListed(d *shalev1.ShardDescriptor, all []*shalev1.ShardStatus, listed map[uint64]bool) bool {
	for _, ss := range all {
		o := ss.GetDescriptor_()
		if o.GetShardId() == d.GetShardId() || !listed[o.GetShardId()] || o.GetSystem() {
			continue
		}
		if overlaps(o, d) {
			return true
		}
	}
	return false
}

func (s *adminService) NodeInfo(ctx context.Context, _ *shalev1.NodeInfoRequest) (*shalev1.NodeInfoResponse, error) {
	return s.n.localStatus(ctx), nil
}

func (s *adminService) GetRouting(ctx context.Context, _ *shalev1.GetRoutingRequest) (*shalev1.GetRoutingResponse, error) {
	n := s.n
	infos := n.gather(ctx)
	resp := &shalev1.GetRoutingResponse{ClusterId: n.clusterID}
	for _, ss := range n.shardStatuses(ctx, infos) {
		if ss.GetDescriptor_().GetSystem() {
			continue
		}
		resp.Shards = append(resp.Shards, &shalev1.RoutedShard{Descriptor_: ss.GetDescriptor_(), LeaderNodeId: ss.GetLeaderNodeId()})
	}
	n.mu.Lock()
	for id, a := range n.addrs {
		resp.Nodes = append(resp.Nodes, &shalev1.NodeDescriptor{NodeId: id, Address: a})
	}
	n.mu.Unlock()
	sort.Slice(resp.Nodes, func(i, j int) bool { return resp.Nodes[i].GetNodeId() < resp.Nodes[j].GetNodeId() })
	return resp, nil
}

func (s *adminService) nodeStatuses(ctx context.Context, infos map[uint64]*shalev1.NodeInfoResponse) ([]*shalev1.NodeStatus, error) {
	n := s.n
	reg, err := n.registry(ctx)
	if err != nil {
		// Without the registry, report the nodes this node knows of.
		n.mu.Lock()
		for id, a := range n.addrs {
			reg = append(reg, &shalev1.NodeDescriptor{NodeId: id, Address: a})
		}
		n.mu.Unlock()
	}
	var out []*shalev1.NodeStatus
	for _, d := range reg {
		ns := &shalev1.NodeStatus{Node: d, Removed: d.GetRemoved()}
		if info, ok := infos[d.GetNodeId()]; ok {
			ns.Live = true
			ns.LastSeenUnixNanos = n.wallNanos()
			ns.UsedBytes = info.GetUsedBytes()
			for _, ss := range info.GetShards() {
				ns.ReplicaCount++
				if ss.GetLeaderNodeId() == d.GetNodeId() {
					ns.LeaderCount++
				}
			}
		} else if t := n.store.LastHeard(d.GetNodeId()); !t.IsZero() {
			ns.LastSeenUnixNanos = t.UnixNano()
		}
		out = append(out, ns)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetNode().GetNodeId() < out[j].GetNode().GetNodeId() })
	return out, nil
}

func (s *adminService) ClusterStatus(ctx context.Context, _ *shalev1.ClusterStatusRequest) (*shalev1.ClusterStatusResponse, error) {
	infos := s.n.gather(ctx)
	nodes, err := s.nodeStatuses(ctx, infos)
	if err != nil {
		return nil, err
	}
	return &shalev1.ClusterStatusResponse{ClusterId: s.n.clusterID, Nodes: nodes, Shards: s.n.shardStatuses(ctx, infos)}, nil
}

func (s *adminService) ListNodes(ctx context.Context, _ *shalev1.ListNodesRequest) (*shalev1.ListNodesResponse, error) {
	nodes, err := s.nodeStatuses(ctx, s.n.gather(ctx))
	if err != nil {
		return nil, err
	}
	return &shalev1.ListNodesResponse{Nodes: nodes}, nil
}

func (s *adminService) ListShards(ctx context.Context, _ *shalev1.ListShardsRequest) (*shalev1.ListShardsResponse, error) {
	return &shalev1.ListShardsResponse{Shards: s.n.shardStatuses(ctx, s.n.gather(ctx))}, nil
}

func (s *adminService) ShardInfo(ctx context.Context, req *shalev1.ShardInfoRequest) (*shalev1.ShardInfoResponse, error) {
	if req.GetShardId() == 0 {
		return nil, invalidArg("shard_id is required")
	}
	for _, ss := range mergeShards(s.n.gather(ctx)) {
		if ss.GetDescriptor_().GetShardId() == req.GetShardId() {
			return &shalev1.ShardInfoResponse{Shard: ss}, nil
		}
	}
	return nil, withDetail(codes.NotFound, "no live node reports shard "+itoa(req.GetShardId()), &shalev1.ShardNotFound{ShardId: req.GetShardId()})
}

// systemLeaderAddr finds the node leading the system shard, for forwarding.
// systemLeaderAdmin returns the Admin client of the system shard's leader
// and the context to call it with, for a request this node cannot answer
// because it does not lead the system shard. A request already forwarded
// once is not forwarded again (Unavailable: the leadership moved).
func (n *Node) systemLeaderAdmin(ctx context.Context) (shalev1.AdminClient, context.Context, error) {
	if isForwarded(ctx) {
		return nil, nil, status.Error(codes.Unavailable, "system shard leadership moved; retry")
	}
	addr, err := n.systemLeaderAddr(ctx)
	if err != nil {
		return nil, nil, err
	}
	return shalev1.NewAdminClient(n.conn(addr)), forwarded(ctx), nil
}

func (n *Node) systemLeaderAddr(ctx context.Context) (string, error) {
	if r := n.store.Replica(SystemShardID); r != nil {
		if st := r.Status(); st.LeaderNodeID != 0 {
			return n.addressOf(st.LeaderNodeID), nil
		}
	}
	for _, ss := range mergeShards(n.gather(ctx)) {
		if ss.GetDescriptor_().GetSystem() && ss.GetLeaderNodeId() != 0 {
			return n.addressOf(ss.GetLeaderNodeId()), nil
		}
	}
	return "", status.Error(codes.Unavailable, "the system shard has no known leader")
}

func (s *adminService) AddNode(ctx context.Context, req *shalev1.AddNodeRequest) (*shalev1.AddNodeResponse, error) {
	n := s.n
	if req.GetAddress() == "" {
		return nil, invalidArg("address is required")
	}
	if r := n.store.Replica(SystemShardID); r != nil && r.IsLeader() {
		d, peers, err := n.addNode(ctx, req.GetAddress(), req.GetZone())
		if err != nil {
			return nil, n.replicationErr(ctx, SystemShardID, err)
		}
		return &shalev1.AddNodeResponse{Node: d, ClusterId: n.clusterID, Peers: peers}, nil
	}
	a, fctx, err := n.systemLeaderAdmin(ctx)
	if err != nil {
		return nil, err
	}
	return a.AddNode(fctx, req)
}

func (s *adminService) RemoveNode(ctx context.Context, req *shalev1.RemoveNodeRequest) (*shalev1.RemoveNodeResponse, error) {
	n := s.n
	if req.GetNodeId() == 0 {
		return nil, invalidArg("node_id is required")
	}
	if r := n.store.Replica(SystemShardID); r != nil && r.IsLeader() {
		if err := n.removeNode(ctx, req.GetNodeId()); err != nil {
			if _, ok := status.FromError(err); ok {
				return nil, err
			}
			return nil, status.Error(codes.NotFound, err.Error())
		}
		return &shalev1.RemoveNodeResponse{}, nil
	}
	a, fctx, err := n.systemLeaderAdmin(ctx)
	if err != nil {
		return nil, err
	}
	return a.RemoveNode(fctx, req)
}

func (s *adminService) TransferLeader(ctx context.Context, req *shalev1.TransferLeaderRequest) (*shalev1.TransferLeaderResponse, error) {
	n := s.n
	if req.GetShardId() == 0 || req.GetTargetNodeId() == 0 {
		return nil, invalidArg("shard_id and target_node_id are required")
	}
	if !req.GetScheduled() {
		// An operator's transfer goes through the placement leader, which
		// pins the shard's leadership once it has moved.
		if !n.isPlacementLeader() {
			a, fctx, err := n.systemLeaderAdmin(ctx)
			if err != nil {
				return nil, err
			}
			return a.TransferLeader(fctx, req)
		}
		sched := proto.Clone(req).(*shalev1.TransferLeaderRequest)
		sched.Scheduled = true
		resp, err := s.transferLeader(ctx, sched, true)
		if err == nil {
			n.pinLeader(ctx, req)
		}
		return resp, err
	}
	return s.transferLeader(ctx, req, false)
}

// transferLeader moves the leadership, here or through the shard's leader;
// mayForward allows that even for a request forwarded to this node.
func (s *adminService) transferLeader(ctx context.Context, req *shalev1.TransferLeaderRequest, mayForward bool) (*shalev1.TransferLeaderResponse, error) {
	n := s.n
	if r := n.store.Replica(req.GetShardId()); r != nil && r.IsLeader() {
		ctx, inner, cancel := n.requestCtx(ctx)
		defer cancel()
		if err := r.TransferLeader(inner, req.GetTargetNodeId()); err != nil {
			var nl *replication.NotLeaderError
			if errors.As(err, &nl) {
				return nil, n.notLeaderErr(req.GetShardId(), nl.LeaderNodeID)
			}
			if ctx.Err() == nil && inner.Err() != nil {
				return nil, status.Errorf(codes.Unavailable, "shard %d: leadership did not move to node %d in time", req.GetShardId(), req.GetTargetNodeId())
			}
			return nil, status.Errorf(codes.FailedPrecondition, "shard %d: %v", req.GetShardId(), err)
		}
		return &shalev1.TransferLeaderResponse{LeaderNodeId: req.GetTargetNodeId()}, nil
	}
	if isForwarded(ctx) && !mayForward {
		return nil, status.Errorf(codes.Unavailable, "shard %d: leadership moved; retry", req.GetShardId())
	}
	var leader uint64
	found := false
	for _, ss := range mergeShards(n.gather(ctx)) {
		if ss.GetDescriptor_().GetShardId() == req.GetShardId() {
			leader, found = ss.GetLeaderNodeId(), true
		}
	}
	if !found {
		return nil, withDetail(codes.NotFound, "no live node reports shard "+itoa(req.GetShardId()), &shalev1.ShardNotFound{ShardId: req.GetShardId()})
	}
	if leader == 0 {
		return nil, status.Errorf(codes.Unavailable, "shard %d has no known leader", req.GetShardId())
	}
	return shalev1.NewAdminClient(n.conn(n.addressOf(leader))).TransferLeader(forwarded(ctx), req)
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
