package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

var (
	// ErrNotFound is returned by Get when the key is absent (never written,
	// deleted, or expired).
	ErrNotFound = errors.New("shale: key not found")

	// ErrInvalidArgument is matched (with errors.Is) by every error that
	// reports a malformed request: the server's InvalidArgument answers
	// (which stay the wrapped cause) and the client's own argument checks,
	// including *CrossShardError. Such requests are never retried.
	ErrInvalidArgument = errors.New("shale: invalid argument")

	// ErrUnavailable is matched (with errors.Is) by the error of a call whose
	// retries ran out: the caller's deadline passed (the error then also
	// matches context.DeadlineExceeded) or WithMaxAttempts attempts failed
	// with retryable errors (no quorum, unreachable replicas, leader changes,
	// overload). The last error seen is wrapped as well, so errors.As can
	// find a *NotLeaderError and status.FromError its gRPC status.
	ErrUnavailable = errors.New("shale: unavailable")

	// ErrClosed is returned by calls made on (or interrupted by) a closed
	// Client.
	ErrClosed = errors.New("shale: client closed")

	// ErrUnauthenticated is matched (with errors.Is) by the error of a call
	// the cluster refused for want of a valid identity (the server's
	// Unauthenticated, which stays the wrapped cause): a wrong user name or
	// password (New made WithCredentials fails with it at once), a token
	// that could not be renewed, a call without token or client
	// certificate to a cluster with authentication enabled, a plaintext
	// call to a TLS node. It is not retried (a refused token is renewed and
	// the call resent once, see WithCredentials).
	ErrUnauthenticated = errors.New("shale: unauthenticated")

	// ErrPermissionDenied is matched (with errors.Is) by the error of a
	// call the caller's user may not make: its roles do not allow the keys
	// (or the call needs the root role). Nothing was changed, and the call
	// is not retried. The server's PermissionDenied status stays the
	// wrapped cause.
	ErrPermissionDenied = errors.New("shale: permission denied")

	// ErrOutcomeUnknown is matched (with errors.Is) by the error of a write
	// (Put, Delete, CompareAndSwap, Batch or Txn Commit, a part of
	// DeleteRange) that failed after at least one of its attempts reached a
	// node without a reply that rules the write out: the write may have
	// applied, or may not. The error also wraps the cause (ErrUnavailable
	// and context.DeadlineExceeded when the deadline passed,
	// context.Canceled, ErrClosed, or a server status). A write error that
	// does not match ErrOutcomeUnknown means the write did not apply.
	// To settle an unknown outcome, read the data, or send the write again
	// with the same WithRequestID: it applies at most once.
	ErrOutcomeUnknown = errors.New("shale: outcome unknown")
)

// outcomeUnknownError marks the error of a write that may have applied.
type outcomeUnknownError struct {
	op    string
	cause error
}

func (e *outcomeUnknownError) Error() string {
	msg := strings.TrimPrefix(e.cause.Error(), "shale: ")
	msg = strings.TrimPrefix(msg, e.op+": ")
	return "shale: " + e.op + ": outcome unknown, the write may have applied: " + msg
}

func (e *outcomeUnknownError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.cause} }

// ruledOut reports whether a failed attempt's error proves that the attempt
// did not apply its write: the server refused it before proposing it
// (leader, epoch, range, validation, permission, admission) or rejected it
// when applying it. An attempt that never reached a node (sent is false)
// is ruled out too. Everything else — a lost connection, a deadline or
// cancellation in flight, Unavailable after proposing, Internal — may
// have applied.
func ruledOut(err error, sent bool) bool {
	if !sent || isWrongNode(err) {
		return true
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	d := statusDetails(st)
	if d.notLeader != nil || d.epoch != nil || d.outside != nil || d.notFound != nil || d.crossShard != nil {
		return true
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.ResourceExhausted,
		codes.FailedPrecondition, codes.OutOfRange, codes.NotFound, codes.AlreadyExists, codes.Aborted,
		codes.Unimplemented:
		return true
	}
	return false
}

// authError is a status error typed as ErrUnauthenticated or
// ErrPermissionDenied. It keeps the status (status.FromError and
// status.Code see it as it came).
type authError struct {
	kind  error // ErrUnauthenticated or ErrPermissionDenied
	cause error // the status error
}

func (e *authError) Error() string {
	return e.kind.Error() + ": " + status.Convert(e.cause).Message()
}

// Is matches the error's kind.
func (e *authError) Is(target error) bool { return target == e.kind }

// Unwrap returns the status error.
func (e *authError) Unwrap() error { return e.cause }

// GRPCStatus returns the status the server sent.
func (e *authError) GRPCStatus() *status.Status { return status.Convert(e.cause) }

// authTyped types an Unauthenticated or PermissionDenied status error as
// an *authError; other errors are returned as they are.
func authTyped(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*authError); ok {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unauthenticated:
		return &authError{kind: ErrUnauthenticated, cause: err}
	case codes.PermissionDenied:
		return &authError{kind: ErrPermissionDenied, cause: err}
	}
	return err
}

