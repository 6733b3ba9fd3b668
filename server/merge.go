package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server/shard"
)

// mergeChunkBytes caps the records one merge_absorb command carries.
const mergeChunkBytes = 512 << 10

// MergeShards implements the Admin RPC: the merge runs on the leader of the
// shard holding key (forwarded there).
func (s *adminService) MergeShards(ctx context.Context, req *shalev1.MergeShardsRequest) (*shalev1.MergeShardsResponse, error) {
	n := s.n
	key := req.GetKey()
	if len(key) == 0 {
		return nil, invalidArg("key is required: any key of the left shard of the merge")
	}
	// Local first: this node may lead the shard.
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil {
			continue
		}
		d := sm.Descriptor()
		if d == nil || d.GetSystem() || d.GetMergingInto() != 0 || !contains(d, key) || !r.IsLeader() {
			continue
		}
		if id := req.GetShardId(); id != 0 && id != d.GetShardId() {
			return nil, withDetail(codes.FailedPrecondition, fmt.Sprintf("key %q is in shard %d, not shard %d", key, d.GetShardId(), id), &shalev1.EpochMismatch{Current: d})
		}
		return n.mergeShards(ctx, d.GetShardId())
	}
	if isForwarded(ctx) {
		return nil, status.Errorf(codes.Unavailable, "the shard holding %q moved its leadership; retry", key)
	}
	var target *shalev1.ShardDescriptor
	var leader uint64
	for _, ss := range mergeShards(n.gather(ctx)) {
		d := ss.GetDescriptor_()
		if !d.GetSystem() && d.GetMergingInto() == 0 && contains(d, key) {
			target, leader = d, ss.GetLeaderNodeId()
		}
	}
	switch {
	case target == nil:
		return nil, status.Errorf(codes.Unavailable, "no live node reports the shard holding %q", key)
	case req.GetShardId() != 0 && req.GetShardId() != target.GetShardId():
		return nil, withDetail(codes.FailedPrecondition, fmt.Sprintf("key %q is in shard %d, not shard %d", key, target.GetShardId(), req.GetShardId()), &shalev1.EpochMismatch{Current: target})
	case leader == 0:
		return nil, status.Errorf(codes.Unavailable, "shard %d has no known leader", target.GetShardId())
	}
	return shalev1.NewAdminClient(n.conn(n.addressOf(leader))).MergeShards(forwarded(ctx), req)
}

// mergeShards merges the shard leftID, which this node leads, with its
// right neighbour (or finishes a merge into it that was interrupted).
func (n *Node) mergeShards(ctx context.Context, leftID uint64) (*shalev1.MergeShardsResponse, error) {
	n.mergeMu.Lock()
	defer n.mergeMu.Unlock()
	return n.mergeShardsLocked(ctx, leftID)
}

