package placement

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// model is a cluster state the datadriven scripts build and the simulator
// changes by applying the scheduler's operations.
type model struct {
	cfg    Config
	nodes  []Node
	shards []Shard
}

func (m *model) node(id uint64) *Node {
	for i := range m.nodes {
		if m.nodes[i].ID == id {
			return &m.nodes[i]
		}
	}
	m.nodes = append(m.nodes, Node{ID: id})
	return &m.nodes[len(m.nodes)-1]
}

func (m *model) shard(id uint64) *Shard {
	for i := range m.shards {
		if m.shards[i].Desc.GetShardId() == id {
			return &m.shards[i]
		}
	}
	return nil
}

func parseIDs(t *testing.T, s string) []uint64 {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			t.Fatalf("bad id list %q: %v", s, err)
		}
		out = append(out, v)
	}
	return out
}

func (m *model) cmd(t *testing.T, d *datadriven.TestData) string {
	arg := func(key string) (string, bool) {
		for _, a := range d.CmdArgs {
			if a.Key == key {
				if len(a.Vals) == 0 {
					return "", true
				}
				return a.Vals[0], true
			}
		}
		return "", false
	}
	num := func(key string, def uint64) uint64 {
		v, ok := arg(key)
		if !ok {
			return def
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s: bad %s=%q", d.Pos, key, v)
		}
		return n
	}
	switch d.Cmd {
	case "init":
		*m = model{cfg: Config{
			ReplicationFactor:  int(num("rf", 3)),
			MaxMovesPerNode:    int(num("max-moves-per-node", 2)),
			MaxMoves:           int(num("max-moves", 8)),
			MaxLeaderTransfers: int(num("leader-transfers", 4)),
		}}
		_, m.cfg.LeaderBalanceDuringMoves = arg("leader-balance-during-moves")
		return ""
	case "node":
		// node ID [zone=Z] [state=live|suspect|dead] [decommissioning] [removed] [draining-leaders] [refused-leadership] [applying-backlog]
		id := num("id", 0)
		if id == 0 && len(d.CmdArgs) > 0 {
			id, _ = strconv.ParseUint(d.CmdArgs[0].Key, 10, 64)
		}
		n := m.node(id)
		if z, ok := arg("zone"); ok {
			n.Zone = z
		}
		if st, ok := arg("state"); ok {
			n.State = map[string]NodeState{"live": Live, "suspect": Suspect, "dead": Dead}[st]
		}
		_, n.Decommissioning = arg("decommissioning")
		_, n.Removed = arg("removed")
		_, n.DrainingLeaders = arg("draining-leaders")
		_, n.RefusedLeadership = arg("refused-leadership")
		_, n.ApplyingBacklog = arg("applying-backlog")
		return ""
	case "nodes":
		// nodes 1-5 [zones=a,b,c]: live nodes, zones round-robin
		r := strings.SplitN(d.CmdArgs[0].Key, "-", 2)
		lo, _ := strconv.ParseUint(r[0], 10, 64)
		hi, _ := strconv.ParseUint(r[1], 10, 64)
		zs, _ := arg("zones")
		zones := strings.Split(zs, ",")
		for id := lo; id <= hi; id++ {
			n := m.node(id)
			if zs != "" {
				n.Zone = zones[int(id-lo)%len(zones)]
			}
		}
		return ""
	case "shard":
		// shard ID leader=N voters=a,b,c [learners=d] [caught-up=d] [size=S] [pinned] [new-leader] [move=a->b]
		id, _ := strconv.ParseUint(d.CmdArgs[0].Key, 10, 64)
		desc := &shalev1.ShardDescriptor{ShardId: id, Epoch: 1}
		rid := uint64(1)
		v, _ := arg("voters")
		for _, n := range parseIDs(t, v) {
			desc.Replicas = append(desc.Replicas, &shalev1.ReplicaDescriptor{NodeId: n, ReplicaId: rid})
			rid++
		}
		sh := Shard{Desc: desc, Leader: num("leader", 0), SizeBytes: num("size", 0), CaughtUp: map[uint64]bool{}}
		l, _ := arg("learners")
		cu, _ := arg("caught-up")
		for _, n := range parseIDs(t, l) {
			desc.Replicas = append(desc.Replicas, &shalev1.ReplicaDescriptor{NodeId: n, ReplicaId: rid, Role: shalev1.ReplicaRole_REPLICA_ROLE_LEARNER})
			if slices.Contains(parseIDs(t, cu), n) {
				sh.CaughtUp[rid] = true
			}
			rid++
		}
		desc.NextReplicaId = rid
		_, sh.Pinned = arg("pinned")
		_, sh.NewLeader = arg("new-leader")
		if mv, ok := arg("move"); ok {
			p := strings.SplitN(mv, "->", 2)
			sh.MoveFrom, _ = strconv.ParseUint(p[0], 10, 64)
			sh.MoveTo, _ = strconv.ParseUint(p[1], 10, 64)
		}
		if old := m.shard(id); old != nil {
			*old = sh
		} else {
			m.shards = append(m.shards, sh)
		}
		return ""
	case "shards":
		// shards N voters=1,2,3 [size=S]: N shards numbered from 10, led
		// by their first voter.
		count, _ := strconv.Atoi(d.CmdArgs[0].Key)
		v, _ := arg("voters")
		vs := parseIDs(t, v)
		for i := 0; i < count; i++ {
			desc := &shalev1.ShardDescriptor{ShardId: uint64(10 + i), Epoch: 1, NextReplicaId: uint64(len(vs) + 1)}
			for j, n := range vs {
				desc.Replicas = append(desc.Replicas, &shalev1.ReplicaDescriptor{NodeId: n, ReplicaId: uint64(j + 1)})
			}
			m.shards = append(m.shards, Shard{Desc: desc, Leader: vs[0], SizeBytes: num("size", 0), CaughtUp: map[uint64]bool{}})
		}
		return ""
	case "schedule":
		p := Schedule(m.cfg, slices.Clone(m.nodes), m.shards)
		out := formatPlan(p)
		if p.Moving {
			out += "moves in flight\n"
		}
		return out
	case "simulate":
		return m.simulate(t, int(num("steps", 100)))
	case "state":
		return m.state()
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}

func formatPlan(p Plan) string {
	var b strings.Builder
	for _, op := range p.Ops {
		fmt.Fprintln(&b, op)
	}
	for _, s := range p.Stuck {
		fmt.Fprintf(&b, "stuck: shard %d on n%d: %s\n", s.ShardID, s.Node, s.Reason)
	}
	if b.Len() == 0 {
		return "nothing to do\n"
	}
	return b.String()
}

// apply applies op to the model as the shard's leader would: an operation
// decided on an older epoch is refused.
func (m *model) apply(t *testing.T, op Op) {
	sh := m.shard(op.ShardID)
	d := sh.Desc
	if d.GetEpoch() != op.Epoch {
		return
	}
	switch op.Kind {
	case AddLearner:
		if hosts(d, op.Node) {
			t.Fatalf("%v: node already hosts the shard", op)
		}
		d.Replicas = append(d.Replicas, &shalev1.ReplicaDescriptor{NodeId: op.Node, ReplicaId: d.NextReplicaId, Role: shalev1.ReplicaRole_REPLICA_ROLE_LEARNER})
		d.NextReplicaId++
	case Promote:
		if !sh.CaughtUp[op.ReplicaID] {
			t.Fatalf("%v: learner not caught up", op)
		}
		for _, rd := range d.Replicas {
			if rd.GetReplicaId() == op.ReplicaID {
				rd.Role = shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED
			}
		}
		if op.RemoveReplicaID != 0 {
			m.remove(t, sh, op.RemoveReplicaID)
		}
	case RemoveReplica:
		m.remove(t, sh, op.ReplicaID)
	case TransferLeader:
		if sh.Leader != op.From {
			t.Fatalf("%v: leader is n%d", op, sh.Leader)
		}
		sh.Leader = op.Node
		return // leadership is not in the descriptor: no epoch bump
	}
	d.Epoch++
}

func (m *model) remove(t *testing.T, sh *Shard, replicaID uint64) {
	d := sh.Desc
	for i, rd := range d.Replicas {
		if rd.GetReplicaId() == replicaID {
			if rd.GetNodeId() == sh.Leader {
				t.Fatalf("shard %d: the scheduler removed its leader's replica", d.GetShardId())
			}
			d.Replicas = slices.Delete(d.Replicas, i, i+1)
			return
		}
	}
	t.Fatalf("shard %d: no replica %d to remove", d.GetShardId(), replicaID)
}

// simulate runs the scheduler until it has nothing more to do: each step
// applies every operation it returns, and learners added in one step have
// caught up by the next. It checks, after every step, that no shard has
// fewer voters on non-dead nodes than a quorum of its voters, and that no
// node holds two replicas of a shard.
func (m *model) simulate(t *testing.T, maxSteps int) string {
	var b strings.Builder
	minVoters := map[uint64]int{}
	for _, sh := range m.shards {
		minVoters[sh.Desc.GetShardId()] = min(len(voters(sh.Desc)), m.cfg.ReplicationFactor)
	}
	steps, ops, adds, maxMoves := 0, 0, 0, 0
	for ; steps < maxSteps; steps++ {
		// Learners present since the last step have caught up.
		for i := range m.shards {
			for _, l := range learners(m.shards[i].Desc) {
				m.shards[i].CaughtUp[l.GetReplicaId()] = true
			}
		}
		p := Schedule(m.cfg, slices.Clone(m.nodes), m.shards)
		if len(p.Ops) == 0 {
			break
		}
		maxMoves = max(maxMoves, Moves(m.shards))
		for _, op := range p.Ops {
			m.apply(t, op)
			ops++
			if op.Kind == AddLearner {
				adds++
			}
		}
		for _, sh := range m.shards {
			seen := map[uint64]bool{}
			live := 0
			for _, rd := range sh.Desc.GetReplicas() {
				if seen[rd.GetNodeId()] {
					t.Fatalf("shard %d has two replicas on node %d", sh.Desc.GetShardId(), rd.GetNodeId())
				}
				seen[rd.GetNodeId()] = true
				if rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED {
					live++
				}
			}
			if live < minVoters[sh.Desc.GetShardId()] {
				t.Fatalf("step %d: shard %d dropped to %d voters", steps, sh.Desc.GetShardId(), live)
			}
		}
	}
	if steps == maxSteps {
		fmt.Fprintf(&b, "did not converge in %d steps\n", maxSteps)
	} else {
		fmt.Fprintf(&b, "converged after %d steps, %d operations, %d replicas added\n", steps, ops, adds)
	}
	b.WriteString(m.state())
	if p := Schedule(m.cfg, slices.Clone(m.nodes), m.shards); len(p.Stuck) > 0 {
		b.WriteString(formatPlan(p))
	}
	return b.String()
}

// state prints per-node replica and leader counts and the zone spread.
func (m *model) state() string {
	var b strings.Builder
	reps, leads := map[uint64]int{}, map[uint64]int{}
	zoneClashes := 0
	for _, sh := range m.shards {
		zones := map[string]bool{}
		for _, rd := range sh.Desc.GetReplicas() {
			reps[rd.GetNodeId()]++
			z := m.node(rd.GetNodeId()).Zone
			if z != "" && zones[z] {
				zoneClashes++
			}
			zones[z] = true
		}
		leads[sh.Leader]++
	}
	ids := make([]uint64, 0, len(m.nodes))
	for _, n := range m.nodes {
		ids = append(ids, n.ID)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "n%d: replicas=%d leaders=%d\n", id, reps[id], leads[id])
	}
	if zoneClashes > 0 {
		fmt.Fprintf(&b, "zone clashes: %d\n", zoneClashes)
	}
	return b.String()
}

func TestScheduler(t *testing.T) {
	datadriven.Walk(t, "testdata/scheduler", func(t *testing.T, path string) {
		m := &model{cfg: Config{ReplicationFactor: 3, MaxMovesPerNode: 2, MaxMoves: 8, MaxLeaderTransfers: 4}}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return m.cmd(t, d)
		})
	})
}
