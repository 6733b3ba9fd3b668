package server

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// maintain runs the node's background duties until Stop: registering the
// founding nodes in the node registry, learning addresses, and — on the
// leaders of local shards — keeping each shard at the replication factor on
// registered, live nodes (adding learners, promoting them once caught up,
// and replacing replicas of removed nodes). Automatic balancing arrives with
// the placement service; this is the minimal repair a cluster needs to add
// and remove nodes.
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
		n.reconcileReplicas(ctx)
		n.splitLargeShards(ctx)
		n.splitHotShards(ctx)
		n.reportDescriptors(ctx)
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

// reconcileReplicas makes one membership step on every local leader replica
// whose shard is under-replicated or has replicas on removed nodes.
func (n *Node) reconcileReplicas(ctx context.Context) {
	nodes, err := n.registry(ctx)
	if err != nil || len(nodes) == 0 {
		return
	}
	registered := map[uint64]*shalev1.NodeDescriptor{}
	for _, d := range nodes {
		registered[d.GetNodeId()] = d
	}
	self, ok := registered[n.cfg.NodeID]
	if !ok {
		// A node that is not registered (yet) makes no decisions.
		return
	}
	hosts := 0 // registered nodes that may host replicas
	for _, d := range nodes {
		if !d.GetRemoved() {
			hosts++
		}
	}
	var live map[uint64]bool // asked for only when a shard needs a change
	for _, r := range n.store.Replicas() {
		if !r.IsLeader() || !n.needsChange(r, registered, hosts, self.GetRemoved()) {
			continue
		}
		if live == nil {
			live = n.liveNodes(ctx)
		}
		if self.GetRemoved() {
			// A removed node only hands its leaderships away.
			if err := n.handOffLeadership(ctx, r, registered, live); err != nil {
				n.log.Warn("leadership hand-off", "shard", r.ShardID(), "err", err)
			}
			continue
		}
		if err := n.reconcileShard(ctx, r, registered, live); err != nil {
			n.log.Warn("membership change", "shard", r.ShardID(), "err", err)
		}
	}
}

// needsChange reports, from the replica's cached state alone (cheap enough
// for every idle shard every second), whether its membership may need a
// step: a learner, a joint configuration, a replica on a removed node, fewer
// voters than the replication factor while a node could take one, or this
// node being removed.
func (n *Node) needsChange(r *replication.Replica, registered map[uint64]*shalev1.NodeDescriptor, hosts int, selfRemoved bool) bool {
	if selfRemoved {
		return true
	}
	desc := r.Status().Descriptor
	voters := 0
	for _, rd := range desc.GetReplicas() {
		if rd.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED {
			return true
		}
		if d, ok := registered[rd.GetNodeId()]; ok && d.GetRemoved() {
			return true
		}
		voters++
	}
	return voters < n.cfg.ReplicationFactor && voters < hosts
}

// liveNodes returns the nodes that answered a status request just now
// (cached for a few seconds).
func (n *Node) liveNodes(ctx context.Context) map[uint64]bool {
	n.mu.Lock()
	if time.Since(n.liveAt) < 3*time.Second && n.live != nil {
		live := n.live
		n.mu.Unlock()
		return live
	}
	n.mu.Unlock()
	live := map[uint64]bool{}
	for id := range n.gather(ctx) {
		live[id] = true
	}
	n.mu.Lock()
	n.live, n.liveAt = live, time.Now()
	n.mu.Unlock()
	return live
}