// mergeShardsLocked is mergeShards with n.mergeMu held.
func (n *Node) mergeShardsLocked(ctx context.Context, leftID uint64) (*shalev1.MergeShardsResponse, error) {
	lr, lsm := n.store.Replica(leftID), n.Shard(leftID)
	if lr == nil || lsm == nil || lsm.Descriptor() == nil {
		return nil, n.shardNotFoundErr(leftID)
	}
	left := lsm.Descriptor()
	// The right neighbour: a shard already frozen into this one, else the
	// one starting where this one ends. This node must host it.
	var rr *replication.Replica
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil || sm.Descriptor() == nil {
			continue
		}
		d := sm.Descriptor()
		if d.GetMergingInto() == leftID && !d.GetRetired() {
			rr = r
			break
		}
		if rr == nil && d.GetMergingInto() == 0 && !d.GetSystem() && len(left.GetEndKey()) > 0 && bytes.Equal(d.GetStartKey(), left.GetEndKey()) {
			rr = r
		}
	}
	if rr == nil {
		if len(left.GetEndKey()) == 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "shard %d is the last shard; it has no right neighbour to merge with", leftID)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "node %d has no replica of the shard starting at %q (shard %d's right neighbour); a merge needs both shards' replicas on the same nodes",
			n.cfg.NodeID, left.GetEndKey(), leftID)
	}
	rightID := rr.ShardID()
	rsm := n.Shard(rightID)
	right := rsm.Descriptor()
	if right.GetMergingInto() == 0 {
		if err := settled(left, right); err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
	}
	ctx, inner, cancel := n.requestCtx(ctx)
	defer cancel()
	// Lead the right shard here too, so its freeze applies here first.
	// A balancer may move a leadership away meanwhile: every step takes it
	// back and retries while the proposal was refused unproposed.
	if right.GetMergingInto() == 0 {
		if _, err := n.proposeLed(ctx, inner, rr, right.GetEpoch(), freezeCommand(leftID)); err != nil {
			return nil, fmt.Errorf("freeze shard %d: %w", rightID, err)
		}
		right = rsm.Descriptor()
	}
	merged := lsm.Descriptor()
	if !bytes.Equal(merged.GetEndKey(), right.GetEndKey()) {
		// Copy right's records through left's log, then take its range.
		// Every step names this copy's attempt: should another driver
		// (another node that took the left's leadership meanwhile) begin
		// its own copy, this one's later steps are refused (Aborted), and
		// that driver finishes the merge.
		attempt := randomID()
		absorb := func(m *shalev1.MergeAbsorb) error {
			m.Attempt = attempt
			_, err := n.proposeLed(ctx, inner, lr, 0, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeAbsorb{MergeAbsorb: m}})
			if hook := n.mergeStepHook.Load(); hook != nil {
				(*hook)(absorbStep(m), err)
			}
			return err
		}
		if err := absorb(&shalev1.MergeAbsorb{Begin: true, Right: right}); err != nil {
			return nil, fmt.Errorf("merge shard %d into %d: begin: %w", rightID, leftID, err)
		}
		chunk := &shalev1.MergeAbsorb{}
		size := 0
		// added counts n more bytes in chunk and proposes it once full.
		added := func(n int) error {
			if size += n; size < mergeChunkBytes {
				return nil
			}
			if err := absorb(chunk); err != nil {
				return err
			}
			chunk, size = &shalev1.MergeAbsorb{}, 0
			return nil
		}
		err := rsm.ScanRecords(func(k, v []byte) error {
			chunk.Keys = append(chunk.Keys, bytes.Clone(k))
			chunk.Values = append(chunk.Values, bytes.Clone(v))
			return added(len(k) + len(v))
		})
		if err == nil {
			// The right's deduplication table too: a write it applied,
			// retried after the merge, must find its result in the left.
			err = rsm.ScanDedup(func(id, result []byte) error {
				chunk.DedupIds = append(chunk.DedupIds, bytes.Clone(id))
				chunk.DedupResults = append(chunk.DedupResults, bytes.Clone(result))
				return added(len(id) + len(result))
			})
		}
		if err == nil {
			chunk.Commit, chunk.RightRevision = true, rsm.Revision()
			err = absorb(chunk)
		}
		if status.Code(err) == codes.Aborted {
			// The other driver retires the right shard and reports to
			// the directory (or, should it fail, the left's leader's
			// maintenance finishes that): this one only waits.
			n.log.Info("merge: another driver restarted the copy; waiting for it to finish", "shard", leftID, "absorbing", rightID, "err", err)
			if err := awaitMerged(inner, lsm, right); err != nil {
				return nil, fmt.Errorf("merge shard %d into %d: %w", rightID, leftID, err)
			}
			return &shalev1.MergeShardsResponse{Merged: lsm.Descriptor(), RemovedShardId: rightID}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("merge shard %d into %d: copy: %w", rightID, leftID, err)
		}
		merged = lsm.Descriptor()
	}
	if _, err := n.proposeLed(ctx, inner, rr, 0, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeRetire{MergeRetire: true}}); err != nil && !errors.Is(err, replication.ErrReplicaRemoved) {
		return nil, fmt.Errorf("retire shard %d: %w", rightID, err)
	}
	n.log.Info("merged shards", "shard", leftID, "absorbed", rightID, "range", fmt.Sprintf("[%q, %q)", merged.GetStartKey(), merged.GetEndKey()))
	// The directory: the right shard goes (retried by the periodic reports
	// until it has), and the merged one's new descriptor is reported.
	n.mu.Lock()
	n.removedShards[rightID] = true
	n.mu.Unlock()
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	n.reportDescriptors(rctx)
	rcancel()
	return &shalev1.MergeShardsResponse{Merged: proto.Clone(merged).(*shalev1.ShardDescriptor), RemovedShardId: rightID}, nil
}

// shouldFinishMerge reports whether this node, which hosts the frozen
// shard right and a replica l of the left shard it is merging into, but
// does not lead l, must take l's leadership to finish the merge: the left's
// leader hosts no replica of right (a replica of the left moved, and its
// leadership with it, after the freeze), so it cannot copy right's records,
// and of the nodes hosting both (a voter of the left) this one has the
// lowest ID.
func (n *Node) shouldFinishMerge(l *replication.Replica, right *shalev1.ShardDescriptor) bool {
	leader := l.Status().LeaderNodeID
	lsm := n.Shard(l.ShardID())
	if leader == 0 || lsm == nil || lsm.Descriptor() == nil {
		return false // no leader to judge yet
	}
	onLeft := map[uint64]bool{} // the left's voters: a learner cannot lead
	for _, rd := range lsm.Descriptor().GetReplicas() {
		if rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED {
			onLeft[rd.GetNodeId()] = true
		}
	}
	lowest := uint64(0)
	for _, rd := range right.GetReplicas() {
		id := rd.GetNodeId()
		if id == leader {
			return false // the leader finishes it
		}
		if onLeft[id] && (lowest == 0 || id < lowest) {
			lowest = id
		}
	}
	return lowest == n.cfg.NodeID
}

