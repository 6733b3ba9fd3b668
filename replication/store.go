// Package replication runs the Raft groups of one node: a Store hosts many
// Replicas (one raft.RawNode per shard) and drives them all from one loop
// that batches Ready handling across groups. Each cycle makes the log entries
// and hard states of every group durable with a single sync of the node's
// Raft-log engine before any message that depends on them leaves, then
// applies committed entries to the shards' state machines.
//
// The package knows the shard state machines only through the StateMachine
// interface and the network only through Transport.
package replication

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication/hlc"
	"github.com/shale-db/shale/replication/raftlog"
	"github.com/shale-db/shale/storage"
)

// Config configures a Store. Zero fields take the documented defaults.
type Config struct {
	// NodeID is this node's ID (non-zero).
	NodeID uint64
	// ClusterID is stamped on every outgoing batch.
	ClusterID string
	// LogDB is the node's Raft-log engine. The Store writes it with Sync.
	LogDB *storage.DB
	// Transport carries messages to other nodes.
	Transport Transport
	// TickInterval is the Raft tick (default 100ms).
	TickInterval time.Duration
	// ElectionTicks is the election timeout in ticks (default 10).
	ElectionTicks int
	// HeartbeatTicks is the heartbeat interval in ticks (default 2).
	HeartbeatTicks int
	// LeaseReads serves linearizable reads on the leader from a lease
	// instead of a ReadIndex round trip each: a confirmed round lets the
	// leader serve reads alone for an election timeout less two ticks from
	// when the round was sent (under CheckQuorum no other leader can be
	// elected sooner), and asking for a leadership transfer or quiescing
	// ends it. It relies on bounded clock drift.
	LeaseReads bool
	// DisableQuiescence keeps idle groups ticking and heartbeating.
	DisableQuiescence bool
	// DisablePackedEntries makes the node's leaders give every proposal a
	// Raft entry of its own, and the node stop advertising that it reads
	// packed entries, as a node that predates them (so no leader of
	// another node packs for a shard it hosts). It still reads them. See
	// packed.go.
	DisablePackedEntries bool
	// StateMachineFeatures are what the node's state machine reads beyond
	// what every version did (FeatureCompactCommands), advertised to peers
	// with the Raft layer's own features; a proposer checks that every
	// node of a shard reads one before using it (Replica.NodesRead).
	StateMachineFeatures Feature
	// SnapshotDir is where outgoing snapshot checkpoints are staged (default
	// a "snapshots" directory in the OS temp dir).
	SnapshotDir string
	// MaxConcurrentSnapshots bounds outgoing snapshot streams (default 2).
	MaxConcurrentSnapshots int
	// MaxProposalBytes bounds one proposal (default 8 MiB).
	MaxProposalBytes int
	// MaxInflightProposals bounds proposals waiting per replica (default
	// 10,000); beyond it Propose returns ErrBusy.
	MaxInflightProposals int
	// LogTruncateEntries is how many applied entries a replica keeps before
	// its log is truncated (default 1,000); LogTruncateBytes bounds the
	// log's size the same way (default 64 MiB).
	LogTruncateEntries uint64
	LogTruncateBytes   uint64
	// LogKeepForDownNodes is how long a leader keeps the log tail a
	// follower still needs after the follower's node was last heard from
	// (default 5 minutes; negative: not at all), while the log is under
	// LogTruncateBytes: a node restarted or cut off for less catches up
	// from the log, not by a snapshot. A live follower's tail is kept
	// until the log holds twice LogTruncateBytes.
	LogKeepForDownNodes time.Duration
	// OpenReplica creates the (empty) state machine of a replica this node
	// learns of from a message — a replica just added to a shard, which
	// will be filled by a snapshot. It runs off the Raft loop, in two
	// steps. OpenReplica itself claims the replica's place (a server: its
	// shard's directory, emptied) while no replica of the node applies,
	// since an apply may host the same shard (a split's new shard, which
	// the split leaves alone once its place is taken): it must be quick.
	// The function it returns then opens the state machine there while the
	// node's replicas apply and the loop serves them. Until the open is
	// done the shard's messages wait for the replica (see createOnDemand).
	OpenReplica func(shardID uint64) (open func() (StateMachine, error), err error)
	// ReplicaRemoved is called after a replica was removed from its shard
	// and closed; the callee deletes its data. It runs off the Raft loop
	// (the loop serves the node's other replicas meanwhile), and the Store
	// creates no new replica of the shard until it returned.
	ReplicaRemoved func(shardID uint64)
	// Logger receives the Store's logs (default slog.Default()).
	Logger *slog.Logger
	// Metrics, when set, records Raft metrics.
	Metrics *Metrics
	// ApplyWorkers is how many goroutines apply committed entries to the
	// state machines, each replica's in order and the replicas in parallel
	// (default GOMAXPROCS, at least 2).
	ApplyWorkers int
	// applyHook, when set (by tests), runs on an apply worker before each
	// state machine call, with the shard's ID.
	applyHook func(shardID uint64)
	// earlySendHook, when set (by tests), sees each batch a cycle sends
	// before its write (the leaders' messages), on the loop.
	earlySendHook func(b *shalev1.RaftMessageBatch)
	// Clock, when set, is the node's hybrid logical clock: every batch
	// sent carries its reading, and every batch received moves it past the
	// sender's (a reading beyond the clock's maximum offset is refused and
	// logged; the batch is delivered all the same).
	Clock *hlc.Clock
	// TracerProvider, when set, traces the proposals made under a
	// recording span: a propose span until the entry commits and an apply
	// span until it applied, on the proposing replica (docs/tracing.md).
	// Nil traces nothing, at no cost.
	TracerProvider trace.TracerProvider
}

func (c *Config) applyDefaults() {
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 2
	}
	if c.SnapshotDir == "" {
		c.SnapshotDir = filepath.Join(os.TempDir(), "shale-snapshots")
	}
	if c.MaxConcurrentSnapshots == 0 {
		c.MaxConcurrentSnapshots = 2
	}
	if c.MaxProposalBytes == 0 {
		c.MaxProposalBytes = 8 << 20
	}
	if c.MaxInflightProposals == 0 {
		c.MaxInflightProposals = 10000
	}
	if c.LogTruncateEntries == 0 {
		c.LogTruncateEntries = 1000
	}
	if c.LogTruncateBytes == 0 {
		c.LogTruncateBytes = 64 << 20
	}
	if c.LogKeepForDownNodes == 0 {
		c.LogKeepForDownNodes = 5 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ApplyWorkers == 0 {
		c.ApplyWorkers = max(2, runtime.GOMAXPROCS(0))
	}
}

