package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/placement"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// Placement: every node heartbeats its stats and the shards it leads to the
// placement leader (the system shard's leader) once a second. The placement
// leader judges liveness from the heartbeats, reads the shard directory and
// the pins from the system shard, asks placement.Schedule for the next
// steps and carries them out through the shards' leaders. Everything it
// keeps in memory (heartbeats, history, the last status) is rebuilt by the
// next placement leader; everything it decides from is replicated.

// maxPlacementCalls caps the scheduling operations in flight at once.
const maxPlacementCalls = 32

// After a leadership transfer a shard is left alone until the next
// decision sees its new leader's report (a transfer does not change the
// shard's epoch, so nothing else tells the report apart): until a report
// names the node the transfer went to, and at least changeSettle, but at
// most placementSettle (a transfer that failed, or whose target lost the
// leadership again, is waited out for placementSettle). After a membership
// change the shard is left alone until the directory and its leader's
// report show the change's epoch, and at least changeSettle.
const (
	placementSettle = 2500 * time.Millisecond
	changeSettle    = 200 * time.Millisecond
)

// Scheduling rounds run once a second (placementInterval), and sooner when
// something they wait for happened: a heartbeat reports a learner caught up,
// or an operation finished (a kick), but never closer together than
// placementMinInterval; and at once when the next replica move's start is
// due (moveDue, see moveStartInterval). While a node leads a shard whose learner is still
// catching up, it heartbeats every fastHeartbeatInterval, so that the
// placement leader learns of the caught-up learner, and frees its move's
// slot, within a fraction of a second.
const (
	placementInterval     = time.Second
	placementMinInterval  = 200 * time.Millisecond
	fastHeartbeatInterval = 250 * time.Millisecond
)

// moveStartInterval spreads the starts of replica moves: a round starts at
// most one add-learner, and none within moveStartInterval of the last, so
// a wave's snapshots (each a checkpoint streamed by its leader, then
// installed) do not all begin in the same second. On the 2-core benchmark
// machine four moves started at once filled both cores and stalled the
// foreground's puts together (docs/BENCHMARKS.md, issue 24).
//
// The round that starts the next move runs when it is due (moveDue), so
// the starts come moveStartInterval apart. Until 2026-12-01 the interval
// was 250 ms but that round queued behind ordinary kicks, and the starts
// came 0.40 s apart in every measurement; the interval now says 400 ms.
// Starts 0.25 s apart moved 1.34x the bytes a second and raised the
// foreground's p99 during the move 1.91x in the median of six pairs.
const moveStartInterval = 400 * time.Millisecond

// leaderSettle is how long after a shard's leader changed (an election, a
// transfer) leader balancing leaves it alone: a leader elected after a
// kill is not moved again at once.
const leaderSettle = 10 * time.Second

// leaderBalanceDeferMax bounds how long leader balancing waits for the last
// replica move to start (placement.Plan.Moving): the moves of a rebalance of
// a few GB all start well within it, and moves that cannot start (their
// slots held by learners that do not catch up) do not keep the leaderships
// unbalanced (placement.Config.LeaderBalanceDuringMoves).
const leaderBalanceDeferMax = 30 * time.Second

// refusedLeaderFor is how long after a leadership transfer to a node
// failed balancing gives the node no leadership (it may be down, though
// not yet known dead).
const refusedLeaderFor = 30 * time.Second

// placementState is the placement leader's soft state, and every node's
// heartbeat counters.
type placementState struct {
	tracker *placement.Tracker
	history *placement.History
	calls   chan struct{} // semaphore of operations in flight
	metrics *placementMetrics
	// kick asks placementLoop for a scheduling round soon (see
	// placementMinInterval); it holds at most one request.
	kick chan struct{}
	// moveDue asks placementLoop for a round at once: the next replica
	// move's start is due (mayStartMove); it holds at most one request.
	moveDue chan struct{}
	// catchingUp is set by heartbeat when this node leads a shard whose
	// learner is not caught up yet: it then heartbeats faster.
	catchingUp atomic.Bool

	mu        sync.Mutex
	leading   bool
	leadSince time.Time
	// inflight holds the shards with an operation in flight: the node a
	// leadership transfer goes to, 0 for other operations.
	inflight map[uint64]uint64
	settle   map[uint64]settleState
	view     *shalev1.PlacementStatusResponse
	dirRev   uint64
	dir      []*shalev1.ShardDescriptor
	// Heartbeat sender state.
	hbAddr    string
	lastOps   uint64
	lastWrote uint64
	lastBeat  time.Time
	// lastMoveStart is when the last add-learner started (moveStartInterval);
	// moveKick is set while a round is due for the next.
	lastMoveStart time.Time
	moveKick      bool
	// movingSince is when the scheduler's rounds started to find replica
	// moves to start (placement.Plan.Moving; zero: none in the last round).
	movingSince time.Time
	// drainingPeers are the nodes draining their leaderships, as the
	// placement leader last answered a heartbeat.
	drainingPeers []uint64
	// leaderSeen is each shard's leader as the placement leader last saw
	// it, and since when; refusedAt, when a leadership transfer to a node
	// last failed.
	leaderSeen map[uint64]leaderSeen
	refusedAt  map[uint64]time.Time
}

// leaderSeen is a shard's leader and when the placement leader first saw
// it lead.
type leaderSeen struct {
	node  uint64
	since time.Time
}

// settleState holds a shard back until its leader reports epoch (at most
// until limit), and at least until until; after a leadership transfer, also
// until the transfer's target reports it leads (at most until leaderBy).
type settleState struct {
	epoch uint64
	until time.Time
	limit time.Time
	// leader is the node a leadership transfer went to (zero: none): the
	// shard settles once a report names it, or at leaderBy.
	leader   uint64
	leaderBy time.Time
}

type placementMetrics struct {
	leader   prometheus.Gauge
	ops      *prometheus.CounterVec
	moves    prometheus.Gauge
	stuck    prometheus.Gauge
	replicas *prometheus.GaugeVec
	leaders  *prometheus.GaugeVec
	state    *prometheus.GaugeVec
}

