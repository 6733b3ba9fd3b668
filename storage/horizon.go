package storage

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shale-db/shale/storage/manifest"
)

// ErrHistoryUnavailable is matched (errors.Is) by the error GetAt returns
// when the sequence number read at is below the history horizon's reach
// (HistoryHorizon()-1), before or during the read, or when the DB keeps no
// history horizon (Options.HistoryHorizon off).
var ErrHistoryUnavailable = errors.New("storage: history no longer available at that sequence number")

// HistoryHorizon returns the history horizon H (Options.HistoryHorizon):
// every version visible at a sequence number >= H-1 is kept, and GetAt
// reads at any of them. H is the latest of: the first sequence number of
// the oldest WAL file still on disk (a lower bound of it for the WAL files
// this DB created), or one past the last sequence number when no WAL holds
// a batch; with Options.HistoryWindow, the first sequence number written
// after now-HistoryWindow (to within a sample, about a second); with
// Options.HistoryWindowBytes, the first written after the point where more
// than that many WAL bytes were written since; whatever
// AdvanceHistoryHorizon was given. It only grows, also across a reopen (a
// reopened DB starts at the highest H its MANIFEST recorded, and its
// window counts from the reopen). It returns 0 when the DB keeps no
// horizon.
func (d *DB) HistoryHorizon() SeqNum { return SeqNum(d.horizon.Load()) }

// GetAt returns a copy of key's value as of sequence number seq (what a
// snapshot taken at seq would read), or ErrNotFound. seq must be at most
// LastSeq() and at least HistoryHorizon()-1; the horizon is checked after
// the read as well, so a read that a compaction may have raced with fails
// instead of returning a wrong value. Either failure matches
// ErrHistoryUnavailable. The one exception to "as a snapshot would read":
// see Options.HistoryHorizon on the CompactionFilter.
func (d *DB) GetAt(key []byte, seq SeqNum) ([]byte, error) {
	if !d.opts.HistoryHorizon {
		return nil, fmt.Errorf("read at %d: no history horizon kept: %w", seq, ErrHistoryUnavailable)
	}
	if last := d.LastSeq(); seq > last {
		return nil, fmt.Errorf("read at %d: beyond the last sequence number %d", seq, last)
	}
	if err := d.checkHorizon(seq); err != nil {
		return nil, err
	}
	v, err := d.getAt(key, seq, false)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	// Flushes and compactions take the horizon when they start, and it
	// only grows: if it still allows seq now, every one whose output the
	// read could have met kept the versions seq sees.
	if herr := d.checkHorizon(seq); herr != nil {
		return nil, herr
	}
	return v, err
}

