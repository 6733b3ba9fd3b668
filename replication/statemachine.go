package replication

import (
	"go.etcd.io/raft/v3/raftpb"
	"go.opentelemetry.io/otel/trace"

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
	// Retired says the shard no longer exists (its keys went to another
	// shard): the replica has nothing left to replicate. The Store removes
	// a replica whose state machine is retired, when it is added or once an
	// Apply retired it.
	Retired bool
}

// Applied is what an Apply call produced.
type Applied struct {
	// Results holds one result per entry (per Entry value: a packed
	// entry's commands each have theirs; nil where the entry produces
	// none); the proposer of an entry gets its result.
	Results []any
	// Effects are what the entries ask of the Store beyond the state
	// machine, in log order. The Store carries them out after the call,
	// before the replica applies anything more.
	Effects []Effect
}

// Effect is something applying entries asks of the Store: HostShard.
type Effect interface{ effect() }

// HostShard asks the Store to host a new shard whose first replica on this
// node the entries created (a split's right-hand shard): StateMachine is
// its state machine, open and initialized at the start of the new shard's
// own Raft group. The replica on LeaderNodeID (or, when that is 0, on the
// node leading the shard whose entry created it) campaigns at once, so
// that the new shard gets a leader without an election timeout; when
// another node was named, the leader of the creating shard campaigns too
// if the new shard still has no leader after half an election timeout. If
// the Store cannot host it, the replica that applied the entry halts (a
// restart hosts the new shard from its state on disk).
type HostShard struct {
	StateMachine StateMachine
	// LeaderNodeID is the node whose replica should lead the new shard
	// first (0: the creating shard's leader).
	LeaderNodeID uint64
}

func (HostShard) effect() {}

// Entry is one committed Raft entry handed to a state machine, or one
// command of a packed Raft entry (several proposals in one entry: see
// Part).
type Entry struct {
	Index, Term uint64
	// Payload is the proposed command (nil for the empty entries Raft appends
	// on leader election and for conf changes).
	Payload []byte
	// Part and Parts place a command of a packed entry: such an entry comes
	// as Parts consecutive Entry values (Parts >= 2), all with its Index and
	// Term, Part 0 to Parts-1, in the order proposed, and always within one
	// Apply call. Each has its own result. The entry is applied once its
	// last part is: the applied index moves to Index only then. Parts is 0
	// for any other entry.
	Part, Parts int
	// ConfChange is set for a configuration change entry.
	ConfChange *AppliedConfChange
	// Span is the entry's apply span on the replica that proposed it, when
	// its proposal was traced (Config.TracerProvider); nil otherwise, and
	// always on the other replicas. A state machine may start child spans
	// of it (its engine write) and must not end it. It is not replicated.
	Span trace.Span
	// Decoded is what the proposer gave ProposeFunc as Payload's decoded
	// form, on the replica that proposed the command (each command of a
	// packed entry its own), so that the state machine need not decode what
	// it has just encoded; nil on the other replicas, on replays and for
	// commands proposed otherwise. Whatever the proposer's contract with its
	// state machine is, Decoded must apply exactly as Payload does (the
	// other replicas apply Payload). It is not replicated; the proposer may
	// still be reading it, so the state machine must not modify it.
	Decoded any
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
// and Restore are called from an apply worker, one at a time for a state
// machine, never concurrently with each other; AppliedState may be called
// from other goroutines (the Raft loop's among them) concurrently with
// both, and reports the old or the new state during a Restore; Flush and
// Checkpoint may be called concurrently with Apply (but not with Restore).
// Reads may run concurrently with all of them. The Store creates no
// replica on demand while an Apply runs, so a state machine may create
// another shard's replica on disk in Apply (HostShard) without racing a
// message of the new shard's group.
type StateMachine interface {
	// AppliedState reports the last applied entry, configuration and descriptor.
	AppliedState() AppliedState
	// AppliedDescriptor returns the descriptor after the last applied
	// entry (nil for an uninitialized state machine) without copying it:
	// the caller must not modify it. The state machine never modifies a
	// descriptor it returned, so the same pointer comes back until the
	// descriptor changes.
	AppliedDescriptor() *shalev1.ShardDescriptor
	// Apply applies committed entries in order and records the new applied
	// state in the same atomic write, so that a restart resumes exactly after
	// the last entry applied. It returns one result per entry and the
	// entries' effects (Applied). An error means the state machine can no
	// longer make progress (I/O failure): nothing after the error is
	// applied.
	Apply(entries []Entry) (Applied, error)
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
