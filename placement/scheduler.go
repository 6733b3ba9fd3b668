// Package placement decides where shard replicas and leaderships live: it
// tracks node liveness and stats from heartbeats, keeps a bounded history of
// its decisions, and schedules membership changes and leadership transfers
// (repair, decommission, zone spreading, replica and leader balance).
//
// The scheduler is a pure function of the cluster's state: Schedule looks at
// the nodes and the shards' descriptors as they are now and returns the next
// step for each shard that needs one. A move of a replica is not a remembered
// plan but a sequence of states every shard passes through (a learner is
// added, catches up by snapshot, is promoted while the replaced voter is
// removed in the same joint configuration change), so a new placement leader
// finishes what the old one started by looking at the same descriptors.
// Leader balancing waits until the last replica move has started (unless
// told otherwise, Config.LeaderBalanceDuringMoves), so that it balances the
// layout the moves leave rather than one they are changing.
package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// NodeState is a node's liveness as the placement leader judges it.
type NodeState int

const (
	// Live nodes heartbeat and may take replicas.
	Live NodeState = iota
	// Suspect nodes missed heartbeats for a few seconds: they get no new
	// replicas, and theirs are not replaced yet.
	Suspect
	// Dead nodes missed heartbeats for longer than the dead timeout: their
	// replicas are replaced on live nodes.
	Dead
)

// String names the state as placement status shows it.
func (s NodeState) String() string {
	switch s {
	case Live:
		return "live"
	case Suspect:
		return "suspect"
	case Dead:
		return "dead"
	}
	return fmt.Sprintf("NodeState(%d)", int(s))
}

// Node is one node of the cluster as the scheduler sees it.
type Node struct {
	ID    uint64
	Zone  string
	State NodeState
	// Decommissioning nodes are drained: their replicas and leaderships
	// move away and they get no new ones. Removed nodes likewise.
	Decommissioning bool
	Removed         bool
	// DrainingLeaders nodes are about to stop: they get no leaderships
	// (they hand theirs away themselves).
	DrainingLeaders bool
	// RefusedLeadership nodes did not take a leadership transferred to
	// them a moment ago (killed, cut off, far behind, though not yet known
	// dead): balancing gives them none for a while.
	RefusedLeadership bool
	// ApplyingBacklog nodes have committed entries of a shard they have
	// not yet applied (catching up after a restart or a partition): a
	// leadership moved there would answer no write until they are, so
	// balancing gives them none meanwhile.
	ApplyingBacklog bool
}

// Shard is one shard as the scheduler sees it.
type Shard struct {
	Desc *shalev1.ShardDescriptor
	// Leader is the node leading the shard (0: none known). The scheduler
	// changes only shards with a known leader.
	Leader    uint64
	SizeBytes uint64
	// CaughtUp holds the replica IDs of learners ready to be promoted.
	CaughtUp map[uint64]bool
	// Pinned shards are left alone by balancing (an operator placed them).
	Pinned bool
	// MoveFrom and MoveTo, when both set, are a manual move to finish.
	MoveFrom, MoveTo uint64
	// Busy shards have an operation in flight; the scheduler skips them.
	Busy bool
	// NewLeader shards changed leader a moment ago (an election, a
	// transfer): leader balancing lets the new leader settle first.
	NewLeader bool
}

// Config holds the scheduler's limits.
type Config struct {
	// ReplicationFactor is the number of voters each shard should have.
	ReplicationFactor int
	// MaxMovesPerNode caps the replica moves (learners catching up) a node
	// takes part in at once, as the learner's node or the sending leader's.
	MaxMovesPerNode int
	// MaxMoves caps the replica moves running at once in the cluster.
	MaxMoves int
	// MaxLeaderTransfers caps the balancing leadership transfers one
	// Schedule call returns.
	MaxLeaderTransfers int
	// LeaderBalanceDuringMoves lets leader balancing run while replica
	// moves are due. By default it waits until the last move has started
	// (Plan.Moving): a leadership it moved in the middle of a
	// rebalance is often on the wrong node once the moves are done, and
	// the shard is then held by the caller's settle time (Shard.NewLeader)
	// when it has to move again. Callers set it when the deferral has
	// lasted too long (moves that cannot start because learners that do
	// not catch up hold their slots).
	LeaderBalanceDuringMoves bool
}

// Kind is the kind of an operation.
type Kind string