func newPlacementMetrics(reg prometheus.Registerer) *placementMetrics {
	m := &placementMetrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shale_placement_is_leader",
			Help: "1 on the placement leader (the system shard's leader), else 0."}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shale_placement_operations_total",
			Help: "Scheduling operations carried out by this node as placement leader, by kind and result (done, failed)."}, []string{"kind", "result"}),
		moves: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shale_placement_moves_running",
			Help: "Replica moves in flight (learners catching up), as the placement leader last saw them."}),
		stuck: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shale_placement_stuck_replicas",
			Help: "Replicas that should move but cannot, as the placement leader last saw them."}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shale_placement_node_replicas",
			Help: "Replicas per node, as the placement leader counts them."}, []string{"node"}),
		leaders: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shale_placement_node_leaders",
			Help: "Shard leaderships per node, as the placement leader counts them."}, []string{"node"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shale_placement_node_state",
			Help: "1 for each node's current state (live, suspect, dead, removed), as the placement leader judges it."}, []string{"node", "state"}),
	}
	reg.MustRegister(m.leader, m.ops, m.moves, m.stuck, m.replicas, m.leaders, m.state)
	return m
}

func newPlacementState(cfg Config, reg prometheus.Registerer) *placementState {
	suspect := min(3*time.Second, cfg.DeadNodeTimeout/2)
	return &placementState{
		tracker:  placement.NewTracker(suspect, cfg.DeadNodeTimeout, nil),
		history:  placement.NewHistory(1000),
		calls:    make(chan struct{}, maxPlacementCalls),
		kick:     make(chan struct{}, 1),
		moveDue:  make(chan struct{}, 1),
		metrics:  newPlacementMetrics(reg),
		inflight: map[uint64]uint64{},
		settle:   map[uint64]settleState{},

		leaderSeen: map[uint64]leaderSeen{},
		refusedAt:  map[uint64]time.Time{},
	}
}

// --- heartbeats (every node) ---

// heartbeat builds this node's heartbeat.
func (n *Node) heartbeat(ctx context.Context) *shalev1.HeartbeatRequest {
	stats := &shalev1.NodeStats{Node: &shalev1.NodeDescriptor{NodeId: n.cfg.NodeID, Address: n.cfg.AdvertiseAddr, Zone: n.cfg.Zone}}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(n.cfg.DataDir, &fs); err == nil {
		stats.CapacityBytes = fs.Blocks * uint64(fs.Bsize)
		stats.AvailableBytes = fs.Bavail * uint64(fs.Bsize)
	}
	stats.DrainingLeaders = n.drainingLeaders()
	stats.ApplyingBacklog = n.store.ApplyingBacklog()
	req := &shalev1.HeartbeatRequest{Stats: stats}
	var ops uint64
	catchingUp := false
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil {
			continue
		}
		stats.ReplicaCount++
		size := sm.SizeBytes()
		stats.UsedBytes += size
		if l, ok := n.loads.Load(r.ShardID()); ok {
			ops += l.(*shardLoad).ops.Load()
		}
		if !r.IsLeader() {
			continue
		}
		d := sm.Descriptor()
		if d == nil {
			continue
		}
		stats.LeaderCount++
		led := &shalev1.LedShard{ShardId: d.GetShardId(), Epoch: d.GetEpoch(), SizeBytes: size}
		for _, rd := range d.GetReplicas() {
			if rd.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_LEARNER {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			st, err := r.ProgressStatus(cctx)
			cancel()
			if err == nil {
				for id, pr := range st.Progress {
					if !pr.Learner {
						continue
					}
					if pr.Match > 0 && pr.Match+100 >= st.Commit {
						led.CaughtUpLearners = append(led.CaughtUpLearners, id)
					} else {
						catchingUp = true
					}
				}
			} else {
				catchingUp = true
			}
			break
		}
		req.Led = append(req.Led, led)
	}
	n.place.catchingUp.Store(catchingUp)
	wrote := n.writeBytes.Load()
	now := time.Now()
	p := n.place
	p.mu.Lock()
	if !p.lastBeat.IsZero() {
		dt := now.Sub(p.lastBeat).Seconds()
		stats.RequestsPerSecond = float64(ops-min(ops, p.lastOps)) / dt
		stats.WriteBytesPerSecond = float64(wrote-p.lastWrote) / dt
	}
	p.lastOps, p.lastWrote, p.lastBeat = ops, wrote, now
	p.mu.Unlock()
	return req
}

