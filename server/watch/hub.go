// Package watch serves change feeds of a shard replica: one Hub per shard
// tails the shard engine's change log (its WAL, see shard.DecodeBatch) and
// fans every entry out to the shard's watchers, each with a bounded queue.
// A watcher that starts from an older revision first reads the log on its
// own, then joins the hub's stream.
package watch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/storage"
)

// Options configure a Hub.
type Options struct {
	// MaxQueueBytes bounds the events a watcher may have queued and not yet
	// taken; past it the watcher is cancelled (ErrTooSlow). Default 8 MiB.
	MaxQueueBytes int
	// Logger receives the hub's logs. Default slog.Default().
	Logger *slog.Logger
	// TooSlow, if set, is called each time a watcher is cancelled as too
	// slow, when it happens (its reader learns of it after taking what was
	// queued before). It must not block.
	TooSlow func()
}

// Errors that end a watcher, wrapped in an *InterruptedError.
var (
	// ErrTooSlow: the watcher's queue exceeded Options.MaxQueueBytes.
	ErrTooSlow = errors.New("watch: watcher too slow")
	// ErrCompacted: the change log no longer holds the start revision.
	ErrCompacted = errors.New("watch: revision compacted")
	// ErrStopped: the hub stopped (the replica closed, was removed, or
	// restored a snapshot, which replaces the change log).
	ErrStopped = errors.New("watch: change feed stopped")
)

// InterruptedError ends a watcher early. Resume is the revision a new
// watch of the same range on the same shard starts from to lose and repeat
// nothing (0 when the history is gone); Compact, with ErrCompacted, is the
// oldest start revision the replica can serve.
type InterruptedError struct {
	Err     error
	Resume  uint64
	Compact uint64
	Detail  string
}

// Error describes the interruption and how to resume.
func (e *InterruptedError) Error() string {
	switch {
	case e.Resume != 0:
		return fmt.Sprintf("%v (%s); resume from revision %d", e.Err, e.Detail, e.Resume)
	case e.Compact != 0:
		return fmt.Sprintf("%v (%s); the oldest revision available is %d", e.Err, e.Detail, e.Compact)
	}
	return fmt.Sprintf("%v (%s)", e.Err, e.Detail)
}

// Unwrap returns the kind of interruption.
func (e *InterruptedError) Unwrap() error { return e.Err }

// Hub is the change feed of one shard replica.
type Hub struct {
	sh   *shard.Shard
	id   uint64
	opts Options
	log  *slog.Logger

	stop chan struct{}
	done chan struct{}

	mu sync.Mutex
	// pos is just after the last batch published; rev is the revision
	// after it.
	pos shard.ChangeLogPosition
	rev uint64
	// desc is the shard's descriptor at pos.
	desc *shalev1.ShardDescriptor
	// samples are positions in the log with the revision there, oldest
	// first: a catch-up starts from the newest one below its revision.
	samples []sample
	// sinceSample counts the batches published since the last sample.
	sinceSample int
	live        map[*Watcher]struct{}
	// catching are the watchers reading the log on their own (catchUp).
	catching map[*Watcher]struct{}
	// stopErr is set once the hub stopped: new watchers are refused.
	stopErr error
}

type sample struct {
	rev uint64
	pos shard.ChangeLogPosition
}

// Sampling of log positions: one sample every sampleEvery batches, at most
// maxSamples kept (the oldest half is thinned out when full).
const (
	sampleEvery = 64
	maxSamples  = 1024
)