// The operations the scheduler asks for.
const (
	// AddLearner adds a learner on Node.
	AddLearner Kind = "add-learner"
	// Promote makes the learner ReplicaID (on Node) a voter and, when
	// RemoveReplicaID is set, removes that voter (on From) in the same
	// joint configuration change.
	Promote Kind = "promote"
	// RemoveReplica removes ReplicaID (on From).
	RemoveReplica Kind = "remove-replica"
	// TransferLeader moves the leadership from From to Node.
	TransferLeader Kind = "transfer-leader"
)

// Op is one step for one shard.
type Op struct {
	Kind    Kind
	ShardID uint64
	// Epoch is the descriptor epoch the step was decided on; the shard's
	// leader refuses it if the shard has changed since.
	Epoch uint64
	// Node gains a replica or the leadership; From loses one (0: none).
	Node, From uint64
	// ReplicaID is the learner to promote or the replica to remove.
	ReplicaID uint64
	// RemoveReplicaID is the voter a Promote removes (0: none).
	RemoveReplicaID uint64
	// Reason says why, for people.
	Reason string
	// Manual is true for the steps of an operator's move.
	Manual bool
}

// String formats the op for history and tests.
func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "shard %d: %s", o.ShardID, o.Kind)
	switch o.Kind {
	case AddLearner:
		fmt.Fprintf(&b, " on n%d", o.Node)
	case Promote:
		fmt.Fprintf(&b, " r%d on n%d", o.ReplicaID, o.Node)
		if o.RemoveReplicaID != 0 {
			fmt.Fprintf(&b, ", remove r%d on n%d", o.RemoveReplicaID, o.From)
		}
	case RemoveReplica:
		fmt.Fprintf(&b, " r%d on n%d", o.ReplicaID, o.From)
	case TransferLeader:
		fmt.Fprintf(&b, " n%d -> n%d", o.From, o.Node)
	}
	fmt.Fprintf(&b, " (%s)", o.Reason)
	return b.String()
}

// Stuck is a replica that should move but cannot yet, and why.
type Stuck struct {
	ShardID uint64
	// Node holds the replica (0: the shard lacks a replica altogether).
	Node   uint64
	Reason string
}

// Plan is the result of one Schedule call.
type Plan struct {
	Ops   []Op
	Stuck []Stuck
	// Moving is true when a replica move starts in this plan or another is
	// due but waits for the move limits (a repair's, or replica balance's
	// while the replica counts, running moves counted as finished, differ
	// by two or more and a shard could move). Leader
	// balancing then did not run, unless Config.LeaderBalanceDuringMoves;
	// leadership transfers that repair or drain a shard, or hand a
	// leadership off before its replica's removal, are made either way.
	Moving bool
}

// Moves reports how many replica moves are in flight in the shards: shards
// with a learner that is not ready to be promoted.
func Moves(shards []Shard) int {
	n := 0
	for i := range shards {
		if l := learners(shards[i].Desc); len(l) > 0 && !shards[i].CaughtUp[l[0].GetReplicaId()] {
			n++
		}
	}
	return n
}

// scheduler is the working state of one Schedule call.
type scheduler struct {
	cfg    Config
	nodes  map[uint64]*Node
	order  []uint64 // node IDs, ascending
	shards []Shard

	replicas map[uint64]int    // replicas per node, as they will be once running moves finish
	leaders  map[uint64]int    // leaderships per node
	bytes    map[uint64]uint64 // bytes per node
	moving   map[uint64]int    // moves each node takes part in
	moves    int               // moves in the cluster
	// victims are, per shard with a learner, the voter its promotion will
	// remove, decided once per call so counts and steps agree.
	victims map[uint64]*shalev1.ReplicaDescriptor
	// waiting is set when a move is due but waits for the move limits.
	waiting bool
	plan    Plan
}

