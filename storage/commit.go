package storage

import (
	"fmt"
	"slices"
	"time"
)

// commitWriter is one Apply call waiting in the commit queue.
type commitWriter struct {
	// barrier marks a pseudo-writer that holds the head of the queue so
	// that no group is in flight (see acquireCommitBarrierLocked).
	barrier bool
	batch   *Batch
	opts    WriteOptions
	done    bool
	err     error
}

// maxGroupBytes bounds the size of a commit group, so one huge group does
// not delay a small synced write for long.
const maxGroupBytes = 1 << 20

// Apply applies the batch atomically: after it returns nil every record is
// visible to new reads, and, with opts.Sync, durable. On error nothing of the
// batch is acknowledged; an I/O error puts the DB in the background-error
// state (see Metrics().BackgroundError) and every later write fails.
//
// Concurrent Apply calls are committed in groups: one writer (the leader)
// writes the batches of every writer queued behind it to the WAL with a
// single write and at most one sync.
func (d *DB) Apply(b *Batch, opts WriteOptions) error {
	err := d.apply(b, opts)
	if err == nil && b.hasRangeDel && d.opts.HistoryHorizon {
		// The deleted data's space comes back once the horizon passes.
		d.noteRangeDeletions(b)
	}
	return err
}

// apply is Apply without the reclaim of range deletions.
func (d *DB) apply(b *Batch, opts WriteOptions) error {
	if b.err != nil {
		return b.err
	}
	if b.Len() > maxBatchSize {
		return fmt.Errorf("%w: %d bytes", ErrBatchTooLarge, b.Len())
	}
	if b.Empty() {
		return nil
	}
	// The queue entry lives in the batch: no allocation per write. A batch
	// must not be applied twice concurrently (it is not safe for concurrent
	// use anyway).
	w := &b.commit
	*w = commitWriter{batch: b, opts: opts}

	// Pace before queueing, outside every lock: a paced writer never holds up
	// the group it would otherwise join.
	if !d.opts.DisableWritePacing && d.wc.active.Load() {
		if delay := d.wc.delay(b.Len(), time.Now()); delay > 0 {
			time.Sleep(delay)
		}
	}

	d.mu.Lock()
	if err := d.checkWritableLocked(); err != nil {
		d.mu.Unlock()
		return err
	}
	d.writers = append(d.writers, w)
	for !w.done && d.writers[0] != w {
		d.cond.Wait()
	}
	if w.done {
		d.mu.Unlock()
		return w.err
	}

	// w leads a group.
	err := d.makeRoomForWriteLocked(batchFootprint(b))
	group := d.writers[:1]
	var groupBytes int
	if err == nil {
		groupBytes = b.Len()
		for _, o := range d.writers[1:] {
			if o.barrier {
				break
			}
			if groupBytes+o.batch.Len() > maxGroupBytes || !d.mem.hasRoom(d.groupFootprint(group)+batchFootprint(o.batch)) {
				break
			}
			groupBytes += o.batch.Len()
			group = d.writers[:len(group)+1]
		}
		err = d.commitGroupLocked(group)
	}
	for _, o := range group {
		o.done, o.err = true, err
	}
	d.writers = d.writers[len(group):]
	if len(d.writers) == 0 {
		d.writers = nil
	}
	d.cond.Broadcast()
	d.mu.Unlock()
	return err
}

func (d *DB) groupFootprint(group []*commitWriter) uint64 {
	var n uint64
	for _, w := range group {
		n += batchFootprint(w.batch)
	}
	return n
}