// NewHub starts the change feed of a shard from the end of its log. Stop
// it when the replica goes away.
func NewHub(sh *shard.Shard, shardID uint64, opts Options) (*Hub, error) {
	if opts.MaxQueueBytes <= 0 {
		opts.MaxQueueBytes = 8 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	// Subscribe before reading the end, so that no change is missed.
	changed := sh.Changed()
	pos, rev, desc, err := sh.ChangeLogEnd()
	if err != nil {
		return nil, fmt.Errorf("watch: shard %d: %w", shardID, err)
	}
	h := &Hub{
		sh: sh, id: shardID, opts: opts, log: opts.Logger.With("shard", shardID),
		stop: make(chan struct{}), done: make(chan struct{}),
		pos: pos, rev: rev, desc: desc, live: map[*Watcher]struct{}{}, catching: map[*Watcher]struct{}{},
		samples: []sample{{rev: rev, pos: pos}},
	}
	go h.run(changed)
	return h, nil
}

// Stop stops the hub and ends its watchers with ErrStopped.
func (h *Hub) Stop() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	<-h.done
}

// Stopped returns a channel closed once the hub has stopped, by Stop or by
// an error reading the log.
func (h *Hub) Stopped() <-chan struct{} { return h.done }

func (h *Hub) run(changed <-chan struct{}) {
	defer close(h.done)
	var err error
	for {
		select {
		case <-h.stop:
			err = errors.New("the replica stopped serving the shard")
		case <-changed:
			changed = h.sh.Changed()
			err = h.tail()
		}
		if err != nil {
			break
		}
	}
	h.mu.Lock()
	h.stopErr = err
	live := h.live
	h.live = nil
	for w := range h.catching {
		live[w] = struct{}{}
	}
	h.catching = nil
	h.mu.Unlock()
	for w := range live {
		resume := w.resumeRevision()
		w.mu.Lock()
		w.finish(&InterruptedError{Err: ErrStopped, Resume: resume, Detail: err.Error()}, nil)
		w.mu.Unlock()
	}
	if !errors.Is(err, shard.ErrClosed) {
		h.log.Debug("watch: change feed stopped", "err", err)
	}
}

// tail publishes every batch written after the hub's position.
func (h *Hub) tail() error {
	h.mu.Lock()
	pos := h.pos
	h.mu.Unlock()
	r, err := h.sh.ReadChanges(pos)
	if err != nil {
		return err
	}
	defer r.Close()
	for r.Next() {
		select {
		case <-h.stop:
			return errors.New("the replica stopped serving the shard")
		default:
		}
		entries, err := decode(h.id, r.Batch())
		if err != nil {
			return err
		}
		h.publish(entries, shareAll(entries, r), r.Position())
	}
	if err := r.Error(); err != nil {
		return fmt.Errorf("shard %d change log: %w", h.id, err)
	}
	return nil
}

// publish hands one batch's entries (evs: their events in wire form) to
// the live watchers and moves the hub's position past the batch.
func (h *Hub) publish(entries []*shard.AppliedEntry, evs [][]sharedEvent, next shard.ChangeLogPosition) {
	h.mu.Lock()
	defer h.mu.Unlock()
	compact := sync.OnceValue(func() uint64 { return h.prevCompactAfter(next, entries) })
	for w := range h.live {
		if !w.deliver(entries, evs, compact) {
			delete(h.live, w)
		}
	}
	h.pos = next
	for _, e := range entries {
		h.rev = e.Mark.Revision
		if e.Range != nil {
			h.desc = e.Range
		}
	}
	if h.sinceSample++; h.sinceSample >= sampleEvery {
		h.sinceSample = 0
		if len(h.samples) >= maxSamples {
			// Keep every other one of the older half.
			kept := h.samples[:0]
			for i, s := range h.samples {
				if i >= maxSamples/2 || i%2 == 0 {
					kept = append(kept, s)
				}
			}
			h.samples = kept
		}
		h.samples = append(h.samples, sample{rev: h.rev, pos: next})
	}
}

// prevCompactAfter returns the oldest revision from which a watch with
// PrevKV can start now, for a watcher that met a change older than the
// shard engine's history horizon in one of entries, the entries of the
// batch before pos: the revision after the last entry written below the
// horizon (the log is read on from pos up to the first batch at or past
// it), or after the last one in the log.
func (h *Hub) prevCompactAfter(pos shard.ChangeLogPosition, entries []*shard.AppliedEntry) uint64 {
	var rev uint64
	if len(entries) > 0 {
		rev = entries[len(entries)-1].Mark.Revision
	}
	hz := h.sh.HistoryHorizon()
	if pos.NextSeq() >= hz {
		return rev + 1
	}
	r, err := h.sh.ReadChanges(pos)
	if err != nil {
		return rev + 1
	}
	defer r.Close()
	for r.Next() && r.Batch().SeqNum() < hz {
		_ = shard.DecodeBatch(r.Batch(), func(e *shard.AppliedEntry) error {
			rev = e.Mark.Revision
			return nil
		})
	}
	return rev + 1
}