// AdvanceHistoryHorizon moves the history horizon up to h (it never moves
// back): the caller gives up the history before h-1, so that flushes,
// compactions and DeleteFilesInRange may drop what only reads below h-1
// saw, such as the data a range deletion at a sequence number below h
// removed. Reads below h-1 fail from now on (GetAt). h is capped at
// LastSeq()+1. It does nothing when the DB keeps no horizon.
func (d *DB) AdvanceHistoryHorizon(h SeqNum) {
	if !d.opts.HistoryHorizon {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.raiseHorizonLocked(min(h, SeqNum(d.visibleSeq.Load())+1))
}

// checkHorizon fails, matching ErrHistoryUnavailable, when the horizon no
// longer keeps what a read at seq sees.
func (d *DB) checkHorizon(seq SeqNum) error {
	if h := d.HistoryHorizon(); seq+1 < h {
		return fmt.Errorf("read at %d: history horizon %d: %w", seq, h, ErrHistoryUnavailable)
	}
	return nil
}

// refreshHorizonLocked moves the history horizon up to the first sequence
// number of the oldest WAL file still on disk (see HistoryHorizon): called
// after the recovery's replay and whenever WAL files were deleted. For the
// WAL files this DB created or replayed it uses the sequence number they
// start at (walStart); older ones are read. A WAL that holds no batch does
// not count. Called with d.mu held.
func (d *DB) refreshHorizonLocked() {
	if !d.opts.HistoryHorizon {
		return
	}
	files, err := d.listWALFiles()
	if err != nil {
		// Keep the horizon where it is: too low only keeps more.
		d.log.Warn("list wal files for the history horizon", "err", err)
		return
	}
	onDisk := make(map[manifest.FileNum]bool, len(files))
	for _, f := range files {
		onDisk[manifest.FileNum(f.Num)] = true
	}
	for num := range d.walStart {
		if !onDisk[num] {
			delete(d.walStart, num)
		}
	}
	h := d.logSeq + 1
	for _, f := range files {
		if s, ok := d.walStart[manifest.FileNum(f.Num)]; ok {
			h = s
			break
		}
		s, ok, err := d.firstSeqOf(f)
		if err != nil {
			d.log.Warn("read wal for the history horizon", "wal", f.Name, "err", err)
			return
		}
		if ok {
			h = s
			break
		}
	}
	d.raiseHorizonLocked(h)
}

// raiseHorizonLocked moves the history horizon up to h (never back) and
// starts the reclaims it made due. Called with d.mu held.
func (d *DB) raiseHorizonLocked(h SeqNum) {
	if h <= d.HistoryHorizon() {
		return
	}
	d.horizon.Store(uint64(h))
	d.maybeStartReclaimsLocked()
}

// historySampleEvery is how often a DB with a history window
// (Options.HistoryWindow, HistoryWindowBytes) samples its sequence number
// and WAL bytes while it is written to; every flush and compaction also
// samples when it starts, before it takes the horizon.
const historySampleEvery = time.Second

// historyTimerFloor is the shortest wait historyTick arms for a sample's
// passing of the window, so that a clock that runs backwards or a sample
// that is just short of passing never spins the timer.
const historyTimerFloor = 10 * time.Millisecond

// maxHistorySamples bounds the samples a DB keeps for its history window:
// when full, the sample whose removal leaves the smallest gap goes, so the
// samples thin out evenly over the window (a horizon computed from fewer
// samples only lags, keeping more).
const maxHistorySamples = 64

// historySample records where the DB's writes stood at a moment.
type historySample struct {
	at time.Time // Options.now
	// next is LastSeq()+1 at that moment: every batch applied later has
	// a sequence number >= next.
	next SeqNum
	// walBytes is the DB's WAL bytes (Metrics.WALBytes) at that moment.
	walBytes uint64
}

// historyWindowOn reports whether the history horizon is bounded by a
// window apart from the WAL.
func (d *DB) historyWindowOn() bool {
	return d.opts.HistoryHorizon && (d.opts.HistoryWindow > 0 || d.opts.HistoryWindowBytes > 0)
}

// startHistoryTimerLocked takes the window's first sample and arms its
// timer; Open calls it once, with d.mu held. The window counts from here:
// the samples of before a reopen are gone.
func (d *DB) startHistoryTimerLocked() {
	d.sampleHistoryLocked()
	d.historyTimer = time.AfterFunc(historySampleEvery, d.historyTick)
	d.historyWake = false
}

// historyWokenLocked is called, with d.mu held, after a write made new sequence
// numbers visible: a DB whose timer waits for nothing but a sample's
// passing (or for nothing at all) samples again in historySampleEvery.
// It costs one test of a bool per commit group.
func (d *DB) historyWokenLocked() {
	if d.historyWake && !d.closed {
		d.historyWake = false
		d.historyTimer.Reset(historySampleEvery)
	}
}

// historyTick samples the window and rearms historyTimer for the next
// moment the horizon can move, until the DB is closed. While the DB is
// written to, that is historySampleEvery. Once a sample finds no write
// since the one before, the horizon moves only when a kept sample passes
// the time window, so the timer waits for exactly that (and, when no kept
// sample can move the horizon any more, is not armed at all) until the
// next write wakes it (historyWokenLocked): a process hosting thousands of
// idle DBs runs none of their timers.
func (d *DB) historyTick() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if wait, armed := d.historyTickLocked(); armed {
		d.historyTimer.Reset(wait)
	}
}