// Store hosts the Replicas of one node and runs their Raft loop. It is a
// Handler for its Transport's incoming traffic.
type Store struct {
	cfg  Config
	log  *raftlog.Store
	rlog raft.Logger
	// tracer is Config.TracerProvider's (nil without one).
	tracer trace.Tracer

	// refuseUntil (unix nanoseconds) drops leadership transfers to local
	// replicas until then (RefuseLeadershipTransfersUntil).
	refuseUntil atomic.Int64
	// syncs times the Raft-log syncs (LogSyncs).
	syncs syncTimes
	// clockWarned maps a peer node ID to the time (*atomic.Int64, unix
	// nanoseconds) its clock was last reported too far ahead.
	clockWarned sync.Map

	mu       sync.Mutex
	replicas map[uint64]*Replica
	inbox    []*shalev1.RaftMessageBatch
	snapIn   []*incomingSnapshot
	work     map[*Replica]struct{} // replicas with queued proposals/reads/ops
	stopped  bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
	// failed is closed, with failErr set first, when the node's storage
	// failed (see Failed).
	failed   chan struct{}
	failOnce sync.Once
	failErr  error
	started  atomic.Bool
	proposal atomic.Uint64 // proposal ID source
	snapSem  chan struct{}
	bg       sync.WaitGroup

	// applier applies committed entries off the loop (see apply.go);
	// applyReports are its workers' reports for the loop (under mu).
	applier      *applyPool
	applyReports []applyReport
	// hostMu orders the claim of an on-demand replica's place (Lock; see
	// Config.OpenReplica) after the applies in progress (RLock): a split's
	// apply creates its new shard's replica, which a message of the new
	// group must not create meanwhile.
	hostMu sync.RWMutex

	// Loop-only state.
	lastHeard map[uint64]time.Time // node → last batch received (under mu)
	// peerBacklog holds the nodes whose last batch said they were applying
	// a backlog (under mu).
	peerBacklog map[uint64]bool
	// backlogged counts the replicas holding more than applyBacklogEntries
	// committed entries unapplied (Replica.backlogged).
	backlogged atomic.Int64
	// peerFeatures maps each node to the features it advertised on its
	// last batch (see Replica.NodesRead): replaced, never changed in place,
	// under mu, when a node's features change; read without a lock.
	peerFeatures atomic.Pointer[map[uint64]Feature]
	lastBeat     time.Time
	truncating   map[uint64]bool
	// quiesceNotices are this cycle's quiesce notices from leaders.
	quiesceNotices []quiesceNotice
	// active are the replicas stepped, ticked or proposed to this cycle
	// (or left with a Ready by the last one): only they can have a Ready.
	active map[*Replica]struct{}
	// Spares the loop swaps with inbox, work and active each cycle, and
	// the cycle's readies, kept emptied (clear) between cycles so that a
	// cycle allocates no new slices or maps for them: at one get at a
	// time these were 23 of a get's 259 allocations (BenchmarkGet).
	// inboxSpare and workSpare are loop-only; the loop hands them to
	// inbox and work under mu.
	inboxSpare  []*shalev1.RaftMessageBatch
	workSpare   map[*Replica]struct{}
	activeSpare map[*Replica]struct{}
	readies     []readyReplica
	// quiescing are leaders that quiesced this cycle and must tell their
	// followers.
	quiescing []*Replica
	// logBatch is the batch of the last cycle's log write, kept for the
	// next one (loop only).
	logBatch *storage.Batch
	// hosting are the shards whose replica on this node is being opened
	// or removed off the loop (guarded by mu; see hostChange); opened are
	// the opens done, for the loop to take in (guarded by mu).
	hosting map[uint64]*hostChange
	opened  []*hostChange
	// earlyVotes are vote requests for shards this node does not host yet
	// (guarded by mu; see holdEarlyVote).
	earlyVotes map[uint64]*earlyVotes
	// peers caches peerNodes (loop only), computed at peersAt.
	peers   []uint64
	peersAt time.Time
}

type incomingSnapshot struct {
	header *shalev1.SnapshotHeader
	msg    *raftpb.Message
	dir    string
	done   chan error
	// answered is set once done has its one value (by the loop, or by
	// whoever drops the install's task).
	answered atomic.Bool
	// installing is set (on the loop) once the snapshot was handed to an
	// apply worker: its answer comes when the install ends.
	installing bool
	// held is set (on the loop) while the snapshot is kept for a replica
	// being opened: it is stepped, and answered, once the replica is.
	held bool
}

// answer gives the snapshot's sender its outcome, once.
func (in *incomingSnapshot) answer(err error) {
	if in.answered.CompareAndSwap(false, true) {
		in.done <- err
	}
}

// NewStore opens the Raft-log state in cfg.LogDB. Add replicas with
// AddReplica, then Start the loop.
func NewStore(cfg Config) (*Store, error) {
	cfg.applyDefaults()
	if cfg.NodeID == 0 {
		return nil, errors.New("replication: NodeID must be non-zero")
	}
	if cfg.LogDB == nil || cfg.Transport == nil {
		return nil, errors.New("replication: LogDB and Transport are required")
	}
	if err := os.MkdirAll(cfg.SnapshotDir, 0o755); err != nil {
		return nil, fmt.Errorf("replication: snapshot dir: %w", err)
	}
	s := &Store{
		cfg:         cfg,
		log:         raftlog.New(cfg.LogDB, raftlog.Options{}),
		rlog:        raftLogger{l: cfg.Logger.With("component", "raft")},
		replicas:    make(map[uint64]*Replica),
		work:        make(map[*Replica]struct{}),
		wake:        make(chan struct{}, 1),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
		failed:      make(chan struct{}),
		snapSem:     make(chan struct{}, cfg.MaxConcurrentSnapshots),
		lastHeard:   make(map[uint64]time.Time),
		peerBacklog: make(map[uint64]bool),
		truncating:  make(map[uint64]bool),
		hosting:     make(map[uint64]*hostChange),
		earlyVotes:  make(map[uint64]*earlyVotes),
		active:      make(map[*Replica]struct{}),
		workSpare:   make(map[*Replica]struct{}),
		activeSpare: make(map[*Replica]struct{}),
	}
	s.peerFeatures.Store(&map[uint64]Feature{})
	s.applier = newApplyPool(s)
	s.proposal.Store(rand.Uint64() >> 16)
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	return s, nil
}

// NodeID returns the node's ID.
func (s *Store) NodeID() uint64 { return s.cfg.NodeID }

// Start runs the Raft loop until Stop.
func (s *Store) Start() {
	if s.started.Swap(true) {
		return
	}
	s.applier.start(s.cfg.ApplyWorkers)
	go s.run()
}

// Stop stops the loop and the background work, fails every waiting call
// with ErrStopped, and closes nothing else (the state machines and the log
// engine belong to the caller).
func (s *Store) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	s.mu.Unlock()
	close(s.stop)
	if s.started.Load() {
		<-s.done
		// What was handed off applies (the state machines are still open).
		s.applier.stop()
	}
	s.bg.Wait()
	s.mu.Lock()
	reps := make([]*Replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		reps = append(reps, r)
	}
	inc := s.snapIn
	s.snapIn = nil
	opened := s.opened
	s.opened = nil
	s.mu.Unlock()
	for _, in := range inc {
		_ = os.RemoveAll(in.dir)
		in.answer(ErrStopped)
	}
	// Replicas opened on demand that the loop did not take in: their state
	// machines were never the caller's.
	for _, w := range opened {
		w.abandon(s, ErrStopped)
	}
	// Installs the loop did not finish: their state machines may hold the
	// snapshot, and a restart realigns the log to it.
	for _, r := range reps {
		if r.installing != nil {
			r.installing.in.answer(ErrStopped)
		}
	}
	for _, r := range reps {
		r.failAll(ErrStopped)
	}
}