// sharedEvent is an event in wire form, shared by every watcher that
// receives it: bare (without the previous value) and full, with their
// encoded sizes.
type sharedEvent struct {
	key  []byte
	rev  uint64
	bare *shalev1.WatchEvent
	// full is nil until withPrev read the previous value that the change
	// log does not hold (ev.PrevUnread) from the engine.
	full               *shalev1.WatchEvent
	bareSize, fullSize int
	// ev is the decoded event, and src the reader of the log it came from.
	ev  *shard.Event
	src *shard.ChangeReader
}

// shareEvents puts e's events (read from src) in wire form.
func shareEvents(e *shard.AppliedEntry, src *shard.ChangeReader) []sharedEvent {
	out := make([]sharedEvent, 0, len(e.Events))
	for i := range e.Events {
		ev := &e.Events[i]
		typ := shalev1.WatchEvent_TYPE_PUT_UNSPECIFIED
		if ev.Kind == shard.EventDelete {
			typ = shalev1.WatchEvent_TYPE_DELETE
		}
		bare := &shalev1.WatchEvent{Type: typ, Kv: ev.KV}
		se := sharedEvent{key: ev.KV.GetKey(), rev: ev.Revision, bare: bare, bareSize: codec.Size(bare), ev: ev, src: src}
		if !ev.PrevUnread {
			se.setFull()
		}
		out = append(out, se)
	}
	return out
}

// setFull makes se.full of the event's previous value (bare when the key
// had none).
func (se *sharedEvent) setFull() {
	se.full, se.fullSize = se.bare, se.bareSize
	if p := se.ev.Prev; p != nil {
		se.full = &shalev1.WatchEvent{Type: se.bare.GetType(), Kv: se.bare.GetKv(), PrevKv: p}
		se.fullSize = codec.Size(se.full)
	}
}

// withPrev returns the event with its previous value and its size,
// reading the value from the shard's engine the first time when the change
// log does not hold it (see shard.ChangeReader.ReadPrev for the errors).
// The caller holds the lock under which the event is delivered.
func (se *sharedEvent) withPrev() (*shalev1.WatchEvent, int, error) {
	if se.full == nil {
		if err := se.src.ReadPrev(se.ev); err != nil {
			return nil, 0, err
		}
		se.setFull()
	}
	return se.full, se.fullSize, nil
}

// Request describes what a watcher follows.
type Request struct {
	// Start and End bound the user keys watched: [Start, End), End nil for
	// no bound.
	Start, End []byte
	// StartRevision is the first revision delivered; 0 means the changes
	// after the hub's current revision.
	StartRevision uint64
	// PrevKV asks for the previous values.
	PrevKV bool
	// Epoch is the shard's epoch when the range was checked to lie inside
	// it: a later range change (a descriptor of a newer epoch) that leaves
	// part of the range to another shard ends the watcher.
	Epoch uint64
	// RevisionShard is the shard whose revisions StartRevision counts (0:
	// the hub's). A start at or below the last revision of a shard that a
	// merge absorbed into the hub's fails with ErrCompacted: those changes
	// came without their history.
	RevisionShard uint64
}

func (r *Request) contains(key []byte) bool {
	return bytes.Compare(key, r.Start) >= 0 && (r.End == nil || bytes.Compare(key, r.End) < 0)
}

