package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication/raftlog"
	"github.com/shale-db/shale/storage"
)

// Replica is one node's member of a shard's Raft group. Its methods are safe
// for concurrent use; the Raft state itself is only touched by the Store's
// loop.
type Replica struct {
	store     *Store
	shardID   uint64
	replicaID uint64
	sm        StateMachine
	log       *raftlog.Log
	rn        *raft.RawNode // loop only

	inflight atomic.Int64

	mu    sync.Mutex
	props []*proposal
	reads []*readWaiter
	ops   []loopOp
	nodes map[uint64]uint64 // replica ID → node ID
	// nodesDesc is the applied descriptor whose replicas nodes last took
	// in (loop side): an apply report that leaves it unchanged skips the
	// update.
	nodesDesc *shalev1.ShardDescriptor
	// conflicts are the (replica, node) claims noteNode refused and
	// logged, each logged once.
	conflicts map[[2]uint64]bool
	status    Status
	stopErr   error
	// backlogged: the replica holds more than applyBacklogEntries
	// committed entries unapplied (counted in Store.backlogged).
	backlogged bool
	// transferTo is the replica this one last asked Raft to hand its
	// leadership to, until a leader is known again: a replica that stepped
	// down for it names it as the likely leader.
	transferTo uint64
	// firstLeader is closed once a replica a split created here knows its
	// group's first leader, or stops (see WaitFirstLeader); nil for any
	// other replica and after it was closed.
	firstLeader chan struct{}

	// Loop-only state.
	waiters map[uint64]*proposal
	// parked are proposals Raft dropped while this leader was handing its
	// leadership over: they are proposed again if the transfer is
	// abandoned, or answered NotLeader naming the new leader once it is
	// known (resolveParked), instead of bouncing the caller mid-transfer.
	parked      []*proposal
	parkedTicks int
	// With Config.LeaseReads, the leader serves reads without a ReadIndex
	// round until leaseUntil, in term leaseTerm (see leaseRead; zero while
	// quiesced); transferAt is when it last asked Raft to hand its
	// leadership over (rounds sent before then extend no lease); renewing
	// marks a renewal round in flight.
	leaseUntil     time.Time
	leaseTerm      uint64
	transferAt     time.Time
	renewing       bool
	readBatches    map[string]*readBatch
	readSeq        uint64
	appliedWaiters []*readWaiter
	// readsWaitApplied is set while appliedWaiters is not empty: the apply
	// workers' reports of this replica then wake the loop (Store.report).
	readsWaitApplied atomic.Bool
	applied          uint64
	quiesced         bool
	// quiescedLeaderNode is the node whose leader quiesced the group.
	quiescedLeaderNode uint64
	// quiescedVoterNodes are, on a leader that quiesced, the nodes of the
	// other voters: while fewer than a quorum of them (with the leader)
	// are live, it ticks again so that CheckQuorum can depose it.
	quiescedVoterNodes []uint64
	notifyQuiesce      bool
	stableTicks        int
	lastCommit         uint64
	wasLeader          bool
	removed            bool
	halted             bool
	pendingSnap        *incomingSnapshot
	// installing is the snapshot an apply worker restores (or restored)
	// into the state machine, from the Ready that carried it until the
	// loop persisted and advanced that Ready (see startInstall).
	installing  *snapInstall
	sendingSnap map[uint64]bool
	ticks       uint64

	// applyQ is the replica's apply work (guarded by the Store's apply
	// pool).
	applyQ applyQueue
}

// Status is a replica's view of its shard's Raft group.
type Status struct {
	ShardID, ReplicaID, NodeID uint64
	// Leader is true when this replica leads the group.
	Leader          bool
	LeaderReplicaID uint64
	LeaderNodeID    uint64
	Term            uint64
	Commit          uint64
	Applied         uint64
	LastIndex       uint64
	Quiesced        bool
	// Stopped says why the replica no longer serves (halted or removed);
	// empty while it serves.
	Stopped string
	// Progress is the leader's view of every member (leader only).
	Progress map[uint64]Progress
	// Descriptor is the applied shard descriptor.
	Descriptor *shalev1.ShardDescriptor
}

// Progress is the leader's view of one member of the group.
type Progress struct {
	NodeID  uint64
	Match   uint64
	State   string
	Learner bool
}

type proposal struct {
	id   uint64
	data []byte
	cc   *raftpb.ConfChangeV2
	// alone: the proposal gets a Raft entry of its own (ProposeAlone).
	alone bool
	term  uint64
	start time.Time
	// done receives the result of a proposal whose caller waits for it
	// (Propose); nil for one made by ProposeFunc.
	done chan proposalResult
	// then, r and answered are a ProposeFunc proposal's: its callback,
	// its replica, and whether it has been answered (once: by finish or
	// by Proposal.Cancel, whichever comes first).
	then func(any, error)
	r    *Replica
	// decoded is the payload's decoded form given to ProposeFunc, which
	// the proposal's entry carries to the state machine (Entry.Decoded).
	decoded  any
	answered atomic.Bool
	// trace is the proposal's spans when its context was traced (nil
	// otherwise; see trace.go).
	trace *proposalTrace
}

type proposalResult struct {
	result any
	err    error
}

// finish ends p with its result (or the reason it has none): Propose's
// caller receives it, or ProposeFunc's callback runs with it on this
// goroutine. A proposal finished again, or after its caller stopped
// waiting, is not answered again.
func (p *proposal) finish(res any, err error) {
	if p.then != nil {
		p.answer(res, err)
		return
	}
	select {
	case p.done <- proposalResult{res, err}:
	default:
	}
}

// answer runs a ProposeFunc proposal's callback with its outcome the first
// time it is called: it ends the proposal's propose span, as Propose does
// when it returns, and frees its place among the replica's proposals in
// flight.
func (p *proposal) answer(res any, err error) {
	if !p.answered.CompareAndSwap(false, true) {
		return
	}
	p.r.inflight.Add(-1)
	if p.trace != nil {
		p.trace.proposed(err)
	}
	p.then(res, err)
}

type loopOp struct {
	fn   func() error
	done chan error
}

type readWaiter struct {
	index uint64
	done  chan error
}

type readBatch struct {
	ctx     []byte
	waiters []*readWaiter
	ticks   int
	// sent is when the round was first asked for, in term term; renew
	// marks a round sent only to renew the leader's lease.
	sent  time.Time
	term  uint64
	renew bool
}

func newReplica(s *Store, shardID, replicaID uint64, sm StateMachine, lg *raftlog.Log) *Replica {
	r := &Replica{
		store:       s,
		shardID:     shardID,
		replicaID:   replicaID,
		sm:          sm,
		log:         lg,
		nodes:       make(map[uint64]uint64),
		waiters:     make(map[uint64]*proposal),
		readBatches: make(map[string]*readBatch),
		sendingSnap: make(map[uint64]bool),
	}
	r.nodes[replicaID] = s.cfg.NodeID
	r.updateNodes(sm.AppliedState().Descriptor)
	return r
}

func (r *Replica) initRaft() error {
	r.log.SetCallbacks(func() *raftpb.ConfState {
		if cs := r.sm.AppliedState().ConfState; cs != nil {
			return proto.Clone(cs).(*raftpb.ConfState)
		}
		return &raftpb.ConfState{}
	}, func() (*raftpb.Snapshot, error) {
		st := r.sm.AppliedState()
		if st.Index == 0 || st.ConfState == nil {
			return nil, raft.ErrSnapshotTemporarilyUnavailable
		}
		return snapshotOf(st), nil
	})
	cfg := r.store.cfg
	st := r.sm.AppliedState()
	rc := &raft.Config{
		ID:                        r.replicaID,
		ElectionTick:              cfg.ElectionTicks,
		HeartbeatTick:             cfg.HeartbeatTicks,
		Storage:                   r.log,
		Applied:                   st.Index,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  8 << 20,
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    r.store.rlog,
	}
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return fmt.Errorf("replication: shard %d: raft: %w", r.shardID, err)
	}
	r.rn = rn
	r.applied = st.Index
	r.refreshStatus()
	return nil
}