// commitGroupLocked writes the group to the WAL and the memtable and
// publishes it. It releases d.mu while doing I/O; only the leader runs it, so
// the WAL writer and the mutable memtable are not touched by anyone else
// meanwhile (rotation also happens only in the leader).
func (d *DB) commitGroupLocked(group []*commitWriter) error {
	seq := d.logSeq + 1
	mem := d.mem
	var sync, anyWAL bool
	var groupBytes int
	for _, w := range group {
		w.batch.setSeqNum(seq)
		seq += w.batch.seqSpan()
		groupBytes += w.batch.Len()
		if !w.opts.DisableWAL {
			anyWAL = true
			sync = sync || w.opts.Sync
		} else {
			mem.unlogged.Store(true)
		}
	}
	last := seq - 1
	d.mu.Unlock()

	pending, walErr := d.writeWAL(group, anyWAL, sync, groupBytes <= syncInlineBytes)
	var err error
	if walErr == nil {
		for _, w := range group {
			if err = mem.apply(w.batch, w.batch.SeqNum()); err != nil {
				err = fmt.Errorf("apply to memtable: %w", err)
				break
			}
		}
	}
	if serr := pending.wait(); serr != nil && walErr == nil {
		walErr = fmt.Errorf("sync wal: %w", serr)
	}
	if walErr != nil {
		err = walErr
	}

	d.mu.Lock()
	if err != nil {
		// The WAL may hold part of the group; the DB can no longer tell
		// which writes are durable, so it refuses all further writes.
		d.setBackgroundErrorLocked(err)
		return err
	}
	d.logSeq = last
	d.visibleSeq.Store(uint64(last))
	d.historyWokenLocked()
	d.prepareNextArenaLocked(mem)
	return nil
}

// prepareNextArenaLocked asks the shared pool, once the mutable memtable mem
// is half full, to allocate the arena of the next memtable in the
// background, so that the rotation does not: allocating a fresh 16-64 MiB
// arena at rotation, in the commit path, took 45-57 ms in a fillbatch-sync
// run (the writes' slowest batches). A DB that writes little never fills
// half a memtable and has no arena prepared for it.
func (d *DB) prepareNextArenaLocked(mem *memTable) {
	if mem.nextArenaAsked || d.opts.MemTable == VectorMemTable || mem != d.mem {
		return
	}
	if mem.approxBytes() < mem.capacity/2 {
		return
	}
	mem.nextArenaAsked = true
	d.shared.arenas.prepare(uint32(d.peekMemTableSizeLocked() + skiplistFixedOverhead))
}

// syncInlineBytes is the largest synced commit group whose sync runs in
// the commit leader's goroutine, after its memtable inserts, instead of in
// a goroutine of its own beside them. Inserting a group this small takes
// microseconds against the sync's hundreds, so running both at once saves
// little, while the goroutine costs a hand-off each way (a Raft log's
// synced write per loop cycle paid two wake-ups for it).
const syncInlineBytes = 64 << 10

// walSync is a synced group's pending sync (walSync.wait).
type walSync struct {
	buf  *walBuffer // to sync in the caller's goroutine
	done chan error // the result of a sync running in the background
}

// wait returns the result of the pending sync, running it first if it is
// the caller's to run; it returns nil when nothing was to be synced.
func (s walSync) wait() error {
	switch {
	case s.done != nil:
		return <-s.done
	case s.buf != nil:
		return s.buf.sync()
	}
	return nil
}

// writeWAL writes the group's logged batches to the WAL. With sync it
// flushes them and returns the sync to wait for: started in the background
// (the caller inserts into the memtable meanwhile), or, with inline, left
// for the caller to run once it has inserted. Either way the caller
// acknowledges nothing before the sync succeeds. The file cannot be
// rotated during the sync: only a commit leader or a holder of the commit
// barrier rotates, and the caller leads. Called by the leader without d.mu.
func (d *DB) writeWAL(group []*commitWriter, anyWAL, sync, inline bool) (walSync, error) {
	if !anyWAL {
		return walSync{}, nil
	}
	d.walMu.Lock()
	defer d.walMu.Unlock()
	for _, w := range group {
		if w.opts.DisableWAL {
			continue
		}
		if _, err := d.logWriter.WriteRecord(w.batch.Repr()); err != nil {
			return walSync{}, fmt.Errorf("write wal: %w", err)
		}
		d.walBytes.Add(uint64(w.batch.Len()))
	}
	// Move the framed bytes into the WAL buffer (a memory copy); the write
	// system call happens in drain, outside walMu.
	if err := d.logWriter.Flush(); err != nil {
		return walSync{}, fmt.Errorf("write wal: %w", err)
	}
	if !sync {
		// Hand the write system call to the background flusher (once
		// enough is buffered, with a WALFlushThreshold).
		if t := d.opts.WALFlushThreshold; t > 0 && d.logBuf.pendingBytes() < t {
			// One wake-up per hold: the flusher, once told, writes out
			// everything held by then and after (walHeldTold).
			if !d.walHeldTold {
				d.walHeldTold = true
				select {
				case d.walHeldC <- struct{}{}:
				default:
				}
			}
			return walSync{}, nil
		}
		select {
		case d.walFlushC <- struct{}{}:
		default:
		}
		return walSync{}, nil
	}
	d.walSyncs.Add(1)
	if inline {
		return walSync{buf: d.logBuf}, nil
	}
	done := make(chan error, 1)
	buf := d.logBuf
	go func() { done <- buf.sync() }()
	return walSync{done: done}, nil
}