// CrossShardError reports a Batch, Txn or request whose keys span more than
// one shard. It matches ErrInvalidArgument with errors.Is. The client returns
// it without sending the request when its routing already shows the keys in
// different shards; the server answers the same (InvalidArgument with a
// CrossShardRequest detail) otherwise. Either way status.FromError(err)
// yields an InvalidArgument status carrying the detail.
type CrossShardError struct {
	// SplitKey is the shard boundary the request crosses.
	SplitKey []byte
	// ShardID is the shard the request was addressed to (the shard of its
	// first key).
	ShardID uint64
	// cause is the gRPC status error, received or synthesised.
	cause error
}

// Error describes the boundary crossed.
func (e *CrossShardError) Error() string {
	return fmt.Sprintf("shale: request crosses shard boundary %q of shard %d (batches and transactions must stay within one shard)", e.SplitKey, e.ShardID)
}

// Unwrap returns ErrInvalidArgument and the gRPC status error.
func (e *CrossShardError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrInvalidArgument}
	}
	return []error{ErrInvalidArgument, e.cause}
}

// newCrossShardError builds the error the client reports without a round
// trip, with the same status the server would send.
func newCrossShardError(splitKey []byte, shardID uint64) *CrossShardError {
	st := status.New(codes.InvalidArgument, fmt.Sprintf("request crosses shard boundary %q of shard %d", splitKey, shardID))
	if d, err := st.WithDetails(&shalev1.CrossShardRequest{SplitKey: splitKey, ShardId: shardID}); err == nil {
		st = d
	}
	return &CrossShardError{SplitKey: splitKey, ShardID: shardID, cause: st.Err()}
}

// NotLeaderError reports that the replica asked was not the shard's leader.
// The client follows leaders by itself, so it surfaces only wrapped in an
// ErrUnavailable error, when retries ran out while leadership was moving.
type NotLeaderError struct {
	// ShardID is the shard addressed.
	ShardID uint64
	// LeaderNodeID is the leader the replica knew of, 0 if none.
	LeaderNodeID uint64
	// LeaderAddress is that leader's address, "" if unknown.
	LeaderAddress string
	// cause is the gRPC status error.
	cause error
}

// Error describes the shard and the leader hint.
func (e *NotLeaderError) Error() string {
	if e.LeaderNodeID == 0 {
		return fmt.Sprintf("shale: not the leader of shard %d (leader unknown)", e.ShardID)
	}
	return fmt.Sprintf("shale: not the leader of shard %d (leader is node %d at %s)", e.ShardID, e.LeaderNodeID, e.LeaderAddress)
}

// Unwrap returns the gRPC status error.
func (e *NotLeaderError) Unwrap() error { return e.cause }

// retryError is the error of a call that stopped retrying: on the
// deadline, on cancellation, or after the maximum number of attempts.
type retryError struct {
	op     string
	reason error // context.DeadlineExceeded, context.Canceled, or errAttempts
	last   error // the last attempt's (typed) error, may be nil
}

// refusedError is New's error when every endpoint refused connections for
// refusedGiveUp. Its message names the endpoints; the per-node errors stay
// the wrapped cause.
type refusedError struct {
	endpoints []string
	cause     error
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("shale: connect: unavailable: no node reachable at %s: connection refused (for %v; is the cluster running, and are these its client addresses?)",
		strings.Join(e.endpoints, ", "), refusedGiveUp)
}

func (e *refusedError) Unwrap() []error { return []error{ErrUnavailable, e.cause} }

