package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// shardHolding returns, of the shards the nodes report, the one holding key
// and its leader, and the highest shard ID reported. A replica left behind
// by a merge (not yet removed) still claims its old range: of the shards
// claiming the key, the one with the highest epoch holds it (a merge's
// epoch is above both shards'); frozen and retired ones hold nothing.
func shardHolding(statuses []*shalev1.ShardStatus, key []byte) (target *shalev1.ShardDescriptor, leader, maxID uint64) {
	for _, ss := range statuses {
		d := ss.GetDescriptor_()
		maxID = max(maxID, d.GetShardId())
		if !d.GetSystem() && !d.GetRetired() && d.GetMergingInto() == 0 && contains(d, key) &&
			(target == nil || d.GetEpoch() > target.GetEpoch()) {
			target, leader = d, ss.GetLeaderNodeId()
		}
	}
	return target, leader, maxID
}

// SplitShard implements the Admin RPC. The new shard's ID is allocated by
// the system shard (on its leader), then the split is proposed on the
// shard's leader; the request is forwarded to each as needed.
func (s *adminService) SplitShard(ctx context.Context, req *shalev1.SplitShardRequest) (*shalev1.SplitShardResponse, error) {
	n := s.n
	key := req.GetSplitKey()
	if err := n.checkKey(key); err != nil {
		return nil, err
	}
	target, leader, maxID := shardHolding(mergeShards(n.gather(ctx)), key)
	if target == nil {
		return nil, status.Errorf(codes.Unavailable, "no live node reports the shard holding %q", key)
	}
	if id := req.GetShardId(); id != 0 && id != target.GetShardId() {
		return nil, withDetail(codes.FailedPrecondition, fmt.Sprintf("key %q is in shard %d, not shard %d", key, target.GetShardId(), id),
			&shalev1.EpochMismatch{Current: target})
	}
	if string(key) == string(target.GetStartKey()) {
		return nil, invalidArg("%q is already where shard %d starts", key, target.GetShardId())
	}
	if id := req.GetRightLeaderNodeId(); id != 0 && !hasVoterOn(target, id) {
		return nil, invalidArg("right_leader_node_id %d: shard %d has no voting replica on that node", id, target.GetShardId())
	}

	allocatedHere := false
	if req.GetRightShardId() == 0 {
		sys := n.store.Replica(SystemShardID)
		if sys == nil || !sys.IsLeader() {
			a, fctx, err := n.systemLeaderAdmin(ctx)
			if err != nil {
				return nil, err
			}
			return a.SplitShard(fctx, req)
		}
		res, err := n.proposeSystem(ctx, randomID(), &shalev1.SystemCommand{Op: &shalev1.SystemCommand_AllocateShardId{AllocateShardId: maxID + 1}})
		if err != nil {
			return nil, err
		}
		req = proto.Clone(req).(*shalev1.SplitShardRequest)
		req.ShardId, req.RightShardId = target.GetShardId(), res.GetAllocatedId()
		allocatedHere = true
	}

	if r := n.store.Replica(target.GetShardId()); r != nil && r.IsLeader() {
		return n.proposeSplit(ctx, target, req)
	}
	if isForwarded(ctx) && !allocatedHere {
		return nil, status.Errorf(codes.Unavailable, "shard %d: leadership moved; retry", target.GetShardId())
	}
	if leader == 0 {
		return nil, status.Errorf(codes.Unavailable, "shard %d has no known leader", target.GetShardId())
	}
	return shalev1.NewAdminClient(n.conn(n.addressOf(leader))).SplitShard(forwarded(ctx), req)
}