// Schedule returns the next steps for the shards that need one, at most one
// per shard, and the replicas that should move but cannot. It never asks
// for a step that lowers a shard's number of voters below the replication
// factor while the shard has a replica on a live node that could be
// replaced instead: voters on dead or draining nodes are removed only in
// the same joint change that promotes their caught-up replacement.
func Schedule(cfg Config, nodes []Node, shards []Shard) Plan {
	if cfg.ReplicationFactor < 1 {
		cfg.ReplicationFactor = 3
	}
	if cfg.MaxMovesPerNode < 1 {
		cfg.MaxMovesPerNode = 1
	}
	if cfg.MaxMoves < 1 {
		cfg.MaxMoves = 1
	}
	s := &scheduler{
		cfg:      cfg,
		nodes:    make(map[uint64]*Node, len(nodes)),
		shards:   slices.Clone(shards),
		replicas: map[uint64]int{},
		leaders:  map[uint64]int{},
		bytes:    map[uint64]uint64{},
		moving:   map[uint64]int{},
		victims:  map[uint64]*shalev1.ReplicaDescriptor{},
	}
	for i := range nodes {
		s.nodes[nodes[i].ID] = &nodes[i]
		s.order = append(s.order, nodes[i].ID)
	}
	slices.Sort(s.order)
	slices.SortFunc(s.shards, func(a, b Shard) int { return cmp.Compare(a.Desc.GetShardId(), b.Desc.GetShardId()) })
	s.count()
	touched := map[uint64]bool{}
	for i := range s.shards {
		if s.repair(&s.shards[i]) {
			touched[s.shards[i].Desc.GetShardId()] = true
		}
	}
	s.balanceReplicas(touched)
	s.plan.Moving = s.movesWanted()
	if !s.plan.Moving || cfg.LeaderBalanceDuringMoves {
		s.balanceLeaders(touched)
	}
	return s.plan
}

// movesWanted reports whether the plan starts a replica move, or one is due
// but waits for the move limits (a repair's, or replica balance's).
func (s *scheduler) movesWanted() bool {
	if s.waiting {
		return true
	}
	for _, op := range s.plan.Ops {
		if op.Kind == AddLearner {
			return true
		}
	}
	return false
}

// count fills the per-node counts, counting running moves as finished: the
// learner's node has the replica, the voter it will replace does not.
func (s *scheduler) count() {
	for i := range s.shards {
		sh := &s.shards[i]
		if sh.Leader != 0 {
			s.leaders[sh.Leader]++
		}
		for _, rd := range sh.Desc.GetReplicas() {
			s.replicas[rd.GetNodeId()]++
			s.bytes[rd.GetNodeId()] += sh.SizeBytes
		}
		if ls := learners(sh.Desc); len(ls) > 0 && !sh.CaughtUp[ls[0].GetReplicaId()] {
			s.moves++
			s.moving[ls[0].GetNodeId()]++
			if sh.Leader != 0 {
				s.moving[sh.Leader]++
			}
		}
	}
	// The voters that running moves will remove, decided one move at a
	// time on counts that already leave out the voters picked before (so
	// that several moves do not all pick the fullest node), and kept for
	// finishLearner.
	for i := range s.shards {
		sh := &s.shards[i]
		if ls := learners(sh.Desc); len(ls) > 0 && len(voters(sh.Desc))+1 > s.cfg.ReplicationFactor {
			if v := s.victim(sh, ls[0].GetNodeId()); v != nil {
				s.victims[sh.Desc.GetShardId()] = v
				s.replicas[v.GetNodeId()]--
				s.bytes[v.GetNodeId()] -= min(s.bytes[v.GetNodeId()], sh.SizeBytes)
			}
		}
	}
}

// eligible reports whether a node may take new replicas and leaderships.
func (s *scheduler) eligible(id uint64) bool {
	n := s.nodes[id]
	return n != nil && n.State == Live && !n.Decommissioning && !n.Removed
}

// mayLead reports whether a node may take leaderships.
func (s *scheduler) mayLead(id uint64) bool {
	n := s.nodes[id]
	return s.eligible(id) && !n.DrainingLeaders && !n.RefusedLeadership && !n.ApplyingBacklog
}

// leaving reports why a replica on the node must be replaced ("" if not).
func (s *scheduler) leaving(id uint64) string {
	n := s.nodes[id]
	switch {
	case n == nil:
		return fmt.Sprintf("node %d is not registered", id)
	case n.Removed:
		return fmt.Sprintf("node %d was removed", id)
	case n.State == Dead:
		return fmt.Sprintf("node %d is dead", id)
	case n.Decommissioning:
		return fmt.Sprintf("node %d is decommissioning", id)
	}
	return ""
}

// zone is the node's failure domain: its zone label, or the node itself.
func (s *scheduler) zone(id uint64) string {
	if n := s.nodes[id]; n != nil && n.Zone != "" {
		return n.Zone
	}
	return fmt.Sprintf("\x00node-%d", id)
}