// covered reports whether the shard described by d still serves the whole
// watched range.
func (r *Request) covered(d *shalev1.ShardDescriptor) bool {
	if d.GetMergingInto() != 0 || d.GetRetired() {
		return false
	}
	if bytes.Compare(r.Start, d.GetStartKey()) < 0 {
		return false
	}
	end := d.GetEndKey()
	if len(end) == 0 {
		return true
	}
	return r.End != nil && bytes.Compare(r.End, end) <= 0
}

// Watch starts a watcher. With a StartRevision at or below the hub's
// revision, the watcher first reads the log from there on its own (it
// fails with ErrCompacted, as an *InterruptedError, when the log no longer
// holds it), then joins the live stream. It returns the revision R the
// watcher is current through from the start: it delivers every change
// after R.
func (h *Hub) Watch(ctx context.Context, req Request) (*Watcher, uint64, error) {
	w := &Watcher{hub: h, req: req, maxQueue: h.opts.MaxQueueBytes,
		wake: make(chan struct{}, 1), drained: make(chan struct{}, 1), closed: make(chan struct{})}
	h.mu.Lock()
	if h.stopErr != nil {
		h.mu.Unlock()
		return nil, 0, &InterruptedError{Err: ErrStopped, Detail: h.stopErr.Error()}
	}
	// The log is needed from the start revision on, or from just after
	// the merge that brought the whole range into the shard, if later:
	// the shard holds no change to the range before that.
	w.from = req.StartRevision
	merged := h.sh.AbsorbedAt(req.Start, req.End)
	floor := merged.Rev
	if req.StartRevision != 0 && floor+1 > w.from {
		w.from = floor + 1
	}
	// A resume counted by a shard (the last one the client streamed the
	// range on) that starts at or before the merge that brought the range
	// here needs the range's changes from its start to the merge, and this
	// shard's log does not hold them. Revisions only grow along a range's
	// history (a split keeps the count, a merge takes the larger one), so
	// the resume has them all only if it comes from the shard that merge
	// absorbed, after that shard's last change. Otherwise (the range left
	// this shard and came back, or went through a shard the client never
	// streamed it on) the history is gone: ErrCompacted, never a gap.
	if rs := req.RevisionShard; req.StartRevision != 0 && rs != 0 && floor != 0 && req.StartRevision <= floor &&
		(merged.From != rs || req.StartRevision <= merged.FromRev) {
		h.mu.Unlock()
		detail := fmt.Sprintf("the range came into shard %d by a merge of shard %d at revision %d, after revision %d that the watch had reached on shard %d; its changes in between are not in this shard's history",
			h.id, merged.From, floor, req.StartRevision-1, rs)
		if merged.From == rs {
			detail = fmt.Sprintf("shard %d was merged into shard %d with its changes from revision %d to %d, which the merge carried without their history",
				rs, h.id, req.StartRevision, merged.FromRev)
		}
		return nil, 0, &InterruptedError{Err: ErrCompacted, Compact: floor + 1, Detail: detail}
	}
	if req.StartRevision == 0 || w.from > h.rev {
		if req.StartRevision == 0 {
			w.req.StartRevision = h.rev + 1
		}
		through := w.req.StartRevision - 1
		w.through = through
		if !w.joinLocked() {
			w.through = max(through, h.rev)
			w.finish(nil, h.desc)
		}
		h.mu.Unlock()
		return w, through, nil
	}
	// Catch up from the newest sample that precedes every entry at or
	// after the revision before the start (a range change that did not
	// bump the revision may share it with the last change delivered).
	var from *shard.ChangeLogPosition
	for i := len(h.samples) - 1; i >= 0; i-- {
		if h.samples[i].rev+1 < w.from {
			p := h.samples[i].pos
			from = &p
			break
		}
	}
	w.through = req.StartRevision - 1
	h.catching[w] = struct{}{}
	h.mu.Unlock()
	r, err := w.startCatchUp(from)
	if err == nil && req.PrevKV {
		err = w.catchUpToStart(r)
	}
	if err != nil {
		h.mu.Lock()
		delete(h.catching, w)
		h.mu.Unlock()
		return nil, 0, err
	}
	go w.catchUp(r)
	return w, req.StartRevision - 1, nil
}