// ShardID returns the replica's shard.
func (r *Replica) ShardID() uint64 { return r.shardID }

// ReplicaID returns the replica's Raft ID in its shard.
func (r *Replica) ReplicaID() uint64 { return r.replicaID }

// StateMachine returns the replica's state machine (for reads).
func (r *Replica) StateMachine() StateMachine { return r.sm }

// Status returns the last observed state of the replica (without Progress;
// see ProgressStatus).
func (r *Replica) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.status
	if r.stopErr != nil {
		st.Stopped = r.stopErr.Error()
	}
	st.Descriptor = r.sm.AppliedState().Descriptor
	return st
}

// IsLeader reports whether the replica was the leader at its last update.
func (r *Replica) IsLeader() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status.Leader
}

// Leadership reports whether the replica was the leader at its last update
// and its term then: a caller that sees the same term with leader true at
// two moments knows the replica led throughout.
func (r *Replica) Leadership() (leader bool, term uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status.Leader, r.status.Term
}

// awaitFirstLeader marks a replica a split just created on this node:
// until its group's first leader is known, WaitFirstLeader waits for it.
func (r *Replica) awaitFirstLeader() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.status.LeaderReplicaID == 0 && r.stopErr == nil {
		r.firstLeader = make(chan struct{})
	}
}

// WaitFirstLeader returns the replica's status once it knows a leader,
// when the replica is a split's new shard whose group had none yet
// (created on this node by the split's apply, which elects one within
// milliseconds to an election timeout); it returns at once for any other
// replica, and when ctx ends or the replica stops. A request that meets
// the new shard before its election ended is then answered with the
// leader (or served, on it) instead of bouncing to a client's backoff.
func (r *Replica) WaitFirstLeader(ctx context.Context) Status {
	r.mu.Lock()
	ch := r.firstLeader
	r.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	return r.Status()
}

// NodeOf returns the node hosting a replica of this shard, or 0.
func (r *Replica) NodeOf(replicaID uint64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[replicaID]
}

func (r *Replica) notLeader() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.notLeaderLocked(r.status.LeaderReplicaID, r.status.Leader)
}

// notLeaderFrom is notLeader with Raft's own status (loop side), which
// may be newer than the cached one.
func (r *Replica) notLeaderFrom(bs *raft.BasicStatus) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.notLeaderLocked(bs.Lead, bs.RaftState == raft.StateLeader)
}

func (r *Replica) notLeaderLocked(lead uint64, leader bool) error {
	if (lead == 0 || lead == r.replicaID) && !leader && r.transferTo != 0 {
		// Stepped down for a transfer whose target has not yet won.
		lead = r.transferTo
	}
	return &NotLeaderError{ShardID: r.shardID, LeaderReplicaID: lead, LeaderNodeID: r.nodes[lead]}
}

// Propose replicates payload through the shard's log and returns what the
// state machine's Apply returned for it. It must be called on the leader
// (else *NotLeaderError). If the replica loses leadership before the entry
// applies, it returns ErrOutcomeUnknown; if ctx ends first, ctx's error —
// in both cases the command may still apply. The command may share its
// Raft entry with others proposed at the same time (see packed.go): the
// state machine gets it as an Entry of its own all the same.
func (r *Replica) Propose(ctx context.Context, payload []byte) (any, error) {
	return r.proposeCommand(ctx, payload, false)
}

// ProposeAlone is Propose for a command that must have a Raft entry of its
// own, never packed with others (one whose apply the state machine needs
// to see as a whole entry: a split, a merge step).
func (r *Replica) ProposeAlone(ctx context.Context, payload []byte) (any, error) {
	return r.proposeCommand(ctx, payload, true)
}

// ProposeFunc is Propose's completion form: it starts the proposal and
// returns without waiting for it, and then gets what Propose would have
// returned, exactly once: on an apply worker or the Raft loop once the
// proposal applied or failed, on the goroutine that calls the returned
// Proposal's Cancel if that comes first, or before ProposeFunc returns if
// the proposal did not start (not the leader, too large, ErrBusy, the
// replica stopped). ctx carries the proposal's trace (see trace.go) and is
// not watched: a caller with a deadline cancels the proposal at it, as
// Propose's caller stops waiting when its context ends (the command may
// still apply). then must not block: the goroutines finishing proposals
// serve every shard of the node. decoded, if not nil, is payload's decoded
// form, which this replica's state machine gets as Entry.Decoded when it
// applies the command instead of decoding payload (see Entry.Decoded for
// what it must be).
// (Watching a context costs a registration with it, under its lock, and
// its removal per proposal; a caller with many proposals in flight can
// cancel them all from one timer.)
func (r *Replica) ProposeFunc(ctx context.Context, payload []byte, decoded any, then func(result any, err error)) Proposal {
	p, err := r.newProposal(ctx, payload, false)
	if err != nil {
		then(nil, err)
		return Proposal{}
	}
	p.then, p.r, p.decoded = then, r, decoded
	if err := r.admit(); err != nil {
		if p.trace != nil {
			p.trace.proposed(err)
		}
		then(nil, err)
		return Proposal{}
	}
	if err := r.queue(p); err != nil {
		p.answer(nil, err)
	}
	return Proposal{p: p}
}

// Proposal is a proposal ProposeFunc started, for its caller to end.
type Proposal struct{ p *proposal }

// Cancel answers the proposal with err (its callback runs on this
// goroutine), unless it has been answered; the command may still apply.
// On the zero Proposal (one that did not start) it does nothing.
func (h Proposal) Cancel(err error) {
	if h.p != nil {
		h.p.answer(nil, err)
	}
}

// proposeCommand is Propose and ProposeAlone: it queues the proposal and
// waits for its result or for ctx's end.
func (r *Replica) proposeCommand(ctx context.Context, payload []byte, alone bool) (any, error) {
	p, err := r.newProposal(ctx, payload, alone)
	if err != nil {
		return nil, err
	}
	p.done = make(chan proposalResult, 1)
	res, err := r.submit(ctx, p)
	if p.trace != nil {
		p.trace.proposed(err)
	}
	return res, err
}

// newProposal checks and encodes a proposal of payload, and starts its
// propose span when ctx is traced.
func (r *Replica) newProposal(ctx context.Context, payload []byte, alone bool) (*proposal, error) {
	if len(payload) > r.store.cfg.MaxProposalBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrProposalTooLarge, len(payload), r.store.cfg.MaxProposalBytes)
	}
	if !r.IsLeader() {
		return nil, r.notLeader()
	}
	p := &proposal{id: r.store.proposal.Add(1), alone: alone, start: time.Now()}
	p.data = encodeEntry(p.id, payload)
	p.trace = r.store.traceProposal(ctx, r.shardID, len(payload))
	return p, nil
}

// admit takes a place among the replica's proposals in flight, or returns
// ErrBusy when they are all taken.
func (r *Replica) admit() error {
	if r.inflight.Add(1) > int64(r.store.cfg.MaxInflightProposals) {
		r.inflight.Add(-1)
		return ErrBusy
	}
	return nil
}