// RefuseLeadershipTransfersUntil makes the node's replicas refuse
// leadership transfers from their leaders until deadline (the zero time:
// accept them again): a refused transfer times out and the leader stays.
// Elections are not affected. A node about to stop refuses them so that no
// shard's leadership moves onto it.
func (s *Store) RefuseLeadershipTransfersUntil(deadline time.Time) {
	var ns int64
	if !deadline.IsZero() {
		ns = deadline.UnixNano()
	}
	s.refuseUntil.Store(ns)
}

// Replica returns the shard's local replica, or nil.
func (s *Store) Replica(shardID uint64) *Replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replicas[shardID]
}

// Replicas returns the local replicas sorted by shard ID.
func (s *Store) Replicas() []*Replica {
	s.mu.Lock()
	out := make([]*Replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		out = append(out, r)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].shardID < out[j].shardID })
	return out
}

// Key prefixes of the Store's own records in the log engine (the raftlog
// package uses 'r').
const (
	replicaIDPrefix = 'n' // 'n' + shardID → this node's replica ID in the shard
	tombstonePrefix = 'z' // 'z' + shardID → lowest replica ID still allowed here
)

func storeKey(prefix byte, shardID uint64) []byte {
	k := make([]byte, 9)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:], shardID)
	return k
}

func (s *Store) readUint(prefix byte, shardID uint64) (uint64, bool, error) {
	v, err := s.cfg.LogDB.Get(storeKey(prefix, shardID))
	if errors.Is(err, storage.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if len(v) != 8 {
		return 0, false, fmt.Errorf("replication: shard %d: record %q has %d bytes, want 8", shardID, prefix, len(v))
	}
	return binary.BigEndian.Uint64(v), true, nil
}

func putUint(b *storage.Batch, prefix byte, shardID, v uint64) {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], v)
	b.Set(storeKey(prefix, shardID), buf[:])
}

// InitialIndex and InitialTerm are where the log of a bootstrapped shard
// starts: its first state is treated as a snapshot at this index and term.
const (
	InitialIndex = 10
	InitialTerm  = 5
)

// BootstrapState returns the applied state of a freshly created shard whose
// voters are the descriptor's replicas.
func BootstrapState(desc *shalev1.ShardDescriptor) AppliedState {
	cs := &raftpb.ConfState{}
	for _, r := range desc.GetReplicas() {
		if r.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_LEARNER {
			cs.Learners = append(cs.Learners, r.GetReplicaId())
		} else {
			cs.Voters = append(cs.Voters, r.GetReplicaId())
		}
	}
	return AppliedState{Index: InitialIndex, Term: InitialTerm, ConfState: cs, Descriptor: desc}
}

// AddReplica hosts sm's shard on this node. The replica's Raft ID is the
// descriptor's replica on this node, or the ID recorded when the replica was
// created on demand. A state machine at a later applied index than the log
// (a snapshot installed just before a crash) realigns the log to it.
func (s *Store) AddReplica(sm StateMachine) (*Replica, error) {
	st := sm.AppliedState()
	shardID := st.Descriptor.GetShardId()
	var replicaID uint64
	for _, rd := range st.Descriptor.GetReplicas() {
		if rd.GetNodeId() == s.cfg.NodeID {
			replicaID = rd.GetReplicaId()
		}
	}
	if st.Descriptor == nil {
		return nil, errors.New("replication: AddReplica needs an initialized state machine; use AddEmptyReplica")
	}
	if replicaID == 0 {
		id, ok, err := s.readUint(replicaIDPrefix, shardID)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("replication: shard %d has no replica on node %d", shardID, s.cfg.NodeID)
		}
		replicaID = id
	}
	r, err := s.addReplica(shardID, replicaID, sm, true)
	if err == nil && st.Retired {
		// Retired before a restart removed it: remove it now.
		s.removeReplica(r)
		return nil, ErrReplicaRemoved
	}
	return r, err
}

// AddEmptyReplica hosts an uninitialized replica (created on demand before
// a restart) whose replica ID was recorded in the log engine.
func (s *Store) AddEmptyReplica(shardID uint64, sm StateMachine) (*Replica, error) {
	id, ok, err := s.readUint(replicaIDPrefix, shardID)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("replication: no replica ID recorded for uninitialized shard %d", shardID)
	}
	return s.addReplica(shardID, id, sm, true)
}

func (s *Store) addReplica(shardID, replicaID uint64, sm StateMachine, persistID bool) (*Replica, error) {
	s.mu.Lock()
	if _, ok := s.replicas[shardID]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("replication: shard %d already hosted", shardID)
	}
	s.mu.Unlock()
	lg, err := s.log.Shard(shardID)
	if err != nil {
		return nil, fmt.Errorf("replication: shard %d log: %w", shardID, err)
	}
	r := newReplica(s, shardID, replicaID, sm, lg)
	st := sm.AppliedState()
	b := storage.NewBatch()
	if persistID {
		putUint(b, replicaIDPrefix, shardID, replicaID)
	}
	last, _ := lg.LastIndex()
	agrees := true
	if st.Index > 0 && st.Index <= last {
		if agrees, err = logHas(lg, st.Index, st.Term); err != nil {
			return nil, fmt.Errorf("replication: shard %d: %w", shardID, err)
		}
	}
	if st.Index > 0 && (st.Index > last || lg.TruncatedIndex() == 0 || !agrees) {
		// A fresh bootstrap, or a snapshot installed in the state machine
		// whose log reset did not become durable: start the log there. The
		// log may be longer than the snapshot and disagree with it (a
		// suffix from an old leader that never committed): it is dropped.
		hs := codec.Clone(lg.HardState())
		if hs.GetTerm() < st.Term {
			hs.Term, hs.Vote = proto.Uint64(st.Term), proto.Uint64(0)
		}
		if hs.GetCommit() < st.Index {
			hs.Commit = proto.Uint64(st.Index)
		}
		if err := lg.ApplySnapshot(b, st.Index, st.Term, hs); err != nil {
			return nil, fmt.Errorf("replication: shard %d: align log: %w", shardID, err)
		}
	} else if hs := lg.HardState(); st.Index > hs.GetCommit() {
		// The state machine applied entries whose commit index was not made
		// durable (commit-only writes are not synced): they were committed,
		// so the commit index moves up to them.
		hs = codec.Clone(hs)
		hs.Commit = proto.Uint64(st.Index)
		if err := lg.Append(b, nil, hs); err != nil {
			return nil, fmt.Errorf("replication: shard %d: align commit index: %w", shardID, err)
		}
	}
	if !b.Empty() {
		if err := s.log.Commit(b); err != nil {
			return nil, fmt.Errorf("replication: shard %d: %w", shardID, err)
		}
	}
	if err := r.initRaft(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil, ErrStopped
	}
	s.replicas[shardID] = r
	early := s.earlyVotes[shardID]
	delete(s.earlyVotes, shardID)
	s.mu.Unlock()
	if early != nil && time.Since(early.since) < s.electionTimeout() {
		s.requeue(early.held, nil)
	}
	return r, nil
}

// electionTimeout is the Raft election timeout (the shortest: Raft
// randomizes each replica's in [1, 2) of it).
func (s *Store) electionTimeout() time.Duration {
	return s.cfg.TickInterval * time.Duration(s.cfg.ElectionTicks)
}

