package server

import (
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shale-db/shale/placement"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// TestPlacementSpreadsMoveStarts: the placement leader starts at most one
// replica move per moveStartInterval, and asks for the round that starts
// the next one (moveDue) once the interval has passed, so that a wave's
// snapshots do not all begin at once (issue 24: four moves started together
// filled the benchmark machine's two cores and stalled the foreground's
// puts).
func TestPlacementSpreadsMoveStarts(t *testing.T) {
	n := &Node{place: newPlacementState(Config{DeadNodeTimeout: 5 * time.Minute}, prometheus.NewRegistry())}
	t0 := time.Now()
	if !n.mayStartMove(t0) {
		t.Fatal("the first move may not start")
	}
	for _, d := range []time.Duration{0, time.Millisecond, moveStartInterval / 2, moveStartInterval - time.Millisecond} {
		if n.mayStartMove(t0.Add(d)) {
			t.Fatalf("a second move may start %v after the first; want none within %v", d, moveStartInterval)
		}
	}
	select {
	case <-n.place.moveDue:
	case <-time.After(10 * moveStartInterval):
		t.Fatal("no round asked for after the interval")
	}
	if !n.mayStartMove(t0.Add(moveStartInterval)) {
		t.Fatalf("a move may not start %v after the last", moveStartInterval)
	}
	if n.mayStartMove(t0.Add(moveStartInterval + time.Millisecond)) {
		t.Fatal("two moves started within the interval")
	}
}

// TestPlacementRunsDueMoveStartAtOnce: the round that starts a due replica
// move runs when the move is due, even while a kick waits out
// placementMinInterval since the last round. When the due start asked for
// its round with an ordinary kick, which queued behind the kick already
// waiting, the start ran two rounds (0.40 s) after the last, not
// moveStartInterval (issue 24).
func TestPlacementRunsDueMoveStartAtOnce(t *testing.T) {
	n := &Node{place: newPlacementState(Config{DeadNodeTimeout: 5 * time.Minute}, prometheus.NewRegistry())}
	p := n.place
	const due = 50 * time.Millisecond
	last := time.Now() // the last round
	p.lastMoveStart = last.Add(due - moveStartInterval)
	if n.mayStartMove(last) {
		t.Fatalf("a move may start %v before it is due", due)
	}
	n.kickPlacement() // a step finished: a kick waits out placementMinInterval
	timer := time.NewTimer(placementInterval)
	defer timer.Stop()
	stop := make(chan struct{})
	if !p.awaitRound(stop, timer, last) {
		t.Fatal("awaitRound returned false with stop open")
	}
	if took := time.Since(last); took >= placementMinInterval || took < due {
		t.Fatalf("the round came %v after the last; want it when the move is due, %v (not at the kick's %v)", took, due, placementMinInterval)
	}
	if !n.mayStartMove(time.Now()) {
		t.Fatal("the due move may not start in its round")
	}
	// That round served the kick too; a kick after it waits out
	// placementMinInterval.
	last = time.Now()
	n.kickPlacement()
	if !p.awaitRound(stop, timer, last) {
		t.Fatal("awaitRound returned false with stop open")
	}
	if took := time.Since(last); took < placementMinInterval-5*time.Millisecond || took >= placementInterval/2 {
		t.Fatalf("the kicked round came %v after the last; want %v", took, placementMinInterval)
	}
	close(stop)
	if p.awaitRound(stop, timer, time.Now()) {
		t.Fatal("awaitRound returned true after stop")
	}
}

// TestPlacementCountsTransfersAtTheirTarget: a shard whose leadership is
// being transferred, or was and its target has not reported it yet, counts
// for the transfer's target in the scheduler's input. Without it the rounds
// that run meanwhile (kicked 200 ms apart as steps finish) saw the target
// still short of leaderships and sent it more: after a rebalance whose
// leader balancing waited for the moves, one joining node went from 0 to 5
// leaderships of 17, and moving them back waited out the 10-s settle.
func TestPlacementCountsTransfersAtTheirTarget(t *testing.T) {
	n := &Node{place: newPlacementState(Config{DeadNodeTimeout: 5 * time.Minute}, prometheus.NewRegistry())}
	dir := []*shalev1.ShardDescriptor{}
	for id := uint64(10); id < 13; id++ {
		dir = append(dir, &shalev1.ShardDescriptor{ShardId: id, Epoch: 1, Replicas: []*shalev1.ReplicaDescriptor{
			{NodeId: 1, ReplicaId: 1}, {NodeId: 2, ReplicaId: 2}, {NodeId: 3, ReplicaId: 3}}})
	}
	// Node 1 reports leading all three.
	n.place.tracker.Heartbeat(&shalev1.HeartbeatRequest{
		Stats: &shalev1.NodeStats{Node: &shalev1.NodeDescriptor{NodeId: 1}},
		Led:   []*shalev1.LedShard{{ShardId: 10, Epoch: 1}, {ShardId: 11, Epoch: 1}, {ShardId: 12, Epoch: 1}},
	})
	now := time.Now()
	n.place.inflight[10] = 2 // a transfer to node 2 in flight
	n.place.settle[11] = settleState{epoch: 1, until: now.Add(changeSettle), limit: now.Add(30 * time.Second),
		leader: 3, leaderBy: now.Add(placementSettle)} // done, node 3 has not reported it yet
	states := map[uint64]placement.NodeState{1: placement.Live, 2: placement.Live, 3: placement.Live}
	got := map[uint64]uint64{}
	for _, sh := range n.placementShards(dir, nil, states, now) {
		got[sh.Desc.GetShardId()] = sh.Leader
		if id := sh.Desc.GetShardId(); id != 12 && !sh.Busy {
			t.Errorf("shard %d is not left alone during its transfer", id)
		}
	}
	if want := map[uint64]uint64{10: 2, 11: 3, 12: 1}; !maps.Equal(got, want) {
		t.Fatalf("leaders counted %v, want %v (transfers at their targets)", got, want)
	}
}
