package cluster

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func TestPlacementSplits(t *testing.T) {
	if got := PlacementSplits(1); got != "" {
		t.Fatalf("PlacementSplits(1) = %q", got)
	}
	if got, want := PlacementSplits(4), "4000,8000,c000"; got != want {
		t.Fatalf("PlacementSplits(4) = %q, want %q", got, want)
	}
	// 16 shards: every shard gets about 1/16 of the benchmark's keys.
	splits := strings.Split(PlacementSplits(16), ",")
	counts := make([]int, 16)
	const n = 1 << 16
	for i := range n {
		k := AppendKey(nil, uint64(i))
		s := 0
		for s < len(splits) && bytes.Compare(k, []byte(splits[s])) >= 0 {
			s++
		}
		counts[s]++
	}
	for s, c := range counts {
		if c < n/16*9/10 || c > n/16*11/10 {
			t.Fatalf("shard %d holds %d of %d keys: %v", s, c, n, counts)
		}
	}
}

func TestPlacementViewBalanced(t *testing.T) {
	node := func(id uint64) *shalev1.NodeStatus {
		return &shalev1.NodeStatus{Node: &shalev1.NodeDescriptor{NodeId: id}, Live: true}
	}
	shard := func(id, leader uint64, role shalev1.ReplicaRole, nodes ...uint64) *shalev1.ShardStatus {
		d := &shalev1.ShardDescriptor{ShardId: id}
		for _, n := range nodes {
			d.Replicas = append(d.Replicas, &shalev1.ReplicaDescriptor{NodeId: n, Role: role})
		}
		return &shalev1.ShardStatus{Descriptor_: d, LeaderNodeId: leader, SizeBytes: 100}
	}
	voter := shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED
	st := &shalev1.ClusterStatusResponse{
		Nodes: []*shalev1.NodeStatus{node(1), node(2), node(3), node(4)},
		Shards: []*shalev1.ShardStatus{
			shard(1, 1, voter, 1, 2, 3),
			shard(2, 2, voter, 2, 3, 4),
			shard(3, 4, voter, 1, 3, 4),
			shard(4, 3, voter, 1, 2, 4),
		},
	}
	v := viewOf(st, 3)
	if !v.balanced() {
		t.Fatalf("want balanced: %s", v)
	}
	// Leaders 2/0/1/1: spread 2.
	st.Shards[1].LeaderNodeId = 1
	if v := viewOf(st, 3); v.balanced() {
		t.Fatalf("want unbalanced leaders: %s", v)
	}
	st.Shards[1].LeaderNodeId = 2
	// A learner left: not balanced.
	st.Shards[0].Descriptor_.Replicas[0].Role = shalev1.ReplicaRole_REPLICA_ROLE_LEARNER
	if v := viewOf(st, 3); v.balanced() || v.nonVoters != 1 {
		t.Fatalf("want a learner: %s", v)
	}
	st.Shards[0].Descriptor_.Replicas[0].Role = voter
	// A fifth, empty node: replicas 3/3/3/3/0.
	st.Nodes = append(st.Nodes, node(5))
	if v := viewOf(st, 3); v.balanced() {
		t.Fatalf("want unbalanced replicas: %s", v)
	}
}

func TestPlacementLogOps(t *testing.T) {
	dir := t.TempDir()
	for i, text := range []string{
		`time=2026-11-22T15:50:39.362Z level=INFO msg="became placement leader" node=1
time=2026-11-22T15:50:42.483Z level=INFO msg="placement operation" node=1 op="shard 2: transfer-leader n2 -> n1 (leader balance)"
time=2026-11-22T15:50:59.262Z level=INFO msg="placement operation" node=1 op="shard 14: add-learner on n4 (rebalance)"
time=2026-11-22T15:51:09.346Z level=INFO msg="placement operation" node=1 op="shard 15: add-learner on n2 (rebalance)"
`,
		`time=2026-11-22T15:51:01.340Z level=INFO msg="became placement leader" node=2
time=2026-11-22T15:51:03.385Z level=INFO msg="placement operation" node=2 op="shard 7: promote r4 on n4, remove r1 on n3 (learner caught up)"
time=2026-11-22T15:51:04.000Z level=INFO msg="placement operation failed" node=2 op="shard 7: promote r4 on n4" err="x"
time=2026-11-22T15:52:00.000Z level=INFO msg="placement operation" node=2 op="shard 8: add-learner on n1 (rebalance)"
`,
	} {
		d := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "server.log"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	start, _ := time.Parse(time.RFC3339, "2026-11-22T15:50:50Z")
	end, _ := time.Parse(time.RFC3339, "2026-11-22T15:51:30Z")
	ops, onOld, leaders := placementLogOps(dir, start, end, map[uint64]bool{1: true, 2: true, 3: true})
	want := map[string]int{"add-learner": 2, "promote": 1, "failed": 1}
	if fmt.Sprint(ops) != fmt.Sprint(want) || onOld != 1 || leaders != 1 {
		t.Fatalf("got %v, %d on old nodes, %d leaders; want %v, 1, 1", ops, onOld, leaders, want)
	}
}