// historyTickLocked is historyTick's work with d.mu held: it samples, sets
// historyWake (a write wakes the timer unless the tick found writes), and
// returns how long the timer is to wait, or false when it rests.
func (d *DB) historyTickLocked() (time.Duration, bool) {
	sampled := d.sampleHistoryLocked()
	d.historyWake = !sampled
	return d.nextHistoryTickLocked(sampled)
}

// nextHistoryTickLocked returns how long historyTick's timer waits after a
// sample (sampled: it found writes since the one before), and false when
// it need not be armed until the next write. Called with d.mu held.
func (d *DB) nextHistoryTickLocked(sampled bool) (time.Duration, bool) {
	if sampled {
		return historySampleEvery, true
	}
	if d.opts.HistoryWindow <= 0 {
		return 0, false // without writes the WAL bytes stay, and so does H
	}
	// The samples are in time order, and the ones the window passed
	// have raised the horizon already: the next to move it is the first
	// that would raise it.
	for _, s := range d.historySamples {
		if s.next > d.HistoryHorizon() {
			return max(s.at.Add(d.opts.HistoryWindow).Sub(d.opts.now()), historyTimerFloor), true
		}
	}
	return 0, false
}

// sampleHistoryLocked records where the writes stand now (unless nothing
// was written since the last sample, which then stands for both) and moves
// the horizon up to the newest sample the window has passed: one taken at
// least HistoryWindow ago, or one after which more than HistoryWindowBytes
// of WAL were written. Samples older than that one are no longer needed.
// It reports whether it recorded a new sample. Called with d.mu held.
func (d *DB) sampleHistoryLocked() (added bool) {
	if !d.historyWindowOn() {
		return false
	}
	now := d.opts.now()
	next := SeqNum(d.visibleSeq.Load()) + 1
	wb := d.walBytes.Load()
	if n := len(d.historySamples); n == 0 || d.historySamples[n-1].next != next {
		if n >= maxHistorySamples {
			d.thinHistorySamplesLocked()
		}
		d.historySamples = append(d.historySamples, historySample{at: now, next: next, walBytes: wb})
		added = true
	}
	passed := -1
	for i, s := range d.historySamples {
		if (d.opts.HistoryWindow > 0 && now.Sub(s.at) >= d.opts.HistoryWindow) ||
			(d.opts.HistoryWindowBytes > 0 && wb-s.walBytes > uint64(d.opts.HistoryWindowBytes)) {
			passed = i
		}
	}
	if passed < 0 {
		return added
	}
	h := d.historySamples[passed].next
	d.historySamples = slices.Delete(d.historySamples, 0, passed)
	d.raiseHorizonLocked(h)
	return added
}

// thinHistorySamplesLocked drops the inner sample whose neighbours are
// closest together, in time over HistoryWindow plus WAL bytes over
// HistoryWindowBytes.
func (d *DB) thinHistorySamplesLocked() {
	ss := d.historySamples
	best, bestGap := -1, 0.0
	for i := 1; i+1 < len(ss); i++ {
		var gap float64
		if d.opts.HistoryWindow > 0 {
			gap += float64(ss[i+1].at.Sub(ss[i-1].at)) / float64(d.opts.HistoryWindow)
		}
		if d.opts.HistoryWindowBytes > 0 {
			gap += float64(ss[i+1].walBytes-ss[i-1].walBytes) / float64(d.opts.HistoryWindowBytes)
		}
		if best < 0 || gap < bestGap {
			best, bestGap = i, gap
		}
	}
	if best >= 0 {
		d.historySamples = slices.Delete(ss, best, best+1)
	}
}

// maxHorizonReclaims bounds the reclaims waiting for the horizon: past it,
// overlapping and then neighbouring spans are merged (a merged span is
// compacted once the horizon passes the later of the two sequence
// numbers, and drops no files without compacting them).
const maxHorizonReclaims = 256

