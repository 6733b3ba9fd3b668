package server

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// The shard directory is every shard's descriptor, recorded in the system
// shard. Each node reports, once a second, the descriptors of the shards it
// leads whose epoch it has not reported yet (after a split, a membership
// change, or when it becomes leader); the system shard's leader records
// them with put_shard, which keeps the newest epoch of each shard. With its
// descriptor, a shard's leader reports as removed the shards its merges
// absorbed: so a merge whose merging node stopped before it removed the
// absorbed shard from the directory is cleaned up by the next leader's
// report, and never leaves a listed shard without replicas.

// reportDescriptors reports the changed descriptors of the shards this node
// leads to the system shard's leader.
func (n *Node) reportDescriptors(ctx context.Context) {
	var descs []*shalev1.ShardDescriptor
	var absorbed []uint64
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil || !r.IsLeader() {
			continue
		}
		d := sm.Descriptor()
		if d == nil || d.GetRetired() {
			continue
		}
		n.mu.Lock()
		done := n.reported[d.GetShardId()] >= d.GetEpoch()
		n.mu.Unlock()
		if !done {
			descs = append(descs, d)
			absorbed = append(absorbed, sm.AbsorbedShards()...)
		}
	}
	n.mu.Lock()
	removed := make([]uint64, 0, len(n.removedShards))
	for id := range n.removedShards {
		removed = append(removed, id)
	}
	n.mu.Unlock()
	if len(descs) == 0 && len(removed) == 0 {
		return
	}
	removed = append(removed, absorbed...)
	if _, err := (&adminService{n: n}).ReportShards(ctx, &shalev1.ReportShardsRequest{Descriptors: descs, RemovedShardIds: removed}); err != nil {
		n.log.Debug("report shard descriptors to the directory", "shards", len(descs), "removed", len(removed), "err", err)
		return
	}
	n.mu.Lock()
	for _, d := range descs {
		n.reported[d.GetShardId()] = max(n.reported[d.GetShardId()], d.GetEpoch())
	}
	for _, id := range removed {
		delete(n.removedShards, id)
		delete(n.reported, id)
	}
	n.mu.Unlock()
}

// ReportShards implements the Admin RPC.
func (s *adminService) ReportShards(ctx context.Context, req *shalev1.ReportShardsRequest) (*shalev1.ReportShardsResponse, error) {
	n := s.n
	for _, d := range req.GetDescriptors() {
		if d.GetShardId() == 0 || d.GetEpoch() == 0 {
			return nil, invalidArg("a reported descriptor needs a shard_id and an epoch")
		}
	}
	for _, id := range req.GetRemovedShardIds() {
		if id == 0 || id == SystemShardID {
			return nil, invalidArg("removed_shard_ids must name user shards (got %d)", id)
		}
	}
	if r := n.store.Replica(SystemShardID); r == nil || !r.IsLeader() {
		a, fctx, err := n.systemLeaderAdmin(ctx)
		if err != nil {
			return nil, err
		}
		return a.ReportShards(fctx, req)
	}
	// Records the directory already holds are not written again (a new
	// leader, or a restarted node, reports every shard it leads).
	have := map[uint64]*shalev1.ShardDescriptor{}
	if stored, err := n.directory(); err == nil {
		for _, d := range stored {
			have[d.GetShardId()] = d
		}
	}
	for _, d := range req.GetDescriptors() {
		if proto.Equal(have[d.GetShardId()], d) || d.GetRetired() || d.GetMergingInto() != 0 {
			// A frozen or retired shard is on its way out: its merge
			// removes it; recording it late would bring it back.
			continue
		}
		id := requestIDFor("put-shard", itoa(d.GetShardId()), itoa(d.GetEpoch()))
		res, err := n.proposeSystem(ctx, id, &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutShard{PutShard: d}})
		if err != nil && codes.Code(res.GetErrorCode()) != codes.FailedPrecondition {
			// FailedPrecondition: the directory already has a newer epoch.
			return nil, err
		}
	}
	for _, id := range req.GetRemovedShardIds() {
		if _, ok := have[id]; !ok {
			continue
		}
		// A removal is idempotent; the time in the request ID keeps one
		// that removes an entry a stale report brought back from being
		// taken for a repeat of the first.
		rid := requestIDFor("remove-shard", itoa(id), fmt.Sprint(time.Now().UnixNano()))
		if _, err := n.proposeSystem(ctx, rid, &shalev1.SystemCommand{Op: &shalev1.SystemCommand_RemoveShardId{RemoveShardId: id}}); err != nil {
			return nil, err
		}
	}
	return &shalev1.ReportShardsResponse{}, nil
}

// ShardDirectory implements the Admin RPC: the system shard's leader
// answers from its applied state.
func (s *adminService) ShardDirectory(ctx context.Context, _ *shalev1.ShardDirectoryRequest) (*shalev1.ShardDirectoryResponse, error) {
	n := s.n
	r := n.store.Replica(SystemShardID)
	if r == nil || !r.IsLeader() {
		a, fctx, err := n.systemLeaderAdmin(ctx)
		if err != nil {
			return nil, err
		}
		return a.ShardDirectory(fctx, &shalev1.ShardDirectoryRequest{})
	}
	ctx, inner, cancel := n.requestCtx(ctx)
	defer cancel()
	if err := r.ReadIndex(inner); err != nil {
		return nil, n.replicationErr(ctx, SystemShardID, err)
	}
	descs, err := n.Shard(SystemShardID).Shards()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the shard directory: %v", err)
	}
	sort.Slice(descs, func(i, j int) bool {
		a, b := descs[i], descs[j]
		if a.GetSystem() != b.GetSystem() {
			return a.GetSystem()
		}
		return bytes.Compare(a.GetStartKey(), b.GetStartKey()) < 0
	})
	return &shalev1.ShardDirectoryResponse{Shards: descs}, nil
}
