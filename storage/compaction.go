package storage

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/internal/compact"
	"github.com/shale-db/shale/storage/internal/compactiter"
	"github.com/shale-db/shale/storage/internal/iters"
	"github.com/shale-db/shale/storage/internal/rangedel"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/sstable"
)

// writerOptions returns the SST writer options for files of level.
func (d *DB) writerOptions(level int) sstable.WriterOptions {
	lo := d.opts.Levels[level]
	wo := sstable.WriterOptions{
		BlockSize:            lo.BlockSize,
		BlockRestartInterval: lo.BlockRestartInterval,
		Compression:          lo.Compression,
		ZstdLevel:            lo.ZstdLevel,
		FilterBitsPerKey:     lo.filterBits(),
		CreationTime:         d.opts.now().Unix(),
	}
	if d.opts.PrefixExtractor != nil {
		wo.PrefixExtractor = d.opts.PrefixExtractor.Prefix
		wo.PrefixExtractorName = d.opts.PrefixExtractor.Name()
	}
	return wo
}

// outputSpec describes where a flush or compaction writes.
type outputSpec struct {
	level     int
	snapshots []SeqNum
	// horizon is the history horizon taken with snapshots (0: none).
	horizon    SeqNum
	bottommost bool
	// split decides output-file boundaries (nil: one file).
	split *compact.Compaction
}