// proposeSplit proposes the split on the local leader of the shard and
// returns both descriptors once it applied here.
func (n *Node) proposeSplit(ctx context.Context, target *shalev1.ShardDescriptor, req *shalev1.SplitShardRequest) (*shalev1.SplitShardResponse, error) {
	id := target.GetShardId()
	r := n.store.Replica(id)
	if r == nil {
		return nil, n.shardNotFoundErr(id)
	}
	cmd := &shalev1.RaftCommand{
		RequestId:    randomID(),
		FirstAttempt: true,
		Epoch:        target.GetEpoch(),
		Command: &shalev1.RaftCommand_Split{Split: &shalev1.SplitCommand{
			SplitKey: req.GetSplitKey(), RightShardId: req.GetRightShardId(), Automatic: req.GetAutomatic(), RightLeaderNodeId: req.GetRightLeaderNodeId(),
		}},
	}
	// The split's apply flushes the engine's memtable before its
	// checkpoint, and the shard's requests wait behind that apply.
	// Flushing here first leaves the leader's apply only what arrives
	// meanwhile.
	if sm := n.Shard(id); sm != nil {
		t := time.Now()
		if err := sm.FlushMemTables(); err != nil {
			return nil, status.Errorf(codes.Unavailable, "shard %d: flush before the split: %v", id, err)
		}
		n.log.Debug("flushed before a split", "shard", id, "took", time.Since(t))
	}
	ctx, inner, cancel := n.requestCtx(ctx)
	defer cancel()
	cr, err := n.proposeCmd(ctx, inner, r, cmd)
	if err != nil {
		if ctx.Err() == nil && inner.Err() != nil {
			return nil, status.Errorf(codes.Unavailable, "shard %d: the split did not commit in time", id)
		}
		return nil, err
	}
	n.log.Info("split shard", "shard", id, "split_key", fmt.Sprintf("%q", req.GetSplitKey()), "right_shard", req.GetRightShardId())
	return &shalev1.SplitShardResponse{Left: cr.GetDescriptor_(), Right: cr.GetRightDescriptor()}, nil
}

// hasVoterOn reports whether desc has a voting replica on node.
func hasVoterOn(desc *shalev1.ShardDescriptor, node uint64) bool {
	for _, rd := range desc.GetReplicas() {
		if rd.GetNodeId() == node && rd.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_LEARNER {
			return true
		}
	}
	return false
}

// randomID returns a fresh 16-byte request ID.
func randomID() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}

// splitLargeShards splits, at most one per call, a shard this node leads
// whose engine holds more than SplitSizeBytes of its own range
// (shard.Shard.OwnSizeBytes, which leaves out a range a split gave away
// and the engine keeps for its history window). A shard split in the last
// ten seconds is left alone.
func (n *Node) splitLargeShards(ctx context.Context) {
	if n.cfg.SplitSizeBytes < 0 {
		return
	}
	now := time.Now()
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil || !r.IsLeader() {
			continue
		}
		desc := sm.Descriptor()
		// SizeBytes bounds OwnSizeBytes and is cheaper: most shards stop here.
		if desc == nil || desc.GetSystem() || uint64(n.cfg.SplitSizeBytes) >= sm.SizeBytes() {
			continue
		}
		if n.splitWithin(desc.GetShardId(), now, splitCooldown) {
			continue
		}
		size := sm.OwnSizeBytes()
		if uint64(n.cfg.SplitSizeBytes) >= size {
			continue
		}
		key, err := sm.SplitKey()
		if err != nil || key == nil {
			continue
		}
		n.noteSplit(desc.GetShardId(), now)
		resp, err := (&adminService{n: n}).SplitShard(ctx, &shalev1.SplitShardRequest{SplitKey: key, ShardId: desc.GetShardId(), Automatic: true})
		if err != nil {
			n.log.Warn("automatic split failed", "shard", desc.GetShardId(), "size", size, "split_key", fmt.Sprintf("%q", key), "err", err)
			return
		}
		n.log.Info("split a shard over the size threshold", "shard", desc.GetShardId(), "size", size,
			"threshold", n.cfg.SplitSizeBytes, "right_shard", resp.GetRight().GetShardId())
		return
	}
}
