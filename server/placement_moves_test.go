package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestPlacementSpreadsMoveStarts: the placement leader starts at most one
// replica move per moveStartInterval, and asks for the round that starts
// the next one once the interval has passed, so that a wave's snapshots do
// not all begin at once (issue 24: four moves started together filled the
// benchmark machine's two cores and stalled the foreground's puts).
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