// sendHeartbeat sends this node's heartbeat to the placement leader: to
// the address that took the last one, else to the leader this node knows
// of, else to each peer in turn (any node forwards it to the leader).
func (n *Node) sendHeartbeat(ctx context.Context) {
	req := n.heartbeat(ctx)
	if n.isPlacementLeader() {
		n.place.tracker.Heartbeat(req)
		n.setDrainingPeers(n.drainingNodes())
		return
	}
	p := n.place
	p.mu.Lock()
	cached := p.hbAddr
	p.mu.Unlock()
	var addrs []string
	if cached != "" {
		addrs = append(addrs, cached)
	} else {
		if r := n.store.Replica(SystemShardID); r != nil {
			if l := r.Status().LeaderNodeID; l != 0 && l != n.cfg.NodeID {
				addrs = append(addrs, n.addressOf(l))
			}
		}
		addrs = append(addrs, n.peerAddrs()...)
	}
	var err error
	for _, addr := range addrs {
		if addr == "" {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		var resp *shalev1.HeartbeatResponse
		resp, err = shalev1.NewAdminClient(n.conn(addr)).Heartbeat(cctx, req)
		cancel()
		if err == nil {
			n.setDrainingPeers(resp.GetDrainingLeaderNodes())
			p.mu.Lock()
			p.hbAddr = addr
			p.mu.Unlock()
			return
		}
	}
	p.mu.Lock()
	p.hbAddr = "" // look for the placement leader again next time
	p.mu.Unlock()
	n.log.Debug("heartbeat to the placement leader", "tried", len(addrs), "err", err)
}

// Heartbeat implements the Admin RPC: the placement leader records it; any
// other node forwards it there.
func (s *adminService) Heartbeat(ctx context.Context, req *shalev1.HeartbeatRequest) (*shalev1.HeartbeatResponse, error) {
	n := s.n
	if req.GetStats().GetNode().GetNodeId() == 0 {
		return nil, invalidArg("a heartbeat needs stats.node.node_id")
	}
	if r := n.store.Replica(SystemShardID); r != nil && r.IsLeader() {
		// A node that joined or came back may take replicas now, and a
		// move's learner that is ready is promoted, with the next move
		// started in its slot, without waiting for the tick.
		kick := n.place.tracker.Heartbeat(req)
		for _, l := range req.GetLed() {
			if len(l.GetCaughtUpLearners()) > 0 {
				kick = true
				break
			}
		}
		if kick {
			n.kickPlacement()
		}
		return &shalev1.HeartbeatResponse{DrainingLeaderNodes: n.drainingNodes()}, nil
	}
	a, fctx, err := n.systemLeaderAdmin(ctx)
	if err != nil {
		return nil, err
	}
	return a.Heartbeat(fctx, req)
}

// drainingNodes (placement leader) are the live nodes whose last heartbeat
// says they are draining their leaderships.
func (n *Node) drainingNodes() []uint64 {
	var out []uint64
	for id, b := range n.place.tracker.Beats() {
		if !b.Req.GetStats().GetDrainingLeaders() {
			continue
		}
		if st, _, _ := n.place.tracker.State(id); st == placement.Live {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (n *Node) setDrainingPeers(ids []uint64) {
	n.place.mu.Lock()
	n.place.drainingPeers = ids
	n.place.mu.Unlock()
}

// drainingPeer reports whether node id was draining its leaderships at the
// last heartbeat this node sent.
func (n *Node) drainingPeer(id uint64) bool {
	n.place.mu.Lock()
	defer n.place.mu.Unlock()
	return slices.Contains(n.place.drainingPeers, id)
}

// --- the scheduler loop (placement leader) ---

// ledInfo is a shard as its leader last reported it.
type ledInfo struct {
	node  uint64
	at    time.Time
	led   *shalev1.LedShard
	epoch uint64
}

// directory returns the shard directory, re-read only when the system
// shard's revision moved.
func (n *Node) directory() ([]*shalev1.ShardDescriptor, error) {
	sys := n.Shard(SystemShardID)
	if sys == nil {
		return nil, errors.New("no system shard replica")
	}
	rev := sys.Revision()
	p := n.place
	p.mu.Lock()
	if p.dir != nil && p.dirRev == rev {
		d := p.dir
		p.mu.Unlock()
		return d, nil
	}
	p.mu.Unlock()
	dir, err := sys.Shards()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.dir, p.dirRev = dir, rev
	p.mu.Unlock()
	return dir, nil
}

// runPlacement is one scheduling round; it does nothing on nodes that do
// not lead the system shard.
func (n *Node) runPlacement(ctx context.Context) {
	p := n.place
	r := n.store.Replica(SystemShardID)
	leading := r != nil && r.IsLeader()
	now := time.Now()
	p.mu.Lock()
	was := p.leading
	p.leading = leading
	if leading && !was {
		p.leadSince = now
	}
	if !leading {
		p.view = nil
	}
	since := p.leadSince
	p.mu.Unlock()
	p.metrics.leader.Set(b2f(leading))
	if !leading {
		return
	}
	if !was {
		// A new placement leader: silence is counted from now.
		p.tracker.Reset()
		n.log.Info("became placement leader")
	}
	if now.Sub(since) < 2*time.Second {
		return // let every node's heartbeat arrive first
	}
	sys := n.Shard(SystemShardID)
	reg, err := sys.Nodes()
	if err != nil {
		return
	}
	dir, err := n.directory()
	if err != nil {
		return
	}
	pins, err := sys.Pins()
	if err != nil {
		return
	}
	nodes, states := n.placementNodes(reg)
	shards := n.placementShards(dir, pins, states, now)
	p.mu.Lock()
	movingSince := p.movingSince
	p.mu.Unlock()
	plan := placement.Schedule(placement.Config{
		ReplicationFactor:        n.cfg.ReplicationFactor,
		MaxMovesPerNode:          n.cfg.PlacementMaxMovesPerNode,
		MaxMoves:                 n.cfg.PlacementMaxMoves,
		MaxLeaderTransfers:       maxPlacementCalls / 2,
		LeaderBalanceDuringMoves: !movingSince.IsZero() && now.Sub(movingSince) >= leaderBalanceDeferMax,
	}, nodes, shards)
	p.mu.Lock()
	switch {
	case !plan.Moving:
		p.movingSince = time.Time{}
	case p.movingSince.IsZero():
		p.movingSince = now
	}
	p.mu.Unlock()
	leaderOf := map[uint64]uint64{}
	for _, sh := range shards {
		leaderOf[sh.Desc.GetShardId()] = sh.Leader
	}
	for _, op := range plan.Ops {
		if op.Kind == placement.AddLearner && !n.mayStartMove(now) {
			continue // a later round starts it
		}
		n.startOp(op, leaderOf[op.ShardID])
	}
	n.finishManualMoves(ctx, pins, dir)
	n.recordHeartbeats(ctx, reg)
	n.updateView(reg, states, shards, plan)
}

// placementNodes turns the registry and the heartbeats into the
// scheduler's nodes.
func (n *Node) placementNodes(reg []*shalev1.NodeDescriptor) ([]placement.Node, map[uint64]placement.NodeState) {
	nodes := make([]placement.Node, 0, len(reg))
	states := map[uint64]placement.NodeState{}
	// One look at the failed transfers for the whole registry.
	n.place.mu.Lock()
	refusedAt := maps.Clone(n.place.refusedAt)
	n.place.mu.Unlock()
	for _, d := range reg {
		st, beat, ok := n.place.tracker.State(d.GetNodeId())
		states[d.GetNodeId()] = st
		zone := d.GetZone()
		if ok {
			// A node's own word on its zone wins (the registry learns it
			// from the heartbeats: founding nodes are registered by the
			// first system leader, which knows only its own zone).
			zone = beat.Req.GetStats().GetNode().GetZone()
		}
		refused := time.Since(refusedAt[d.GetNodeId()]) < refusedLeaderFor
		nodes = append(nodes, placement.Node{ID: d.GetNodeId(), Zone: zone, State: st,
			Decommissioning: d.GetDecommissioning(), Removed: d.GetRemoved(),
			DrainingLeaders:   ok && beat.Req.GetStats().GetDrainingLeaders(),
			RefusedLeadership: refused,
			ApplyingBacklog:   ok && beat.Req.GetStats().GetApplyingBacklog()})
	}
	return nodes, states
}

// recordHeartbeats writes into the registry what the nodes' heartbeats tell:
// the zone each reports, where it differs, and that it started.
func (n *Node) recordHeartbeats(ctx context.Context, reg []*shalev1.NodeDescriptor) {
	beats := n.place.tracker.Beats()
	for _, d := range reg {
		b, ok := beats[d.GetNodeId()]
		if !ok || d.GetRemoved() {
			continue
		}
		zone := b.Req.GetStats().GetNode().GetZone()
		addr := b.Req.GetStats().GetNode().GetAddress()
		if addr != "" && addr != d.GetAddress() {
			n.recordNewAddress(ctx, reg, d, addr)
			continue
		}
		if zone == d.GetZone() && d.GetStarted() {
			continue
		}
		nd := proto.Clone(d).(*shalev1.NodeDescriptor)
		nd.Zone, nd.Started = zone, true
		if _, err := n.proposeSystem(ctx, requestIDFor("zone", itoa(d.GetNodeId()), zone, "started"), &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutNode{PutNode: nd}}); err != nil {
			n.log.Debug("record a node's zone", "node", d.GetNodeId(), "err", err)
			return
		}
	}
}

// recordNewAddress registers the address a node's heartbeats report when it
// differs from the registered one (the node restarted with another
// --advertise): peers and clients learn it from the registry. An address
// registered to another node that is not removed is refused (logged once
// per heartbeat round), since two live nodes cannot share one.
func (n *Node) recordNewAddress(ctx context.Context, reg []*shalev1.NodeDescriptor, d *shalev1.NodeDescriptor, addr string) {
	for _, o := range reg {
		if o.GetNodeId() != d.GetNodeId() && !o.GetRemoved() && o.GetAddress() == addr {
			n.log.Warn("a node reports an address registered to another node; keeping its registered address",
				"node", d.GetNodeId(), "address", addr, "registered_to", o.GetNodeId(), "registered_address", d.GetAddress())
			return
		}
	}
	nd := proto.Clone(d).(*shalev1.NodeDescriptor)
	nd.Address, nd.Started = addr, true
	nd.Zone = d.GetZone()
	// The time makes the request ID new even when a node goes back to an
	// address it had before.
	id := requestIDFor("address", itoa(d.GetNodeId()), addr, fmt.Sprint(time.Now().UnixNano()))
	if _, err := n.proposeSystem(ctx, id, &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutNode{PutNode: nd}}); err != nil {
		n.log.Debug("record a node's new address", "node", d.GetNodeId(), "err", err)
		return
	}
	n.log.Info("node address changed", "node", d.GetNodeId(), "old", d.GetAddress(), "new", addr)
	n.setAddr(d.GetNodeId(), addr)
}

// placementShards turns the directory, the leaders' reports and the pins
// into the scheduler's shards.
func (n *Node) placementShards(dir []*shalev1.ShardDescriptor, pins []*shalev1.ShardPin, states map[uint64]placement.NodeState, now time.Time) []placement.Shard {
	led := map[uint64]ledInfo{}
	for node, b := range n.place.tracker.Beats() {
		if states[node] != placement.Live {
			continue // a silent node's claims are void
		}
		for _, l := range b.Req.GetLed() {
			cur, ok := led[l.GetShardId()]
			if !ok || l.GetEpoch() > cur.epoch || (l.GetEpoch() == cur.epoch && b.At.After(cur.at)) {
				led[l.GetShardId()] = ledInfo{node: node, at: b.At, led: l, epoch: l.GetEpoch()}
			}
		}
	}
	pinOf := map[uint64]*shalev1.ShardPin{}
	for _, pin := range pins {
		pinOf[pin.GetShardId()] = pin
	}
	p := n.place
	p.mu.Lock()
	defer p.mu.Unlock()
	shards := make([]placement.Shard, 0, len(dir))
	listed := make(map[uint64]bool, len(dir))
	// A shard absorbing a frozen neighbour keeps its replicas where they
	// are until the merge is done: the merge's driver must host both.
	absorbing := map[uint64]bool{}
	for _, d := range dir {
		if into := d.GetMergingInto(); into != 0 && !d.GetRetired() {
			absorbing[into] = true
		}
	}
	for _, d := range dir {
		id := d.GetShardId()
		listed[id] = true
		to, inflight := p.inflight[id]
		sh := placement.Shard{Desc: d, Busy: inflight || d.GetMergingInto() != 0 || absorbing[id]}
		if l, ok := led[id]; ok {
			sh.SizeBytes = l.led.GetSizeBytes()
			if l.epoch == d.GetEpoch() {
				sh.Leader = l.node
				seen, ok := p.leaderSeen[id]
				if !ok || seen.node != l.node {
					seen = leaderSeen{node: l.node, since: now}
					p.leaderSeen[id] = seen
				}
				sh.NewLeader = now.Sub(seen.since) < leaderSettle
				if ids := l.led.GetCaughtUpLearners(); len(ids) > 0 {
					sh.CaughtUp = make(map[uint64]bool, len(ids))
					for _, rid := range ids {
						sh.CaughtUp[rid] = true
					}
				}
			} else {
				sh.Busy = true // the directory and the leader disagree for now
			}
		}
		if st, ok := p.settle[id]; ok {
			if (now.Before(st.until) || d.GetEpoch() < st.epoch || sh.Leader == 0) && now.Before(st.limit) ||
				st.leader != 0 && sh.Leader != st.leader && now.Before(st.leaderBy) {
				sh.Busy = true
			} else {
				delete(p.settle, id)
			}
			if sh.Busy && to == 0 {
				to = st.leader
			}
		}
		if sh.Busy && to != 0 {
			// A leadership on its way counts where it is going (the
			// shard is left alone until then): the rounds that run
			// before its target reports it do not send that node more.
			sh.Leader = to
		}
		if pin := pinOf[id]; pin != nil && pin.GetUntilUnixNanos() > n.wallNanos() {
			sh.Pinned = true
			sh.MoveFrom, sh.MoveTo = pin.GetMoveFromNodeId(), pin.GetMoveToNodeId()
		}
		shards = append(shards, sh)
	}
	for id := range p.leaderSeen {
		if !listed[id] {
			delete(p.leaderSeen, id)
		}
	}
	return shards
}

// startOp carries out op in the background through the shard's leader,
// unless too many operations are in flight already.
func (n *Node) startOp(op placement.Op, leader uint64) {
	p := n.place
	select {
	case p.calls <- struct{}{}:
	default:
		return // next round
	}
	p.mu.Lock()
	p.inflight[op.ShardID] = 0
	if op.Kind == placement.TransferLeader {
		p.inflight[op.ShardID] = op.Node
	}
	p.mu.Unlock()
	rec := p.history.Start(&shalev1.PlacementOperation{ShardId: op.ShardID, Kind: string(op.Kind), NodeId: op.Node,
		FromNodeId: op.From, Reason: op.Reason, StartedUnixNanos: n.wallNanos()})
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer func() { <-p.calls }()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		go func() {
			select {
			case <-n.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		epoch, desc, err := n.execOp(ctx, op, leader)
		now := time.Now()
		p.history.Finish(rec, n.wallNanos(), err)
		result := "done"
		if err != nil {
			result = "failed"
			n.log.Info("placement operation failed", "op", op.String(), "err", err)
		} else {
			n.log.Info("placement operation", "op", op.String())
		}
		p.metrics.ops.WithLabelValues(string(op.Kind), result).Inc()
		st := settleState{epoch: epoch, until: now.Add(placementSettle), limit: now.Add(30 * time.Second)}
		if op.Kind == placement.TransferLeader && err == nil {
			// The target leads now (TransferLeader returned once it
			// did): settled as soon as its report says so.
			st.until, st.leader, st.leaderBy = now.Add(changeSettle), op.Node, now.Add(placementSettle)
		}
		if desc != nil {
			st.until = now.Add(changeSettle)
			// The directory learns the new descriptor now rather than
			// at the shard leader's next maintenance round (which
			// reports it again, a no-op).
			if _, err := (&adminService{n: n}).ReportShards(ctx, &shalev1.ReportShardsRequest{Descriptors: []*shalev1.ShardDescriptor{desc}}); err != nil {
				n.log.Debug("report a changed descriptor to the directory", "shard", op.ShardID, "err", err)
			}
		}
		p.mu.Lock()
		delete(p.inflight, op.ShardID)
		p.settle[op.ShardID] = st
		if err != nil && op.Kind == placement.TransferLeader {
			p.refusedAt[op.Node] = now
		}
		p.mu.Unlock()
		n.kickPlacement()
	}()
}

// mayStartMove reports whether a replica move may start now, and if so
// counts it as started: at most one in each moveStartInterval. When not, a
// round is asked for (moveDue) for when the interval has passed.
func (n *Node) mayStartMove(now time.Time) bool {
	p := n.place
	p.mu.Lock()
	defer p.mu.Unlock()
	wait := p.lastMoveStart.Add(moveStartInterval).Sub(now)
	if wait <= 0 {
		p.lastMoveStart = now
		return true
	}
	if !p.moveKick {
		p.moveKick = true
		time.AfterFunc(wait, func() {
			p.mu.Lock()
			p.moveKick = false
			p.mu.Unlock()
			select {
			case p.moveDue <- struct{}{}:
			default:
			}
		})
	}
	return false
}

// kickPlacement asks for a scheduling round soon (placementLoop).
func (n *Node) kickPlacement() {
	select {
	case n.place.kick <- struct{}{}:
	default:
	}
}

// execOp asks the shard's leader to carry out op; it returns the epoch the
// shard has after it and, for a membership change, the shard's descriptor
// after it.
func (n *Node) execOp(ctx context.Context, op placement.Op, leader uint64) (uint64, *shalev1.ShardDescriptor, error) {
	addr := n.addressOf(leader)
	if addr == "" {
		return 0, nil, fmt.Errorf("no address for node %d", leader)
	}
	a := shalev1.NewAdminClient(n.conn(addr))
	if op.Kind == placement.TransferLeader {
		_, err := a.TransferLeader(forwarded(ctx), &shalev1.TransferLeaderRequest{ShardId: op.ShardID, TargetNodeId: op.Node, Scheduled: true})
		return op.Epoch, nil, err
	}
	req := &shalev1.ChangeReplicasRequest{ShardId: op.ShardID, Epoch: op.Epoch}
	switch op.Kind {
	case placement.AddLearner:
		req.Changes = []*shalev1.ReplicaChange{{Type: shalev1.ReplicaChange_TYPE_ADD_LEARNER, NodeId: op.Node}}
	case placement.Promote:
		req.Changes = []*shalev1.ReplicaChange{{Type: shalev1.ReplicaChange_TYPE_PROMOTE_LEARNER, ReplicaId: op.ReplicaID}}
		if op.RemoveReplicaID != 0 {
			req.Changes = append(req.Changes, &shalev1.ReplicaChange{Type: shalev1.ReplicaChange_TYPE_REMOVE_REPLICA, ReplicaId: op.RemoveReplicaID})
		}
	case placement.RemoveReplica:
		req.Changes = []*shalev1.ReplicaChange{{Type: shalev1.ReplicaChange_TYPE_REMOVE_REPLICA, ReplicaId: op.ReplicaID}}
	default:
		return 0, nil, fmt.Errorf("unknown operation %q", op.Kind)
	}
	resp, err := a.ChangeReplicas(forwarded(ctx), req)
	if err != nil {
		return 0, nil, err
	}
	d := resp.GetDescriptor_()
	epoch := d.GetEpoch()
	if d.GetShardId() != op.ShardID || epoch == 0 {
		d = nil // not a descriptor to record: the shard's leader reports it
	}
	return epoch, d, nil
}

// finishManualMoves clears the move of pins whose move is done (the
// replica is on the target and gone from the source).
func (n *Node) finishManualMoves(ctx context.Context, pins []*shalev1.ShardPin, dir []*shalev1.ShardDescriptor) {
	byID := map[uint64]*shalev1.ShardDescriptor{}
	for _, d := range dir {
		byID[d.GetShardId()] = d
	}
	for _, pin := range pins {
		d := byID[pin.GetShardId()]
		if pin.GetMoveToNodeId() == 0 || d == nil {
			continue
		}
		onTo, onFrom := false, false
		for _, rd := range d.GetReplicas() {
			onTo = onTo || (rd.GetNodeId() == pin.GetMoveToNodeId() && rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED)
			onFrom = onFrom || rd.GetNodeId() == pin.GetMoveFromNodeId()
		}
		expired := pin.GetUntilUnixNanos() <= n.wallNanos()
		if !(onTo && !onFrom) && !expired {
			continue
		}
		done := proto.Clone(pin).(*shalev1.ShardPin)
		done.MoveFromNodeId, done.MoveToNodeId = 0, 0
		if expired {
			done.UntilUnixNanos = 0
		}
		id := requestIDFor("pin-done", itoa(pin.GetShardId()), fmt.Sprint(pin.GetUntilUnixNanos()))
		if _, err := n.proposeSystem(ctx, id, &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutPin{PutPin: done}}); err != nil {
			n.log.Debug("clear a finished manual move", "shard", pin.GetShardId(), "err", err)
		}
	}
}

// updateView records the status PlacementStatus serves, and the metrics.
func (n *Node) updateView(reg []*shalev1.NodeDescriptor, states map[uint64]placement.NodeState, shards []placement.Shard, plan placement.Plan) {
	view := &shalev1.PlacementStatusResponse{PlacementLeaderNodeId: n.cfg.NodeID, Stuck: stuckProto(plan.Stuck)}
	byNode := map[uint64]*shalev1.NodePlacement{}
	beats := n.place.tracker.Beats()
	m := n.place.metrics
	m.replicas.Reset()
	m.leaders.Reset()
	m.state.Reset()
	for _, d := range reg {
		st := states[d.GetNodeId()].String()
		if d.GetRemoved() {
			st = "removed"
		}
		np := &shalev1.NodePlacement{Node: d, State: st}
		if b, ok := beats[d.GetNodeId()]; ok {
			np.LastHeartbeatUnixNanos = b.At.UnixNano()
			np.Stats = b.Req.GetStats()
		}
		byNode[d.GetNodeId()] = np
		view.Nodes = append(view.Nodes, np)
		m.state.WithLabelValues(itoa(d.GetNodeId()), st).Set(1)
	}
	now := time.Now().UnixNano()
	for _, sh := range shards {
		for _, rd := range sh.Desc.GetReplicas() {
			if np := byNode[rd.GetNodeId()]; np != nil {
				np.Replicas++
				np.Bytes += sh.SizeBytes
			}
		}
		if np := byNode[sh.Leader]; np != nil {
			np.Leaders++
		}
		for _, rd := range sh.Desc.GetReplicas() {
			if rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_LEARNER && !sh.CaughtUp[rd.GetReplicaId()] {
				view.Running = append(view.Running, &shalev1.PlacementOperation{ShardId: sh.Desc.GetShardId(), Kind: "catch-up",
					NodeId: rd.GetNodeId(), FromNodeId: sh.Leader, Reason: "learner receiving a snapshot or the log", StartedUnixNanos: now, State: "running"})
			}
		}
	}
	view.Running = append(n.place.history.Running(), view.Running...)
	for _, s := range plan.Stuck {
		if np := byNode[s.Node]; np != nil {
			np.Stuck = append(np.Stuck, &shalev1.StuckReplica{ShardId: s.ShardID, NodeId: s.Node, Reason: s.Reason})
		}
	}
	// Spreads over the nodes that may hold replicas.
	var minR, maxR, minL, maxL, minB, maxB uint64 = math.MaxUint64, 0, math.MaxUint64, 0, math.MaxUint64, 0
	eligible := 0
	for _, np := range view.Nodes {
		m.replicas.WithLabelValues(itoa(np.GetNode().GetNodeId())).Set(float64(np.GetReplicas()))
		m.leaders.WithLabelValues(itoa(np.GetNode().GetNodeId())).Set(float64(np.GetLeaders()))
		if np.GetState() != "live" || np.GetNode().GetDecommissioning() {
			continue
		}
		eligible++
		minR, maxR = min(minR, np.GetReplicas()), max(maxR, np.GetReplicas())
		minL, maxL = min(minL, np.GetLeaders()), max(maxL, np.GetLeaders())
		minB, maxB = min(minB, np.GetBytes()), max(maxB, np.GetBytes())
	}
	if eligible > 0 {
		view.ReplicaSpread, view.LeaderSpread = maxR-minR, maxL-minL
		if maxB > 0 {
			view.BytesSpreadPercent = 100 * float64(maxB-minB) / float64(maxB)
		}
	}
	quiet := true // every shard led, idle, and out of any membership change
	for _, sh := range shards {
		if sh.Busy || sh.Leader == 0 || settled(sh.Desc) != nil {
			quiet = false
		}
	}
	view.Balanced = quiet && len(plan.Ops) == 0 && len(view.Running) == 0 && len(plan.Stuck) == 0
	m.moves.Set(float64(placement.Moves(shards)))
	m.stuck.Set(float64(len(plan.Stuck)))
	n.place.mu.Lock()
	n.place.view = view
	n.place.mu.Unlock()
}

func stuckProto(in []placement.Stuck) []*shalev1.StuckReplica {
	out := make([]*shalev1.StuckReplica, 0, len(in))
	for _, s := range in {
		out = append(out, &shalev1.StuckReplica{ShardId: s.ShardID, NodeId: s.Node, Reason: s.Reason})
	}
	return out
}

// --- Admin RPCs ---

// ChangeReplicas implements the Admin RPC on the shard's leader.
func (s *adminService) ChangeReplicas(ctx context.Context, req *shalev1.ChangeReplicasRequest) (*shalev1.ChangeReplicasResponse, error) {
	n := s.n
	if req.GetShardId() == 0 || req.GetEpoch() == 0 || len(req.GetChanges()) == 0 {
		return nil, invalidArg("shard_id, epoch and at least one change are required")
	}
	var changes []replication.ReplicaChange
	for _, c := range req.GetChanges() {
		switch c.GetType() {
		case shalev1.ReplicaChange_TYPE_ADD_LEARNER:
			if c.GetNodeId() == 0 {
				return nil, invalidArg("an add-learner change needs a node_id")
			}
			changes = append(changes, replication.ReplicaChange{Type: replication.AddLearner, NodeID: c.GetNodeId()})
		case shalev1.ReplicaChange_TYPE_PROMOTE_LEARNER, shalev1.ReplicaChange_TYPE_REMOVE_REPLICA:
			if c.GetReplicaId() == 0 {
				return nil, invalidArg("promote and remove changes need a replica_id")
			}
			t := replication.PromoteLearner
			if c.GetType() == shalev1.ReplicaChange_TYPE_REMOVE_REPLICA {
				t = replication.RemoveReplica
			}
			changes = append(changes, replication.ReplicaChange{Type: t, ReplicaID: c.GetReplicaId()})
		default:
			return nil, invalidArg("unknown replica change type %v", c.GetType())
		}
	}
	r := n.store.Replica(req.GetShardId())
	sm := n.Shard(req.GetShardId())
	if r == nil || sm == nil {
		return nil, n.shardNotFoundErr(req.GetShardId())
	}
	if !r.IsLeader() {
		return nil, n.notLeaderErr(req.GetShardId(), r.Status().LeaderNodeID)
	}
	d := sm.Descriptor()
	if d.GetMergingInto() != 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d is being merged into shard %d", req.GetShardId(), d.GetMergingInto())
	}
	if d.GetEpoch() != req.GetEpoch() {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d is at epoch %d, not %d", req.GetShardId(), d.GetEpoch(), req.GetEpoch())
	}
	for _, c := range changes {
		if c.Type == replication.PromoteLearner || c.Type == replication.RemoveReplica {
			found := false
			for _, rd := range d.GetReplicas() {
				found = found || rd.GetReplicaId() == c.ReplicaID
			}
			if !found {
				return nil, status.Errorf(codes.FailedPrecondition, "shard %d has no replica %d", req.GetShardId(), c.ReplicaID)
			}
		}
	}
	ctx, inner, cancel := n.requestCtx(ctx)
	defer cancel()
	desc, err := r.ChangeReplicas(inner, changes)
	if err != nil {
		var nl *replication.NotLeaderError
		if errors.As(err, &nl) {
			return nil, n.notLeaderErr(req.GetShardId(), nl.LeaderNodeID)
		}
		if ctx.Err() == nil && inner.Err() != nil {
			return nil, status.Errorf(codes.Unavailable, "shard %d: the membership change did not apply in time", req.GetShardId())
		}
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d: %v", req.GetShardId(), err)
	}
	for _, c := range changes {
		if c.Type == replication.AddLearner {
			// Heartbeat fast from now on (not from the next heartbeat),
			// so the placement leader hears at once when the learner has
			// caught up.
			n.place.catchingUp.Store(true)
			n.kickPlacement()
		}
	}
	return &shalev1.ChangeReplicasResponse{Descriptor_: desc}, nil
}

// isPlacementLeader reports whether this node leads the system shard.
func (n *Node) isPlacementLeader() bool {
	r := n.store.Replica(SystemShardID)
	return r != nil && r.IsLeader()
}

// PlacementStatus implements the Admin RPC.
func (s *adminService) PlacementStatus(ctx context.Context, req *shalev1.PlacementStatusRequest) (*shalev1.PlacementStatusResponse, error) {
	n := s.n
	if !n.isPlacementLeader() {
		a, fctx, err := n.systemLeaderAdmin(ctx)
		if err != nil {
			return nil, err
		}
		return a.PlacementStatus(fctx, req)
	}
	n.place.mu.Lock()
	view := n.place.view
	n.place.mu.Unlock()
	if view == nil {
		return nil, status.Error(codes.Unavailable, "the placement leader took over moments ago and is collecting heartbeats; retry in a few seconds")
	}
	return proto.Clone(view).(*shalev1.PlacementStatusResponse), nil
}

// PlacementHistory implements the Admin RPC.
func (s *adminService) PlacementHistory(ctx context.Context, req *shalev1.PlacementHistoryRequest) (*shalev1.PlacementHistoryResponse, error) {
	n := s.n
	if !n.isPlacementLeader() {
		a, fctx, err := n.systemLeaderAdmin(ctx)
		if err != nil {
			return nil, err
		}
		return a.PlacementHistory(fctx, req)
	}
	return &shalev1.PlacementHistoryResponse{Operations: n.place.history.List(int(req.GetLimit()))}, nil
}

// setDecommissioning flips a registered node's decommissioning flag on the
// system shard's leader.
func (n *Node) setDecommissioning(ctx context.Context, id uint64, on bool) error {
	nodes, err := n.Shard(SystemShardID).Nodes()
	if err != nil {
		return status.Errorf(codes.Unavailable, "read the node registry: %v", err)
	}
	for _, d := range nodes {
		if d.GetNodeId() != id {
			continue
		}
		if d.GetRemoved() {
			return status.Errorf(codes.FailedPrecondition, "node %d was removed from the cluster", id)
		}
		if d.GetDecommissioning() == on {
			return nil
		}
		d = proto.Clone(d).(*shalev1.NodeDescriptor)
		d.Decommissioning = on
		verb := "decommission"
		if !on {
			verb = "recommission"
		}
		if _, err := n.proposeSystem(ctx, requestIDFor(verb, itoa(id), fmt.Sprint(time.Now().UnixNano())), &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutNode{PutNode: d}}); err != nil {
			return n.replicationErr(ctx, SystemShardID, err)
		}
		n.log.Info("node "+verb+"ed", "node", id)
		return nil
	}
	return status.Errorf(codes.NotFound, "node %d is not registered", id)
}