// queue hands p to the Raft loop, unless the replica has stopped.
func (r *Replica) queue(p *proposal) error {
	r.mu.Lock()
	if r.stopErr != nil {
		err := r.stopErr
		r.mu.Unlock()
		return err
	}
	r.props = append(r.props, p)
	r.mu.Unlock()
	r.store.queueWork(r)
	return nil
}

// submit queues p, which holds a place among the proposals in flight
// until its result comes or ctx ends, and waits for either.
func (r *Replica) submit(ctx context.Context, p *proposal) (any, error) {
	if err := r.admit(); err != nil {
		return nil, err
	}
	defer r.inflight.Add(-1)
	if err := r.queue(p); err != nil {
		return nil, err
	}
	select {
	case res := <-p.done:
		return res.result, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ReadIndex returns once the replica has applied everything committed
// before the call: a read of the state machine after it is linearizable.
// On a follower the index comes from the leader. It retries while no leader
// is known, until ctx ends.
func (r *Replica) ReadIndex(ctx context.Context) error {
	w := &readWaiter{done: make(chan error, 1)}
	r.mu.Lock()
	if r.stopErr != nil {
		err := r.stopErr
		r.mu.Unlock()
		return err
	}
	r.reads = append(r.reads, w)
	r.mu.Unlock()
	r.store.queueWork(r)
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runOnLoop runs fn on the Store's loop and waits for it (or ctx).
func (r *Replica) runOnLoop(ctx context.Context, fn func() error) error {
	done := make(chan error, 1)
	r.mu.Lock()
	if r.stopErr != nil {
		err := r.stopErr
		r.mu.Unlock()
		return err
	}
	r.ops = append(r.ops, loopOp{fn: fn, done: done})
	r.mu.Unlock()
	r.store.queueWork(r)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-r.store.stop:
		return ErrStopped
	}
}

// Campaign makes the replica start an election.
func (r *Replica) Campaign(ctx context.Context) error {
	return r.runOnLoop(ctx, func() error {
		r.unquiesce()
		return r.rn.Campaign()
	})
}

// campaignUnlessStanding makes the replica start an election unless it
// knows a leader or is a candidate past its pre-vote (whose votes are on
// their way: a new campaign would discard them). It decides on the loop,
// where a pre-vote's answers may just have made it a candidate.
func (r *Replica) campaignUnlessStanding(ctx context.Context) error {
	return r.runOnLoop(ctx, func() error {
		bs := r.rn.BasicStatus()
		if bs.Lead != 0 || bs.RaftState == raft.StateCandidate || bs.RaftState == raft.StateLeader {
			return nil
		}
		r.unquiesce()
		return r.rn.Campaign()
	})
}

// ProgressStatus returns Status with the leader's Progress of every member.
func (r *Replica) ProgressStatus(ctx context.Context) (Status, error) {
	var st Status // written by the loop; read only once it has finished
	err := r.runOnLoop(ctx, func() error {
		st = r.Status()
		rs := r.rn.Status()
		if rs.RaftState == raft.StateLeader {
			st.Progress = make(map[uint64]Progress, len(rs.Progress))
			for id, pr := range rs.Progress {
				st.Progress[id] = Progress{NodeID: r.NodeOf(id), Match: pr.Match, State: pr.State.String(), Learner: pr.IsLearner}
			}
		}
		return nil
	})
	if err != nil {
		return Status{}, err
	}
	return st, nil
}

// TransferLeader asks the leader to hand leadership to the replica on
// targetNode and waits until it has, or ctx ends. A target more than a
// few entries behind the leader's log is first given up to 5 seconds to
// catch up, while the shard keeps taking writes; one still behind then
// fails the call with an error matching ErrTargetBehind, the leadership
// unmoved. A node that holds no voter of the shard's current
// configuration (no replica, a learner, or only a replica removed since)
// fails the call at once with an error matching ErrNotVoter.
func (r *Replica) TransferLeader(ctx context.Context, targetNode uint64) error {
	target, err := r.voterOn(ctx, targetNode)
	if err != nil {
		return err
	}
	// One request: Raft gives the target an election timeout to take over
	// (catching it up first if it is behind) and drops proposals until then,
	// so the request is not repeated: a target that cannot take over (down,
	// refusing, or with configuration changes still to apply) fails the
	// call after two election timeouts, and the shard serves writes again
	// while the caller decides whether to retry. Nor is it made while the
	// target is more than maxTransferLag entries behind (a node just back
	// from a restart, catching up from the log), or while its node says it
	// is applying a backlog of committed entries (it would answer no write
	// before it applied them): the shard keeps taking writes while the
	// target catches up, for up to transferCatchUpWait, and a target still
	// behind then fails the call with ErrTargetBehind.
	requested := false
	var giveUp time.Time
	catchUpBy := time.Now().Add(transferCatchUpWait)
	var lag uint64
	for {
		st := r.Status()
		if st.LeaderReplicaID == target {
			return nil
		}
		switch {
		case !st.Leader:
			if !requested || (st.LeaderReplicaID != 0 && st.LeaderReplicaID != target) {
				return r.notLeader()
			}
			// Leadership is in transit.
		case !requested && r.store.nodeApplyingBacklog(targetNode):
			// Caught up on the log, perhaps, but not on its applies: as
			// leader it would answer no write until it applied them.
			if time.Now().After(catchUpBy) {
				return fmt.Errorf("replication: shard %d: node %d is still applying a backlog of committed entries after %v: %w", r.shardID, targetNode, transferCatchUpWait, ErrTargetBehind)
			}
		case !requested:
			err := r.runOnLoop(ctx, func() error {
				rs := r.rn.Status()
				if lead, to := rs.Progress[r.replicaID].Match, rs.Progress[target].Match; lead > to+maxTransferLag {
					lag = lead - to
					return errTargetBehind
				}
				requested = true
				r.unquiesce()
				// The target may win without waiting out the voters'
				// refusal to vote for others: no lease from here on.
				r.transferAt, r.leaseUntil = time.Now(), time.Time{}
				r.rn.TransferLeader(target)
				r.mu.Lock()
				r.transferTo = target
				r.mu.Unlock()
				return nil
			})
			switch {
			case errors.Is(err, errTargetBehind):
				if time.Now().After(catchUpBy) {
					return fmt.Errorf("replication: shard %d: the replica on node %d is %d entries behind the leader after %v: %w", r.shardID, targetNode, lag, transferCatchUpWait, ErrTargetBehind)
				}
			case err != nil:
				return err
			default:
				giveUp = time.Now().Add(2 * time.Duration(r.store.cfg.ElectionTicks) * r.store.cfg.TickInterval)
			}
		case time.Now().After(giveUp):
			return fmt.Errorf("replication: shard %d: the replica on node %d did not take the leadership within two election timeouts", r.shardID, targetNode)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.store.cfg.TickInterval):
		}
	}
}

// voterOn returns the ID of the replica on node that votes in the shard's
// current configuration (its incoming one, during a joint change): the
// only replica Raft hands a leadership to. The node map also keeps the
// replicas removed from the shard (a replica ID is never reused, and a node
// may hold a newer replica of the same shard), so it alone cannot tell.
func (r *Replica) voterOn(ctx context.Context, node uint64) (uint64, error) {
	var voter, learner uint64
	removed := false
	err := r.runOnLoop(ctx, func() error {
		cfg := r.rn.Status().Config
		r.mu.Lock()
		defer r.mu.Unlock()
		for rid, n := range r.nodes {
			if n != node {
				continue
			}
			_, isVoter := cfg.Voters[0][rid]
			_, isLearner := cfg.Learners[rid]
			_, nextLearner := cfg.LearnersNext[rid]
			switch {
			case isVoter:
				voter = rid
			case isLearner || nextLearner:
				learner = rid
			default:
				removed = true
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return 0, err
	case voter != 0:
		return voter, nil
	case learner != 0:
		return 0, fmt.Errorf("replication: shard %d: node %d holds %w (its replica there is a learner)", r.shardID, node, ErrNotVoter)
	case removed:
		return 0, fmt.Errorf("replication: shard %d: node %d holds %w (its replica there was removed)", r.shardID, node, ErrNotVoter)
	default:
		return 0, fmt.Errorf("replication: shard %d: node %d holds %w (none at all)", r.shardID, node, ErrNotVoter)
	}
}

// Destroy removes this replica from the node (its Raft state and, through
// the Store's ReplicaRemoved hook, its data), as a replica removed from its
// shard is. It is for replicas of shards that no longer exist (a merge
// retired the shard while this replica was away).
func (r *Replica) Destroy(ctx context.Context) error {
	var cleaned <-chan struct{}
	if err := r.runOnLoop(ctx, func() error {
		if !r.dead() {
			cleaned = r.store.removeReplica(r)
		}
		return nil
	}); err != nil {
		return err
	}
	if cleaned == nil {
		return nil
	}
	select {
	case <-cleaned:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ChangeType is a kind of membership change.
type ChangeType int

const (
	// AddVoter adds a voting replica on NodeID.
	AddVoter ChangeType = iota
	// AddLearner adds a non-voting replica on NodeID.
	AddLearner
	// PromoteLearner makes the learner ReplicaID a voter.
	PromoteLearner
	// RemoveReplica removes ReplicaID.
	RemoveReplica
)

// ReplicaChange is one membership change.
type ReplicaChange struct {
	Type      ChangeType
	NodeID    uint64 // AddVoter, AddLearner
	ReplicaID uint64 // PromoteLearner, RemoveReplica
}

// ChangeReplicas changes the shard's membership with one configuration
// change: several changes at once go through joint consensus, which is left
// automatically. It returns the descriptor once the change (and the leaving
// of the joint configuration) has applied on this replica.
func (r *Replica) ChangeReplicas(ctx context.Context, changes []ReplicaChange) (*shalev1.ShardDescriptor, error) {
	if len(changes) == 0 {
		return nil, errors.New("replication: no changes")
	}
	if !r.IsLeader() {
		return nil, r.notLeader()
	}
	p := &proposal{id: r.store.proposal.Add(1), start: time.Now(), done: make(chan proposalResult, 1)}
	desc := r.sm.AppliedState().Descriptor
	next := desc.GetNextReplicaId()
	for _, rd := range desc.GetReplicas() {
		next = max(next, rd.GetReplicaId()+1)
		for _, c := range changes {
			if (c.Type == AddVoter || c.Type == AddLearner) && rd.GetNodeId() == c.NodeID {
				return nil, fmt.Errorf("replication: shard %d already has replica %d on node %d", r.shardID, rd.GetReplicaId(), c.NodeID)
			}
		}
	}
	var cc raftpb.ConfChangeV2
	var cctx shalev1.ConfChangeContext
	for _, c := range changes {
		switch c.Type {
		case AddVoter, AddLearner:
			typ, role := raftpb.ConfChangeAddNode, shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED
			if c.Type == AddLearner {
				typ, role = raftpb.ConfChangeAddLearnerNode, shalev1.ReplicaRole_REPLICA_ROLE_LEARNER
			}
			cc.Changes = append(cc.Changes, &raftpb.ConfChangeSingle{Type: typ.Enum(), NodeId: proto.Uint64(next)})
			cctx.Replicas = append(cctx.Replicas, &shalev1.ReplicaDescriptor{NodeId: c.NodeID, ReplicaId: next, Role: role})
			next++
		case PromoteLearner:
			cc.Changes = append(cc.Changes, &raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(c.ReplicaID)})
		case RemoveReplica:
			cc.Changes = append(cc.Changes, &raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(c.ReplicaID)})
		}
	}
	ctxBytes, err := proto.Marshal(&cctx)
	if err != nil {
		return nil, err
	}
	cc.Context = encodeEntry(p.id, ctxBytes)
	p.cc = &cc
	if _, err := r.submit(ctx, p); err != nil {
		return nil, err
	}
	// Wait for the automatic leave of a joint configuration.
	for {
		st := r.sm.AppliedState()
		if len(st.ConfState.GetVotersOutgoing()) == 0 && len(st.ConfState.GetLearnersNext()) == 0 {
			return proto.Clone(st.Descriptor).(*shalev1.ShardDescriptor), nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(r.store.cfg.TickInterval / 4):
		}
	}
}

// entryHeaderLen is the length of encodeEntry's frame before the payload.
const entryHeaderLen = 9

// encodeEntry frames a payload with the proposal ID that lets the proposing
// replica find its waiter: version byte 1, 8-byte ID, payload. (Several
// proposals packed into one entry are version 2: packed.go.)
func encodeEntry(id uint64, payload []byte) []byte {
	b := make([]byte, entryHeaderLen+len(payload))
	b[0] = entryVersionSingle
	binary.BigEndian.PutUint64(b[1:9], id)
	copy(b[9:], payload)
	return b
}

func decodeEntry(data []byte) (uint64, []byte, error) {
	if len(data) < entryHeaderLen || data[0] != entryVersionSingle {
		return 0, nil, fmt.Errorf("replication: malformed entry (%d bytes, version %d)", len(data), func() byte {
			if len(data) > 0 {
				return data[0]
			}
			return 0
		}())
	}
	return binary.BigEndian.Uint64(data[1:9]), data[9:], nil
}

// --- loop side ---

func (r *Replica) dead() bool { return r.removed || r.halted }

// fatal halts the replica after an error it cannot recover from (its state
// machine failed): nothing more is applied or acknowledged.
//
// An I/O error (a full disk) fails the whole node (Store.Failed): the node
// is restarted, and applies the entries again from its durable state.
// Proposals in flight fail with ErrOutcomeUnknown: they may have committed
// on the other replicas.
func (r *Replica) fatal(err error) {
	if r.halted {
		return
	}
	r.halted = true
	r.store.cfg.Logger.Error("replica halted", "shard", r.shardID, "err", err)
	r.store.applier.stopReplica(r, fmt.Errorf("%w: replication: shard %d halted: %w", ErrOutcomeUnknown, r.shardID, err))
	r.abandonInstall(err)
	if isIOError(err) {
		r.store.fail(fmt.Errorf("shard %d: %w", r.shardID, err))
	}
	r.failAll(fmt.Errorf("%w: shard %d halted: %w", ErrStopped, r.shardID, err))
}

// stepPeer hands a peer's message to raft. etcd raft panics on a message
// that only a lost or rolled-back local log explains: a leader's commit
// index beyond the end of the log, after this replica acknowledged those
// entries (a data directory wiped, or restored from an older copy, under
// the same replica). That halts this replica, with the reason, instead of
// ending the process with every other shard's replica on the node.
func (r *Replica) stepPeer(m *raftpb.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.fatal(fmt.Errorf("a message from replica %d (%s) contradicts the local Raft log, which was lost or rolled back "+
				"(a wiped or restored data directory?); remove this node's replica and let the shard re-replicate: %v", m.GetFrom(), m.GetType(), p))
			err = nil
		}
	}()
	return r.rn.Step(m)
}

// failAll fails every waiting call; later calls fail with err too.
func (r *Replica) failAll(err error) {
	r.mu.Lock()
	if r.stopErr == nil {
		r.stopErr = err
	}
	r.setBacklogged(false)
	if r.firstLeader != nil {
		close(r.firstLeader)
		r.firstLeader = nil
	}
	props, reads, ops := r.props, r.reads, r.ops
	r.props, r.reads, r.ops = nil, nil, nil
	r.mu.Unlock()
	for _, p := range props {
		p.finish(nil, err)
	}
	for _, w := range reads {
		w.done <- err
	}
	for _, op := range ops {
		op.done <- err
	}
	// Proposals handed to Raft may have committed on the other replicas.
	unknown := err
	if !errors.Is(err, ErrOutcomeUnknown) {
		unknown = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	for _, p := range r.waiters {
		p.finish(nil, unknown)
	}
	r.waiters = make(map[uint64]*proposal)
	for _, p := range r.parked {
		p.finish(nil, err) // never handed to Raft: not applied
	}
	r.parked = nil
	for _, b := range r.readBatches {
		for _, w := range b.waiters {
			w.done <- err
		}
	}
	r.readBatches = make(map[string]*readBatch)
	for _, w := range r.appliedWaiters {
		w.done <- err
	}
	r.appliedWaiters = nil
	r.readsWaitApplied.Store(false)
}

// drainQueued hands queued proposals, reads and operations to Raft.
func (r *Replica) drainQueued() {
	r.mu.Lock()
	props, reads, ops := r.props, r.reads, r.ops
	r.props, r.reads, r.ops = nil, nil, nil
	r.mu.Unlock()
	if r.dead() {
		err := ErrReplicaRemoved
		if r.halted {
			err = ErrStopped
		}
		for _, p := range props {
			p.finish(nil, err)
		}
		for _, w := range reads {
			w.done <- err
		}
		for _, op := range ops {
			op.done <- err
		}
		return
	}
	if len(props) > 0 || len(reads) > 0 {
		r.unquiesce()
	}
	bs := r.rn.BasicStatus()
	r.proposeAll(props, &bs)
	if len(reads) > 0 && !r.leaseRead(&bs, reads) {
		r.sendReadIndex(&bs, reads, false)
	}
	for _, op := range ops {
		op.done <- op.fn()
	}
}

// sendReadIndex starts a ReadIndex round for waiters (loop side); renew
// marks a round that only renews the lease.
func (r *Replica) sendReadIndex(bs *raft.BasicStatus, waiters []*readWaiter, renew bool) {
	r.readSeq++
	ctx := make([]byte, 16)
	binary.BigEndian.PutUint64(ctx, r.store.proposal.Add(1))
	binary.BigEndian.PutUint64(ctx[8:], r.readSeq)
	r.readBatches[string(ctx)] = &readBatch{ctx: ctx, waiters: waiters, sent: time.Now(), term: bs.GetTerm(), renew: renew}
	r.rn.ReadIndex(ctx)
}

// leaseDuration is how long a confirmed ReadIndex round lets the leader
// serve reads on its own: an election timeout less two ticks. The voters
// that answered the round heard from this leader after it was sent, and
// with CheckQuorum a voter refuses to vote (or pre-vote) for another
// candidate for an election timeout of its own ticks after hearing from
// its leader; ticks run no faster than the wall clock (missed ticks are
// dropped, not caught up). A quiesced voter does not tick at all, so it
// refuses for longer, not shorter: quiescence keeps the argument (and a
// leader gives up its lease when it quiesces anyway). A leadership
// transfer skips that refusal, so asking for one ends the lease.
func (r *Replica) leaseDuration() time.Duration {
	c := r.store.cfg
	return c.TickInterval * time.Duration(max(1, c.ElectionTicks-2))
}

// leaseRead answers reads from the leader's lease (loop side): with
// Config.LeaseReads, a leader holding a lease in its current term, with no
// transfer under way, reads at its commit index without a round trip, and
// renews the lease in the background once half of it has passed. It
// reports whether it answered them.
func (r *Replica) leaseRead(bs *raft.BasicStatus, reads []*readWaiter) bool {
	if !r.store.cfg.LeaseReads || bs.RaftState != raft.StateLeader || bs.LeadTransferee != 0 || bs.GetTerm() != r.leaseTerm {
		return false
	}
	now := time.Now()
	if !now.Before(r.leaseUntil) {
		return false
	}
	// No other leader can have committed anything since the lease was
	// confirmed: every write acknowledged before these reads started is
	// at or below this leader's commit index.
	idx := bs.GetCommit()
	for _, w := range reads {
		if r.applied >= idx {
			w.done <- nil
		} else {
			w.index = idx
			r.awaitApplied(w)
		}
	}
	if !r.renewing && r.leaseUntil.Sub(now) < r.leaseDuration()/2 {
		r.renewing = true
		r.sendReadIndex(bs, nil, true)
	}
	return true
}

// extendLease extends the lease by a confirmed round b (loop side).
func (r *Replica) extendLease(b *readBatch) {
	if b.renew {
		r.renewing = false
	}
	if !r.store.cfg.LeaseReads {
		return
	}
	bs := r.rn.BasicStatus()
	if bs.RaftState != raft.StateLeader || bs.GetTerm() != b.term || bs.LeadTransferee != 0 || !b.sent.After(r.transferAt) {
		return
	}
	if until := b.sent.Add(r.leaseDuration()); bs.GetTerm() != r.leaseTerm || until.After(r.leaseUntil) {
		r.leaseTerm, r.leaseUntil = bs.GetTerm(), until
	}
}

// propose hands one proposal to Raft as an entry of its own (loop side);
// bs is Raft's status.
func (r *Replica) propose(p *proposal, bs *raft.BasicStatus) {
	var err error
	if p.cc != nil {
		err = r.rn.ProposeConfChange(p.cc)
	} else {
		err = r.rn.Propose(p.data)
	}
	r.proposed([]*proposal{p}, err, bs)
}

// proposed records the outcome err of handing ps, in one entry, to Raft
// (loop side): they wait for their entry, or are parked or answered.
func (r *Replica) proposed(ps []*proposal, err error, bs *raft.BasicStatus) {
	if err != nil {
		for _, p := range ps {
			switch {
			case !errors.Is(err, raft.ErrProposalDropped):
				p.finish(nil, fmt.Errorf("replication: shard %d: propose: %w", r.shardID, err))
			case bs.RaftState == raft.StateLeader && bs.LeadTransferee != 0:
				if len(r.parked) == 0 {
					r.parkedTicks = 0
				}
				r.parked = append(r.parked, p)
			default:
				p.finish(nil, r.notLeaderFrom(bs))
			}
		}
		return
	}
	for _, p := range ps {
		p.term = bs.GetTerm()
		r.waiters[p.id] = p
	}
	if m := r.store.cfg.Metrics; m != nil {
		m.proposals.Add(float64(len(ps)))
	}
}

// resolveParked answers or re-proposes the parked proposals once the
// leadership transfer that parked them ended (loop side): still leader
// with no transfer under way, they are proposed again (only on a tick,
// whose Ready the loop collects next); a follower that knows the new
// leader, or that has waited an election timeout, answers NotLeader.
func (r *Replica) resolveParked(ticked bool) {
	if len(r.parked) == 0 {
		return
	}
	if ticked {
		r.parkedTicks++
	}
	bs := r.rn.BasicStatus()
	leader := bs.RaftState == raft.StateLeader
	switch {
	case leader && bs.LeadTransferee == 0 && ticked:
		ps := r.parked
		r.parked = nil
		r.proposeAll(ps, &bs)
	case !leader && (bs.Lead != 0 || r.parkedTicks >= r.store.cfg.ElectionTicks):
		err := r.notLeaderFrom(&bs)
		for _, p := range r.parked {
			p.finish(nil, err)
		}
		r.parked = nil
	}
}

// tick advances Raft's clock, retries unanswered reads, and quiesces an
// idle group. It reports whether raft was ticked (a quiesced group is not).
func (r *Replica) tick() bool {
	r.ticks++
	if r.quiesced {
		// A quiesced follower wakes up when its leader's node goes quiet;
		// a quiesced leader when it no longer hears from a quorum (it may
		// be cut off, and must tick for CheckQuorum to depose it rather
		// than hold requests until their deadlines).
		if r.quiescedLeaderNode == r.store.cfg.NodeID {
			if r.quorumLive() {
				return false
			}
			r.store.cfg.Logger.Info("quiesced leader lost contact with a quorum; waking up", "shard", r.shardID)
		} else if r.store.nodeLive(r.quiescedLeaderNode) {
			return false
		}
		r.unquiesce()
	}
	r.rn.Tick()
	r.resolveParked(true)
	for _, b := range r.readBatches {
		b.ticks++
		if b.ticks >= r.store.cfg.ElectionTicks {
			b.ticks = 0
			r.rn.ReadIndex(b.ctx)
		}
	}
	r.maybeQuiesceLeader()
	if r.ticks%uint64(r.store.cfg.ElectionTicks) == 0 {
		r.maybeTruncate()
	}
	return true
}

func (r *Replica) unquiesce() {
	if r.quiesced {
		r.quiesced = false
		r.quiescedVoterNodes = nil
		r.stableTicks = 0
		r.refreshStatus()
	}
}

// quorumLive reports whether a quiesced leader's node and the live nodes
// among its other voters' make a quorum.
func (r *Replica) quorumLive() bool {
	live := 1
	for _, n := range r.quiescedVoterNodes {
		if r.store.nodeLive(n) {
			live++
		}
	}
	return live > (len(r.quiescedVoterNodes)+1)/2
}

// maybeQuiesceLeader stops ticking an idle group: the leader has nothing in
// flight, every member has every entry, the commit index has been stable
// for two heartbeats (so followers know it), and every member is reachable.
// Its followers are told to stop ticking too.
func (r *Replica) maybeQuiesceLeader() {
	cfg := r.store.cfg
	if cfg.DisableQuiescence {
		return
	}
	bs := r.rn.BasicStatus()
	if bs.RaftState != raft.StateLeader {
		r.stableTicks = 0
		return
	}
	if bs.GetCommit() != r.lastCommit {
		r.lastCommit = bs.GetCommit()
		r.stableTicks = 0
		return
	}
	r.stableTicks++
	if r.stableTicks < 2*cfg.HeartbeatTicks+1 {
		return
	}
	if len(r.waiters) > 0 || len(r.readBatches) > 0 || len(r.appliedWaiters) > 0 || r.pendingSnap != nil || len(r.sendingSnap) > 0 {
		return
	}
	last, _ := r.log.LastIndex()
	if bs.GetCommit() != last || r.applied != last || bs.LeadTransferee != 0 {
		return
	}
	st := r.rn.Status()
	if len(st.Config.Voters[1]) > 0 || len(st.Config.LearnersNext) > 0 {
		return
	}
	var voterNodes []uint64
	for id, pr := range st.Progress {
		if id == r.replicaID {
			continue
		}
		n := r.NodeOf(id)
		if pr.Match != last || n == 0 || !cfg.Transport.Reachable(n) || !r.store.nodeLive(n) {
			return
		}
		if _, voter := st.Config.Voters[0][id]; voter {
			voterNodes = append(voterNodes, n)
		}
	}
	if _, voter := st.Config.Voters[0][r.replicaID]; !voter {
		return
	}
	r.quiesced = true
	r.quiescedLeaderNode = cfg.NodeID
	r.quiescedVoterNodes = voterNodes
	// A quiesced leader holds no lease: the first read after the group
	// wakes confirms a ReadIndex round again (see leaseRead).
	r.leaseUntil = time.Time{}
	r.notifyQuiesce = true
	r.store.quiescing = append(r.store.quiescing, r)
	r.refreshStatus()
}

// maybeQuiesceFollower quiesces a follower on its leader's notice, if it
// has applied everything it has and agrees on who leads.
func (r *Replica) maybeQuiesceFollower(fromNode uint64) {
	bs := r.rn.BasicStatus()
	if bs.RaftState != raft.StateFollower || bs.Lead == 0 || r.NodeOf(bs.Lead) != fromNode {
		return
	}
	last, _ := r.log.LastIndex()
	if bs.GetCommit() != last || r.applied != last {
		return
	}
	r.quiesced = true
	r.quiescedLeaderNode = fromNode
	r.refreshStatus()
}

// appendQuiesceNotices tells followers' nodes that this group quiesced.
func (r *Replica) appendQuiesceNotices(out map[uint64]*shalev1.RaftMessageBatch) {
	if !r.notifyQuiesce || r.dead() {
		return
	}
	r.notifyQuiesce = false
	r.mu.Lock()
	defer r.mu.Unlock()
	for rid, n := range r.nodes {
		if rid == r.replicaID || n == r.store.cfg.NodeID {
			continue
		}
		b := r.store.batchFor(out, n)
		b.QuiescedShards = append(b.QuiescedShards, r.shardID)
	}
}

func (s *Store) batchFor(out map[uint64]*shalev1.RaftMessageBatch, node uint64) *shalev1.RaftMessageBatch {
	b, ok := out[node]
	if !ok {
		b = s.newBatch(node)
		out[node] = b
	}
	return b
}

// newBatch is an empty batch of Raft messages to node, with what every
// batch tells its receiver of this node: its features and whether it is
// applying a backlog.
func (s *Store) newBatch(node uint64) *shalev1.RaftMessageBatch {
	return &shalev1.RaftMessageBatch{ClusterId: s.cfg.ClusterID, FromNodeId: s.cfg.NodeID, ToNodeId: node,
		Features: s.features(), ApplyingBacklog: s.ApplyingBacklog()}
}

// noteNode records which node a replica lives on, learned from traffic or a
// configuration change not yet applied, for a replica whose node is not
// known yet. A replica never moves (a replica ID is never reused), so a
// known mapping is kept: a message claiming otherwise is logged, never
// believed, and only the descriptor (updateNodes) can correct a mapping.
func (r *Replica) noteNode(replicaID, nodeID uint64, source string) {
	if replicaID == 0 || nodeID == 0 {
		return
	}
	r.mu.Lock()
	old := r.nodes[replicaID]
	report := false
	if old == 0 {
		r.nodes[replicaID] = nodeID
	} else if claim := [2]uint64{replicaID, nodeID}; old != nodeID && !r.conflicts[claim] {
		if r.conflicts == nil {
			r.conflicts = make(map[[2]uint64]bool)
		}
		r.conflicts[claim] = true
		report = true
	}
	r.mu.Unlock()
	if report {
		r.store.cfg.Logger.Warn("ignoring a conflicting node for a replica", "shard", r.shardID,
			"replica", replicaID, "known_node", old, "claimed_node", nodeID, "source", source)
	}
}

// updateNodes records the nodes of the descriptor's replicas: the applied
// descriptor is the authority on where each replica lives.
func (r *Replica) updateNodes(desc *shalev1.ShardDescriptor) {
	if desc == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rd := range desc.GetReplicas() {
		id, node := rd.GetReplicaId(), rd.GetNodeId()
		if node == 0 {
			continue
		}
		if old := r.nodes[id]; old != 0 && old != node {
			r.store.cfg.Logger.Warn("the descriptor corrects a replica's node", "shard", r.shardID,
				"replica", id, "was", old, "now", node, "epoch", desc.GetEpoch())
		}
		r.nodes[id] = node
	}
}

// sendMessages routes Raft messages to their nodes' batches; snapshots go
// out of band. A halted or removed replica sends nothing: a replica halted
// while applying, before its cycle's log write, skips that write, and its
// messages of the cycle acknowledge entries it never wrote (chaos/README
// bug 11). Appends and acknowledgements that others of the same Ready
// make redundant are merged first (coalesceMessages).
func (r *Replica) sendMessages(msgs []*raftpb.Message, out map[uint64]*shalev1.RaftMessageBatch) {
	if r.dead() {
		return
	}
	msgs = coalesceMessages(msgs)
	// The envelopes of a Ready's messages are allocated together (a
	// heartbeat round of a read index is a message per follower).
	var envs []shalev1.RaftEnvelope
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			r.startSnapshotSend(m)
			continue
		}
		n := r.NodeOf(m.GetTo())
		if n == 0 {
			r.store.cfg.Logger.Debug("no node for replica", "shard", r.shardID, "replica", m.GetTo())
			continue
		}
		if m.GetType() == raftpb.MsgApp && !r.store.cfg.Transport.Reachable(n) {
			r.rn.ReportUnreachable(m.GetTo())
		}
		data, err := codec.Marshal(m)
		if err != nil {
			r.store.cfg.Logger.Error("marshal raft message", "err", err)
			continue
		}
		if len(envs) == 0 {
			envs = make([]shalev1.RaftEnvelope, len(msgs))
		}
		env := &envs[0]
		envs = envs[1:]
		env.ShardId, env.Message = r.shardID, data
		b := r.store.batchFor(out, n)
		b.Messages = append(b.Messages, env)
	}
}

// snapshotOf is the Raft snapshot (metadata only) of an applied state.
func snapshotOf(st AppliedState) *raftpb.Snapshot {
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index:     proto.Uint64(st.Index),
		Term:      proto.Uint64(st.Term),
		ConfState: proto.Clone(st.ConfState).(*raftpb.ConfState),
	}}
}