// makeRoomForWriteLocked ensures the mutable memtable can take a batch of
// the given footprint, rotating it (and the WAL) when full and waiting at the
// hard limits. Called by the commit leader with d.mu held.
func (d *DB) makeRoomForWriteLocked(footprint uint64) error {
	var stallStart time.Time
	defer func() {
		if !stallStart.IsZero() {
			d.metrics.stallTime += time.Since(stallStart)
			d.metrics.stalls++
		}
	}()
	for {
		if err := d.checkWritableLocked(); err != nil {
			return err
		}
		// Over the shared memtable budget, a DB with no flush pending seals
		// its memtable early to give memory back; one with a flush pending
		// keeps filling its current memtable (that costs no memory) and,
		// once it is full, waits for the flush instead of allocating
		// another: rotating would only grow the memory over the budget.
		overBudget := d.shared.overBudget()
		flushEarly := overBudget && len(d.imm) == 0 && d.mem.used() > d.mem.capacity/8
		if d.mem.hasRoom(footprint) && !flushEarly {
			return nil
		}
		if d.mem.empty() && !flushEarly {
			// A batch larger than a memtable gets a memtable of its own.
			old := d.mem
			old.release()
			d.mem = newMemTable(footprint, d.logNum, d.shared, false, d.opts.MemTable)
			d.updateReadStateLocked()
			old.unref()
			return nil
		}
		capacity := max(d.peekMemTableSizeLocked(), footprint)
		// A DB with a flush pending takes more memtable memory only within
		// the shared budget (reserved atomically, so DBs racing for the
		// last room cannot all take it): past the budget, each DB holds at
		// most one memtable more than its share, the one a flushEarly
		// rotation adds while its only immutable memtable flushes.
		reserved := len(d.imm) > 0 && d.shared.opts.MemTableBudget > 0
		if len(d.imm)+1 >= d.opts.MaxMemTables || len(d.vers.Levels[0]) >= d.opts.L0StopTrigger ||
			(reserved && !d.shared.reserveWithinBudget(int64(capacity))) {
			// The hard limit. Pacing exists so that this is rare.
			if stallStart.IsZero() {
				stallStart = time.Now()
				d.log.Warn("write stall", "immutable_memtables", len(d.imm), "l0_files", len(d.vers.Levels[0]))
			}
			d.maybeScheduleFlushLocked()
			d.maybeScheduleCompactionLocked()
			d.cond.Wait()
			continue
		}
		d.nextMemTableSizeLocked()
		if err := d.rotateMemTableLocked(capacity, reserved); err != nil {
			d.setBackgroundErrorLocked(err)
			return err
		}
	}
}

// peekMemTableSizeLocked returns what nextMemTableSizeLocked will return,
// without advancing the ramp.
func (d *DB) peekMemTableSizeLocked() uint64 {
	if d.memRamp == 0 {
		return d.opts.MemTableInitialSize
	}
	return d.memRamp
}

// nextMemTableSizeLocked returns the capacity of the next memtable. Sizes
// ramp up from MemTableInitialSize, doubling per memtable, to MemTableSize:
// a small or new DB does not reserve a full-size memtable, and inserts into
// the early, smaller skiplists stay cache-friendly.
func (d *DB) nextMemTableSizeLocked() uint64 {
	if d.memRamp == 0 {
		d.memRamp = d.opts.MemTableInitialSize
	}
	size := d.memRamp
	d.memRamp = min(d.memRamp*2, d.opts.MemTableSize)
	return size
}

