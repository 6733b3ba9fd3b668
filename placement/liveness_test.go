package placement

import (
	"errors"
	"fmt"
	"testing"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func beat(id uint64) *shalev1.HeartbeatRequest {
	return &shalev1.HeartbeatRequest{Stats: &shalev1.NodeStats{Node: &shalev1.NodeDescriptor{NodeId: id}}}
}

func TestTrackerStates(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	tr := NewTracker(3*time.Second, time.Minute, c.now)
	check := func(node uint64, want NodeState) {
		t.Helper()
		if got, _, _ := tr.State(node); got != want {
			t.Fatalf("node %d: %v, want %v", node, got, want)
		}
	}
	check(1, Suspect) // never heard from
	tr.Heartbeat(beat(1))
	tr.Heartbeat(beat(0)) // ignored
	check(1, Live)
	c.t = c.t.Add(3 * time.Second)
	check(1, Suspect)
	check(2, Suspect)
	c.t = c.t.Add(57 * time.Second)
	check(1, Dead)
	check(2, Dead) // silent since the tracker started
	tr.Heartbeat(beat(1))
	check(1, Live)
	// A new placement leader: silence is counted from its start.
	tr.Reset()
	check(1, Suspect)
	check(2, Suspect)
	c.t = c.t.Add(59 * time.Second)
	check(2, Suspect)
	c.t = c.t.Add(time.Second)
	check(2, Dead)
	if len(tr.Beats()) != 0 {
		t.Fatalf("beats after reset: %v", tr.Beats())
	}
}

func TestTrackerTurnedLive(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	tr := NewTracker(3*time.Second, time.Minute, c.now)
	if !tr.Heartbeat(beat(1)) {
		t.Fatal("a node's first heartbeat did not turn it live")
	}
	c.t = c.t.Add(time.Second)
	if tr.Heartbeat(beat(1)) {
		t.Fatal("a live node's heartbeat turned it live")
	}
	c.t = c.t.Add(3 * time.Second)
	if !tr.Heartbeat(beat(1)) {
		t.Fatal("a suspect node's heartbeat did not turn it live")
	}
	if tr.Heartbeat(beat(0)) {
		t.Fatal("an ignored heartbeat turned a node live")
	}
	tr.Reset()
	if !tr.Heartbeat(beat(1)) {
		t.Fatal("the first heartbeat after a Reset did not turn the node live")
	}
}

func TestHistoryBounded(t *testing.T) {
	h := NewHistory(3)
	var ops []*shalev1.PlacementOperation
	for i := 1; i <= 5; i++ {
		ops = append(ops, h.Start(&shalev1.PlacementOperation{ShardId: uint64(i)}))
	}
	h.Finish(ops[3], 7, nil)
	h.Finish(ops[4], 8, errors.New("boom"))
	got := h.List(0)
	if len(got) != 3 || got[0].GetShardId() != 3 || got[2].GetShardId() != 5 {
		t.Fatalf("List = %v", got)
	}
	if got[1].GetState() != "done" || got[2].GetState() != "failed" || got[2].GetError() != "boom" {
		t.Fatalf("states: %v", got)
	}
	if r := h.Running(); len(r) != 1 || r[0].GetShardId() != 3 {
		t.Fatalf("Running = %v", r)
	}
	if l := h.List(1); len(l) != 1 || l[0].GetShardId() != 5 {
		t.Fatalf("List(1) = %v", fmt.Sprint(l))
	}
}
