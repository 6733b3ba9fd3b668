package placement

import (
	"sync"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Beat is the last heartbeat a node sent.
type Beat struct {
	At  time.Time
	Req *shalev1.HeartbeatRequest
}

// Tracker keeps the nodes' last heartbeats and judges their liveness. It is
// soft state of the placement leader: a new placement leader starts with
// an empty tracker (Reset) and counts every node's silence from that
// moment, so a leadership change never makes a node look dead sooner than
// the dead timeout after the new leader took over.
type Tracker struct {
	suspectAfter, deadAfter time.Duration
	now                     func() time.Time

	mu    sync.Mutex
	since time.Time
	beats map[uint64]Beat
}

// NewTracker returns a tracker that calls a node suspect after
// suspectAfter without a heartbeat and dead after deadAfter; now is the
// clock (time.Now when nil).
func NewTracker(suspectAfter, deadAfter time.Duration, now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{suspectAfter: suspectAfter, deadAfter: deadAfter, now: now, since: now(), beats: map[uint64]Beat{}}
}

// Reset forgets every heartbeat and restarts the silence clocks.
func (t *Tracker) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.since = t.now()
	t.beats = map[uint64]Beat{}
}

// Heartbeat records a node's heartbeat, received now. It reports whether
// the heartbeat turned the node live: the first since the last Reset, or
// the first after the node turned suspect.
func (t *Tracker) Heartbeat(req *shalev1.HeartbeatRequest) (turnedLive bool) {
	id := req.GetStats().GetNode().GetNodeId()
	if id == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	last, ok := t.beats[id]
	t.beats[id] = Beat{At: now, Req: req}
	return !ok || now.Sub(last.At) >= t.suspectAfter
}

// State returns a node's liveness and its last heartbeat (ok false when
// none arrived since the last Reset). A node never heard from is suspect
// until the dead timeout has passed since the Reset.
func (t *Tracker) State(node uint64) (st NodeState, last Beat, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	last, ok = t.beats[node]
	from := t.since
	if ok {
		from = last.At
	}
	age := t.now().Sub(from)
	switch {
	case age >= t.deadAfter:
		return Dead, last, ok
	case !ok || age >= t.suspectAfter:
		return Suspect, last, ok
	}
	return Live, last, ok
}

// Beats returns the last heartbeat of every node heard from.
func (t *Tracker) Beats() map[uint64]Beat {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[uint64]Beat, len(t.beats))
	for id, b := range t.beats {
		out[id] = b
	}
	return out
}
