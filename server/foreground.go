package server

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// The node's foreground work, which its snapshot pacing yields to: client
// requests routed to its shards, and replicated writes (Raft-log syncs) it
// makes as a leader or a follower. A node that saw neither for
// foregroundWindow is idle, and its snapshots and backups go out unpaced.
const (
	// foregroundWindow is how recent foreground work must be for the node
	// to count as busy.
	foregroundWindow = time.Second
	// foregroundSyncs is how many Raft-log syncs in the last
	// foregroundWindow make the node busy: fewer are the background
	// writes of an idle cluster (the system shard's records, a replica
	// move's configuration changes).
	foregroundSyncs = 10
	// foregroundCheckEvery is how long a verdict is reused.
	foregroundCheckEvery = 100 * time.Millisecond
	// requestStampEvery is the resolution of the last request's time: a
	// request stores the time only if the stored one is older.
	requestStampEvery = 10 * time.Millisecond
)

// foreground tracks the node's foreground work. Its methods are safe for
// concurrent use.
type foreground struct {
	lastRequest atomic.Int64 // unix ns of a recent client request (to requestStampEvery)
	// syncs reports the Raft-log syncs that ended within the window.
	syncs func(window time.Duration) int
	log   *slog.Logger // nil: no logs

	mu        sync.Mutex
	checkedAt time.Time
	busy      bool
}

// request notes a client request routed to one of the node's shards (a
// nil foreground, of a Node made without Start in a test, notes nothing).
func (f *foreground) request() {
	if f == nil {
		return
	}
	now := time.Now().UnixNano()
	if now-f.lastRequest.Load() >= int64(requestStampEvery) {
		f.lastRequest.Store(now)
	}
}

// Busy reports whether the node did foreground work in the last
// foregroundWindow (as of a check at most foregroundCheckEvery old): a
// client request, or foregroundSyncs Raft-log syncs.
func (f *foreground) Busy() bool {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.checkedAt.IsZero() && now.Sub(f.checkedAt) < foregroundCheckEvery {
		return f.busy
	}
	f.checkedAt = now
	requested := now.UnixNano()-f.lastRequest.Load() < int64(foregroundWindow)
	syncs := 0
	if f.syncs != nil {
		syncs = f.syncs(foregroundWindow)
	}
	busy := requested || syncs >= foregroundSyncs
	if busy != f.busy && f.log != nil {
		f.log.Debug("foreground work changed: snapshots and backups paced only while busy", "busy", busy, "client_requests", requested, "log_syncs", syncs)
	}
	f.busy = busy
	return busy
}