// handOffLeadership moves the leadership of r to a live voter on a node
// that is not removed.
func (n *Node) handOffLeadership(ctx context.Context, r *replication.Replica, registered map[uint64]*shalev1.NodeDescriptor, live map[uint64]bool) error {
	desc := r.Status().Descriptor
	for _, rd := range desc.GetReplicas() {
		id := rd.GetNodeId()
		if id == n.cfg.NodeID || rd.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED || !live[id] {
			continue
		}
		if d, ok := registered[id]; ok && d.GetRemoved() {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return r.TransferLeader(tctx, id)
	}
	return nil
}

func (n *Node) reconcileShard(ctx context.Context, r *replication.Replica, registered map[uint64]*shalev1.NodeDescriptor, live map[uint64]bool) error {
	st, err := r.ProgressStatus(ctx)
	if err != nil || !st.Leader || st.Descriptor == nil {
		return err
	}
	desc := st.Descriptor
	hosting := map[uint64]bool{}
	voters := 0
	var learners, doomed []*shalev1.ReplicaDescriptor
	for _, rd := range desc.GetReplicas() {
		hosting[rd.GetNodeId()] = true
		switch rd.GetRole() {
		case shalev1.ReplicaRole_REPLICA_ROLE_LEARNER:
			learners = append(learners, rd)
		case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_INCOMING, shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING:
			return nil // a joint configuration is being left
		default:
			voters++
		}
		if d, ok := registered[rd.GetNodeId()]; ok && d.GetRemoved() {
			doomed = append(doomed, rd)
		}
	}
	// Candidates: registered, not removed, live, no replica of the shard.
	var candidates []uint64
	waiting := 0 // registered nodes that could take a replica but are not live
	for id, d := range registered {
		if d.GetRemoved() || hosting[id] {
			continue
		}
		if live[id] {
			candidates = append(candidates, id)
		} else {
			waiting++
		}
	}
	sort.Slice(candidates, func(i, j int) bool { return candidates[i] < candidates[j] })

	// Promote caught-up learners.
	for _, l := range learners {
		if d, ok := registered[l.GetNodeId()]; ok && d.GetRemoved() {
			_, err := r.ChangeReplicas(ctx, []replication.ReplicaChange{{Type: replication.RemoveReplica, ReplicaID: l.GetReplicaId()}})
			return err
		}
		if pr, ok := st.Progress[l.GetReplicaId()]; ok && pr.Match+100 >= st.Commit && pr.Match > 0 {
			n.log.Info("promoting caught-up learner", "shard", desc.GetShardId(), "node", l.GetNodeId(), "replica", l.GetReplicaId())
			_, err := r.ChangeReplicas(ctx, []replication.ReplicaChange{{Type: replication.PromoteLearner, ReplicaID: l.GetReplicaId()}})
			return err
		}
		return nil // wait for it to catch up
	}
	// Move replicas off removed nodes.
	for _, d := range doomed {
		if d.GetNodeId() == n.cfg.NodeID {
			// Hand leadership to another voter first; it will do the move.
			return n.handOffLeadership(ctx, r, registered, live)
		}
		if len(candidates) > 0 {
			n.log.Info("replacing replica on removed node", "shard", desc.GetShardId(), "node", d.GetNodeId(), "with", candidates[0])
			_, err := r.ChangeReplicas(ctx, []replication.ReplicaChange{
				{Type: replication.AddVoter, NodeID: candidates[0]},
				{Type: replication.RemoveReplica, ReplicaID: d.GetReplicaId()},
			})
			return err
		}
		if voters > 1 && waiting == 0 {
			// No node could ever take its place: shrink the shard.
			n.log.Info("removing replica on removed node", "shard", desc.GetShardId(), "node", d.GetNodeId())
			_, err := r.ChangeReplicas(ctx, []replication.ReplicaChange{{Type: replication.RemoveReplica, ReplicaID: d.GetReplicaId()}})
			return err
		}
		return nil
	}
	// Up-replicate.
	if voters < n.cfg.ReplicationFactor && len(candidates) > 0 {
		n.log.Info("adding learner", "shard", desc.GetShardId(), "node", candidates[0])
		_, err := r.ChangeReplicas(ctx, []replication.ReplicaChange{{Type: replication.AddLearner, NodeID: candidates[0]}})
		return err
	}
	return nil
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

// removeNode marks a node removed (on the system leader); shard leaders
// then move its replicas away.
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
