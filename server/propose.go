package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// proposeCmd is the one way this node proposes a command: it replicates
// cmd through r, this node's replica of its shard (which must lead for the
// command to commit), and returns the command's result once it applied
// here. inner bounds the proposal; ctx is the caller's, which tells a
// deadline of the caller's from inner's (see replicationErr).
//
// Every error is a gRPC status: the proposal's failure as replicationErr
// maps it (NotLeader, Unavailable with the outcome unknown, ...), or the
// result's error code (resultErr); the result is returned with it. A proposal that
// failed because r was removed still matches replication.ErrReplicaRemoved
// with errors.Is.
func (n *Node) proposeCmd(ctx, inner context.Context, r *replication.Replica, cmd *shalev1.RaftCommand) (*shalev1.CommandResult, error) {
	id := r.ShardID()
	payload, err := n.encodeCommand(r, cmd)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "shard %d: encode command: %v", id, err)
	}
	// A transaction may share its Raft entry with others proposed at the
	// same time; every other command (a split, a merge step, a system
	// command, an expiry) changes what the shard's apply must see as a
	// whole entry, and goes alone.
	_, txn := cmd.GetCommand().(*shalev1.RaftCommand_Txn)
	propose := r.ProposeAlone
	if txn {
		propose = r.Propose
	}
	res, err := propose(inner, payload)
	return n.commandResult(ctx, id, cmd, len(payload), res, err)
}

// commandResult is proposeCmd's outcome for cmd, proposed on shard id in
// payloadBytes, from what the replica's propose returned (res, err). It
// waits for nothing unless the result has an error code (resultErr may
// look for the leader of the next shard).
func (n *Node) commandResult(ctx context.Context, id uint64, cmd *shalev1.RaftCommand, payloadBytes int, res any, err error) (*shalev1.CommandResult, error) {
	if err != nil {
		return nil, n.replicationErr(ctx, id, err)
	}
	if _, txn := cmd.GetCommand().(*shalev1.RaftCommand_Txn); txn {
		n.writeBytes.Add(uint64(payloadBytes))
	}
	cr, _ := res.(*shalev1.CommandResult)
	if cr == nil {
		return nil, status.Errorf(codes.Internal, "shard %d: the command's apply returned %T", id, res)
	}
	if err := resultErr(cmd, cr, func(d *shalev1.ShardDescriptor) *shalev1.RoutedShard { return n.nextShard(ctx, d) }); err != nil {
		return cr, err
	}
	return cr, nil
}

// resultErr is the status of a command result with an error code (nil
// without one). The result of a command a client routed by its shard's
// epoch (a KV write, a split) that carries the shard's descriptor gets the
// detail the client re-routes by: EpochMismatch with FailedPrecondition,
// KeyOutsideShard with OutOfRange; next (when not nil) names the shard
// after a descriptor for EpochMismatch. Other commands' descriptors (a merge
// step's, a system command's) explain the refusal and get no detail.
func resultErr(cmd *shalev1.RaftCommand, cr *shalev1.CommandResult, next func(*shalev1.ShardDescriptor) *shalev1.RoutedShard) error {
	code := codes.Code(cr.GetErrorCode())
	if code == codes.OK {
		return nil
	}
	routed := false
	switch cmd.GetCommand().(type) {
	case *shalev1.RaftCommand_Txn, *shalev1.RaftCommand_Split:
		routed = true
	}
	switch {
	case routed && code == codes.FailedPrecondition && cr.GetDescriptor_() != nil:
		var nx *shalev1.RoutedShard
		if next != nil {
			nx = next(cr.GetDescriptor_())
		}
		return epochMismatchErr(cmd.GetEpoch(), cr.GetDescriptor_(), nx)
	case routed && code == codes.OutOfRange && cr.GetDescriptor_() != nil:
		return withDetail(code, cr.GetErrorMessage(), &shalev1.KeyOutsideShard{Shard: cr.GetDescriptor_()})
	}
	return status.Error(code, cr.GetErrorMessage())
}

// causedStatus is a status error that keeps the error it was made from
// visible to errors.Is and errors.As.
type causedStatus struct {
	st    *status.Status
	cause error
}

func (e *causedStatus) Error() string {
	return fmt.Sprintf("rpc error: code = %s desc = %s", e.st.Code(), e.st.Message())
}

// GRPCStatus makes the error the status it carries for gRPC and
// status.FromError.
func (e *causedStatus) GRPCStatus() *status.Status { return e.st }

func (e *causedStatus) Unwrap() error { return e.cause }
