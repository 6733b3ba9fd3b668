package server

import (
	"bytes"
	"context"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// collectStrayReplicas removes this node's replicas that their shard no
// longer has, with their data (replica GC). By the shard directory:
//
//   - a frozen replica of a shard the directory no longer lists: a merge
//     retired the shard while this node was away;
//   - a replica of a shard the directory no longer lists whose range a
//     listed shard at a higher epoch overlaps: a merge absorbed the shard
//     before this replica saw its freeze;
//   - a replica that the directory's descriptor of its shard, at a higher
//     epoch than the replica's own, does not place on this node: it was
//     removed (moved away) while this node was down.
//
// A leader is never removed, nor a replica without a descriptor (one
// waiting for its first snapshot). Apart from frozen ones, a replica must
// qualify at two checks in a row at the same local epoch, so a directory
// that lags a split or a move for a moment removes nothing.
func (n *Node) collectStrayReplicas(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	dir, err := (&adminService{n: n}).ShardDirectory(dctx, &shalev1.ShardDirectoryRequest{})
	if err != nil {
		return
	}
	listed := map[uint64]*shalev1.ShardDescriptor{}
	for _, d := range dir.GetShards() {
		listed[d.GetShardId()] = d
	}
	suspects := map[uint64]uint64{}
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil || r.IsLeader() {
			continue
		}
		local := sm.Descriptor()
		if local == nil || local.GetSystem() {
			continue
		}
		why := strayReason(n.cfg.NodeID, local, listed)
		switch {
		case why == "":
			continue
		case local.GetMergingInto() != 0 && listed[local.GetShardId()] == nil:
			// Frozen and unlisted: the merge finished; nothing to wait for.
		case n.strays[r.ShardID()] != local.GetEpoch()+1:
			suspects[r.ShardID()] = local.GetEpoch() + 1
			continue
		}
		n.removeStray(ctx, r, why)
	}
	n.strays = suspects
}

// strayReason says why the directory (listed) shows that a replica on node
// self whose descriptor is local is no longer part of its shard, or "".
func strayReason(self uint64, local *shalev1.ShardDescriptor, listed map[uint64]*shalev1.ShardDescriptor) string {
	cur := listed[local.GetShardId()]
	if cur == nil {
		if local.GetMergingInto() != 0 {
			return "its shard was merged away"
		}
		for _, d := range listed {
			if !d.GetSystem() && d.GetEpoch() > local.GetEpoch() && overlaps(d, local) {
				return "a merge absorbed its shard"
			}
		}
		return ""
	}
	if cur.GetEpoch() <= local.GetEpoch() {
		return ""
	}
	for _, rd := range cur.GetReplicas() {
		if rd.GetNodeId() == self {
			return ""
		}
	}
	return "it was removed from its shard"
}

// overlaps reports whether the key ranges of two shards overlap: [a, b)
// and [c, e) do when a < e and c < b (an empty end is no bound).
func overlaps(a, b *shalev1.ShardDescriptor) bool {
	return (len(a.GetEndKey()) == 0 || bytes.Compare(b.GetStartKey(), a.GetEndKey()) < 0) &&
		(len(b.GetEndKey()) == 0 || bytes.Compare(a.GetStartKey(), b.GetEndKey()) < 0)
}

// removeStray deletes a stray replica and its data.
func (n *Node) removeStray(ctx context.Context, r *replication.Replica, why string) {
	n.log.Info("removing a stray replica", "shard", r.ShardID(), "reason", why)
	if err := r.Destroy(ctx); err != nil {
		n.log.Warn("remove a stray replica", "shard", r.ShardID(), "err", err)
		return
	}
	n.strayRemoved.Inc()
}
