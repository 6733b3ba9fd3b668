package client

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// nodePlacement finds a node in a PlacementStatusResponse.
func nodePlacement(t *testing.T, st *shalev1.PlacementStatusResponse, id uint64) *shalev1.NodePlacement {
	t.Helper()
	for _, n := range st.GetNodes() {
		if n.GetNode().GetNodeId() == id {
			return n
		}
	}
	t.Fatalf("node %d not in placement status %v", id, st)
	return nil
}

func TestPlacementStatusAndDecommission(t *testing.T) {
	fc := threeShards(t)
	fc.adminLeader = 3
	fc.stuck = []*shalev1.StuckReplica{{ShardId: 2, NodeId: 1, Reason: "no eligible node"}}
	fc.load(map[string]string{"apple": "1", "kiwi": "2"})
	c := fc.client()
	ctx := bg(t)

	st, err := c.PlacementStatus(ctx)
	if err != nil || st.GetPlacementLeaderNodeId() != 1 || len(st.GetNodes()) != 3 || st.GetBalanced() {
		t.Fatalf("PlacementStatus = %v, %v", st, err)
	}
	n1 := nodePlacement(t, st, 1)
	if n1.GetReplicas() != 3 || n1.GetLeaders() != 1 || n1.GetBytes() != 3000 || n1.GetState() != "live" ||
		len(n1.GetStuck()) != 1 || n1.GetStuck()[0].GetReason() != "no eligible node" || n1.GetNode().GetDecommissioning() {
		t.Errorf("node 1: %v", n1)
	}

	// Decommission and recommission are mutations: they follow the admin
	// leader's NotLeader hint and send the node ID.
	if err := c.DecommissionNode(ctx, 2); err != nil {
		t.Fatal(err)
	}
	reqs := adminRequests[*shalev1.DecommissionNodeRequest](fc)
	if len(reqs) == 0 || reqs[len(reqs)-1].GetNodeId() != 2 {
		t.Errorf("DecommissionNode requests: %v", reqs)
	}
	if st, err = c.PlacementStatus(ctx); err != nil || !nodePlacement(t, st, 2).GetNode().GetDecommissioning() ||
		nodePlacement(t, st, 1).GetNode().GetDecommissioning() {
		t.Fatalf("after DecommissionNode(2): %v, %v", st, err)
	}
	if err := c.RecommissionNode(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if rr := adminRequests[*shalev1.RecommissionNodeRequest](fc); len(rr) == 0 || rr[len(rr)-1].GetNodeId() != 2 {
		t.Errorf("RecommissionNode requests: %v", rr)
	}
	if st, err = c.PlacementStatus(ctx); err != nil || nodePlacement(t, st, 2).GetNode().GetDecommissioning() {
		t.Fatalf("after RecommissionNode(2): %v, %v", st, err)
	}

	// Errors come back typed, with the operation named.
	err = c.DecommissionNode(ctx, 42)
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "decommission-node") {
		t.Errorf("DecommissionNode(42) = %v", err)
	}
	if err := c.RecommissionNode(ctx, 42); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "recommission-node") {
		t.Errorf("RecommissionNode(42) = %v", err)
	}
	if err := c.DecommissionNode(ctx, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("DecommissionNode(0) = %v, want ErrInvalidArgument", err)
	}
}