// earlyVotes are the vote requests held for a shard not hosted here yet,
// the first of them held at since.
type earlyVotes struct {
	held  heldMessages
	since time.Time
}

// Bounds of the vote requests held for shards not hosted here: how many
// shards, and how many requests each.
const (
	maxEarlyVoteShards = 64
	maxEarlyVotes      = 8
)

// holdEarlyVote keeps env, a pre-vote or vote request from node from, for
// shardID, which this node does not host. A split's new shard is hosted
// by each replica when it applies the split, and the replica named to
// lead it campaigns as soon as it has: its requests reach replicas still
// applying the split, which would drop them and leave the shard without a
// leader until the candidate stands again a tick later (a request for the
// shard's keys waits meanwhile). They are delivered when the shard's
// replica joins (addReplica), if within an election timeout of the first;
// requests held longer, or beyond the bounds, are dropped, as before:
// Raft tolerates late and lost votes.
func (s *Store) holdEarlyVote(shardID, from uint64, env *shalev1.RaftEnvelope) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.earlyVotes[shardID]
	if e == nil || now.Sub(e.since) >= s.electionTimeout() {
		for id, old := range s.earlyVotes {
			if now.Sub(old.since) >= s.electionTimeout() {
				delete(s.earlyVotes, id)
			}
		}
		if len(s.earlyVotes) >= maxEarlyVoteShards {
			return
		}
		e = &earlyVotes{since: now}
		s.earlyVotes[shardID] = e
	}
	if len(e.held) < maxEarlyVotes {
		e.held.hold(from, env)
	}
}

// logHas reports whether lg holds the entry (index, term) or was
// truncated at it (an index below the truncation counts as held): if not,
// every entry of lg from index on conflicts with the log that committed
// the entry (Raft's log matching).
func logHas(lg *raftlog.Log, index, term uint64) (bool, error) {
	t, err := lg.Term(index)
	switch {
	case errors.Is(err, raft.ErrCompacted):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("term of entry %d: %w", index, err)
	}
	return t == term, nil
}

// signal wakes the loop.
func (s *Store) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Store) queueWork(r *Replica) {
	s.mu.Lock()
	s.work[r] = struct{}{}
	s.mu.Unlock()
	s.signal()
}

// HandleRaftBatch implements Handler: the batch is queued for the loop.
func (s *Store) HandleRaftBatch(b *shalev1.RaftMessageBatch) {
	s.observeClock(b.GetFromNodeId(), b.GetHlc())
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.lastHeard[b.GetFromNodeId()] = time.Now()
	s.notePeerFeatures(b.GetFromNodeId(), Feature(b.GetFeatures()))
	if b.GetApplyingBacklog() {
		s.peerBacklog[b.GetFromNodeId()] = true
	} else {
		delete(s.peerBacklog, b.GetFromNodeId())
	}
	if len(b.GetMessages()) > 0 || len(b.GetQuiescedShards()) > 0 {
		s.inbox = append(s.inbox, b)
	}
	s.mu.Unlock()
	if len(b.GetMessages()) > 0 || len(b.GetQuiescedShards()) > 0 {
		s.signal()
	}
}

// HandleSnapshot implements Handler: it installs the snapshot in dir into
// the shard's replica (creating an uninitialized one if needed) through the
// loop, and returns once Raft accepted and the state machine restored it.
func (s *Store) HandleSnapshot(ctx context.Context, header *shalev1.SnapshotHeader, dir string) error {
	msg := &raftpb.Message{}
	if err := proto.Unmarshal(header.GetRaftMessage(), msg); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("replication: snapshot for shard %d: bad raft message: %w", header.GetShardId(), err)
	}
	if msg.GetType() != raftpb.MsgSnap || msg.GetSnapshot().GetMetadata().GetIndex() == 0 {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("replication: snapshot for shard %d carries %s, not a MsgSnap with a snapshot", header.GetShardId(), msg.GetType())
	}
	in := &incomingSnapshot{header: header, msg: msg, dir: dir, done: make(chan error, 1)}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		_ = os.RemoveAll(dir)
		return ErrStopped
	}
	s.snapIn = append(s.snapIn, in)
	s.mu.Unlock()
	s.signal()
	select {
	case err := <-in.done:
		return err
	case <-ctx.Done():
		// The loop still owns dir and will delete or install it.
		return ctx.Err()
	}
}

// run is the Raft loop.
func (s *Store) run() {
	defer close(s.done)
	ticker := time.NewTicker(s.cfg.TickInterval)
	defer ticker.Stop()
	for {
		tick := false
		select {
		case <-s.stop:
			return
		case <-ticker.C:
			tick = true
		case <-s.wake:
		}
		if err := s.cycle(tick); err != nil {
			// The log engine failed: nothing can be made durable any more.
			// Stop acknowledging anything; the node must be restarted.
			s.cfg.Logger.Error("raft loop stopped: log engine failed", "err", err)
			s.fail(fmt.Errorf("raft log: %w", err))
			s.mu.Lock()
			reps := make([]*Replica, 0, len(s.replicas))
			for _, r := range s.replicas {
				reps = append(reps, r)
			}
			s.mu.Unlock()
			// Calls fail as on a stopped node (clients go to another
			// replica); those whose entries were proposed, with an
			// unknown outcome.
			stopped := fmt.Errorf("%w: the node's Raft log failed: %w", ErrStopped, err)
			for _, r := range reps {
				r.failAll(stopped)
			}
			<-s.stop
			return
		}
	}
}

// Failed is closed when the node's storage failed with an I/O error (a
// full disk, a failing device): the Raft log could not be written, or a
// replica's state machine could not apply committed entries. Nothing more
// is acknowledged; the node must be stopped and restarted once the cause
// is fixed, and then recovers from what it made durable (fail-stop). Err
// says what failed.
func (s *Store) Failed() <-chan struct{} { return s.failed }

// Err returns the storage failure that closed Failed, or nil.
func (s *Store) Err() error {
	select {
	case <-s.failed:
		return s.failErr
	default:
		return nil
	}
}

func (s *Store) fail(err error) {
	s.failOnce.Do(func() {
		s.failErr = err
		close(s.failed)
	})
}

// isIOError reports whether err comes from the operating system (ENOSPC,
// EIO, ...): the storage, not the data, failed.
func isIOError(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno)
}