func (s *scheduler) canMove(nodes ...uint64) bool {
	if s.moves >= s.cfg.MaxMoves {
		return false
	}
	for _, id := range nodes {
		if id != 0 && s.moving[id] >= s.cfg.MaxMovesPerNode {
			return false
		}
	}
	return true
}

func (s *scheduler) emit(op Op) {
	s.plan.Ops = append(s.plan.Ops, op)
	if op.Kind == AddLearner {
		s.moves++
		s.moving[op.Node]++
		s.moving[op.From]++ // the leader, which sends the snapshot
	}
}

func (s *scheduler) stuck(shard, node uint64, format string, args ...any) {
	s.plan.Stuck = append(s.plan.Stuck, Stuck{ShardID: shard, Node: node, Reason: fmt.Sprintf(format, args...)})
}

func voters(d *shalev1.ShardDescriptor) []*shalev1.ReplicaDescriptor {
	var out []*shalev1.ReplicaDescriptor
	for _, rd := range d.GetReplicas() {
		if rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED {
			out = append(out, rd)
		}
	}
	return out
}

func learners(d *shalev1.ShardDescriptor) []*shalev1.ReplicaDescriptor {
	var out []*shalev1.ReplicaDescriptor
	for _, rd := range d.GetReplicas() {
		if rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_LEARNER {
			out = append(out, rd)
		}
	}
	return out
}

func joint(d *shalev1.ShardDescriptor) bool {
	for _, rd := range d.GetReplicas() {
		switch rd.GetRole() {
		case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_INCOMING, shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING:
			return true
		}
	}
	return false
}

func hosts(d *shalev1.ShardDescriptor, node uint64) bool {
	for _, rd := range d.GetReplicas() {
		if rd.GetNodeId() == node {
			return true
		}
	}
	return false
}

// victim is the voter to remove when a learner on learnerNode is promoted
// into a shard that has enough voters: the source of a manual move, else a
// voter on a dead, removed or draining node, else one sharing a zone with
// another replica that stays, else the one on the node with the most
// replicas.
func (s *scheduler) victim(sh *Shard, learnerNode uint64) *shalev1.ReplicaDescriptor {
	vs := voters(sh.Desc)
	if len(vs) == 0 {
		return nil
	}
	if sh.MoveFrom != 0 && sh.MoveTo == learnerNode {
		for _, v := range vs {
			if v.GetNodeId() == sh.MoveFrom {
				return v
			}
		}
	}
	rank := func(v *shalev1.ReplicaDescriptor) int {
		n := s.nodes[v.GetNodeId()]
		switch {
		case n == nil || n.Removed || n.State == Dead:
			return 0
		case n.Decommissioning:
			return 1
		}
		z := s.zone(v.GetNodeId())
		if z == s.zone(learnerNode) {
			return 2
		}
		for _, o := range vs {
			if o != v && s.zone(o.GetNodeId()) == z {
				return 2
			}
		}
		if sh.Desc.GetSystem() && v.GetNodeId() == sh.Leader {
			// Its leader is the placement leader: moving it restarts
			// placement, so it goes last.
			return 4
		}
		return 3
	}
	best := vs[0]
	for _, v := range vs[1:] {
		rb, rv := rank(best), rank(v)
		cb, cv := s.replicas[best.GetNodeId()], s.replicas[v.GetNodeId()]
		lb, lv := best.GetNodeId() == sh.Leader, v.GetNodeId() == sh.Leader
		switch {
		case rv < rb,
			rv == rb && cv > cb,
			// Equally good: spare the leader (removing it needs a
			// leadership transfer first), then the lower ID.
			rv == rb && cv == cb && lb && !lv,
			rv == rb && cv == cb && lb == lv && v.GetNodeId() > best.GetNodeId():
			best = v
		}
	}
	return best
}