// rotateMemTableLocked seals the mutable memtable, starts a new WAL and a new
// memtable of the given capacity, and schedules a flush. With reserved, the
// capacity is already counted in the shared memtable bytes (and given back
// if the rotation fails).
func (d *DB) rotateMemTableLocked(capacity uint64, reserved bool) error {
	if err := d.newLogLocked(); err != nil {
		if reserved {
			d.shared.memUsed.Add(-int64(capacity))
		}
		return err
	}
	d.mem.immutable.Store(true)
	d.imm = append(d.imm, d.mem)
	d.mem = newMemTable(capacity, d.logNum, d.shared, reserved, d.opts.MemTable)
	d.updateReadStateLocked()
	d.maybeScheduleFlushLocked()
	d.updatePacingLocked()
	return nil
}

// acquireCommitBarrierLocked waits until every commit group queued before it
// has finished and holds the head of the commit queue: until the barrier is
// released no batch is written, so the WAL, the memtable and the sequence
// number are quiescent (d.mu may still be released and retaken meanwhile).
func (d *DB) acquireCommitBarrierLocked() *commitWriter {
	w := &commitWriter{barrier: true}
	d.writers = append(d.writers, w)
	for d.writers[0] != w {
		d.cond.Wait()
	}
	return w
}

// releaseCommitBarrierLocked lets queued writers proceed.
func (d *DB) releaseCommitBarrierLocked(w *commitWriter) {
	if i := slices.Index(d.writers, w); i >= 0 {
		d.writers = slices.Delete(d.writers, i, i+1)
	}
	d.cond.Broadcast()
}

// SyncWAL makes every write acknowledged before the call durable, as if it
// had been written with Sync: a cheap alternative to Flush for a caller that
// only needs durability (the data stays in the memtable and the WAL). Writes
// made with DisableWAL are not covered. A failed sync puts the DB in the
// background-error state, like a failed synced write.
func (d *DB) SyncWAL() error {
	d.mu.Lock()
	err := d.checkWritableLocked()
	d.mu.Unlock()
	if err != nil {
		return err
	}
	d.walMu.Lock()
	if d.logWriter == nil {
		d.walMu.Unlock()
		return ErrClosed
	}
	// Earlier WALs were synced when they were rotated out: syncing the
	// current one covers every acknowledged write.
	num := d.logNum
	err = d.logWriter.Flush()
	if err == nil {
		err = d.logBuf.sync()
		d.walSyncs.Add(1)
	}
	d.walMu.Unlock()
	if err != nil {
		err = fmt.Errorf("sync wal %s: %w", num, err)
		d.mu.Lock()
		d.setBackgroundErrorLocked(err)
		d.mu.Unlock()
		return err
	}
	return nil
}

// applyOne applies a pooled one-record batch built by fill.
func (d *DB) applyOne(opts WriteOptions, fill func(b *Batch)) error {
	b, _ := d.batchPool.Get().(*Batch)
	if b == nil {
		b = NewBatch()
	}
	fill(b)
	err := d.Apply(b, opts)
	if cap(b.data) <= 64<<10 {
		b.Reset()
		d.batchPool.Put(b)
	}
	return err
}

// Set writes key=value (a one-record batch).
func (d *DB) Set(key, value []byte, opts WriteOptions) error {
	return d.applyOne(opts, func(b *Batch) { b.Set(key, value) })
}

// Delete removes key (a one-record batch).
func (d *DB) Delete(key []byte, opts WriteOptions) error {
	return d.applyOne(opts, func(b *Batch) { b.Delete(key) })
}

// DeleteRange removes every key in [start, end) (a one-record batch).
func (d *DB) DeleteRange(start, end []byte, opts WriteOptions) error {
	return d.applyOne(opts, func(b *Batch) { b.DeleteRange(start, end) })
}

// Merge adds a merge operand for key (a one-record batch).
func (d *DB) Merge(key, operand []byte, opts WriteOptions) error {
	return d.applyOne(opts, func(b *Batch) { b.Merge(key, operand) })
}