// writeOutputs drains input through a compaction iterator into new SSTs at
// spec.level, together with the range tombstones (clipped per file) that
// must survive. It returns the files written; on error it returns the error
// and the caller leaves the partial files to obsolete-file deletion.
func (d *DB) writeOutputs(input base.InternalIterator, tombs *rangedel.List, spec outputSpec) (outs []*manifest.FileMetadata, stats compactiter.Stats, err error) {
	defer func() {
		if cerr := input.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	ciOpts := compactiter.Options{
		Snapshots:   spec.snapshots,
		Horizon:     spec.horizon,
		Bottommost:  spec.bottommost,
		Merger:      d.opts.MergeOperator,
		OutputLevel: spec.level,
	}
	if spec.level > 0 {
		ciOpts.Filter = d.opts.CompactionFilter
	}
	if tombs != nil && !tombs.Empty() {
		ciOpts.RangeDels = tombs
	}
	ci := compactiter.New(input, ciOpts)
	// The horizon keeps the tombstones its implicit snapshots (H-1 and
	// above) need: TombstoneNeeded takes H-1 as one more snapshot.
	tombSnaps := spec.snapshots
	if spec.horizon > 0 {
		tombSnaps = append(slices.Clone(spec.snapshots), spec.horizon-1)
	}

	var (
		w         *sstable.Writer
		num       manifest.FileNum
		fileStart []byte // lower bound of the current file's tombstones
	)
	wo := d.writerOptions(spec.level)
	start := func() error {
		d.mu.Lock()
		num = d.allocFileNumLocked()
		d.mu.Unlock()
		f, err := d.fs.Create(d.tablePath(num))
		if err != nil {
			return fmt.Errorf("create sst %s: %w", num, err)
		}
		w = sstable.NewWriter(f, wo)
		return nil
	}
	finish := func(fileEnd []byte) error {
		if tombs != nil {
			for _, t := range tombs.Clip(fileStart, fileEnd) {
				if compactiter.TombstoneNeeded(t.Seq, tombSnaps, spec.bottommost) {
					if err := w.AddRangeDel(t.Start, t.End, t.Seq); err != nil {
						return fmt.Errorf("sst %s: %w", num, err)
					}
				}
			}
		}
		md, err := w.Finish()
		w = nil
		if err != nil {
			return fmt.Errorf("finish sst %s: %w", num, err)
		}
		if !md.HasPointKeys && !md.HasRangeDels {
			return nil // empty: left for obsolete-file deletion
		}
		meta := &manifest.FileMetadata{
			FileNum:      num,
			Size:         md.Size,
			SmallestSeq:  md.SmallestSeq,
			LargestSeq:   md.LargestSeq,
			CreationTime: md.Properties.CreationTime,
		}
		switch {
		case md.HasPointKeys && md.HasRangeDels:
			meta.Smallest = minKey(md.SmallestPoint, md.SmallestRangeDel).Clone()
			meta.Largest = maxKey(md.LargestPoint, md.LargestRangeDel).Clone()
		case md.HasPointKeys:
			meta.Smallest, meta.Largest = md.SmallestPoint.Clone(), md.LargestPoint.Clone()
		default:
			meta.Smallest, meta.Largest = md.SmallestRangeDel.Clone(), md.LargestRangeDel.Clone()
		}
		outs = append(outs, meta)
		return nil
	}

	for ok := ci.First(); ok; ok = ci.Next() {
		k := ci.Key()
		if w != nil && spec.split != nil && spec.split.ShouldSplitBefore(k.UserKey, w.EstimatedSize()) {
			end := slices.Clone(k.UserKey)
			if err := finish(end); err != nil {
				return outs, ci.Stats(), err
			}
			fileStart = end
		}
		if w == nil {
			if err := start(); err != nil {
				return outs, ci.Stats(), err
			}
		}
		if err := w.Add(k, ci.Value()); err != nil {
			return outs, ci.Stats(), fmt.Errorf("sst %s: %w", num, err)
		}
	}
	if err := ci.Error(); err != nil {
		if w != nil {
			_, _ = w.Finish()
		}
		return outs, ci.Stats(), err
	}
	if w == nil && tombs != nil && !tombs.Empty() {
		// Only tombstones remain: they may still be needed.
		needed := false
		for _, t := range tombs.Clip(fileStart, nil) {
			needed = needed || compactiter.TombstoneNeeded(t.Seq, tombSnaps, spec.bottommost)
		}
		if needed {
			if err := start(); err != nil {
				return outs, ci.Stats(), err
			}
		}
	}
	if w != nil {
		if err := finish(nil); err != nil {
			return outs, ci.Stats(), err
		}
	}
	return outs, ci.Stats(), nil
}

func minKey(a, b base.InternalKey) base.InternalKey {
	if base.CompareInternal(a, b) <= 0 {
		return a
	}
	return b
}

func maxKey(a, b base.InternalKey) base.InternalKey {
	if base.CompareInternal(a, b) >= 0 {
		return a
	}
	return b
}

// flushInput returns a merged iterator and the tombstones of mems.
func flushInput(mems []*memTable) (base.InternalIterator, *rangedel.List) {
	var its []base.InternalIterator
	var tombs []rangedel.Tombstone
	for _, m := range mems {
		its = append(its, m.points.NewIter(nil, nil))
		tombs = append(tombs, m.tombstones()...)
	}
	return iters.NewMergingIter(its...), rangedel.NewList(tombs)
}

// writeL0 writes one memtable to an L0 SST during recovery and returns its
// metadata (nil when nothing survived). The file stays in pendingOut until
// the caller installs it.
func (d *DB) writeL0(m *memTable) (*manifest.FileMetadata, error) {
	input, tombs := flushInput([]*memTable{m})
	outs, _, err := d.writeOutputs(input, tombs, outputSpec{level: 0, horizon: d.HistoryHorizon()})
	if err != nil {
		return nil, fmt.Errorf("flush recovered memtable: %w", err)
	}
	if len(outs) == 0 {
		return nil, nil
	}
	return outs[0], nil
}

// maybeScheduleFlushLocked queues a flush when memtables wait for one.
func (d *DB) maybeScheduleFlushLocked() {
	if d.flushing || len(d.imm) == 0 || d.closed || d.readOnly || d.bgErr != nil {
		return
	}
	d.flushing = true
	d.bgRunning++
	if !d.shared.pool.submit(priorityFlush, d.runFlush) {
		d.flushing = false
		d.bgRunning--
	}
}

// runFlush writes every immutable memtable queued at its start into one L0
// file and installs it.
func (d *DB) runFlush() {
	d.mu.Lock()
	mems := slices.Clone(d.imm)
	snapshots := d.snapshots.seqs()
	d.sampleHistoryLocked() // the horizon as fresh as the window allows
	horizon := d.HistoryHorizon()
	d.mu.Unlock()

	start := time.Now()
	var memBytes uint64
	for _, m := range mems {
		memBytes += m.approxBytes()
	}
	input, tombs := flushInput(mems)
	outs, _, err := d.writeOutputs(input, tombs, outputSpec{level: 0, snapshots: snapshots, horizon: horizon})
	if err == nil {
		ve := &manifest.VersionEdit{}
		for _, o := range outs {
			ve.NewFiles = append(ve.NewFiles, manifest.NewFileEntry{Level: 0, Meta: o})
		}
		d.mu.Lock()
		if len(d.imm) > len(mems) {
			ve.MinUnflushedLogNum = d.imm[len(mems)].logNum
		} else {
			ve.MinUnflushedLogNum = d.mem.logNum
		}
		d.mu.Unlock()
		err = d.logAndApply(ve, func() {
			d.imm = d.imm[len(mems):]
			// Give the memory back to the shared budget in the same
			// step: a commit seeing no immutable memtable may rotate,
			// and must not find the flushed ones still counted.
			for _, m := range mems {
				m.release()
			}
		})
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range outs {
		delete(d.pendingOut, o.FileNum)
	}
	d.flushing = false
	d.bgRunning--
	if err != nil {
		if !d.closed {
			d.setBackgroundErrorLocked(fmt.Errorf("flush: %w", err))
		}
		d.cond.Broadcast()
		return
	}
	for _, m := range mems {
		// Out of d.imm (logAndApply published a read state without it)
		// and released: drop the DB's reference.
		m.unref()
	}
	dur := time.Since(start)
	d.metrics.flushes++
	d.metrics.flushInBytes += memBytes
	for _, o := range outs {
		d.metrics.flushOutBytes += o.Size
		d.metrics.levels[0].bytesWritten += o.Size
	}
	d.wc.reportFlush(memBytes, dur)
	// A flush means writes came: an at-rest merge waits for them to stop
	// again.
	d.atRestDue = false
	d.armAtRestLocked()
	d.deleteObsoleteFilesLocked()
	d.updatePacingLocked()
	d.maybeScheduleFlushLocked()
	d.maybeScheduleCompactionLocked()
	d.cond.Broadcast()
}

// levelsView adapts a version for the picker.
func levelsView(v *manifest.Version) *compact.LevelsView {
	return &compact.LevelsView{Levels: v.Levels}
}

// maybeScheduleCompactionLocked starts compactions while the picker finds
// work and this DB has free compaction slots.
func (d *DB) maybeScheduleCompactionLocked() {
	if d.closed || d.readOnly || d.bgErr != nil || d.manualWaiters > 0 || d.ingesting > 0 {
		return
	}
	for len(d.compactions) < d.opts.MaxConcurrentCompactions {
		c := d.picker.Pick(levelsView(d.vers), d.compactions)
		if c == nil && d.opts.PeriodicCompaction > 0 {
			cutoff := d.opts.now().Add(-d.opts.PeriodicCompaction).Unix()
			c = d.picker.PickPeriodic(levelsView(d.vers), d.compactions, cutoff)
		}
		if c == nil && d.atRestDue {
			if c = d.picker.PickAtRest(levelsView(d.vers), d.compactions); c != nil {
				d.metrics.atRestCompactions++
			} else if d.picker.AtRestL0Bytes(levelsView(d.vers)) == 0 {
				d.atRestDue = false // done; the next flush arms the check again
			}
		}
		if c == nil {
			return
		}
		d.startCompactionLocked(c)
	}
}

// startCompactionLocked marks c's inputs and queues it.
func (d *DB) startCompactionLocked(c *compact.Compaction) {
	d.startCompactionWithDone(c, nil)
}

func (d *DB) startCompactionWithDone(c *compact.Compaction, done chan error) {
	for _, in := range c.Inputs {
		for _, f := range in.Files {
			f.Compacting = true
		}
	}
	d.compactions = append(d.compactions, c)
	d.metrics.peakCompactions = max(d.metrics.peakCompactions, len(d.compactions))
	d.bgRunning++
	prio := priorityCompaction
	if c.StartLevel == 0 {
		prio = priorityL0Compaction
	}
	if !d.shared.pool.submit(prio, func() { d.runCompaction(c, done) }) {
		d.finishCompactionLocked(c)
		d.bgRunning--
		if done != nil {
			done <- ErrClosed
		}
	}
}

// finishCompactionLocked unmarks c's inputs and forgets it.
func (d *DB) finishCompactionLocked(c *compact.Compaction) {
	for _, in := range c.Inputs {
		for _, f := range in.Files {
			f.Compacting = false
		}
	}
	if i := slices.Index(d.compactions, c); i >= 0 {
		d.compactions = slices.Delete(d.compactions, i, i+1)
	}
}

// runCompaction executes c and installs its result.
func (d *DB) runCompaction(c *compact.Compaction, done chan error) {
	start := time.Now()
	ve := &manifest.VersionEdit{DeletedFiles: make(map[manifest.DeletedFileEntry]*manifest.FileMetadata)}
	for _, in := range c.Inputs {
		for _, f := range in.Files {
			ve.DeletedFiles[manifest.DeletedFileEntry{Level: in.Level, FileNum: f.FileNum}] = f
		}
	}
	var outs []*manifest.FileMetadata
	var err error
	if c.Kind == compact.KindMove {
		f := c.StartFiles()[0]
		moved := &manifest.FileMetadata{
			FileNum: f.FileNum, Size: f.Size, Smallest: f.Smallest, Largest: f.Largest,
			SmallestSeq: f.SmallestSeq, LargestSeq: f.LargestSeq, CreationTime: f.CreationTime,
		}
		ve.NewFiles = append(ve.NewFiles, manifest.NewFileEntry{Level: c.OutputLevel, Meta: moved})
	} else {
		outs, err = d.compactFiles(c)
		for _, o := range outs {
			ve.NewFiles = append(ve.NewFiles, manifest.NewFileEntry{Level: c.OutputLevel, Meta: o})
		}
	}
	if err == nil {
		err = d.logAndApply(ve, nil)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range outs {
		delete(d.pendingOut, o.FileNum)
	}
	d.finishCompactionLocked(c)
	d.bgRunning--
	if err != nil && !d.closed {
		d.setBackgroundErrorLocked(fmt.Errorf("compaction %s: %w", c, err))
	}
	if err == nil {
		in := c.InputBytes()
		var out uint64
		for _, o := range outs {
			out += o.Size
		}
		lm := &d.metrics.levels[c.OutputLevel]
		if c.Kind == compact.KindMove {
			d.metrics.moves++
			lm.bytesMoved += c.StartFiles()[0].Size
		} else {
			d.metrics.compactions++
			if c.Kind == compact.KindPeriodic {
				d.metrics.periodicCompactions++
			}
			d.metrics.compactInBytes += in
			d.metrics.compactOutBytes += out
			lm.bytesIn += in
			lm.bytesWritten += out
			d.wc.reportCompaction(in, time.Since(start))
		}
		d.deleteObsoleteFilesLocked()
	}
	if done != nil {
		done <- err
	}
	d.updatePacingLocked()
	d.maybeScheduleCompactionLocked()
	d.cond.Broadcast()
}

// compactFiles merges c's inputs into new files at c.OutputLevel.
func (d *DB) compactFiles(c *compact.Compaction) ([]*manifest.FileMetadata, error) {
	var children []base.InternalIterator
	var tombs []rangedel.Tombstone
	closeAll := func() {
		for _, ch := range children {
			_ = ch.Close()
		}
	}
	for _, lf := range c.Inputs {
		in := lf.Files
		if len(in) == 0 {
			continue
		}
		for _, f := range in {
			ts, err := d.tableTombstones(f)
			if err != nil {
				closeAll()
				return nil, err
			}
			tombs = append(tombs, ts...)
		}
		if lf.Level == 0 {
			for _, f := range in {
				it, err := d.newTableIter(f, nil, nil, false)
				if err != nil {
					closeAll()
					return nil, err
				}
				children = append(children, it)
			}
			continue
		}
		files := in
		bounds := make([]iters.FileBounds, len(files))
		for j, f := range files {
			bounds[j] = iters.FileBounds{Smallest: f.Smallest, Largest: f.Largest}
		}
		children = append(children, iters.NewLevelIter(bounds, func(j int, lo, hi []byte) (base.InternalIterator, error) {
			return d.newTableIter(files[j], lo, hi, false)
		}, nil, nil))
	}
	d.mu.Lock()
	snapshots := d.snapshots.seqs()
	d.sampleHistoryLocked() // the horizon as fresh as the window allows
	horizon := d.HistoryHorizon()
	d.mu.Unlock()
	var list *rangedel.List
	if len(tombs) > 0 {
		list = rangedel.NewList(tombs)
	}
	outs, _, err := d.writeOutputs(iters.NewMergingIter(children...), list, outputSpec{
		level:      c.OutputLevel,
		snapshots:  snapshots,
		horizon:    horizon,
		bottommost: c.Bottommost,
		split:      c,
	})
	return outs, err
}

// updatePacingLocked recomputes the write controller's pressure from the
// memtable queue, L0 file count and compaction debt.
func (d *DB) updatePacingLocked() {
	if d.vers == nil {
		return
	}
	imm := float64(len(d.imm))
	p := linearPressure(imm, 1, float64(d.opts.MaxMemTables-1))
	l0 := float64(len(d.vers.Levels[0]))
	p = max(p, linearPressure(l0, float64(d.opts.L0CompactionTrigger), float64(d.opts.L0SlowdownTrigger)))
	debt := float64(d.picker.EstimatedPendingCompactionBytes(levelsView(d.vers)))
	lb := float64(d.opts.LBaseMaxBytes)
	p = max(p, linearPressure(debt, 2*lb, 16*lb))
	d.wc.setState(p, d.metrics.writeAmp())
	d.metrics.pendingCompactionBytes = uint64(debt)
}

// Flush writes the mutable memtable (and any waiting ones) to L0 and waits
// until they are durable in SSTs.
func (d *DB) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkWritableLocked(); err != nil {
		return err
	}
	// Rotate between commit groups, then wait for the sealed memtables.
	barrier := d.acquireCommitBarrierLocked()
	var err error
	if !d.mem.empty() {
		if err = d.checkWritableLocked(); err == nil {
			if err = d.rotateMemTableLocked(d.nextMemTableSizeLocked(), false); err != nil {
				d.setBackgroundErrorLocked(err)
			}
		}
	}
	d.releaseCommitBarrierLocked(barrier)
	if err != nil {
		return err
	}
	target := d.imm
	for {
		if d.bgErr != nil {
			return d.bgErr
		}
		if d.closed {
			return ErrClosed
		}
		pending := false
		for _, m := range d.imm {
			if slices.Contains(target, m) {
				pending = true
			}
		}
		if !pending {
			return nil
		}
		d.maybeScheduleFlushLocked()
		d.cond.Wait()
	}
}

// ErrOlderSnapshot is returned by DeleteFilesInRange while a snapshot
// older than the range's deletion is open.
var ErrOlderSnapshot = errors.New("storage: a snapshot older than the range deletion is open")

// DeleteFilesInRange removes from the DB, without reading or rewriting
// them, the SST files whose entries (range deletions included) all have
// user keys in [start, end) (nil bounds are unbounded) and sequence
// numbers below deletedAt, and returns how many it removed and their
// bytes. The caller guarantees that [start, end) was deleted (a
// DeleteRange) by the batch of sequence number deletedAt (Batch.SeqNum
// after Apply): a file it removes then holds nothing a read at or after
// that deletion can see. While a snapshot older than deletedAt is open it
// removes nothing and returns ErrOlderSnapshot; so it does while the history
// horizon (Options.HistoryHorizon) is at or below deletedAt, and then it
// schedules the same removal and a compaction of the range for when the
// horizon passes deletedAt (see CompactAfterHorizon). Files straddling a bound,
// the file holding the range deletion itself and files in a running
// compaction stay (CompactRange drops what they hold). It is RocksDB's
// DeleteFilesInRange, made safe: the space of a range a shard gave away
// comes back without compaction work.
func (d *DB) DeleteFilesInRange(start, end []byte, deletedAt SeqNum) (files int, size uint64, err error) {
	if start != nil && end != nil && bytes.Compare(start, end) >= 0 {
		return 0, 0, nil
	}
	d.mu.Lock()
	for d.ingesting > 0 {
		d.cond.Wait() // an ingestion is placing files
	}
	if err := d.checkWritableLocked(); err != nil {
		d.mu.Unlock()
		return 0, 0, err
	}
	if seqs := d.snapshots.seqs(); len(seqs) > 0 && seqs[0] < deletedAt {
		d.mu.Unlock()
		return 0, 0, ErrOlderSnapshot
	}
	if h := d.HistoryHorizon(); h > 0 && h-1 < deletedAt {
		// The history horizon reads like a snapshot at H-1. Once it
		// passes the deletion, the span's files go and it is compacted.
		d.addReclaimLocked(manifest.Reclaim{Start: slices.Clone(start), End: slices.Clone(end), Seq: deletedAt, DeletedAt: deletedAt})
		d.mu.Unlock()
		return 0, 0, ErrOlderSnapshot
	}
	ve := &manifest.VersionEdit{DeletedFiles: make(map[manifest.DeletedFileEntry]*manifest.FileMetadata)}
	var marked []*manifest.FileMetadata
	for level := range d.vers.Levels {
		for _, f := range d.vers.Levels[level] {
			if f.Compacting || f.LargestSeq >= deletedAt || (start != nil && bytes.Compare(f.Smallest.UserKey, start) < 0) ||
				(end != nil && bytes.Compare(f.Largest.UserKey, end) >= 0) {
				continue
			}
			f.Compacting = true // no compaction picks it meanwhile
			marked = append(marked, f)
			ve.DeletedFiles[manifest.DeletedFileEntry{Level: level, FileNum: f.FileNum}] = f
			size += f.Size
		}
	}
	d.mu.Unlock()
	if len(marked) == 0 {
		return 0, 0, nil
	}
	err = d.logAndApply(ve, nil)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range marked {
		f.Compacting = false
	}
	if err != nil {
		return 0, 0, fmt.Errorf("delete files in range: %w", err)
	}
	d.deleteObsoleteFilesLocked()
	d.updatePacingLocked()
	d.maybeScheduleCompactionLocked()
	return len(marked), size, nil
}

// CompactRange compacts every file overlapping [start, end] (nil bounds are
// unbounded) down through the levels, so that afterwards the range is in
// as few levels as possible with deleted and overwritten data dropped. It
// flushes the memtables first and waits until done.
func (d *DB) CompactRange(start, end []byte) error {
	if err := d.Flush(); err != nil {
		return err
	}
	d.mu.Lock()
	d.manualWaiters++
	defer func() {
		d.manualWaiters--
		d.maybeScheduleCompactionLocked()
		d.mu.Unlock()
	}()
	// Level by level, top down: PickManual hands out the level's files in
	// pieces of bounded size and returns nil once none overlaps the range.
	// The last level is rewritten in place (dropping what compactions
	// above could not, like tombstones with nothing left to delete).
	for level := 0; level < manifest.NumLevels; level++ {
		for {
			if err := d.checkWritableLocked(); err != nil {
				return err
			}
			if d.ingesting > 0 {
				d.cond.Wait() // an ingestion is placing files
				continue
			}
			c, err := d.picker.PickManual(levelsView(d.vers), level, start, end, d.compactions)
			if errors.Is(err, compact.ErrConflict) {
				d.cond.Wait()
				continue
			}
			if err != nil {
				return fmt.Errorf("compact range at L%d: %w", level, err)
			}
			if c == nil {
				break
			}
			done := make(chan error, 1)
			d.startCompactionWithDone(c, done)
			d.mu.Unlock()
			err = <-done
			d.mu.Lock()
			if err != nil {
				return err
			}
			if d.opts.Compaction == UniversalCompaction {
				return nil // it merged every sorted run into the last level
			}
			if c.OutputLevel == c.StartLevel {
				break // an in-place rewrite of the last level covers it whole
			}
		}
	}
	return nil
}
