package replication

import (
	"sync"
	"sync/atomic"
	"time"
)

// LogSyncReport describes the node's recent Raft-log syncs, the writes
// every acknowledgement of a proposal waits for.
type LogSyncReport struct {
	// Finished is how many syncs ended within the window asked for.
	Finished int
	// Slow is how many of those took at least the duration asked for.
	Slow int
	// Running is how long the sync now in progress has been running
	// (zero when none is).
	Running time.Duration
}

// LogSyncs reports on the Raft-log syncs that ended in the last window and
// on the one in progress; slow is the duration from which a sync counts as
// slow. It reflects at most the last syncHistory syncs.
func (s *Store) LogSyncs(window, slow time.Duration) LogSyncReport {
	return s.syncs.report(time.Now(), window, slow)
}

// syncHistory is how many recent syncs syncTimes keeps.
const syncHistory = 64

// syncTimes keeps the end times and durations of the last syncHistory
// syncs, and the start of the one in progress. The Raft loop writes it
// once per sync; any goroutine may read it.
type syncTimes struct {
	running atomic.Int64 // start of the sync in progress, unix ns; 0 if none

	mu   sync.Mutex
	ends [syncHistory]time.Time
	took [syncHistory]time.Duration
	next int
}

func (t *syncTimes) begin(now time.Time) { t.running.Store(now.UnixNano()) }

// end records the sync that began at start and returns how long it took.
func (t *syncTimes) end(start time.Time) time.Duration {
	t.running.Store(0)
	now := time.Now()
	took := now.Sub(start)
	t.mu.Lock()
	t.ends[t.next], t.took[t.next] = now, took
	t.next = (t.next + 1) % syncHistory
	t.mu.Unlock()
	return took
}

func (t *syncTimes) report(now time.Time, window, slow time.Duration) LogSyncReport {
	var r LogSyncReport
	if at := t.running.Load(); at != 0 {
		r.Running = max(now.Sub(time.Unix(0, at)), 0)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.ends {
		if t.ends[i].IsZero() || now.Sub(t.ends[i]) > window {
			continue
		}
		r.Finished++
		if t.took[i] >= slow {
			r.Slow++
		}
	}
	return r
}
