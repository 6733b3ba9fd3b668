package replication

import (
	"go.etcd.io/raft/v3/raftpb"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// AppliedState is where a state machine stands: the last applied Raft entry,
// the group configuration in force at it, and the shard descriptor.
type AppliedState struct {
	// Index and Term identify the last applied entry.
	Index, Term uint64
	// ConfState is the Raft configuration after applying Index (never nil
	// for an initialized state machine).
	ConfState *raftpb.ConfState
	// Descriptor is the shard descriptor after applying Index.
	Descriptor *shalev1.ShardDescriptor
}

// Entry is one committed Raft entry handed to a state machine.
type Entry struct {
	Index, Term uint64
	// Payload is the proposed command (nil for the empty entries Raft appends
	// on leader election and for conf changes).
	Payload []byte
	// ConfChange is set for a configuration change entry.
	ConfChange *AppliedConfChange
}

// AppliedConfChange is a configuration change that Raft has applied.
type AppliedConfChange struct {
	// Change is the change as proposed (simple changes are converted to V2).
	Change *raftpb.ConfChangeV2
	// ConfState is the configuration that results from it.
	ConfState *raftpb.ConfState
	// Context is the decoded ConfChangeContext proposed with the change (the
	// node of every added replica), or nil.
	Context *shalev1.ConfChangeContext
}

// StateMachine is a shard's replicated state, driven by its Replica. Apply
// is called from an apply worker and Restore from the Raft loop, one at a
// time for a state machine, never concurrently with each other; Flush,
// Checkpoint and AppliedState may be called from other goroutines
// concurrently with Apply (but not with Restore). Reads may run
// concurrently with all of them. An Apply may add a replica to the Store
// (AddReplica: a split's new shard); the Store creates no replica on
// demand while an Apply runs.
type StateMachine interface {
	// AppliedState reports the last applied entry, configuration and descriptor.
	AppliedState() AppliedState
	// Apply applies committed entries in order and records the new applied
	// state in the same atomic write, so that a restart resumes exactly after
	// the last entry applied. It returns one result per entry (nil where the
	// entry produces none). An error means the state machine can no longer
	// make progress (I/O failure): nothing after the error is applied.
	Apply(entries []Entry) ([]any, error)
	// Flush makes everything applied so far durable on its own (without the
	// Raft log) and returns the applied index that is now durable: the Raft
	// log may be truncated up to it.
	Flush() (uint64, error)
	// Checkpoint writes a consistent, openable copy of the state into dir (a
	// directory that does not exist yet) and returns the applied state of the
	// copy. It does not stop Apply for longer than it takes to pin the files.
	Checkpoint(dir string) (AppliedState, error)
	// Restore replaces the whole state with the checkpoint in dir (made by
	// Checkpoint on another replica and verified by the caller); dir is moved
	// into place or deleted. After Restore, AppliedState reports the copy's.
	Restore(dir string) error
	// Close releases the state machine; the Replica calls nothing after it.
	Close() error
}