// cycle is one turn of the loop: deliver messages and queued work, tick,
// then handle every Ready with one durable write.
func (s *Store) cycle(tick bool) error {
	newIDs := s.logBatch
	if newIDs == nil {
		newIDs = storage.NewBatch()
	}
	s.logBatch = nil
	// Replicas opened on demand join first, so that the messages they kept
	// are delivered this cycle.
	s.takeOpened(newIDs)
	s.mu.Lock()
	inbox := s.inbox
	s.inbox, s.inboxSpare = s.inboxSpare, nil
	snapIn := s.snapIn
	s.snapIn = nil
	var work map[*Replica]struct{}
	if len(s.work) > 0 {
		work = s.work
		s.work, s.workSpare = s.workSpare, nil
	}
	s.mu.Unlock()

	s.handleApplyReports()
	for _, b := range inbox {
		s.deliver(b)
	}
	clear(inbox) // the batches are garbage once delivered (or held)
	s.inboxSpare = inbox[:0]
	for _, in := range snapIn {
		s.deliverSnapshot(in)
	}
	for r := range work {
		if r.installing != nil && !r.dead() {
			r.installing.work = true // drained once the install ends
			continue
		}
		r.drainQueued()
		s.active[r] = struct{}{}
	}
	if work != nil {
		clear(work)
		s.workSpare = work
	}
	if tick {
		s.tickAll()
	}

	// Collect Readies of the replicas touched this cycle (only those can
	// have one: raft makes progress only when stepped, ticked or proposed to).
	readies := s.readies[:0]
	defer func() {
		// Dropping the Readies' references; the entries and messages
		// are the appliers' and the transport's.
		clear(readies)
		s.readies = readies[:0]
	}()
	active := s.active
	s.active, s.activeSpare = s.activeSpare, active
	defer clear(active)
	for r := range active {
		if r.dead() {
			continue
		}
		if inst := r.installing; inst != nil {
			// Its Ready waits for the state machine to hold the snapshot.
			if inst.restored {
				readies = append(readies, readyReplica{r: r, rd: inst.rd, installed: true})
			}
			continue
		}
		if !r.rn.HasReady() {
			continue
		}
		rd := r.rn.Ready()
		if !raft.IsEmptySnap(rd.Snapshot) {
			// Restored off the loop: the cycle does not wait for it.
			if err := r.startInstall(rd); err != nil {
				r.fatal(err)
			}
			continue
		}
		readies = append(readies, readyReplica{r: r, rd: rd})
	}
	slices.SortFunc(readies, func(a, b readyReplica) int { return cmp.Compare(a.r.shardID, b.r.shardID) })
	defer s.handleQuiesceNotices()
	if len(readies) == 0 && newIDs.Empty() {
		s.logBatch = newIDs
		s.finishSnapshots(snapIn)
		out := make(map[uint64]*shalev1.RaftMessageBatch)
		s.appendQuiesceNotices(out)
		s.heartbeatNodes(out)
		for _, b := range out {
			s.cfg.Transport.Send(b)
		}
		return nil
	}

	// Leaders send before persisting: a leader may replicate entries to its
	// followers while it writes them itself (its own acknowledgement counts
	// only once they are durable, when raft sees the next Ready). Its term
	// and vote were made durable when it campaigned.
	early := make(map[uint64]*shalev1.RaftMessageBatch)
	for i := range readies {
		rr := &readies[i]
		leader := rr.r.wasLeader
		if rr.rd.SoftState != nil {
			leader = rr.rd.SoftState.RaftState == raft.StateLeader
		}
		// ... unless this Ready changes the term or vote (a leader elected
		// within one Ready): those must be durable before any message.
		if hs := rr.rd.HardState; hs != nil && !raft.IsEmptyHardState(hs) {
			if term, vote := rr.r.log.TermVote(); hs.GetTerm() != term || hs.GetVote() != vote {
				leader = false
			}
		}
		// A Ready whose messages only move followers' commit indexes
		// waits for the late send (commitOnly): a follower learns the
		// commit index after this cycle's write instead of before it,
		// and in the late batch these ride with the node's
		// acknowledgements to the same nodes instead of being a batch of
		// their own.
		if leader && raft.IsEmptySnap(rr.rd.Snapshot) && !commitOnly(rr.rd.Messages) {
			rr.r.sendMessages(rr.rd.Messages, early)
			rr.sent = true
		}
	}
	for _, b := range early {
		if h := s.cfg.earlySendHook; h != nil {
			h(b)
		}
		s.cfg.Transport.Send(b)
	}

	// Hand off, before this cycle's write, the committed entries that are
	// already durable in the local log (all but those this Ready appends):
	// they apply while the log syncs.
	for i := range readies {
		rr := &readies[i]
		ents := rr.rd.CommittedEntries
		if len(ents) == 0 || !raft.IsEmptySnap(rr.rd.Snapshot) || rr.r.dead() {
			continue
		}
		bound, _ := rr.r.log.LastIndex()
		if len(rr.rd.Entries) > 0 {
			bound = min(bound, rr.rd.Entries[0].GetIndex()-1)
		}
		k := 0
		for k < len(ents) && ents[k].GetIndex() <= bound {
			k++
		}
		if k == 0 {
			continue
		}
		if err := rr.r.handOff(ents[:k]); err != nil {
			rr.r.fatal(err)
			continue
		}
		rr.appliedEarly = k
	}

	// Persist: log resets to the snapshots the state machines installed
	// first, then entries and hard states of every group, one sync.
	idsWritten := !newIDs.Empty()
	wb := newIDs
	for i := range readies {
		rr := &readies[i]
		if rr.r.dead() {
			continue
		}
		if rr.installed {
			if err := rr.r.finishInstall(wb); err != nil {
				rr.r.fatal(err) // answers the install's sender
				continue
			}
		}
		hs := durableHardState(rr.rd.HardState, rr.r.log)
		if len(rr.rd.Entries) > 0 || hs != nil {
			if err := rr.r.log.Append(wb, rr.rd.Entries, hs); err != nil {
				return fmt.Errorf("shard %d: append: %w", rr.r.shardID, err)
			}
		}
	}
	if !wb.Empty() {
		// Sync only when raft needs it (new entries, term or vote, a
		// snapshot) or the Store recorded a new replica.
		sync := idsWritten
		for i := range readies {
			sync = sync || readies[i].rd.MustSync || readies[i].installed
		}
		start := time.Now()
		if sync {
			s.syncs.begin(start)
		}
		err := s.log.Write(wb, sync)
		if sync {
			took := s.syncs.end(start)
			if m := s.cfg.Metrics; m != nil && err == nil {
				m.logSync.Observe(took.Seconds())
			}
		}
		if err != nil {
			return err
		}
	}
	// The log engine keeps nothing of a written batch: the next cycle
	// reuses it (unless a snapshot or a burst made it large).
	if wb.Len() <= 1<<20 {
		wb.Reset()
		s.logBatch = wb
	}
	s.finishSnapshots(snapIn)

	// Send, telling the peers whether this node applies a backlog as of
	// this cycle's commit indexes: a follower's acknowledgement of the
	// last of its missing log must not carry the word of the cycle before
	// (no backlog yet), or its leader would hand it a leadership it cannot
	// serve until it applied that log (TransferLeader).
	for i := range readies {
		if hs := readies[i].rd.HardState; hs != nil && hs.GetCommit() > 0 {
			readies[i].r.noteCommitted(hs.GetCommit())
		}
	}
	out := make(map[uint64]*shalev1.RaftMessageBatch)
	for i := range readies {
		if !readies[i].sent {
			readies[i].r.sendMessages(readies[i].rd.Messages, out)
		}
	}
	s.appendQuiesceNotices(out)
	s.heartbeatNodes(out)
	if s.cfg.Clock != nil && len(out) > 0 {
		now := HLCToProto(s.cfg.Clock.Now())
		for _, b := range out {
			b.Hlc = now
		}
	}
	for _, b := range out {
		s.cfg.Transport.Send(b)
	}

	// Hand off the rest and advance.
	for i := range readies {
		rr := &readies[i]
		if rr.r.dead() {
			continue
		}
		rr.r.handleReadStates(rr.rd.ReadStates)
		if err := rr.r.handOff(rr.rd.CommittedEntries[rr.appliedEarly:]); err != nil {
			rr.r.fatal(err)
			continue
		}
		rr.r.afterReady(rr.rd)
		rr.r.rn.Advance(rr.rd)
		if rr.installed {
			rr.r.endInstall()
		}
	}
	// A replica whose Advance produced new work (e.g. the leave-joint
	// proposal) will be picked up next cycle.
	for i := range readies {
		if r := readies[i].r; !r.dead() && r.rn.HasReady() {
			s.active[r] = struct{}{}
			s.signal()
		}
	}
	return nil
}