// startSnapshotSend checkpoints the state machine and streams it to the
// member that needs it, then reports the outcome to Raft. The MsgSnap's
// metadata is replaced by the checkpoint's (at or after what Raft asked
// for), so the data and the metadata always agree.
func (r *Replica) startSnapshotSend(m *raftpb.Message) {
	to := m.GetTo()
	if r.sendingSnap[to] {
		return
	}
	node := r.NodeOf(to)
	if node == 0 {
		r.rn.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	r.sendingSnap[to] = true
	s := r.store
	m = proto.Clone(m).(*raftpb.Message)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		status := raft.SnapshotFailure
		defer func() {
			st := status
			_ = r.runOnLoop(context.Background(), func() error {
				delete(r.sendingSnap, to)
				if !r.dead() {
					r.rn.ReportSnapshot(to, st)
				}
				return nil
			})
		}()
		select {
		case s.snapSem <- struct{}{}:
		case <-s.stop:
			return
		}
		defer func() { <-s.snapSem }()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		dir := filepath.Join(s.cfg.SnapshotDir, fmt.Sprintf("shard-%d-to-%d-%d", r.shardID, to, time.Now().UnixNano()))
		defer os.RemoveAll(dir)
		start := time.Now()
		st, err := r.sm.Checkpoint(dir)
		if err != nil {
			s.cfg.Logger.Warn("snapshot checkpoint failed", "shard", r.shardID, "err", err)
			return
		}
		m.Snapshot = snapshotOf(st)
		data, err := proto.Marshal(m)
		if err != nil {
			return
		}
		header := &shalev1.SnapshotHeader{
			ClusterId:   s.cfg.ClusterID,
			ShardId:     r.shardID,
			FromNodeId:  s.cfg.NodeID,
			ToNodeId:    node,
			RaftMessage: data,
			Descriptor_: st.Descriptor,
		}
		if err := s.cfg.Transport.SendSnapshot(ctx, header, dir); err != nil {
			s.cfg.Logger.Warn("snapshot send failed", "shard", r.shardID, "to_node", node, "err", err)
			if m := s.cfg.Metrics; m != nil {
				m.snapshotsFailed.Inc()
			}
			return
		}
		s.cfg.Logger.Info("snapshot sent", "shard", r.shardID, "to_node", node, "index", st.Index, "took", time.Since(start))
		if m := s.cfg.Metrics; m != nil {
			m.snapshotsSent.Inc()
		}
		status = raft.SnapshotFinish
	}()
}