// repair makes one step toward a shard with the right number of voters,
// none on a leaving node, spread over zones, its manual move done, and its
// leader on an eligible node. It reports whether it asked for a step or
// found the shard mid-change.
func (s *scheduler) repair(sh *Shard) bool {
	d := sh.Desc
	id := d.GetShardId()
	if sh.Busy || joint(d) {
		return true
	}
	vs := voters(d)
	ls := learners(d)
	if sh.Leader == 0 {
		for _, v := range vs {
			if why := s.leaving(v.GetNodeId()); why != "" {
				s.stuck(id, v.GetNodeId(), "waiting: shard %d has no leader (%s)", id, why)
			}
		}
		return len(ls) > 0
	}
	if len(ls) > 0 {
		s.finishLearner(sh, ls[0], vs)
		return true
	}
	rf := s.cfg.ReplicationFactor
	// Leadership off a leaving node first: the leader makes every change.
	if why := s.leaving(sh.Leader); why != "" {
		if to := s.bestLeader(sh, 0); to != 0 {
			s.emit(Op{Kind: TransferLeader, ShardID: id, Epoch: d.GetEpoch(), Node: to, From: sh.Leader, Reason: "drain: " + why})
			s.leaders[sh.Leader]--
			s.leaders[to]++
		} else {
			s.stuck(id, sh.Leader, "no voter on an eligible node can take shard %d's leadership", id)
		}
		return true
	}
	if len(vs) > rf {
		v := s.victim(sh, 0)
		if v.GetNodeId() == sh.Leader {
			return s.handOff(sh, v, "over-replicated")
		}
		s.emit(Op{Kind: RemoveReplica, ShardID: id, Epoch: d.GetEpoch(), ReplicaID: v.GetReplicaId(), From: v.GetNodeId(),
			Reason: fmt.Sprintf("over-replicated: %d voters, replication factor %d", len(vs), rf)})
		return true
	}
	// Why a new replica is needed, and which replica it replaces.
	var reason string
	var replaced uint64 // node
	if sh.MoveTo != 0 && sh.MoveFrom != 0 && hosts(d, sh.MoveFrom) && !hosts(d, sh.MoveTo) {
		reason, replaced = fmt.Sprintf("manual move from node %d to node %d", sh.MoveFrom, sh.MoveTo), sh.MoveFrom
	}
	if reason == "" {
		for _, v := range vs {
			if why := s.leaving(v.GetNodeId()); why != "" {
				reason, replaced = "repair: "+why, v.GetNodeId()
				if n := s.nodes[v.GetNodeId()]; n != nil && n.Decommissioning && n.State != Dead && !n.Removed {
					reason = "drain: " + why
				}
				break
			}
		}
	}
	if reason == "" && len(vs) < rf {
		reason = fmt.Sprintf("under-replicated: %d of %d voters", len(vs), rf)
	}
	zoneFix := false
	if reason == "" {
		if a, b, ok := s.zoneClash(vs); ok {
			reason, replaced, zoneFix = fmt.Sprintf("zone: nodes %d and %d share zone %q", a, b, s.nodes[a].Zone), b, true
		}
	}
	if reason == "" {
		return false
	}
	var target uint64
	if sh.MoveTo != 0 && replaced == sh.MoveFrom && strings.HasPrefix(reason, "manual") {
		if !s.eligible(sh.MoveTo) {
			s.stuck(id, sh.MoveFrom, "manual move to node %d: the node is not live or is draining", sh.MoveTo)
			return false
		}
		target = sh.MoveTo
	} else {
		var why string
		target, why = s.candidate(sh, replaced, zoneFix)
		if target == 0 {
			if !zoneFix { // a zone clash with no better zone is allowed
				s.stuck(id, replaced, "%s; no eligible node: %s", reason, why)
			}
			return false
		}
	}
	if !s.canMove(target, sh.Leader) {
		s.waiting = true
		s.stuck(id, replaced, "waiting: %s; move limit reached (%d per node, %d in the cluster)", reason, s.cfg.MaxMovesPerNode, s.cfg.MaxMoves)
		return true
	}
	s.emit(Op{Kind: AddLearner, ShardID: id, Epoch: d.GetEpoch(), Node: target, From: sh.Leader, Reason: reason, Manual: strings.HasPrefix(reason, "manual")})
	s.replicas[target]++
	s.bytes[target] += sh.SizeBytes
	if replaced != 0 {
		s.replicas[replaced]--
		s.bytes[replaced] -= min(s.bytes[replaced], sh.SizeBytes)
	}
	return true
}