type readyReplica struct {
	r    *Replica
	rd   raft.Ready
	sent bool // messages already sent (leaders send before persisting)
	// installed: rd carries a snapshot the state machine holds (restored
	// by an apply worker); the cycle resets the log to it.
	installed bool
	// appliedEarly committed entries were handed off before the cycle's
	// write.
	appliedEarly int
}

// deliver steps a batch's messages into their replicas, creating
// uninitialized replicas for shards this node newly joined. The messages'
// entries keep slices of the envelopes' bytes, which the Store owns
// (Handler.HandleRaftBatch), rather than copies.
func (s *Store) deliver(b *shalev1.RaftMessageBatch) {
	from := b.GetFromNodeId()
	for _, env := range b.GetMessages() {
		m := &raftpb.Message{}
		if err := codec.UnmarshalRaftMessageAliasing(env.GetMessage(), m); err != nil {
			s.cfg.Logger.Warn("dropping undecodable raft message", "shard", env.GetShardId(), "from", from, "err", err)
			continue
		}
		r := s.Replica(env.GetShardId())
		if r != nil && r.installing != nil && !r.dead() {
			// Delivered once the install ends: Raft takes nothing between
			// a Ready and its Advance here.
			r.installing.held.hold(from, env)
			continue
		}
		if r != nil && r.dead() {
			continue
		}
		if r != nil && m.GetTo() > r.replicaID {
			// The shard has a newer replica on this node: the local one
			// was removed while this node was away. Replace it.
			if !s.replaceStale(r, m) {
				continue
			}
			r = nil
		}
		if r == nil {
			// Delivered once the replica is open.
			if w := s.createOnDemand(env.GetShardId(), m); w != nil {
				w.held.hold(from, env)
				w.heldCount.Store(int64(len(w.held)))
			} else if m.GetType() == raftpb.MsgPreVote || m.GetType() == raftpb.MsgVote {
				// Perhaps for a split's new shard, which this node hosts
				// once it applies the split: delivered then, if soon.
				s.holdEarlyVote(env.GetShardId(), from, env)
			}
			continue
		}
		if m.GetTo() != r.replicaID {
			// A message for an older incarnation of the replica.
			continue
		}
		if m.GetType() == raftpb.MsgTimeoutNow && time.Now().UnixNano() < s.refuseUntil.Load() {
			// The leader's transfer to this replica times out, and it
			// stays leader (or tries another replica).
			s.cfg.Logger.Debug("refusing a leadership transfer", "shard", r.shardID, "from_node", from)
			continue
		}
		r.noteNode(m.GetFrom(), from, "raft message")
		r.unquiesce()
		s.active[r] = struct{}{}
		if err := r.stepPeer(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) && !errors.Is(err, raft.ErrStepLocalMsg) {
			s.cfg.Logger.Debug("raft step", "shard", r.shardID, "err", err)
		}
	}
	for _, shardID := range b.GetQuiescedShards() {
		s.quiesceNotices = append(s.quiesceNotices, quiesceNotice{shardID, from})
	}
}

type quiesceNotice struct{ shardID, fromNode uint64 }

// handleQuiesceNotices quiesces followers whose leader quiesced, once this
// cycle's messages are processed and applied.
func (s *Store) handleQuiesceNotices() {
	for _, q := range s.quiesceNotices {
		if r := s.Replica(q.shardID); r != nil && !r.dead() && r.installing == nil {
			r.maybeQuiesceFollower(q.fromNode)
		}
	}
	s.quiesceNotices = s.quiesceNotices[:0]
}

// replaceStale handles a message m for a newer replica of r's shard on this
// node: replica IDs only grow, so the shard removed r (while this node was
// down or cut off, before r learned it) and added a new replica here. r is
// destroyed, as a removed replica is, and true returned when m is one a
// leader sends a new member: the new replica is then created on demand.
func (s *Store) replaceStale(r *Replica, m *raftpb.Message) bool {
	switch m.GetType() {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
	default:
		return false
	}
	// A replica this one's own descriptor places on another node is not
	// ours, whatever the sender thinks: a sender's wrong mapping must not
	// destroy a valid replica (chaos/README bug 9). A replica removed while
	// this node was away never saw its successor, so the successor is
	// unknown to its descriptor.
	for _, rd := range r.sm.AppliedState().Descriptor.GetReplicas() {
		if rd.GetReplicaId() == m.GetTo() && rd.GetNodeId() != s.cfg.NodeID {
			s.cfg.Logger.Warn("dropping a raft message for another node's replica", "shard", r.shardID,
				"replica", m.GetTo(), "its_node", rd.GetNodeId(), "from_replica", m.GetFrom())
			return false
		}
	}
	s.cfg.Logger.Info("replacing a removed replica with the shard's newer one on this node",
		"shard", r.shardID, "stale_replica", r.replicaID, "replica", m.GetTo())
	<-s.removeReplica(r)
	return true
}

// hostChange is a change of the replica a node hosts for a shard that runs
// off the Raft loop, which owes every other replica its cycles meanwhile:
// the open of a replica created on demand (createOnDemand: the server
// creates a shard engine, 40-320 ms in a rebalance), or the close of a
// removed replica and the deletion of its data (removeReplica: 50-160 ms).
// While it runs, no other replica of the shard is created here. The
// shard's messages wait for a replica being opened (held, as for a
// replica whose snapshot installs), and are dropped for one being
// removed; the senders send again what is dropped.
type hostChange struct {
	shardID uint64
	// done closes when the change is over: the removed replica's data is
	// deleted, or the opened replica joined the loop (or failed to).
	done chan struct{}
	// replicaID is the replica being opened (zero for a removal).
	replicaID uint64
	// Set by the open, before it is queued in Store.opened: the state
	// machine, or why there is none (both nil: a split's apply hosted the
	// shard first).
	sm  StateMachine
	err error
	// held are the shard's messages and snapshots that arrived during the
	// open (loop only).
	held  heldMessages
	snaps []*incomingSnapshot
	// heldCount is len(held), readable off the loop.
	heldCount atomic.Int64
}