func TestMoveReplicaAndHistory(t *testing.T) {
	fc := threeShards(t)
	fc.adminLeader = 2
	c := fc.client()
	ctx := bg(t)
	if _, err := c.AddNode(ctx, "10.0.0.4:7001", "zd"); err != nil {
		t.Fatal(err)
	}

	op, err := c.MoveReplica(ctx, 1, 1, 4, 0)
	if err != nil || op.GetShardId() != 1 || op.GetKind() != "move" || op.GetNodeId() != 4 ||
		op.GetFromNodeId() != 1 || op.GetState() != "done" {
		t.Fatalf("MoveReplica = %v, %v", op, err)
	}
	// The pin travels in whole seconds: 0 is the server's default, any
	// negative duration no pin, and a fraction of a second rounds up.
	for _, c2 := range []struct {
		pin  time.Duration
		want int64
	}{
		{0, 0}, {-time.Nanosecond, -1}, {-time.Hour, -1}, {time.Nanosecond, 1}, {1500 * time.Millisecond, 2},
		{90 * time.Second, 90}, {30 * time.Minute, 1800},
	} {
		if _, err := c.MoveReplica(ctx, 2, 3, 4, c2.pin); err != nil {
			t.Fatalf("MoveReplica pin %v: %v", c2.pin, err)
		}
		reqs := adminRequests[*shalev1.MoveReplicaRequest](fc)
		r := reqs[len(reqs)-1]
		if r.GetShardId() != 2 || r.GetFromNodeId() != 3 || r.GetToNodeId() != 4 || r.GetPinSeconds() != c2.want {
			t.Errorf("MoveReplica pin %v sent %v, want pin_seconds %d", c2.pin, r, c2.want)
		}
	}
	if _, err := c.MoveReplica(ctx, 77, 1, 4, 0); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "move-replica") {
		t.Errorf("MoveReplica of unknown shard: %v", err)
	}
	if _, err := c.MoveReplica(ctx, 1, 1, 2, 0); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("MoveReplica to a node with a replica: %v", err)
	}

	st, err := c.PlacementStatus(ctx)
	if err != nil || len(st.GetRunning()) != 8 || st.GetBalanced() {
		t.Fatalf("PlacementStatus running = %d, %v", len(st.GetRunning()), err)
	}

	// Each move left a "move" and an "add-learner" operation, oldest first.
	hist, err := c.PlacementHistory(ctx, 0)
	if err != nil || len(hist) != 16 || hist[0].GetShardId() != 1 || hist[0].GetKind() != "move" ||
		hist[15].GetShardId() != 2 || hist[15].GetKind() != "add-learner" {
		t.Fatalf("PlacementHistory(0) = %v, %v", hist, err)
	}
	hist, err = c.PlacementHistory(ctx, 2)
	if err != nil || len(hist) != 2 || hist[0].GetKind() != "move" || hist[1].GetState() != "running" {
		t.Fatalf("PlacementHistory(2) = %v, %v", hist, err)
	}
	hr := adminRequests[*shalev1.PlacementHistoryRequest](fc)
	if len(hr) != 2 || hr[0].GetLimit() != 0 || hr[1].GetLimit() != 2 {
		t.Errorf("PlacementHistory requests: %v", hr)
	}
	// A negative limit fails without a request.
	if _, err := c.PlacementHistory(ctx, -1); !errors.Is(err, ErrInvalidArgument) || status.Code(err) != codes.InvalidArgument {
		t.Errorf("PlacementHistory(-1) = %v", err)
	}
	if n := len(adminRequests[*shalev1.PlacementHistoryRequest](fc)); n != 2 {
		t.Errorf("PlacementHistory(-1) sent a request (%d requests)", n)
	}
	if math.MaxInt > math.MaxUint32 {
		if _, err := c.PlacementHistory(ctx, math.MaxInt); err != nil {
			t.Fatal(err)
		}
		hr = adminRequests[*shalev1.PlacementHistoryRequest](fc)
		if l := hr[len(hr)-1].GetLimit(); l != math.MaxUint32 {
			t.Errorf("PlacementHistory(MaxInt) sent limit %d", l)
		}
	}
}

func TestTransferLeaderPin(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	last := func() *shalev1.TransferLeaderRequest {
		reqs := adminRequests[*shalev1.TransferLeaderRequest](fc)
		if len(reqs) == 0 {
			t.Fatal("no TransferLeader request")
		}
		return reqs[len(reqs)-1]
	}

	// TransferLeader keeps its request: pin_seconds 0 (the server's default).
	if l, err := c.TransferLeader(ctx, 1, 2); err != nil || l != 2 {
		t.Fatalf("TransferLeader = %d, %v", l, err)
	}
	if r := last(); r.GetShardId() != 1 || r.GetTargetNodeId() != 2 || r.GetPinSeconds() != 0 || r.GetScheduled() {
		t.Errorf("TransferLeader sent %v", r)
	}
	l, err := c.TransferLeaderPinned(ctx, 1, 3, 10*time.Minute)
	if err != nil || l != 3 {
		t.Fatalf("TransferLeaderPinned = %d, %v", l, err)
	}
	if r := last(); r.GetTargetNodeId() != 3 || r.GetPinSeconds() != 600 || r.GetScheduled() {
		t.Errorf("TransferLeaderPinned 10m sent %v", r)
	}
	if rs, _ := c.Routing(); rs[0].GetLeaderNodeId() != 3 {
		t.Errorf("routing leader of shard 1 = %d after the transfer, want 3", rs[0].GetLeaderNodeId())
	}
	if _, err := c.TransferLeaderPinned(ctx, 2, 1, -time.Second); err != nil {
		t.Fatal(err)
	}
	if r := last(); r.GetShardId() != 2 || r.GetPinSeconds() != -1 {
		t.Errorf("TransferLeaderPinned no pin sent %v", r)
	}
	if _, err := c.TransferLeaderPinned(ctx, 77, 1, time.Minute); status.Code(err) != codes.NotFound ||
		!strings.Contains(err.Error(), "transfer-leader") {
		t.Errorf("TransferLeaderPinned of unknown shard: %v", err)
	}
}