// finishLearner promotes a caught-up learner (removing the voter it
// replaces in the same change), removes a learner that is not wanted, or
// reports the snapshot in flight.
func (s *scheduler) finishLearner(sh *Shard, l *shalev1.ReplicaDescriptor, vs []*shalev1.ReplicaDescriptor) {
	d := sh.Desc
	id := d.GetShardId()
	if why := s.leaving(l.GetNodeId()); why != "" {
		s.emit(Op{Kind: RemoveReplica, ShardID: id, Epoch: d.GetEpoch(), ReplicaID: l.GetReplicaId(), From: l.GetNodeId(), Reason: "learner's " + why})
		return
	}
	if !sh.CaughtUp[l.GetReplicaId()] {
		for _, v := range vs {
			if why := s.leaving(v.GetNodeId()); why != "" {
				s.stuck(id, v.GetNodeId(), "waiting: snapshot in flight to node %d, which replaces it (%s)", l.GetNodeId(), why)
			}
		}
		if sh.MoveFrom != 0 && sh.MoveTo == l.GetNodeId() {
			s.stuck(id, sh.MoveFrom, "waiting: manual move, snapshot in flight to node %d", l.GetNodeId())
		}
		return
	}
	op := Op{Kind: Promote, ShardID: id, Epoch: d.GetEpoch(), Node: l.GetNodeId(), ReplicaID: l.GetReplicaId(),
		Reason: "learner caught up", Manual: sh.MoveTo == l.GetNodeId()}
	if v := s.victims[id]; v != nil {
		if v.GetNodeId() == sh.Leader {
			s.handOff(sh, v, "learner caught up")
			return
		}
		op.RemoveReplicaID, op.From = v.GetReplicaId(), v.GetNodeId()
		op.Reason = "learner caught up; replaces node " + fmt.Sprint(v.GetNodeId())
	}
	s.emit(op)
}

// handOff moves the leadership away from the voter v that is to be removed.
func (s *scheduler) handOff(sh *Shard, v *shalev1.ReplicaDescriptor, why string) bool {
	id := sh.Desc.GetShardId()
	to := s.bestLeader(sh, v.GetNodeId())
	if to == 0 {
		s.stuck(id, v.GetNodeId(), "%s, but no other voter on an eligible node can take shard %d's leadership", why, id)
		return true
	}
	s.emit(Op{Kind: TransferLeader, ShardID: id, Epoch: sh.Desc.GetEpoch(), Node: to, From: sh.Leader,
		Reason: fmt.Sprintf("%s: hand off leadership before removing the replica on node %d", why, v.GetNodeId())})
	s.leaders[sh.Leader]--
	s.leaders[to]++
	return true
}

// bestLeader is the voter on an eligible node, other than the leader and
// except, that leads the fewest shards (0: none).
func (s *scheduler) bestLeader(sh *Shard, except uint64) uint64 {
	var best uint64
	for _, v := range voters(sh.Desc) {
		n := v.GetNodeId()
		if n == sh.Leader || n == except || !s.mayLead(n) {
			continue
		}
		if best == 0 || s.leaders[n] < s.leaders[best] || (s.leaders[n] == s.leaders[best] && n < best) {
			best = n
		}
	}
	return best
}

// zoneClash finds two voters in one zone while a live, eligible node in a
// zone the shard does not use could take one of them.
func (s *scheduler) zoneClash(vs []*shalev1.ReplicaDescriptor) (a, b uint64, ok bool) {
	seen := map[string]uint64{}
	for _, v := range vs {
		z := s.zone(v.GetNodeId())
		if first, dup := seen[z]; dup {
			for _, id := range s.order {
				if s.eligible(id) && seen[s.zone(id)] == 0 && !strings.HasPrefix(s.zone(id), "\x00") {
					used := false
					for _, o := range vs {
						used = used || s.zone(o.GetNodeId()) == s.zone(id)
					}
					if !used {
						return first, v.GetNodeId(), true
					}
				}
			}
			continue
		}
		seen[z] = v.GetNodeId()
	}
	return 0, 0, false
}