// joinLocked adds w to the live watchers (h.mu held), unless the shard's
// range at the hub's position, changed after the epoch the watcher's range
// was checked at, no longer holds all of it: false then.
func (w *Watcher) joinLocked() bool {
	h := w.hub
	if d := h.desc; d != nil && d.GetEpoch() > w.req.Epoch && !w.req.covered(d) {
		return false
	}
	h.live[w] = struct{}{}
	return true
}

// startCatchUp opens the log for w from a position (nil: the oldest batch)
// and, reading from the oldest, checks that the log still holds the start
// revision. The batches it reads are queued.
func (w *Watcher) startCatchUp(from *shard.ChangeLogPosition) (*shard.ChangeReader, error) {
	h := w.hub
	var r *shard.ChangeReader
	var err error
	if from != nil {
		r, err = h.sh.ReadChanges(*from)
	}
	if from == nil || errors.Is(err, storage.ErrUpdatesUnavailable) {
		r, err = h.sh.ReadOldestChanges()
		from = nil
	}
	if err != nil {
		return nil, w.readErr(err)
	}
	if from != nil {
		return r, nil
	}
	var pos shard.ChangeLogPosition
	for attempt := 1; ; attempt++ {
		for r.Next() {
			entries, err := decode(h.id, r.Batch())
			if err != nil {
				r.Close()
				return nil, err
			}
			if len(entries) == 0 {
				continue
			}
			if err := w.checkAvailable(entries[0]); err != nil {
				r.Close()
				return nil, err
			}
			if !w.deliverCatchUp(entries, r) {
				if err := w.endErr(); err != nil {
					// A start below the history window of a watch with
					// PrevKV ends the watch before it began.
					r.Close()
					return nil, err
				}
			}
			return r, nil
		}
		var rerr error
		pos, rerr = r.Position(), r.Error()
		r.Close()
		if rerr == nil {
			break
		}
		if !errors.Is(rerr, storage.ErrUpdatesUnavailable) || attempt == 3 {
			return nil, w.readErr(rerr)
		}
		// The oldest WAL went while being read: start over from the new
		// oldest.
		if r, err = h.sh.ReadOldestChanges(); err != nil {
			return nil, w.readErr(err)
		}
	}
	// No entry in the whole log: the start must be ahead of the shard.
	h.mu.Lock()
	rev := h.rev
	h.mu.Unlock()
	if w.from <= rev {
		return nil, &InterruptedError{Err: ErrCompacted, Compact: rev + 1,
			Detail: fmt.Sprintf("shard %d: the change log holds no entry at or before revision %d", h.id, w.from)}
	}
	if r, err = h.sh.ReadChanges(pos); err != nil {
		return nil, w.readErr(err)
	}
	return r, nil
}

// catchUpToStart reads the log with r for w, which wants previous values,
// until it read the entries of its start revision (or the log's end), so
// that a start whose changes are older than the shard engine's history
// window fails Watch itself (ErrCompacted). It closes r when it fails.
func (w *Watcher) catchUpToStart(r *shard.ChangeReader) error {
	for {
		w.mu.Lock()
		through, finished := w.through, w.finished
		w.mu.Unlock()
		if finished || through >= w.from || !r.Next() {
			return nil
		}
		entries, err := decode(w.hub.id, r.Batch())
		if err == nil && !w.deliverCatchUp(entries, r) {
			err = w.endErr()
		}
		if err != nil {
			r.Close()
			return err
		}
	}
}

