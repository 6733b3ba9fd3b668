package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server/shard"
)

// withDetail returns a status error carrying detail.
func withDetail(code codes.Code, msg string, detail proto.Message) error {
	st := status.New(code, msg)
	if detail != nil {
		if d, err := st.WithDetails(protoadapt.MessageV1Of(detail)); err == nil {
			st = d
		}
	}
	return st.Err()
}

func invalidArg(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// firstLeader returns r's status once it knows its leader, when r is a
// split's new shard whose first election has not ended (at most an
// election timeout, within ctx; see replication.Replica.WaitFirstLeader),
// else at once.
func (n *Node) firstLeader(ctx context.Context, r *replication.Replica) replication.Status {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.TickInterval*time.Duration(n.cfg.ElectionTicks))
	defer cancel()
	return r.WaitFirstLeader(ctx)
}

// notLeaderErr answers a request that needs the leader.
func (n *Node) notLeaderErr(shardID, leaderNode uint64) error {
	d := &shalev1.NotLeader{ShardId: shardID, LeaderNodeId: leaderNode, LeaderAddress: n.addressOf(leaderNode)}
	msg := fmt.Sprintf("shard %d: node %d is not the leader", shardID, n.cfg.NodeID)
	if leaderNode != 0 {
		msg += fmt.Sprintf(" (leader: node %d at %s)", leaderNode, d.LeaderAddress)
	}
	return withDetail(codes.FailedPrecondition, msg, d)
}

// staleEpochErr answers a request routed on a stale epoch of desc's
// shard (see epochMismatchErr), naming the shard that starts where desc
// ends when this node hosts it (waiting, within ctx, for a split's new
// shard to elect its first leader: see nextShard).
func (n *Node) staleEpochErr(ctx context.Context, requested uint64, desc *shalev1.ShardDescriptor) error {
	return epochMismatchErr(requested, desc, n.nextShard(ctx, desc))
}

// epochMismatchErr is the error of a request routed on a stale epoch of
// desc's shard: its current descriptor and next, the shard that starts
// where desc ends (after a split, the new shard; nil when unknown), so that
// the client routes on without fetching the routing table.
func epochMismatchErr(requested uint64, desc *shalev1.ShardDescriptor, next *shalev1.RoutedShard) error {
	return withDetail(codes.FailedPrecondition,
		fmt.Sprintf("shard %d: epoch %d is stale (current %d)", desc.GetShardId(), requested, desc.GetEpoch()),
		&shalev1.EpochMismatch{RequestedEpoch: requested, Current: desc, Next: next})
}

// nextShard returns the user shard this node hosts that starts where desc
// ends, with its leader as known here, or nil. When that shard is a split's
// new shard still electing its first leader, it waits for the leader (see
// firstLeader), so that the client sends its request on to the leader
// instead of guessing a replica and backing off.
func (n *Node) nextShard(ctx context.Context, desc *shalev1.ShardDescriptor) *shalev1.RoutedShard {
	end := desc.GetEndKey()
	if len(end) == 0 {
		return nil
	}
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil {
			continue
		}
		if nd := sm.Descriptor(); nd != nil && !nd.GetSystem() && nd.GetMergingInto() == 0 && string(nd.GetStartKey()) == string(end) {
			leader := r.Status().LeaderNodeID
			if leader == 0 {
				leader = n.firstLeader(ctx, r).LeaderNodeID
			}
			return &shalev1.RoutedShard{Descriptor_: nd, LeaderNodeId: leader}
		}
	}
	return nil
}

func keyOutsideErr(key []byte, desc *shalev1.ShardDescriptor) error {
	return withDetail(codes.OutOfRange,
		fmt.Sprintf("key %q is outside shard %d [%q, %q)", key, desc.GetShardId(), desc.GetStartKey(), desc.GetEndKey()),
		&shalev1.KeyOutsideShard{Key: key, Shard: desc})
}

func (n *Node) shardNotFoundErr(shardID uint64) error {
	return withDetail(codes.NotFound, fmt.Sprintf("shard %d has no replica on node %d", shardID, n.cfg.NodeID),
		&shalev1.ShardNotFound{ShardId: shardID, NodeId: n.cfg.NodeID})
}

func crossShardErr(split []byte, shardID uint64) error {
	return withDetail(codes.InvalidArgument,
		fmt.Sprintf("request spans shards: shard %d ends at %q", shardID, split),
		&shalev1.CrossShardRequest{SplitKey: split, ShardId: shardID})
}

// replicationErr maps errors of the replication layer to statuses.
func (n *Node) replicationErr(ctx context.Context, shardID uint64, err error) error {
	var nl *replication.NotLeaderError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nl):
		return n.notLeaderErr(shardID, nl.LeaderNodeID)
	case errors.Is(err, replication.ErrOutcomeUnknown):
		return status.Errorf(codes.Unavailable, "shard %d: %v; retry with the same request id", shardID, err)
	case errors.Is(err, replication.ErrBusy):
		return status.Errorf(codes.ResourceExhausted, "shard %d: %v", shardID, err)
	case errors.Is(err, replication.ErrProposalTooLarge):
		return status.Errorf(codes.InvalidArgument, "shard %d: %v", shardID, err)
	case errors.Is(err, replication.ErrReplicaRemoved), errors.Is(err, replication.ErrStopped):
		return &causedStatus{st: status.Newf(codes.Unavailable, "shard %d: %v", shardID, err), cause: err}
	case errors.Is(err, context.DeadlineExceeded):
		if deadlinePassed(ctx) {
			return status.Errorf(codes.DeadlineExceeded, "shard %d: no quorum before the deadline", shardID)
		}
		return status.Errorf(codes.Unavailable, "shard %d: no quorum within the deadline", shardID)
	case errors.Is(err, context.Canceled):
		return status.FromContextError(err).Err()
	case errors.Is(err, shard.ErrKeyOutsideShard):
		return status.Errorf(codes.OutOfRange, "shard %d: %v", shardID, err)
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codes.Internal, "shard %d: %v", shardID, err)
}

// isNotLeader reports whether err is a status made by notLeaderErr: the
// request was refused before it was proposed.
func isNotLeader(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*shalev1.NotLeader); ok {
			return true
		}
	}
	return false
}
