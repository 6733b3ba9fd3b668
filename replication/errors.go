package replication

import (
	"errors"
	"fmt"
	"time"
)

// NotLeaderError is returned by operations that need the shard's leader when
// this replica is not it. LeaderNodeID is 0 when no leader is known.
type NotLeaderError struct {
	ShardID         uint64
	LeaderReplicaID uint64
	LeaderNodeID    uint64
}

func (e *NotLeaderError) Error() string {
	if e.LeaderNodeID == 0 {
		return fmt.Sprintf("shard %d: not leader, leader unknown", e.ShardID)
	}
	return fmt.Sprintf("shard %d: not leader, leader is node %d", e.ShardID, e.LeaderNodeID)
}

var (
	// ErrOutcomeUnknown is returned for a proposal whose fate this replica can
	// no longer observe (it lost leadership after proposing): the command may
	// or may not be applied. Retrying with the same request ID is safe.
	ErrOutcomeUnknown = errors.New("replication: proposal outcome unknown")
	// ErrStopped is returned after the Store or the Replica stopped.
	ErrStopped = errors.New("replication: stopped")
	// ErrReplicaRemoved is returned when the replica was removed from its shard.
	ErrReplicaRemoved = errors.New("replication: replica removed from the shard")
	// ErrProposalTooLarge is returned for a proposal over Config.MaxProposalBytes.
	ErrProposalTooLarge = errors.New("replication: proposal too large")
	// ErrBusy is returned when the replica has too many proposals in flight.
	ErrBusy = errors.New("replication: too many proposals in flight")
	// ErrTargetBehind is matched by TransferLeader's error when the target
	// replica's log stayed too far behind the leader's to hand it the
	// leadership without stalling writes; the leadership did not move.
	ErrTargetBehind = errors.New("replication: leadership target behind")
	// ErrNotVoter is matched by TransferLeader's error when the target node
	// holds no voting replica of the shard (none, a learner, or one removed):
	// Raft would ignore the transfer. The leadership did not move.
	ErrNotVoter = errors.New("no voting replica of the shard")
)

// errTargetBehind tells TransferLeader's wait that the target is still
// catching up (the transfer was not requested).
var errTargetBehind = errors.New("replication: target catching up")

const (
	// maxTransferLag is how many entries a leadership transfer's target may
	// lag the leader's log: Raft drops proposals from the transfer's start
	// until the target holds the whole log and takes over, so a target
	// further behind would stall the shard's writes while it catches up.
	maxTransferLag = 128
	// applyBacklogEntries is how many committed entries a replica may hold
	// unapplied before its node counts as applying a backlog
	// (Store.ApplyingBacklog): under load a replica's backlog is a few
	// cycles' entries; a node back after 20 s down under load holds
	// thousands per shard (docs/BENCHMARKS.md, issue 21).
	applyBacklogEntries = 256
	// transferCatchUpWait is how long TransferLeader waits for a target
	// more than maxTransferLag entries behind, or applying a backlog, to
	// catch up.
	transferCatchUpWait = 5 * time.Second
)