// snapInstall is a snapshot being installed into a replica's state
// machine off the loop. The worker reads only in; the rest is loop only.
type snapInstall struct {
	in *incomingSnapshot
	// rd is the Ready that carries the snapshot: held (not persisted,
	// sent or advanced) until the state machine holds the snapshot.
	rd raft.Ready
	// restored: the worker's Restore succeeded.
	restored bool
	// held are the messages for the replica that arrived meanwhile,
	// delivered once the install is finished.
	held heldMessages
	// work: proposals, reads or operations were queued meanwhile.
	work bool
}

// startInstall hands the restore of rd's snapshot to the apply workers, as
// the replica's last task (after the entries handed off before it), and
// holds rd: until the worker reports, the replica takes no messages, ticks
// or proposals and nothing of rd is persisted or sent, while the loop
// serves the node's other replicas. A crash meanwhile leaves the state
// machine with the old state or the snapshot, and the log as it was;
// AddReplica realigns a log the state machine got ahead of.
func (r *Replica) startInstall(rd raft.Ready) error {
	in := r.pendingSnap
	idx := rd.Snapshot.GetMetadata().GetIndex()
	if in == nil || in.msg.GetSnapshot().GetMetadata().GetIndex() != idx {
		return fmt.Errorf("replication: shard %d: raft asked to install snapshot %d without its data", r.shardID, idx)
	}
	r.pendingSnap = nil
	in.installing = true
	r.installing = &snapInstall{in: in, rd: rd}
	r.store.applier.enqueue(r, applyTask{install: r.installing})
	return nil
}

