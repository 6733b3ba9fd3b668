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

// placementLoop heartbeats to the placement leader once a second and, on
// the placement leader, schedules replica and leadership moves, until Stop.
// A kick (kickPlacement) brings the next round forward, to no sooner than
// placementMinInterval after the last; while this node leads a shard
// whose learner is catching up, it heartbeats every fastHeartbeatInterval.
func (n *Node) placementLoop() {
	defer n.wg.Done()
	t := time.NewTimer(placementInterval)
	defer t.Stop()
	last := time.Now()
	for {
		wait := placementInterval
		if n.place.catchingUp.Load() {
			wait = fastHeartbeatInterval
		}
		t.Reset(time.Until(last.Add(wait)))
		select {
		case <-n.stop:
			return
		case <-t.C:
		case <-n.place.kick:
			select {
			case <-n.stop:
				return
			case <-time.After(time.Until(last.Add(placementMinInterval))):
			}
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		n.sendHeartbeat(ctx)
		n.runPlacement(ctx)
		cancel()
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
