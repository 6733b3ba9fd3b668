package server

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// maintain runs the node's background duties once a second until Stop:
// registering the founding nodes in the node registry, learning addresses,
// splitting large and hot shards, merging small ones, and reporting changed
// descriptors to the shard directory. Heartbeats and scheduling run in
// placementLoop, so a long split or merge does not delay them.
func (n *Node) maintain() {
	defer n.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		n.ensureRegistry(ctx)
		if i%5 == 0 || n.Shard(SystemShardID) != nil {
			n.refreshAddrs(ctx)
		}
		n.splitLargeShards(ctx)
		n.splitHotShards(ctx)
		n.mergeSmallShards(ctx)
		if i%5 == 0 {
			n.collectStrayReplicas(ctx)
		}
		n.reportDescriptors(ctx)
		cancel()
	}
}

// placementLoop heartbeats to the placement leader once a second, the
// first time as the node starts, and, on the placement leader, schedules
// replica and leadership moves, until Stop. A kick (kickPlacement) brings
// the next round forward, to no sooner than placementMinInterval after the
// last; a due move start (moveDue) brings it forward at once. While this
// node leads a shard whose learner is catching up, it heartbeats every
// fastHeartbeatInterval.
//
// The first heartbeat is not held for a second: the placement leader
// gives a node replicas from its first heartbeat on, and in rebalances
// onto joining nodes that second was a tenth of the time to balance
// (docs/BENCHMARKS.md, issue 24).
func (n *Node) placementLoop() {
	defer n.wg.Done()
	t := time.NewTimer(placementInterval)
	defer t.Stop()
	last := time.Now().Add(-placementInterval) // the first round at once
	for {
		wait := placementInterval
		if n.place.catchingUp.Load() {
			wait = fastHeartbeatInterval
		}
		t.Reset(time.Until(last.Add(wait)))
		if !n.place.awaitRound(n.stop, t, last) {
			return
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		n.sendHeartbeat(ctx)
		n.runPlacement(ctx)
		cancel()
	}
}

// awaitRound waits for the next round of placementLoop, whose last round
// ran at last: until timer fires, a kick has waited out placementMinInterval
// since last, or a move start is due (moveDue, at once, whether or not a
// kick is waiting out its interval). It returns false once stop is closed.
// Kicks come all through a rebalance (steps returning, learners caught up):
// when the due start's round queued behind such a kick, the next move
// started a round late, 0.40 s after the last rather than
// moveStartInterval (docs/BENCHMARKS.md, issue 24).
func (p *placementState) awaitRound(stop <-chan struct{}, timer *time.Timer, last time.Time) bool {
	var kicked <-chan time.Time
	kick := p.kick
	for {
		select {
		case <-stop:
			return false
		case <-timer.C:
			return true
		case <-p.moveDue:
			return true
		case <-kicked:
			return true
		case <-kick:
			kick = nil
			kicked = time.After(time.Until(last.Add(placementMinInterval)))
		}
	}
}

// ensureRegistry registers the founding nodes, once, on the system leader.
func (n *Node) ensureRegistry(ctx context.Context) {
	r := n.store.Replica(SystemShardID)
	if r == nil || !r.IsLeader() || len(n.cfg.InitialCluster) == 0 {
		return
	}
	nodes, err := n.Shard(SystemShardID).Nodes()
	if err != nil {
		return
	}
	have := map[uint64]bool{}
	for _, d := range nodes {
		have[d.GetNodeId()] = true
	}
	for id, addr := range n.cfg.InitialCluster {
		if have[id] {
			continue
		}
		d := &shalev1.NodeDescriptor{NodeId: id, Address: addr}
		if id == n.cfg.NodeID {
			d.Zone = n.cfg.Zone
		}
		if _, err := n.proposeSystem(ctx, requestIDFor("register", strconv.FormatUint(id, 10)), &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutNode{PutNode: d}}); err != nil {
			n.log.Warn("register founding node", "node", id, "err", err)
			return
		}
	}
}

// addNode registers a new node (on the system leader) or returns the
// existing registration of the same address.
func (n *Node) addNode(ctx context.Context, addr, zone string) (*shalev1.NodeDescriptor, []*shalev1.NodeDescriptor, error) {
	n.ensureRegistry(ctx)
	sys := n.Shard(SystemShardID)
	nodes, err := sys.Nodes()
	if err != nil {
		return nil, nil, err
	}
	var maxID uint64
	for _, d := range nodes {
		maxID = max(maxID, d.GetNodeId())
		if d.GetAddress() == addr && !d.GetRemoved() {
			return d, nodes, nil
		}
	}
	for id := range n.cfg.InitialCluster {
		maxID = max(maxID, id)
	}
	d := &shalev1.NodeDescriptor{NodeId: maxID + 1, Address: addr, Zone: zone}
	if _, err := n.proposeSystem(ctx, requestIDFor("add-node", addr, strconv.FormatUint(d.GetNodeId(), 10)), &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutNode{PutNode: d}}); err != nil {
		return nil, nil, err
	}
	n.setAddr(d.GetNodeId(), addr)
	n.log.Info("node added", "node", d.GetNodeId(), "address", addr)
	return d, append(nodes, d), nil
}

// removeNode marks a node removed (on the system leader); the placement
// leader then moves its replicas away.
func (n *Node) removeNode(ctx context.Context, id uint64) error {
	n.ensureRegistry(ctx)
	nodes, err := n.Shard(SystemShardID).Nodes()
	if err != nil {
		return err
	}
	for _, d := range nodes {
		if d.GetNodeId() != id {
			continue
		}
		if d.GetRemoved() {
			return nil
		}
		d = proto.Clone(d).(*shalev1.NodeDescriptor)
		d.Removed = true
		_, err := n.proposeSystem(ctx, requestIDFor("remove-node", strconv.FormatUint(id, 10)), &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutNode{PutNode: d}})
		if err == nil {
			n.log.Info("node marked removed", "node", id)
		}
		return err
	}
	return fmt.Errorf("node %d is not registered", id)
}