// freezeCommand is a merge's first step on the right shard: freeze it for
// a merge into shard leftID.
func freezeCommand(leftID uint64) *shalev1.RaftCommand {
	return &shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeFreeze{MergeFreeze: &shalev1.MergeFreeze{IntoShardId: leftID}}}
}

// absorbStep names a MergeAbsorb step's kind: begin, records or commit.
func absorbStep(m *shalev1.MergeAbsorb) string {
	switch {
	case m.GetBegin():
		return "begin"
	case m.GetCommit():
		return "commit"
	}
	return "records"
}

// awaitMerged returns once the left shard (lsm) has absorbed right, its
// range reaching right's end, or Unavailable when ctx ends first.
func awaitMerged(ctx context.Context, lsm *shard.Shard, right *shalev1.ShardDescriptor) error {
	for {
		if bytes.Equal(lsm.Descriptor().GetEndKey(), right.GetEndKey()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return status.Errorf(codes.Unavailable, "shard %d's merge of shard %d, driven elsewhere, did not finish in time", lsm.Descriptor().GetShardId(), right.GetShardId())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// shardLoadReport returns the sustained load of r's shard as its leader
// measured it: this node's own history when it leads r, else the leader's
// answer to NodeInfo. known is false when no leader answered for it (a
// leader that predates the report answers no ticks, which no merge passes).
func (n *Node) shardLoadReport(ctx context.Context, r *replication.Replica) (rep loadReport, known bool) {
	if r.IsLeader() {
		return n.loadReport(r), true
	}
	leader := r.Status().LeaderNodeID
	addr := n.addressOf(leader)
	if leader == 0 || addr == "" {
		return loadReport{}, false
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := shalev1.NewAdminClient(n.conn(addr)).NodeInfo(cctx, &shalev1.NodeInfoRequest{})
	if err != nil || info.GetNode().GetNodeId() != leader {
		return loadReport{}, false
	}
	for _, ss := range info.GetShards() {
		if ss.GetDescriptor_().GetShardId() == r.ShardID() && ss.GetLeaderNodeId() == leader {
			return loadReport{ticks: int(ss.GetLedLoadTicks()), peak: ss.GetPeakRequestsPerSecond()}, true
		}
	}
	return loadReport{}, false
}

// rangeChangedWithin reports whether a split or merge changed d's range
// less than window before now (by the date replicated in d).
func rangeChangedWithin(d *shalev1.ShardDescriptor, now time.Time, window time.Duration) bool {
	t := d.GetRangeChangedUnixNanos()
	return t != 0 && now.Sub(time.Unix(0, t)) < window
}

// settled checks that neither shard is changing its membership (a merge
// needs no more: the right shard's records reach every replica of the left
// through the left's Raft log, whatever nodes they are on).
func settled(shards ...*shalev1.ShardDescriptor) error {
	for _, d := range shards {
		for _, rd := range d.GetReplicas() {
			if rd.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED {
				return fmt.Errorf("shard %d is changing its membership; merge it afterwards", d.GetShardId())
			}
		}
	}
	return nil
}

// proposeLed proposes cmd like proposeHere, first moving r's leadership to
// this node if it is elsewhere. A proposal refused because this node does
// not lead r was never proposed, so it is retried, with the leadership taken
// back, until inner ends.
func (n *Node) proposeLed(ctx, inner context.Context, r *replication.Replica, epoch uint64, cmd *shalev1.RaftCommand) (*shalev1.CommandResult, error) {
	// Every attempt but a proposed one is refused unproposed, so each may
	// say it is the ID's first.
	cmd.RequestId, cmd.FirstAttempt = randomID(), true
	for logged := false; ; logged = true {
		if err := n.leadHere(inner, r); err != nil {
			return nil, err
		}
		res, err := n.proposeHere(ctx, inner, r, epoch, cmd)
		if err == nil || !isNotLeader(err) || inner.Err() != nil {
			return res, err
		}
		if !logged {
			n.log.Info("merge: the leadership moved during a step; taking it back", "shard", r.ShardID(), "error", err)
		}
		// A leader transferring its leadership drops proposals until the
		// transfer ends: wait a moment rather than spin.
		select {
		case <-inner.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// leadHere returns once this node leads r, asking its leader to transfer
// the leadership here as often as needed, or fails (Unavailable, with the
// last refusal) when inner ends first. It asks again after any refusal:
// "not the leader" or "no known leader" while the leadership moves, and a
// transfer this node did not complete within two election timeouts (a
// loaded machine: CI's run of 4613f44 failed a merge on it) is asked again.
func (n *Node) leadHere(inner context.Context, r *replication.Replica) error {
	tr := &shalev1.TransferLeaderRequest{ShardId: r.ShardID(), TargetNodeId: n.cfg.NodeID, Scheduled: true}
	var last error
	for !r.IsLeader() {
		if _, err := (&adminService{n: n}).transferLeader(inner, tr, true); err != nil {
			last = err
		}
		for i := 0; i < 10 && !r.IsLeader(); i++ {
			select {
			case <-inner.Done():
				return status.Errorf(codes.Unavailable, "shard %d: could not take its leadership for the merge (last: %v)", r.ShardID(), last)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// proposeHere proposes one command (a merge step, an expiry) on a local
// leader replica and returns its result once applied here; a result with
// an error code is returned as that status.
func (n *Node) proposeHere(ctx, inner context.Context, r *replication.Replica, epoch uint64, cmd *shalev1.RaftCommand) (*shalev1.CommandResult, error) {
	cmd.Epoch = epoch
	return n.proposeCmd(ctx, inner, r, cmd)
}

// mergeSmallShards merges, at most once per call, a shard this node leads
// with its right neighbour (hosted here too) when both are small and quiet
// and the boundary between them was made by an automatic split; it also
// finishes merges into shards it leads that were interrupted.
func (n *Node) mergeSmallShards(ctx context.Context) {
	if !n.mergeMu.TryLock() {
		return // a merge is running here; the next round looks again
	}
	defer n.mergeMu.Unlock()
	now := time.Now()
	type local struct {
		r *replication.Replica
		d *shalev1.ShardDescriptor
	}
	byStart := map[string]local{}
	var led []local
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil || sm.Descriptor() == nil {
			continue
		}
		d := sm.Descriptor()
		if d.GetSystem() || d.GetRetired() {
			continue
		}
		if d.GetMergingInto() != 0 {
			// A frozen shard: finish the merge if this node leads the
			// left, or should, the left's leader hosting no replica of
			// the frozen shard to copy from.
			if l := n.store.Replica(d.GetMergingInto()); l != nil && (l.IsLeader() || n.shouldFinishMerge(l, d)) {
				if _, err := n.mergeShardsLocked(ctx, d.GetMergingInto()); err != nil {
					n.log.Warn("finish an interrupted merge", "shard", d.GetMergingInto(), "absorbing", d.GetShardId(), "err", err)
				}
				return
			}
			continue
		}
		byStart[string(d.GetStartKey())] = local{r, d}
		if r.IsLeader() {
			led = append(led, local{r, d})
		}
	}
	if n.cfg.MergeSizeBytes < 0 {
		return
	}
	for _, l := range led {
		if len(l.d.GetEndKey()) == 0 {
			continue
		}
		rn, ok := byStart[string(l.d.GetEndKey())]
		if !ok || !rn.d.GetAutoSplit() || settled(l.d, rn.d) != nil {
			continue
		}
		ls, rs := n.Shard(l.d.GetShardId()), n.Shard(rn.d.GetShardId())
		if ls.SizeBytes()+rs.SizeBytes() >= uint64(n.cfg.MergeSizeBytes) {
			continue
		}
		// The boundary moved recently, by the shards' own replicated
		// record (whichever node split them: this node's memory of its
		// own splits knows nothing of the others').
		if rangeChangedWithin(l.d, now, n.cfg.MergeDelay) || rangeChangedWithin(rn.d, now, n.cfg.MergeDelay) {
			continue
		}
		if n.cfg.SplitQPS > 0 {
			// Both shards' sustained load as their leaders measured it
			// over the last mergeQuietTicks: this node leads the left,
			// and asks the right's leader when it does not lead that
			// too (a shard led elsewhere is not quiet here for want of
			// requests, nor is one whose leader has not led it long).
			rrep, known := n.shardLoadReport(ctx, rn.r)
			if !known || !quietForMerge(n.loadReport(l.r), rrep, n.cfg.SplitQPS) {
				continue
			}
		}
		if _, err := n.mergeShardsLocked(ctx, l.d.GetShardId()); err != nil {
			n.log.Warn("automatic merge", "shard", l.d.GetShardId(), "right", rn.d.GetShardId(), "err", err)
		}
		return
	}
}