// createOnDemand starts creating an uninitialized replica of shardID for
// m, a message from the shard's leader to a replica this node does not host
// yet (a replica just added, which a snapshot fills), and returns the open,
// in which the caller keeps m for the new replica; or it returns nil and m
// is dropped. While the replica is being opened every message for it is
// kept (returned the same open). The state machine is opened off the loop
// (openOnDemand), and the loop takes the replica in at the start of a
// cycle (takeOpened), recording its ID in that cycle's synced write before
// it delivers the messages kept for it.
func (s *Store) createOnDemand(shardID uint64, m *raftpb.Message) *hostChange {
	s.mu.Lock()
	w := s.hosting[shardID]
	s.mu.Unlock()
	if w != nil {
		if w.replicaID != 0 {
			return w
		}
		// The removed replica's data is still being deleted; the leader
		// sends again.
		return nil
	}
	switch m.GetType() {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
	default:
		return nil
	}
	if s.cfg.OpenReplica == nil {
		return nil
	}
	if min, ok, err := s.readUint(tombstonePrefix, shardID); err != nil || (ok && m.GetTo() < min) {
		return nil
	}
	w = &hostChange{shardID: shardID, done: make(chan struct{}), replicaID: m.GetTo()}
	s.mu.Lock()
	s.hosting[shardID] = w
	s.mu.Unlock()
	s.bg.Add(1)
	go s.openOnDemand(w)
	return w
}

// openOnDemand opens the state machine of w's replica (off the loop) and
// queues w for the loop.
func (s *Store) openOnDemand(w *hostChange) {
	defer s.bg.Done()
	var open func() (StateMachine, error)
	// A split applying now may be creating this very shard's replica: the
	// replica's place is claimed after it, and no split hosts the shard
	// once it is taken.
	s.hostMu.Lock()
	if s.Replica(w.shardID) == nil {
		open, w.err = s.cfg.OpenReplica(w.shardID)
	}
	s.hostMu.Unlock()
	if open != nil && w.err == nil {
		w.sm, w.err = open()
	}
	s.mu.Lock()
	s.opened = append(s.opened, w)
	s.mu.Unlock()
	s.signal()
}

// takeOpened hosts the replicas opened on demand since the last cycle
// (loop side): each joins the Store, its ID is staged in newIDs (the
// cycle's synced write, made before anything it answers is sent), and the
// messages and snapshots kept for it are queued for this cycle. A failed
// open drops them; its leader sends again, which opens the replica anew.
func (s *Store) takeOpened(newIDs *storage.Batch) {
	s.mu.Lock()
	opened := s.opened
	s.opened = nil
	s.mu.Unlock()
	for _, w := range opened {
		if w.sm != nil {
			if _, err := s.addReplica(w.shardID, w.replicaID, w.sm, false); err != nil {
				_ = w.sm.Close()
				w.err = err
			} else {
				putUint(newIDs, replicaIDPrefix, w.shardID, w.replicaID)
				s.cfg.Logger.Info("created replica for a new shard membership", "shard", w.shardID, "replica", w.replicaID)
			}
			w.sm = nil
		}
		s.mu.Lock()
		delete(s.hosting, w.shardID)
		s.mu.Unlock()
		close(w.done)
		if w.err != nil {
			s.cfg.Logger.Error("cannot create replica", "shard", w.shardID, "err", w.err)
			w.abandon(s, fmt.Errorf("replication: shard %d: cannot create replica %d here: %w", w.shardID, w.replicaID, w.err))
			continue
		}
		s.requeue(w.held, w.snaps)
	}
}

// abandon ends an open whose replica will not join the Store: its state
// machine, if any, is closed, and the snapshots kept for it are answered
// with err (their messages are dropped).
func (w *hostChange) abandon(s *Store, err error) {
	if w.sm != nil {
		if cerr := w.sm.Close(); cerr != nil {
			s.cfg.Logger.Warn("close an unused replica", "shard", w.shardID, "err", cerr)
		}
		w.sm = nil
	}
	for _, in := range w.snaps {
		_ = os.RemoveAll(in.dir)
		in.answer(err)
	}
	w.held, w.snaps = nil, nil
}

// heldMessages are messages kept for a replica that takes none for a while
// (its snapshot installs, or it is being opened), delivered once it does.
// Beyond maxHeldMessages they are dropped: Raft sends them again.
type heldMessages []*shalev1.RaftMessageBatch

// maxHeldMessages bounds the messages kept for one replica.
const maxHeldMessages = 1024

// hold keeps env, a message from node from.
func (h *heldMessages) hold(from uint64, env *shalev1.RaftEnvelope) {
	if len(*h) < maxHeldMessages {
		*h = append(*h, &shalev1.RaftMessageBatch{FromNodeId: from, Messages: []*shalev1.RaftEnvelope{env}})
	}
}

// requeue queues messages and snapshots kept for a replica ahead of those
// that came since, for the loop's next delivery.
func (s *Store) requeue(held heldMessages, snaps []*incomingSnapshot) {
	if len(held) == 0 && len(snaps) == 0 {
		return
	}
	s.mu.Lock()
	if len(held) > 0 {
		// A new slice: held's array stays the held list's, and the
		// loop's spare inbox (inboxSpare) is never one of them.
		s.inbox = slices.Concat(held, s.inbox)
	}
	if len(snaps) > 0 {
		s.snapIn = append(snaps, s.snapIn...)
	}
	s.mu.Unlock()
	s.signal()
}

// deliverSnapshot steps an incoming MsgSnap whose data is in in.dir.
func (s *Store) deliverSnapshot(in *incomingSnapshot) {
	in.held = false
	shardID := in.header.GetShardId()
	r := s.Replica(shardID)
	if r != nil && !r.dead() && in.msg.GetTo() > r.replicaID && s.replaceStale(r, in.msg) {
		r = nil
	}
	if r == nil {
		if w := s.createOnDemand(shardID, in.msg); w != nil {
			// Stepped once the replica is open.
			in.held = true
			w.snaps = append(w.snaps, in)
			return
		}
	}
	if r == nil || r.removed || in.msg.GetTo() != r.replicaID {
		_ = os.RemoveAll(in.dir)
		in.answer(fmt.Errorf("replication: shard %d: no replica %d here for the snapshot", shardID, in.msg.GetTo()))
		return
	}
	if r.pendingSnap != nil || r.installing != nil {
		// Another snapshot of this shard came in this cycle (a new leader's
		// while the old one's was on its way), or one is installing: Raft
		// may have taken that one, whose data must stay the one installed.
		_ = os.RemoveAll(in.dir)
		in.answer(fmt.Errorf("replication: shard %d: another snapshot is being installed", shardID))
		return
	}
	r.noteNode(in.msg.GetFrom(), in.header.GetFromNodeId(), "snapshot")
	r.unquiesce()
	r.pendingSnap = in
	s.active[r] = struct{}{}
	if err := r.rn.Step(in.msg); err != nil {
		s.cfg.Logger.Debug("raft step snapshot", "shard", shardID, "err", err)
	}
}

// finishSnapshots answers the incoming snapshots of this cycle: those
// being installed are answered when the install ends, and those kept for
// a replica being opened once it is (or its open failed); the rest were
// refused by Raft (or their replica was replaced or removed this cycle).
// Every one is answered: its sender waits for the answer before it sends
// the shard another.
func (s *Store) finishSnapshots(snapIn []*incomingSnapshot) {
	for _, in := range snapIn {
		if in.installing || in.held || in.answered.Load() {
			continue
		}
		if r := s.Replica(in.header.GetShardId()); r != nil && r.pendingSnap == in {
			r.pendingSnap = nil
		}
		_ = os.RemoveAll(in.dir)
		in.answer(fmt.Errorf("replication: shard %d: snapshot at index %d refused by raft (stale)", in.header.GetShardId(), in.msg.GetSnapshot().GetMetadata().GetIndex()))
	}
}