// CompactAfterHorizon asks the DB to compact [start, end) (nil bounds are
// unbounded) once the history horizon passes seq, so that the space of
// the data deleted there at sequence numbers up to seq comes back as soon
// as no read within the horizon may see it: at most one history window
// (Options.HistoryWindow) late. It is for deletions that are no range
// deletion, such as many point deletions in a span (a DeleteRange applied
// while the DB keeps a horizon is scheduled so by itself). The compaction
// (CompactRange) runs in the background, right away when the horizon is
// already past seq or the DB keeps none. A request that waits for the
// horizon is recorded in the MANIFEST (one synced edit) before the call
// returns, so a reopen, after a crash too, keeps it until it has run. It
// fails on a closed, read-only or failed DB, or when that edit fails.
func (d *DB) CompactAfterHorizon(start, end []byte, seq SeqNum) error {
	if start != nil && end != nil && bytes.Compare(start, end) >= 0 {
		return nil
	}
	d.mu.Lock()
	if err := d.checkWritableLocked(); err != nil {
		d.mu.Unlock()
		return fmt.Errorf("compact after horizon %d: %w", seq, err)
	}
	d.addReclaimLocked(manifest.Reclaim{Start: slices.Clone(start), End: slices.Clone(end), Seq: seq})
	persist := d.reclaimsDirty && d.opts.HistoryHorizon
	d.mu.Unlock()
	if !persist {
		return nil
	}
	// Recorded in the MANIFEST before returning, so that a crash does
	// not forget it (no WAL record says it was asked for).
	if err := d.logAndApply(&manifest.VersionEdit{}, nil); err != nil {
		return fmt.Errorf("compact after horizon %d: record the request: %w", seq, err)
	}
	return nil
}

// rangeDeletionReclaims returns the reclaims of the spans b's range
// deletions cover: due once the horizon passes b.
func rangeDeletionReclaims(b *Batch) []manifest.Reclaim {
	first := b.SeqNum()
	last := b.LastSeqNum()
	var spans []manifest.Reclaim
	r := b.Reader()
	for {
		kind, start, end, ok := r.Next()
		if !ok {
			break
		}
		if kind == KindRangeDelete {
			spans = append(spans, manifest.Reclaim{Start: slices.Clone(start), End: slices.Clone(end), Seq: last, DeletedAt: first})
		}
	}
	return spans
}

// noteRangeDeletions schedules the reclaim of every span b's range
// deletions cover (b was just applied) for when the horizon passes b. The
// MANIFEST records them with its next edit; until then a reopen finds
// them in the WAL (replayWAL).
func (d *DB) noteRangeDeletions(b *Batch) {
	spans := rangeDeletionReclaims(b)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range spans {
		d.addReclaimLocked(s)
	}
}

// addReclaimLocked queues r and starts it when due.
func (d *DB) addReclaimLocked(r manifest.Reclaim) {
	d.addReclaimQuietlyLocked(r)
	d.maybeStartReclaimsLocked()
}

// addReclaimQuietlyLocked queues r, unless the same reclaim waits already
// (a replayed WAL may hold one the MANIFEST recorded), without starting
// anything: recovery's replay uses it directly.
func (d *DB) addReclaimQuietlyLocked(r manifest.Reclaim) {
	if slices.ContainsFunc(d.reclaims, func(q manifest.Reclaim) bool { return sameReclaim(q, r) }) {
		return
	}
	d.reclaims = append(d.reclaims, r)
	d.reclaimsDirty = true
	if len(d.reclaims) > maxHorizonReclaims {
		d.reclaims = mergeReclaims(d.reclaims, false)
		if len(d.reclaims) > maxHorizonReclaims/2 {
			d.reclaims = mergeReclaims(d.reclaims, true)
		}
	}
}

// sameReclaim reports whether a and b are the same request.
func sameReclaim(a, b manifest.Reclaim) bool {
	return a.Seq == b.Seq && a.DeletedAt == b.DeletedAt && sameBound(a.Start, b.Start) && sameBound(a.End, b.End)
}

// sameBound reports whether two span bounds are equal, nil (unbounded)
// differing from an empty key.
func sameBound(a, b []byte) bool {
	return (a == nil) == (b == nil) && bytes.Equal(a, b)
}

// reclaimRecordsLocked returns the reclaims to record in the MANIFEST: the
// waiting ones and those running, which a crash would interrupt. Called
// with d.mu held.
func (d *DB) reclaimRecordsLocked() []manifest.Reclaim {
	return slices.Concat(d.reclaims, d.reclaimsInRun)
}