// candidate picks the node for a new replica of sh replacing the one on
// replaced (0: none): an eligible node without a replica of the shard,
// preferring zones the staying replicas do not use, then the fewest
// replicas, then the fewest bytes. With none, why says what each node lacks.
func (s *scheduler) candidate(sh *Shard, replaced uint64, zoneOnly bool) (uint64, string) {
	used := map[string]bool{}
	for _, rd := range sh.Desc.GetReplicas() {
		if rd.GetNodeId() != replaced {
			used[s.zone(rd.GetNodeId())] = true
		}
	}
	var best uint64
	bestFresh := false
	var reasons []string
	for _, id := range s.order {
		n := s.nodes[id]
		switch {
		case id == replaced:
			continue
		case hosts(sh.Desc, id):
			reasons = append(reasons, fmt.Sprintf("node %d holds a replica", id))
			continue
		case n.Removed:
			continue
		case n.State != Live:
			reasons = append(reasons, fmt.Sprintf("node %d is %s", id, n.State))
			continue
		case n.Decommissioning:
			reasons = append(reasons, fmt.Sprintf("node %d is decommissioning", id))
			continue
		}
		fresh := !used[s.zone(id)]
		if zoneOnly && !fresh {
			reasons = append(reasons, fmt.Sprintf("node %d is in a zone the shard uses", id))
			continue
		}
		if best == 0 || (fresh && !bestFresh) || (fresh == bestFresh && s.less(id, best)) {
			best, bestFresh = id, fresh
		}
	}
	if best == 0 && len(reasons) == 0 {
		reasons = append(reasons, "no other node")
	}
	return best, strings.Join(reasons, ", ")
}

// less orders nodes by load: fewer replicas, then fewer bytes, then ID.
func (s *scheduler) less(a, b uint64) bool {
	if s.replicas[a] != s.replicas[b] {
		return s.replicas[a] < s.replicas[b]
	}
	if s.bytes[a] != s.bytes[b] {
		return s.bytes[a] < s.bytes[b]
	}
	return a < b
}

// balanceReplicas moves replicas from the nodes with the most to those with
// the fewest until the counts differ by at most one, within the move limits.
func (s *scheduler) balanceReplicas(touched map[uint64]bool) {
	var nodes []uint64
	for _, id := range s.order {
		if s.eligible(id) {
			nodes = append(nodes, id)
		}
	}
	if len(nodes) < 2 {
		return
	}
	for {
		// Sources from the most loaded down, targets from the least up.
		slices.SortFunc(nodes, func(a, b uint64) int {
			if s.less(a, b) {
				return -1
			}
			if s.less(b, a) {
				return 1
			}
			return 0
		})
		moved := false
		for i := len(nodes) - 1; i > 0 && !moved; i-- {
			src := nodes[i]
			for _, dst := range nodes[:i] {
				if s.replicas[src]-s.replicas[dst] < 2 {
					break
				}
				if k := s.pickShard(src, dst, touched); k >= 0 {
					sh := &s.shards[k]
					if !s.canMove(dst, sh.Leader) {
						s.waiting = true
						continue
					}
					reason := fmt.Sprintf("rebalance: node %d has %d replicas, node %d has %d", src, s.replicas[src], dst, s.replicas[dst])
					s.emit(Op{Kind: AddLearner, ShardID: sh.Desc.GetShardId(), Epoch: sh.Desc.GetEpoch(), Node: dst, From: sh.Leader, Reason: reason})
					touched[sh.Desc.GetShardId()] = true
					s.replicas[dst]++
					s.replicas[src]--
					s.bytes[dst] += sh.SizeBytes
					s.bytes[src] -= min(s.bytes[src], sh.SizeBytes)
					moved = true
					break
				}
			}
		}
		if !moved {
			return
		}
	}
}

// pickShard finds a shard with a voter on src that can move to dst: not
// touched this round, not pinned, with a leader, and without a zone clash
// at dst. It prefers the shard whose move best evens the two nodes' bytes.
func (s *scheduler) pickShard(src, dst uint64, touched map[uint64]bool) int {
	best := -1
	var bestGap uint64
	for k := range s.shards {
		sh := &s.shards[k]
		d := sh.Desc
		if touched[d.GetShardId()] || sh.Pinned || sh.Busy || sh.Leader == 0 || hosts(d, dst) || len(learners(d)) > 0 || joint(d) {
			continue
		}
		onSrc := false
		clash := false
		for _, v := range voters(d) {
			if v.GetNodeId() == src {
				onSrc = true
			} else if s.zone(v.GetNodeId()) == s.zone(dst) {
				clash = true
			}
		}
		if !onSrc || clash {
			continue
		}
		a := int64(s.bytes[src]) - int64(sh.SizeBytes)
		b := int64(s.bytes[dst]) + int64(sh.SizeBytes)
		gap := uint64(max(a-b, b-a))
		if best < 0 || gap < bestGap {
			best, bestGap = k, gap
		}
	}
	return best
}