// errAttempts is the reason of a call that used up WithMaxAttempts.
var errAttempts = errors.New("retries exhausted")

func (e *retryError) Error() string {
	var b strings.Builder
	b.WriteString("shale: ")
	b.WriteString(e.op)
	if e.reason != context.Canceled {
		b.WriteString(": unavailable")
	}
	b.WriteString(": ")
	b.WriteString(e.reason.Error())
	if e.last != nil {
		b.WriteString("; last error: ")
		b.WriteString(e.last.Error())
	}
	return b.String()
}

func (e *retryError) Unwrap() []error {
	errs := make([]error, 0, 3)
	if e.reason != context.Canceled {
		errs = append(errs, ErrUnavailable)
	}
	errs = append(errs, e.reason)
	if e.last != nil {
		errs = append(errs, e.last)
	}
	return errs
}

// opError adds the operation to a terminal error while keeping it
// matchable.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "shale: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "shale: ")
}
func (e *opError) Unwrap() error { return e.err }
func wrapOp(op string, err error) error {
	if err == nil {
		return nil
	}
	var re *retryError
	var ou *outcomeUnknownError
	if errors.As(err, &re) || errors.As(err, &ou) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrClosed) {
		return err
	}
	return &opError{op: op, err: err}
}

// invalidArgError wraps a status error with ErrInvalidArgument.
type invalidArgError struct {
	cause error
	note  string // said before the cause's message, if set
}

func (e *invalidArgError) Error() string {
	if e.note != "" {
		return "shale: invalid argument: " + e.note + ": " + status.Convert(e.cause).Message()
	}
	return "shale: invalid argument: " + status.Convert(e.cause).Message()
}

// tooLarge reports whether st is gRPC's refusal of a message over the
// size limit of the sender or the receiver. It comes as ResourceExhausted,
// but unlike overload it is the same on every attempt: never retried.
func tooLarge(st *status.Status) bool {
	return st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "message larger than max")
}

// overloaded reports whether st is a ResourceExhausted answer that a later
// attempt may not get (too many requests in flight), not tooLarge.
func overloaded(st *status.Status) bool {
	return st.Code() == codes.ResourceExhausted && !tooLarge(st)
}
func (e *invalidArgError) Unwrap() []error { return []error{ErrInvalidArgument, e.cause} }

// invalidArgf is a client-side argument check failure.
func invalidArgf(format string, args ...any) error {
	return &invalidArgError{cause: status.Errorf(codes.InvalidArgument, format, args...)}
}

// details is the typed detail of a status error, if any.
type details struct {
	notLeader  *shalev1.NotLeader
	epoch      *shalev1.EpochMismatch
	outside    *shalev1.KeyOutsideShard
	notFound   *shalev1.ShardNotFound
	crossShard *shalev1.CrossShardRequest
}

// statusDetails extracts the typed details of a gRPC status.
func statusDetails(st *status.Status) details {
	var d details
	for _, x := range st.Details() {
		switch v := x.(type) {
		case *shalev1.NotLeader:
			d.notLeader = v
		case *shalev1.EpochMismatch:
			d.epoch = v
		case *shalev1.KeyOutsideShard:
			d.outside = v
		case *shalev1.ShardNotFound:
			d.notFound = v
		case *shalev1.CrossShardRequest:
			d.crossShard = v
		}
	}
	return d
}

// typed converts an error returned by an RPC into the package's public
// error types, keeping the status error as the wrapped cause.
func typed(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	d := statusDetails(st)
	switch {
	case d.crossShard != nil:
		return &CrossShardError{SplitKey: d.crossShard.GetSplitKey(), ShardID: d.crossShard.GetShardId(), cause: err}
	case d.notLeader != nil:
		return &NotLeaderError{ShardID: d.notLeader.GetShardId(), LeaderNodeID: d.notLeader.GetLeaderNodeId(),
			LeaderAddress: d.notLeader.GetLeaderAddress(), cause: err}
	case st.Code() == codes.InvalidArgument:
		return &invalidArgError{cause: err}
	case tooLarge(st):
		return &invalidArgError{cause: err, note: "the request is larger than a node accepts (see the value and batch limits in docs/api.md)"}
	case st.Code() == codes.Unauthenticated, st.Code() == codes.PermissionDenied:
		return authTyped(err)
	}
	return err
}