// finishInstall stages the log reset to the restored snapshot (the
// installing Ready's) into wb, the cycle's synced write.
func (r *Replica) finishInstall(wb *storage.Batch) error {
	snap, hs := r.installing.rd.Snapshot, r.installing.rd.HardState
	idx, term := snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm()
	if raft.IsEmptyHardState(hs) {
		hs = r.log.HardState()
	}
	hs = proto.Clone(hs).(*raftpb.HardState)
	if hs.GetCommit() < idx {
		hs.Commit = proto.Uint64(idx)
	}
	if err := r.log.ApplySnapshot(wb, idx, term, hs); err != nil {
		return fmt.Errorf("reset the log to snapshot %d: %w", idx, err)
	}
	r.applied = idx
	r.updateNodes(r.sm.AppliedState().Descriptor)
	return nil
}

// abandonInstall answers the install of a replica that stopped (once no
// worker runs its Restore any more): the sender gets err.
func (r *Replica) abandonInstall(err error) {
	if inst := r.installing; inst != nil {
		r.installing = nil
		inst.in.answer(fmt.Errorf("replication: shard %d: the replica stopped during the snapshot's install: %w", r.shardID, err))
	}
}

// endInstall ends the install once its Ready was written, sent and
// advanced: the sender gets its answer, and the messages and work held
// meanwhile go to the next cycle.
func (r *Replica) endInstall() {
	inst := r.installing
	r.installing = nil
	inst.in.answer(nil)
	s := r.store
	if m := s.cfg.Metrics; m != nil {
		m.snapshotsApplied.Inc()
	}
	s.cfg.Logger.Info("snapshot installed", "shard", r.shardID, "index", inst.rd.Snapshot.GetMetadata().GetIndex())
	s.requeue(inst.held, nil)
	if inst.work {
		s.queueWork(r)
	}
}