// balanceLeaders moves leaderships from the nodes leading the most shards
// to voters on nodes leading at least two fewer. When no shard of such a
// node has a voter on a node leading two fewer, one of its leaderships may
// go to a node leading one fewer that passes one of its own on to a node
// leading two fewer (chainLeaders): two transfers, the counts' effect of one.
func (s *scheduler) balanceLeaders(touched map[uint64]bool) {
	limit := s.cfg.MaxLeaderTransfers
	if limit < 1 {
		limit = 1
	}
	var nodes []uint64
	for _, id := range s.order {
		if s.eligible(id) {
			nodes = append(nodes, id)
		}
	}
	for n := 0; n < limit; n++ {
		// Sources from the node leading the most shards down.
		slices.SortStableFunc(nodes, func(a, b uint64) int { return cmp.Compare(s.leaders[b], s.leaders[a]) })
		k, to := -1, uint64(0)
		for _, src := range nodes {
			if k, to = s.leaderTarget(src, s.leaders[src]-2, -1, touched); k >= 0 {
				break
			}
		}
		if k >= 0 {
			s.transferLeader(k, to, touched)
			continue
		}
		if n+2 > limit || !s.chainLeaders(nodes, touched) {
			return
		}
		n++
	}
}

// movableLeader reports whether leader balancing may move the shard's
// leadership.
func (s *scheduler) movableLeader(sh *Shard, touched map[uint64]bool) bool {
	d := sh.Desc
	// The system shard's leader is the placement leader: balancing leaves
	// it alone (moving it restarts placement).
	return sh.Leader != 0 && !d.GetSystem() && !touched[d.GetShardId()] && !sh.Pinned && !sh.Busy && !sh.NewLeader &&
		len(learners(d)) == 0 && !joint(d)
}

// leaderTarget finds a shard led by src (other than the shard at index
// except) whose leadership balancing may move to a voter on a node leading
// at most most shards: the shard's index and the voter's node leading the
// fewest (-1 and 0: none).
func (s *scheduler) leaderTarget(src uint64, most int, except int, touched map[uint64]bool) (int, uint64) {
	var to uint64
	pick := -1
	for k := range s.shards {
		sh := &s.shards[k]
		if k == except || sh.Leader != src || !s.movableLeader(sh, touched) {
			continue
		}
		for _, v := range voters(sh.Desc) {
			c := v.GetNodeId()
			if c == src || !s.mayLead(c) || s.leaders[c] > most {
				continue
			}
			if to == 0 || s.leaders[c] < s.leaders[to] || (s.leaders[c] == s.leaders[to] && c < to) {
				pick, to = k, c
			}
		}
	}
	return pick, to
}

// chainLeaders moves a leadership from a node to a voter on a node leading
// one fewer shard, and one of that node's leaderships to a node leading at
// least two fewer than the first, taking the first such pair from the
// node leading the most. It reports whether it found one.
func (s *scheduler) chainLeaders(nodes []uint64, touched map[uint64]bool) bool {
	for _, src := range nodes {
		for k := range s.shards {
			sh := &s.shards[k]
			if sh.Leader != src || !s.movableLeader(sh, touched) {
				continue
			}
			for _, v := range voters(sh.Desc) {
				mid := v.GetNodeId()
				if mid == src || !s.mayLead(mid) || s.leaders[mid]+1 != s.leaders[src] {
					continue
				}
				if k2, to := s.leaderTarget(mid, s.leaders[src]-2, k, touched); k2 >= 0 {
					s.transferLeader(k, mid, touched)
					s.transferLeader(k2, to, touched)
					return true
				}
			}
		}
	}
	return false
}

// transferLeader asks for the leadership of the shard at index k to move
// to node to, and counts it there.
func (s *scheduler) transferLeader(k int, to uint64, touched map[uint64]bool) {
	sh := &s.shards[k]
	src := sh.Leader
	s.emit(Op{Kind: TransferLeader, ShardID: sh.Desc.GetShardId(), Epoch: sh.Desc.GetEpoch(), Node: to, From: src,
		Reason: fmt.Sprintf("leader balance: node %d leads %d shards, node %d leads %d", src, s.leaders[src], to, s.leaders[to])})
	touched[sh.Desc.GetShardId()] = true
	s.leaders[src]--
	s.leaders[to]++
}