// catchUp goes on reading the log for w, as fast as its consumer takes
// the changes, until it reaches the hub's position; then w joins the live
// watchers. Errors end w.
func (w *Watcher) catchUp(r *shard.ChangeReader) {
	h := w.hub
	defer func() {
		h.mu.Lock()
		delete(h.catching, w)
		h.mu.Unlock()
	}()
	fail := func(err error) {
		w.mu.Lock()
		w.finish(err, nil)
		w.mu.Unlock()
	}
	for {
		for r.Next() {
			entries, err := decode(h.id, r.Batch())
			if err != nil {
				r.Close()
				fail(err)
				return
			}
			if !w.deliverCatchUp(entries, r) {
				r.Close()
				return // finished: a range change, or closed
			}
			if !w.waitDrained() {
				r.Close()
				return
			}
		}
		pos, rerr := r.Position(), r.Error()
		r.Close()
		if rerr != nil {
			fail(w.readErr(rerr))
			return
		}
		h.mu.Lock()
		if h.stopErr != nil {
			h.mu.Unlock()
			fail(&InterruptedError{Err: ErrStopped, Resume: w.resumeRevision(), Detail: h.stopErr.Error()})
			return
		}
		if pos.Reaches(h.pos) {
			// Caught up: the hub delivers the rest (events already
			// queued are skipped by revision).
			if !w.joinLocked() {
				w.mu.Lock()
				w.through = max(w.through, h.rev)
				w.finish(nil, h.desc)
				w.mu.Unlock()
			}
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		var err error
		if r, err = h.sh.ReadChanges(pos); err != nil {
			fail(w.readErr(err))
			return
		}
	}
}

// decode returns the entries of a change-log batch.
func decode(shardID uint64, b *storage.Batch) ([]*shard.AppliedEntry, error) {
	var entries []*shard.AppliedEntry
	if err := shard.DecodeBatch(b, func(e *shard.AppliedEntry) error {
		entries = append(entries, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("shard %d change log: %w", shardID, err)
	}
	return entries, nil
}

// shareAll puts the events of entries, read from src, in wire form.
func shareAll(entries []*shard.AppliedEntry, src *shard.ChangeReader) [][]sharedEvent {
	evs := make([][]sharedEvent, len(entries))
	for i, e := range entries {
		evs[i] = shareEvents(e, src)
	}
	return evs
}

// checkAvailable fails with ErrCompacted unless the oldest entry in the log,
// first, proves that no change at or after the start revision came before
// it.
func (w *Watcher) checkAvailable(first *shard.AppliedEntry) error {
	start := w.from
	// A packed entry's events start at its first command's revision.
	if start > first.Mark.Revision || (len(first.Events) > 0 && start >= first.Events[0].Revision) {
		return nil
	}
	return &InterruptedError{Err: ErrCompacted, Compact: first.Mark.Revision + 1,
		Detail: fmt.Sprintf("shard %d: the change log starts at revision %d", w.hub.id, first.Mark.Revision)}
}

// prevErr is the error that ends w (w.mu held) when the previous value of
// the change at revision rev to key could not be read (err, from
// shard.ChangeReader.ReadPrev), or, with a nil err, was older than the
// shard engine's history horizon when w started to read it; compact
// computes the oldest revision a watch with PrevKV can start from then.
func (w *Watcher) prevErr(err error, key []byte, rev uint64, compact func() uint64) error {
	h := w.hub
	switch {
	case err == nil || errors.Is(err, storage.ErrHistoryUnavailable):
		return &InterruptedError{Err: ErrCompacted, Compact: compact(),
			Detail: fmt.Sprintf("shard %d: the change of %q at revision %d is older than the shard's history window, which keeps previous values", h.id, key, rev)}
	case errors.Is(err, shard.ErrChangeLogReset) || errors.Is(err, shard.ErrClosed):
		return &InterruptedError{Err: ErrStopped, Resume: w.through + 1, Detail: err.Error()}
	}
	return fmt.Errorf("shard %d change log: %w", h.id, err)
}

func (w *Watcher) readErr(err error) error {
	if errors.Is(err, storage.ErrUpdatesUnavailable) {
		return &InterruptedError{Err: ErrCompacted, Detail: err.Error()}
	}
	if errors.Is(err, shard.ErrChangeLogReset) || errors.Is(err, shard.ErrClosed) {
		return &InterruptedError{Err: ErrStopped, Resume: w.resumeRevision(), Detail: err.Error()}
	}
	return fmt.Errorf("shard %d change log: %w", w.hub.id, err)
}