// resendReads asks again for the index of every read round in flight once
// a leader is known after a change of leader or role (loop side): Raft
// forgets the rounds a leader had not confirmed when it stepped down (as
// a leadership transfer makes it), and drops those a follower forwarded
// while it knew no leader; the tick would resend them only an election
// timeout later, and their reads waited that long. A round resent is
// still sent after its reads arrived; one confirmed twice is answered
// once (handleReadStates ignores a context it no longer holds), and a
// confirmation of another term extends no lease (extendLease).
func (r *Replica) resendReads(lead uint64) {
	if lead == 0 {
		return
	}
	for _, b := range r.readBatches {
		b.ticks = 0
		r.rn.ReadIndex(b.ctx)
	}
}

// awaitApplied queues w until the replica applied w.index (loop side).
// Reports of applies that the loop has not taken in yet may hold it: if
// any are queued, the loop runs another cycle at once; later ones wake
// it (Store.report).
func (r *Replica) awaitApplied(w *readWaiter) {
	r.appliedWaiters = append(r.appliedWaiters, w)
	r.readsWaitApplied.Store(true)
	s := r.store
	s.mu.Lock()
	queued := len(s.applyReports) > 0
	s.mu.Unlock()
	if queued {
		s.signal()
	}
}

// handleReadStates answers read batches whose index Raft confirmed.
func (r *Replica) handleReadStates(states []raft.ReadState) {
	for _, rs := range states {
		b, ok := r.readBatches[string(rs.RequestCtx)]
		if !ok {
			continue
		}
		delete(r.readBatches, string(rs.RequestCtx))
		r.extendLease(b)
		for _, w := range b.waiters {
			if r.applied >= rs.Index {
				w.done <- nil
			} else {
				w.index = rs.Index
				r.awaitApplied(w)
			}
		}
	}
}