// commission starts (on) or stops draining a node, on the placement
// leader; forward sends the request there from any other node.
func (s *adminService) commission(ctx context.Context, id uint64, on bool, forward func(shalev1.AdminClient, context.Context) error) error {
	if id == 0 {
		return invalidArg("node_id is required")
	}
	if !s.n.isPlacementLeader() {
		a, fctx, err := s.n.systemLeaderAdmin(ctx)
		if err != nil {
			return err
		}
		return forward(a, fctx)
	}
	return s.n.setDecommissioning(ctx, id, on)
}

// DecommissionNode implements the Admin RPC.
func (s *adminService) DecommissionNode(ctx context.Context, req *shalev1.DecommissionNodeRequest) (*shalev1.DecommissionNodeResponse, error) {
	err := s.commission(ctx, req.GetNodeId(), true, func(a shalev1.AdminClient, fctx context.Context) error {
		_, err := a.DecommissionNode(fctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &shalev1.DecommissionNodeResponse{}, nil
}

// RecommissionNode implements the Admin RPC.
func (s *adminService) RecommissionNode(ctx context.Context, req *shalev1.RecommissionNodeRequest) (*shalev1.RecommissionNodeResponse, error) {
	err := s.commission(ctx, req.GetNodeId(), false, func(a shalev1.AdminClient, fctx context.Context) error {
		_, err := a.RecommissionNode(fctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &shalev1.RecommissionNodeResponse{}, nil
}

// pinFor returns how long a manual decision pins its shard: pinSeconds, or
// the configured default for 0; negative means no pin.
func (n *Node) pinFor(pinSeconds int64) time.Duration {
	switch {
	case pinSeconds < 0:
		return 0
	case pinSeconds == 0:
		return n.cfg.PlacementPinDuration
	}
	return time.Duration(pinSeconds) * time.Second
}

// writePin records a pin on the system shard (the caller leads it).
func (n *Node) writePin(ctx context.Context, pin *shalev1.ShardPin) error {
	id := requestIDFor("pin", itoa(pin.GetShardId()), fmt.Sprint(pin.GetUntilUnixNanos()), itoa(pin.GetMoveToNodeId()))
	if _, err := n.proposeSystem(ctx, id, &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutPin{PutPin: pin}}); err != nil {
		return n.replicationErr(ctx, SystemShardID, err)
	}
	return nil
}

// MoveReplica implements the Admin RPC on the placement leader: it checks
// the move can be made and records it with a pin; the scheduler carries it
// out.
func (s *adminService) MoveReplica(ctx context.Context, req *shalev1.MoveReplicaRequest) (*shalev1.MoveReplicaResponse, error) {
	n := s.n
	if req.GetShardId() == 0 || req.GetFromNodeId() == 0 || req.GetToNodeId() == 0 {
		return nil, invalidArg("shard_id, from_node_id and to_node_id are required")
	}
	if req.GetFromNodeId() == req.GetToNodeId() {
		return nil, invalidArg("from_node_id and to_node_id are the same node")
	}
	if !n.isPlacementLeader() {
		a, fctx, err := n.systemLeaderAdmin(ctx)
		if err != nil {
			return nil, err
		}
		return a.MoveReplica(fctx, req)
	}
	dir, err := n.directory()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read the shard directory: %v", err)
	}
	var desc *shalev1.ShardDescriptor
	for _, d := range dir {
		if d.GetShardId() == req.GetShardId() {
			desc = d
		}
	}
	if desc == nil {
		return nil, withDetail(codes.NotFound, "shard "+itoa(req.GetShardId())+" is not in the shard directory", &shalev1.ShardNotFound{ShardId: req.GetShardId()})
	}
	onFrom, onTo := false, false
	for _, rd := range desc.GetReplicas() {
		onFrom = onFrom || rd.GetNodeId() == req.GetFromNodeId()
		onTo = onTo || rd.GetNodeId() == req.GetToNodeId()
	}
	if !onFrom {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d has no replica on node %d", req.GetShardId(), req.GetFromNodeId())
	}
	if onTo {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d already has a replica on node %d", req.GetShardId(), req.GetToNodeId())
	}
	nodes, err := n.Shard(SystemShardID).Nodes()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read the node registry: %v", err)
	}
	var to *shalev1.NodeDescriptor
	for _, d := range nodes {
		if d.GetNodeId() == req.GetToNodeId() {
			to = d
		}
	}
	switch st, _, _ := n.place.tracker.State(req.GetToNodeId()); {
	case to == nil:
		return nil, status.Errorf(codes.NotFound, "node %d is not registered", req.GetToNodeId())
	case to.GetRemoved() || to.GetDecommissioning():
		return nil, status.Errorf(codes.FailedPrecondition, "node %d is removed or decommissioning and takes no replicas", req.GetToNodeId())
	case st != placement.Live:
		return nil, status.Errorf(codes.FailedPrecondition, "node %d is %s, not live", req.GetToNodeId(), st)
	}
	// A move pins its shard at least until it is done.
	until := n.cfg.WallClock().Add(max(n.pinFor(req.GetPinSeconds()), 10*time.Minute))
	reason := fmt.Sprintf("manual move from node %d to node %d", req.GetFromNodeId(), req.GetToNodeId())
	pin := &shalev1.ShardPin{ShardId: req.GetShardId(), UntilUnixNanos: until.UnixNano(), Reason: reason,
		MoveFromNodeId: req.GetFromNodeId(), MoveToNodeId: req.GetToNodeId()}
	if err := n.writePin(ctx, pin); err != nil {
		return nil, err
	}
	op := &shalev1.PlacementOperation{ShardId: req.GetShardId(), Kind: "move", NodeId: req.GetToNodeId(), FromNodeId: req.GetFromNodeId(),
		Reason: reason, StartedUnixNanos: n.wallNanos()}
	rec := n.place.history.Start(op)
	n.place.history.Finish(rec, n.wallNanos(), nil) // accepted; the steps follow in the history
	return &shalev1.MoveReplicaResponse{Operation: proto.Clone(op).(*shalev1.PlacementOperation)}, nil
}

// pinLeader records, on the placement leader, that an operator moved a
// shard's leadership.
func (n *Node) pinLeader(ctx context.Context, req *shalev1.TransferLeaderRequest) {
	d := n.pinFor(req.GetPinSeconds())
	if d <= 0 {
		return
	}
	pin := &shalev1.ShardPin{ShardId: req.GetShardId(), UntilUnixNanos: n.cfg.WallClock().Add(d).UnixNano(),
		Reason: fmt.Sprintf("manual leader transfer to node %d", req.GetTargetNodeId())}
	if err := n.writePin(ctx, pin); err != nil {
		n.log.Warn("pin a manual leader transfer", "shard", req.GetShardId(), "err", err)
	}
}
