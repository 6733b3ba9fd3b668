package watch

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/storage"
)

// Watcher is one subscriber of a Hub: a bounded queue of the changes to
// its range, in revision order, taken by Next.
type Watcher struct {
	hub      *Hub
	req      Request
	maxQueue int
	// from is the first revision the watcher needs the log from:
	// req.StartRevision, or later when a merge brought its range in later.
	from uint64
	// wake has room for one signal: the queue or the watcher's state
	// changed.
	wake chan struct{}
	// drained has room for one signal: Next took the queue.
	drained chan struct{}
	// closed is closed by Close.
	closed chan struct{}

	mu      sync.Mutex
	queue   []*shalev1.WatchEvent
	revs    []uint64 // each queued event's revision
	queued  int      // bytes queued
	through uint64   // every change at or below it is queued (or taken)
	// finished: nothing more is queued; the consumer sees rangeChange or
	// err once the queue is empty.
	finished    bool
	rangeChange *shalev1.ShardDescriptor
	err         error
	ended       bool // Next returned the end

	closeOnce sync.Once
}

// Update is a step of a watcher's stream.
type Update struct {
	// Events are the next changes, in revision order; Revisions holds each
	// one's revision.
	Events    []*shalev1.WatchEvent
	Revisions []uint64
	// Through: every change at or below it has been returned.
	Through uint64
	// RangeChange is set on the last update of a watcher whose shard no
	// longer serves its whole range (split, merge): the descriptor after
	// the change, applied at Through.
	RangeChange *shalev1.ShardDescriptor
}

// deliver queues the watched changes of entries; false means the watcher
// is finished and leaves the hub. compact is prevErr's.
func (w *Watcher) deliver(entries []*shard.AppliedEntry, evs [][]sharedEvent, compact func() uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deliverLocked(entries, evs, false, 0, compact)
}

// deliverCatchUp queues the watched changes of entries, the batch r
// returned last, for a watcher reading the log on its own; false means it
// is finished (a range change, closed, or an error: endErr).
func (w *Watcher) deliverCatchUp(entries []*shard.AppliedEntry, r *shard.ChangeReader) bool {
	var horizon storage.SeqNum
	if w.req.PrevKV {
		horizon = w.hub.sh.HistoryHorizon()
	}
	evs := shareAll(entries, r)
	next := r.Position()
	compact := sync.OnceValue(func() uint64 { return w.hub.prevCompactAfter(next, entries) })
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deliverLocked(entries, evs, true, horizon, compact)
}

// endErr returns the error that finished the watcher, nil when it is not
// finished or finished with a range change.
func (w *Watcher) endErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// deliverLocked queues the changes (w.mu held). A live watcher whose queue
// would exceed its bound is cancelled; a catching-up one (catchUp) queues
// the batch and its reader waits for the consumer (waitDrained). A watcher
// with PrevKV gets each change's previous value, read from the shard's
// engine when the log does not hold it; it ends with ErrCompacted when the
// engine no longer has it, or (horizon, when not 0) when the change was
// written below the engine's history horizon as read before the batch;
// compact is prevErr's.
func (w *Watcher) deliverLocked(entries []*shard.AppliedEntry, evs [][]sharedEvent, catchUp bool, horizon storage.SeqNum, compact func() uint64) bool {
	if w.finished {
		return false
	}
	defer w.signal()
	for i, e := range entries {
		rev := e.Mark.Revision
		if rev > w.through {
			// A packed entry's events have their commands' revisions:
			// those at or below through were delivered.
			var add []*shalev1.WatchEvent
			var revs []uint64
			size := 0
			for j := range evs[i] {
				se := &evs[i][j]
				if se.rev <= w.through || !w.req.contains(se.key) {
					continue
				}
				ev, n := se.bare, se.bareSize
				if w.req.PrevKV {
					if se.ev.Seq != 0 && se.ev.Seq < horizon {
						w.finish(w.prevErr(nil, se.key, se.rev, compact), nil)
						return false
					}
					var err error
					if ev, n, err = se.withPrev(); err != nil {
						w.finish(w.prevErr(err, se.key, se.rev, compact), nil)
						return false
					}
				}
				add = append(add, ev)
				revs = append(revs, se.rev)
				size += n
			}
			if !catchUp && len(add) > 0 && len(w.queue) > 0 && w.queued+size > w.maxQueue {
				w.finish(&InterruptedError{Err: ErrTooSlow, Resume: revs[0],
					Detail: fmt.Sprintf("shard %d: %d bytes of events queued, limit %d", w.hub.id, w.queued, w.maxQueue)}, nil)
				if f := w.hub.opts.TooSlow; f != nil {
					f()
				}
				return false
			}
			w.queue = append(w.queue, add...)
			w.revs = append(w.revs, revs...)
			w.queued += size
			w.through = rev
		}
		if d := e.Range; d != nil && d.GetEpoch() > w.req.Epoch && !w.req.covered(d) {
			w.through = max(w.through, rev)
			w.finish(nil, d)
			return false
		}
	}
	return true
}

// finish ends the watcher (w.mu held): with err, or with a range change.
func (w *Watcher) finish(err error, rangeChange *shalev1.ShardDescriptor) {
	if w.finished {
		return
	}
	w.finished, w.err, w.rangeChange = true, err, rangeChange
	w.signal()
}

func (w *Watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// waitDrained waits until the queue is within its bound; false when the
// watcher was closed or finished meanwhile.
func (w *Watcher) waitDrained() bool {
	for {
		w.mu.Lock()
		over, finished := w.queued > w.maxQueue, w.finished
		w.mu.Unlock()
		if finished {
			return false
		}
		if !over {
			return true
		}
		select {
		case <-w.drained:
		case <-w.closed:
			return false
		}
	}
}

// resumeRevision is where a new watcher would continue this one.
func (w *Watcher) resumeRevision() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.through + 1
}

// Next returns the watcher's next update: the changes queued since the
// last call, waiting for some until idle fires, when it returns an update
// without events (a progress report). After an update with RangeChange it
// returns io.EOF; an interrupted watcher returns its *InterruptedError once
// every change queued before the interruption has been returned.
func (w *Watcher) Next(ctx context.Context, idle <-chan time.Time) (Update, error) {
	for {
		w.mu.Lock()
		if len(w.queue) > 0 {
			u := Update{Events: w.queue, Revisions: w.revs, Through: w.through}
			w.queue, w.revs, w.queued = nil, nil, 0
			w.mu.Unlock()
			select {
			case w.drained <- struct{}{}:
			default:
			}
			return u, nil
		}
		if w.finished {
			defer w.mu.Unlock()
			if w.ended {
				return Update{}, io.EOF
			}
			w.ended = true
			if w.err != nil {
				return Update{}, w.err
			}
			return Update{Through: w.through, RangeChange: w.rangeChange}, nil
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-idle:
			w.mu.Lock()
			empty := len(w.queue) == 0 && !w.finished
			through := w.through
			w.mu.Unlock()
			if empty {
				return Update{Through: through}, nil
			}
		case <-ctx.Done():
			return Update{}, ctx.Err()
		}
	}
}

// Close removes the watcher from its hub.
func (w *Watcher) Close() {
	w.closeOnce.Do(func() { close(w.closed) })
	w.hub.mu.Lock()
	delete(w.hub.live, w)
	w.hub.mu.Unlock()
	w.mu.Lock()
	w.finish(context.Canceled, nil)
	w.mu.Unlock()
}
