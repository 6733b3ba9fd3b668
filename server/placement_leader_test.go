package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shale-db/shale/placement"
)

// placementClock is the placement leader's state on an injected clock.
type placementClock struct {
	n   *Node
	now time.Time
}

func newPlacementClock() *placementClock {
	pc := &placementClock{now: time.Unix(1_800_000_000, 0)}
	cfg := Config{DeadNodeTimeout: 5 * time.Minute, WallClock: func() time.Time { return pc.now }}
	pc.n = &Node{cfg: cfg, place: newPlacementState(cfg, prometheus.NewRegistry())}
	pc.n.place.tracker = placement.NewTracker(3*time.Second, cfg.DeadNodeTimeout, func() time.Time { return pc.now })
	return pc
}

// TestPlacementSpreadsMoveStarts: the placement leader starts at most one
// replica move per moveStartInterval, and asks for the round that starts
// the next one once the interval has passed, so that a wave's snapshots do
// not all begin at once (issue 24: four moves started together filled the
// benchmark machine's two cores and stalled the foreground's puts).
func TestPlacementSpreadsMoveStarts(t *testing.T) {
	pc := newPlacementClock()
	n := pc.n
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
	case <-n.place.kick:
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