func (s *Store) tickAll() {
	for _, r := range s.Replicas() {
		if r.dead() || r.installing != nil {
			continue
		}
		if r.tick() {
			s.active[r] = struct{}{}
		}
	}
}

// appendQuiesceNotices tells the followers of groups that quiesced this
// cycle to stop ticking too.
func (s *Store) appendQuiesceNotices(out map[uint64]*shalev1.RaftMessageBatch) {
	for _, r := range s.quiescing {
		r.appendQuiesceNotices(out)
	}
	s.quiescing = s.quiescing[:0]
}

// heartbeatNodes adds an empty batch for every peer node that gets no
// message this cycle at most every heartbeat interval: nodes learn each
// other's liveness even when all groups are quiesced.
func (s *Store) heartbeatNodes(out map[uint64]*shalev1.RaftMessageBatch) {
	interval := s.cfg.TickInterval * time.Duration(s.cfg.HeartbeatTicks)
	if time.Since(s.lastBeat) < interval {
		return
	}
	s.lastBeat = time.Now()
	for _, n := range s.peerNodes() {
		if _, ok := out[n]; !ok {
			// With what every batch tells of its sender (features, the
			// apply backlog): a receiver takes a batch's as the sender's.
			out[n] = s.newBatch(n)
		}
	}
}

// ApplyingBacklog reports whether one of the node's replicas holds more
// than a few hundred committed entries it has not applied: the node is
// catching up, after a restart or a partition. Its peers' leaders transfer
// it no leadership meanwhile (TransferLeader), and placement's leader
// balancing gives it none.
func (s *Store) ApplyingBacklog() bool { return s.backlogged.Load() > 0 }

// nodeApplyingBacklog reports whether node's last batch said it was
// applying a backlog (ApplyingBacklog); false for this node.
func (s *Store) nodeApplyingBacklog(node uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peerBacklog[node]
}

// peerNodes is every other node hosting a replica of a shard we host,
// recomputed at most once a second (it walks every replica).
func (s *Store) peerNodes() []uint64 {
	if s.peers != nil && time.Since(s.peersAt) < time.Second {
		return s.peers
	}
	seen := make(map[uint64]struct{})
	for _, r := range s.Replicas() {
		r.mu.Lock()
		for _, n := range r.nodes {
			if n != s.cfg.NodeID {
				seen[n] = struct{}{}
			}
		}
		r.mu.Unlock()
	}
	out := make([]uint64, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	s.peers, s.peersAt = out, time.Now()
	return out
}

// NodeLive reports whether the node was heard from (any Raft traffic or
// the Store's node heartbeats) within an election timeout.
func (s *Store) NodeLive(nodeID uint64) bool { return s.nodeLive(nodeID) }

// LastHeard returns when the node was last heard from (zero if never).
func (s *Store) LastHeard(nodeID uint64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastHeard[nodeID]
}

func (s *Store) nodeLive(nodeID uint64) bool {
	return s.nodeHeardWithin(nodeID, s.electionTimeout())
}

// nodeHeardWithin reports whether node nodeID (this one always) was heard
// from within the last d.
func (s *Store) nodeHeardWithin(nodeID uint64, d time.Duration) bool {
	if nodeID == s.cfg.NodeID {
		return true
	}
	s.mu.Lock()
	t, ok := s.lastHeard[nodeID]
	s.mu.Unlock()
	return ok && time.Since(t) < d
}

// removeReplica drops a replica that left its shard: its log state is
// deleted and a tombstone keeps its old incarnation from being recreated
// (one synced write). Closing its state machine and deleting its data
// (ReplicaRemoved) run in the background (a hostChange), since deleting a
// shard's files takes tens of milliseconds that the loop owes every other
// replica; the returned channel closes when they are done, and until then
// no replica of the shard is created here.
func (s *Store) removeReplica(r *Replica) <-chan struct{} {
	r.removed = true
	s.applier.stopReplica(r, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrReplicaRemoved))
	r.abandonInstall(ErrReplicaRemoved)
	b := storage.NewBatch()
	r.log.Destroy(b)
	putUint(b, tombstonePrefix, r.shardID, r.replicaID+1)
	b.Delete(storeKey(replicaIDPrefix, r.shardID))
	if err := s.log.Commit(b); err != nil {
		s.cfg.Logger.Error("remove replica: log engine", "shard", r.shardID, "err", err)
	}
	w := &hostChange{shardID: r.shardID, done: make(chan struct{})}
	s.mu.Lock()
	delete(s.replicas, r.shardID)
	s.hosting[r.shardID] = w
	s.mu.Unlock()
	r.failAll(ErrReplicaRemoved)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		if err := r.sm.Close(); err != nil {
			s.cfg.Logger.Warn("close removed replica", "shard", r.shardID, "err", err)
		}
		s.cfg.Logger.Info("replica removed from shard", "shard", r.shardID, "replica", r.replicaID)
		if s.cfg.ReplicaRemoved != nil {
			s.cfg.ReplicaRemoved(r.shardID)
		}
		s.mu.Lock()
		delete(s.hosting, r.shardID)
		s.mu.Unlock()
		close(w.done)
	}()
	return w.done
}

// observeClock moves the node's clock past a peer's reading. A reading too
// far ahead (the peer's wall clock is off) is refused, and logged at most
// once a minute per peer.
func (s *Store) observeClock(from uint64, ts *shalev1.HlcTimestamp) {
	if s.cfg.Clock == nil || ts == nil {
		return
	}
	if _, err := s.cfg.Clock.Update(HLCFromProto(ts)); err != nil {
		now := time.Now().UnixNano()
		v, _ := s.clockWarned.LoadOrStore(from, new(atomic.Int64))
		last := v.(*atomic.Int64)
		if prev := last.Load(); now-prev >= int64(time.Minute) && last.CompareAndSwap(prev, now) {
			s.cfg.Logger.Warn("a peer's clock is too far ahead; not following it", "node", from, "err", err)
		}
	}
}

// HLCFromProto converts a wire timestamp.
func HLCFromProto(ts *shalev1.HlcTimestamp) hlc.Timestamp {
	return hlc.Timestamp{WallNanos: ts.GetWallNanos(), Logical: ts.GetLogical()}
}

// HLCToProto converts a timestamp for the wire.
func HLCToProto(ts hlc.Timestamp) *shalev1.HlcTimestamp {
	return &shalev1.HlcTimestamp{WallNanos: ts.WallNanos, Logical: ts.Logical}
}

// durableHardState is the part of a Ready's hard state (hs) that lg must
// write, given the last one it staged: hs when its term or vote changed,
// else nil. A commit index that moved alone is not written: Raft
// treats it as volatile (a replica relearns it from its leader), and a
// restarted replica whose state machine applied past the commit index on
// disk moves it up to the applied index (newReplica). At one client this
// leaves out a hard-state record with every put and, on followers and on
// an idle leader, whole log writes that moved nothing else.
func durableHardState(hs *raftpb.HardState, lg *raftlog.Log) *raftpb.HardState {
	if hs == nil || raft.IsEmptyHardState(hs) {
		return nil
	}
	if term, vote := lg.TermVote(); hs.GetTerm() == term && hs.GetVote() == vote {
		return nil
	}
	return hs
}