func inConf(cs *raftpb.ConfState, id uint64) bool {
	for _, set := range [][]uint64{cs.GetVoters(), cs.GetVotersOutgoing(), cs.GetLearners(), cs.GetLearnersNext()} {
		for _, v := range set {
			if v == id {
				return true
			}
		}
	}
	return false
}

// afterReady updates the cached status and fails proposals orphaned by a
// lost leadership.
func (r *Replica) afterReady(rd raft.Ready) {
	if rd.SoftState != nil {
		leader := rd.SoftState.RaftState == raft.StateLeader
		if r.wasLeader && !leader && len(r.waiters) > 0 {
			for _, p := range r.waiters {
				p.finish(nil, ErrOutcomeUnknown)
			}
			r.waiters = make(map[uint64]*proposal)
		}
		if leader != r.wasLeader {
			if m := r.store.cfg.Metrics; m != nil && leader {
				m.leaderChanges.Inc()
			}
		}
		r.wasLeader = leader
		r.unquiesce()
		r.resendReads(rd.SoftState.Lead)
	}
	r.refreshStatus()
	r.resolveParked(false)
}

// setBacklogged records whether the replica holds more than
// applyBacklogEntries committed entries unapplied, in its Store's count
// (under r.mu).
func (r *Replica) setBacklogged(b bool) {
	if b == r.backlogged {
		return
	}
	r.backlogged = b
	if b {
		r.store.backlogged.Add(1)
	} else {
		r.store.backlogged.Add(-1)
	}
}

// noteCommitted records, before the status is refreshed, whether the
// replica holds a backlog with commit as its commit index.
func (r *Replica) noteCommitted(commit uint64) {
	r.mu.Lock()
	r.noteBacklogLocked(commit)
	r.mu.Unlock()
}

// noteBacklogLocked records whether a serving replica with commit as its
// commit index holds more than applyBacklogEntries entries unapplied
// (under r.mu).
func (r *Replica) noteBacklogLocked(commit uint64) {
	r.setBacklogged(r.stopErr == nil && commit > r.applied+applyBacklogEntries)
}

func (r *Replica) refreshStatus() {
	bs := r.rn.BasicStatus()
	last, _ := r.log.LastIndex()
	r.mu.Lock()
	r.status = Status{
		ShardID:         r.shardID,
		ReplicaID:       r.replicaID,
		NodeID:          r.store.cfg.NodeID,
		Leader:          bs.RaftState == raft.StateLeader,
		LeaderReplicaID: bs.Lead,
		LeaderNodeID:    r.nodes[bs.Lead],
		Term:            bs.GetTerm(),
		Commit:          bs.GetCommit(),
		Applied:         r.applied,
		LastIndex:       last,
		Quiesced:        r.quiesced,
	}
	r.noteBacklogLocked(bs.GetCommit())
	if (bs.Lead != 0 && bs.Lead != r.replicaID) || (bs.RaftState == raft.StateLeader && bs.LeadTransferee == 0) {
		r.transferTo = 0 // a new leader is known, or the transfer ended
	}
	if bs.Lead != 0 && r.firstLeader != nil {
		close(r.firstLeader)
		r.firstLeader = nil
	}
	r.mu.Unlock()
}

// maybeTruncate truncates the log once enough applied entries piled up:
// the state machine is flushed in the background first, so that a restart
// never needs an entry that is gone.
func (r *Replica) maybeTruncate() {
	s := r.store
	if s.truncating[r.shardID] || r.dead() {
		return
	}
	trunc := r.log.TruncatedIndex()
	if r.applied <= trunc || (r.applied-trunc < s.cfg.LogTruncateEntries && uint64(r.log.SizeBytes()) < s.cfg.LogTruncateBytes) {
		return
	}
	s.truncating[r.shardID] = true
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		durable, err := r.sm.Flush()
		_ = r.runOnLoop(context.Background(), func() error {
			delete(s.truncating, r.shardID)
			if err != nil {
				s.cfg.Logger.Warn("flush for log truncation failed", "shard", r.shardID, "err", err)
				return nil
			}
			if r.dead() {
				return nil
			}
			idx := min(durable, r.applied)
			// Keep the tail lagging followers need unless the log is large:
			// a live follower's up to twice LogTruncateBytes, that of a
			// follower whose node went quiet (restarting, cut off) up to
			// LogTruncateBytes for LogKeepForDownNodes. A follower being
			// sent a snapshot (or probed after one) needs the log after the
			// snapshot's index: truncating past it while the snapshot
			// streams and installs (seconds) would send another.
			if r.rn.BasicStatus().RaftState == raft.StateLeader {
				size := uint64(r.log.SizeBytes())
				for id, pr := range r.rn.Status().Progress {
					if id == r.replicaID {
						continue
					}
					need := pr.Match
					switch pr.State {
					case tracker.StateSnapshot:
						need = pr.PendingSnapshot
					case tracker.StateProbe:
						need = max(pr.Match, pr.Next-1)
					}
					if need < r.log.TruncatedIndex() || need >= idx {
						continue
					}
					node := r.NodeOf(id)
					if (size < 2*s.cfg.LogTruncateBytes && (s.nodeLive(node) || pr.State == tracker.StateSnapshot)) ||
						(size < s.cfg.LogTruncateBytes && s.nodeHeardWithin(node, s.cfg.LogKeepForDownNodes)) {
						idx = need
					}
				}
			}
			if idx <= r.log.TruncatedIndex() {
				return nil
			}
			b := storage.NewBatch()
			if err := r.log.Compact(b, idx); err != nil {
				s.cfg.Logger.Warn("log truncation", "shard", r.shardID, "err", err)
				return nil
			}
			if err := s.log.Commit(b); err != nil {
				s.cfg.Logger.Error("log truncation: log engine", "shard", r.shardID, "err", err)
			}
			return nil
		})
	}()
}