// reclaimDueLocked reports whether r may run: the horizon has passed its
// deletions, or the DB keeps none.
func (d *DB) reclaimDueLocked(r manifest.Reclaim) bool {
	return !d.opts.HistoryHorizon || r.Seq < d.HistoryHorizon()
}

// maybeStartReclaimsLocked starts the reclaim worker when a reclaim is due
// and none runs. It counts as background work, so Close waits for it.
func (d *DB) maybeStartReclaimsLocked() {
	if d.reclaimRunning || !d.opened || d.closed || d.readOnly || d.bgErr != nil {
		return
	}
	if !slices.ContainsFunc(d.reclaims, d.reclaimDueLocked) {
		return
	}
	d.reclaimRunning = true
	d.bgRunning++
	go d.runReclaims()
}

// runReclaims runs the due reclaims until none is left: DeleteFilesInRange
// for range deletions, then CompactRange over the merged spans.
func (d *DB) runReclaims() {
	d.mu.Lock()
	for !d.closed && d.bgErr == nil {
		var due []manifest.Reclaim
		kept := d.reclaims[:0]
		for _, r := range d.reclaims {
			if d.reclaimDueLocked(r) {
				due = append(due, r)
			} else {
				kept = append(kept, r)
			}
		}
		clear(d.reclaims[len(kept):])
		d.reclaims = kept
		if len(due) == 0 {
			break
		}
		d.reclaimsInRun = slices.Clone(due) // reclaim sorts and merges due
		d.mu.Unlock()
		err := d.reclaim(due)
		d.mu.Lock()
		d.reclaimsInRun = nil
		d.reclaimsDirty = true
		if err != nil && !d.closed {
			d.log.Warn("compact deleted spans after the history horizon", "err", err)
		}
	}
	d.reclaimRunning = false
	d.bgRunning--
	d.cond.Broadcast()
	d.mu.Unlock()
}

// reclaim drops the files of due's range deletions and compacts its spans.
func (d *DB) reclaim(due []manifest.Reclaim) error {
	for _, r := range due {
		if r.DeletedAt == 0 {
			continue
		}
		if _, _, err := d.DeleteFilesInRange(r.Start, r.End, r.DeletedAt); err != nil && !errors.Is(err, ErrOlderSnapshot) {
			return fmt.Errorf("drop files of deleted range: %w", err)
		}
	}
	for _, r := range mergeReclaims(due, false) {
		if err := d.CompactRange(r.Start, r.End); err != nil {
			return fmt.Errorf("compact deleted span: %w", err)
		}
		d.mu.Lock()
		d.metrics.horizonReclaims++
		d.mu.Unlock()
	}
	return nil
}

// mergeReclaims sorts rs by start and merges the spans that overlap (and,
// with neighbours, also each with the next one): a merged span has the
// later sequence number and drops no files (deletedAt 0).
func mergeReclaims(rs []manifest.Reclaim, neighbours bool) []manifest.Reclaim {
	slices.SortFunc(rs, func(a, b manifest.Reclaim) int {
		if a.Start == nil || b.Start == nil {
			return boolCmp(a.Start != nil, b.Start != nil)
		}
		return bytes.Compare(a.Start, b.Start)
	})
	out := rs[:0]
	for i, r := range rs {
		if len(out) > 0 {
			last := &out[len(out)-1]
			overlap := last.End == nil || (r.Start != nil && bytes.Compare(r.Start, last.End) <= 0)
			if overlap || (neighbours && i%2 == 1) {
				same := bytes.Equal(last.Start, r.Start) && (last.End == nil) == (r.End == nil) &&
					bytes.Equal(last.End, r.End) && last.DeletedAt == r.DeletedAt
				if !same {
					last.DeletedAt = 0
				}
				if last.End != nil && (r.End == nil || bytes.Compare(r.End, last.End) > 0) {
					last.End = r.End
				}
				last.Seq = max(last.Seq, r.Seq)
				continue
			}
		}
		out = append(out, r)
	}
	clear(rs[len(out):])
	return out
}

// boolCmp orders false before true.
func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}
