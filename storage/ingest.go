package storage

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/sstable"
	"github.com/shale-db/shale/storage/vfs"
)

// SSTWriter builds an SST file that IngestSST can add to a DB. Keys must be
// added in strictly increasing order (Set, Delete and Merge share that
// order); range deletions may be added in any order.
type SSTWriter struct {
	w    *sstable.Writer
	last []byte
	n    int
	err  error
}

// CreateSSTWriter creates path on fs and returns a writer for it, using
// level's block, compression and filter settings.
func CreateSSTWriter(fs vfs.FS, path string, level LevelOptions, prefix PrefixExtractor) (*SSTWriter, error) {
	if fs == nil {
		fs = vfs.Default
	}
	opts := (&Options{Levels: [manifest.NumLevels]LevelOptions{level}}).ensureDefaults()
	f, err := fs.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create sst %s: %w", path, err)
	}
	lo := opts.Levels[0]
	wo := sstable.WriterOptions{
		BlockSize:            lo.BlockSize,
		BlockRestartInterval: lo.BlockRestartInterval,
		Compression:          lo.Compression,
		ZstdLevel:            lo.ZstdLevel,
		FilterBitsPerKey:     lo.filterBits(),
	}
	if prefix != nil {
		wo.PrefixExtractor, wo.PrefixExtractorName = prefix.Prefix, prefix.Name()
	}
	return &SSTWriter{w: sstable.NewWriter(f, wo)}, nil
}

func (s *SSTWriter) add(kind base.Kind, key, value []byte) error {
	if s.err != nil {
		return s.err
	}
	if s.n > 0 && bytes.Compare(key, s.last) <= 0 {
		s.err = fmt.Errorf("sst writer: key %s is not after %s", base.FormatKey(key), base.FormatKey(s.last))
		return s.err
	}
	s.last = append(s.last[:0], key...)
	s.n++
	if err := s.w.Add(base.MakeInternalKey(key, 0, kind), value); err != nil {
		s.err = err
	}
	return s.err
}

// Set adds key=value.
func (s *SSTWriter) Set(key, value []byte) error { return s.add(base.KindSet, key, value) }

// Delete adds a deletion of key (it hides older data of key once ingested).
func (s *SSTWriter) Delete(key []byte) error { return s.add(base.KindDelete, key, nil) }

// Merge adds a merge operand for key.
func (s *SSTWriter) Merge(key, operand []byte) error { return s.add(base.KindMerge, key, operand) }

// DeleteRange adds a deletion of [start, end).
func (s *SSTWriter) DeleteRange(start, end []byte) error {
	if s.err != nil {
		return s.err
	}
	if err := s.w.AddRangeDel(start, end, 0); err != nil {
		s.err = err
	}
	return s.err
}

// Finish writes the file's remaining blocks and footer, syncs and closes it.
func (s *SSTWriter) Finish() error {
	if s.err != nil {
		return s.err
	}
	_, err := s.w.Finish()
	return err
}

// ingestFile is a file being ingested.
type ingestFile struct {
	path              string
	reader            *sstable.Reader
	file              vfs.File
	smallest, largest base.InternalKey
	size              uint64
}

// IngestSST adds SST files written by SSTWriter to the DB atomically, as if
// their contents were one batch applied now: they shadow older data of their
// keys and are invisible to snapshots taken before. Each file is placed at
// the lowest level it fits. When nothing in the DB overlaps a file and no
// snapshot is open, the file is hard-linked (or copied) as is; otherwise it
// is rewritten with the ingestion's sequence number. Memtables overlapping
// the files are flushed first. The source files are left in place.
func (d *DB) IngestSST(paths []string) error {
	if len(paths) == 0 {
		return nil
	}
	files := make([]*ingestFile, 0, len(paths))
	defer func() {
		for _, f := range files {
			_ = f.file.Close()
		}
	}()
	for _, p := range paths {
		f, err := d.loadIngestFile(p)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	slices.SortFunc(files, func(a, b *ingestFile) int { return base.CompareInternal(a.smallest, b.smallest) })
	for i := 1; i < len(files); i++ {
		if base.CompareInternal(files[i-1].largest, files[i].smallest) >= 0 {
			return fmt.Errorf("ingest: %s and %s overlap", files[i-1].path, files[i].path)
		}
	}

	for attempt := 0; ; attempt++ {
		d.mu.Lock()
		if err := d.checkWritableLocked(); err != nil {
			d.mu.Unlock()
			return err
		}
		barrier := d.acquireCommitBarrierLocked()
		if d.memtablesOverlapLocked(files) {
			d.releaseCommitBarrierLocked(barrier)
			d.mu.Unlock()
			if attempt > 3 {
				return errors.New("ingest: memtables keep overlapping the files")
			}
			if err := d.Flush(); err != nil {
				return fmt.Errorf("ingest: flush overlapping memtable: %w", err)
			}
			continue
		}
		err := d.ingestLocked(files)
		d.maybeScheduleCompactionLocked()
		d.releaseCommitBarrierLocked(barrier)
		d.mu.Unlock()
		return err
	}
}

func (d *DB) loadIngestFile(path string) (*ingestFile, error) {
	f, err := d.fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ingest %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("ingest %s: %w", path, err)
	}
	r, err := sstable.NewReader(f, fi.Size(), sstable.ReaderOptions{FileName: path})
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("ingest %s: %w", path, err)
	}
	in := &ingestFile{path: path, reader: r, file: f, size: uint64(fi.Size())}
	fail := func(err error) (*ingestFile, error) {
		_ = f.Close()
		return nil, fmt.Errorf("ingest %s: %w", path, err)
	}
	if p := r.Properties(); p.LargestSeq != 0 {
		return fail(errors.New("file has non-zero sequence numbers: only files from SSTWriter can be ingested"))
	}
	it, err := r.NewIter(nil, nil)
	if err != nil {
		return fail(err)
	}
	var has bool
	if it.First() {
		in.smallest, has = it.Key().Clone(), true
		if it.Last() {
			in.largest = it.Key().Clone()
		}
	}
	if err := it.Close(); err != nil {
		return fail(err)
	}
	rds, err := r.RangeDels()
	if err != nil {
		return fail(err)
	}
	for _, rd := range rds {
		s := base.MakeInternalKey(rd.Start, 0, base.KindRangeDelete)
		e := base.MakeRangeDeleteSentinel(rd.End)
		if !has || base.CompareInternal(s, in.smallest) < 0 {
			in.smallest = s.Clone()
		}
		if !has || base.CompareInternal(e, in.largest) > 0 {
			in.largest = e.Clone()
		}
		has = true
	}
	if !has {
		return fail(errors.New("file is empty"))
	}
	return in, nil
}

// overlapsUser reports whether [a1, a2] and the file bounds [b1, b2]
// (internal keys, b2 possibly an exclusive sentinel) share a user key.
func boundsOverlap(aSmall, aLarge, bSmall, bLarge base.InternalKey) bool {
	endsBefore := func(large, small base.InternalKey) bool {
		c := compareUser(large.UserKey, small.UserKey)
		return c < 0 || (c == 0 && large.IsExclusiveSentinel())
	}
	return !endsBefore(aLarge, bSmall) && !endsBefore(bLarge, aSmall)
}

// memtablesOverlapLocked reports whether any memtable holds a point key or
// range tombstone within a file's bounds.
func (d *DB) memtablesOverlapLocked(files []*ingestFile) bool {
	mems := append([]*memTable{d.mem}, d.imm...)
	for _, m := range mems {
		for _, f := range files {
			it := m.points.NewIter(nil, nil)
			if it.SeekGE(f.smallest.UserKey) && !endsAfterFile(it.Key().UserKey, f) {
				_ = it.Close()
				return true
			}
			_ = it.Close()
			for _, t := range m.tombstones() {
				ts := base.MakeInternalKey(t.Start, t.Seq, base.KindRangeDelete)
				if boundsOverlap(ts, base.MakeRangeDeleteSentinel(t.End), f.smallest, f.largest) {
					return true
				}
			}
		}
	}
	return false
}

// endsAfterFile reports whether user key k lies after f's upper bound.
func endsAfterFile(k []byte, f *ingestFile) bool {
	c := compareUser(k, f.largest.UserKey)
	return c > 0 || (c == 0 && f.largest.IsExclusiveSentinel())
}

// ingestLocked places files into the LSM. Called with d.mu and the commit
// barrier held; it releases d.mu around I/O.
func (d *DB) ingestLocked(files []*ingestFile) error {
	// While the files are placed, no compaction may start (it would not see
	// them and could write overlapping files into their level) and no
	// snapshot may be taken (whether the files need a sequence number was
	// decided from the snapshots open now).
	d.ingesting++
	defer func() {
		d.ingesting--
		d.cond.Broadcast()
	}()
	seq := d.logSeq + 1
	// Reads at older sequence numbers (snapshots, or GetAt within the
	// history horizon) must not see the files.
	needSeq := d.snapshots.l.Len() > 0 || d.opts.HistoryHorizon
	levels := make([]int, len(files))
	for i, f := range files {
		level := -1
		for l := 0; l < manifest.NumLevels; l++ {
			if d.levelBusyLocked(l, f) {
				break
			}
			level = l
		}
		if level < manifest.NumLevels-1 {
			// Something below overlaps: the file must be newer than it.
			needSeq = true
		}
		levels[i] = max(level, 0)
	}
	nums := make([]manifest.FileNum, len(files))
	for i := range files {
		nums[i] = d.allocFileNumLocked()
	}
	d.mu.Unlock()
	ve := &manifest.VersionEdit{}
	var err error
	var ingested uint64
	for i, f := range files {
		var meta *manifest.FileMetadata
		if needSeq {
			meta, err = d.rewriteIngested(f, nums[i], seq)
		} else {
			meta, err = d.linkIngested(f, nums[i])
		}
		if err != nil {
			break
		}
		ingested += meta.Size
		ve.NewFiles = append(ve.NewFiles, manifest.NewFileEntry{Level: levels[i], Meta: meta})
	}
	if err == nil {
		err = vfs.SyncDir(d.fs, d.dirname)
	}
	if err == nil {
		d.mu.Lock()
		if needSeq {
			d.logSeq = seq // logAndApply records it as LastSeqNum
		}
		d.mu.Unlock()
		err = d.logAndApply(ve, nil)
	}
	d.mu.Lock()
	for _, n := range nums {
		delete(d.pendingOut, n)
	}
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	if needSeq {
		d.visibleSeq.Store(uint64(seq))
		d.historyWokenLocked()
	}
	d.metrics.ingestedBytes += ingested
	return nil
}

// levelBusyLocked reports whether level l holds files or a running
// compaction overlapping f.
func (d *DB) levelBusyLocked(l int, f *ingestFile) bool {
	for _, m := range d.vers.Levels[l] {
		if boundsOverlap(m.Smallest, m.Largest, f.smallest, f.largest) {
			return true
		}
	}
	for _, c := range d.compactions {
		if (c.StartLevel == l || c.OutputLevel == l) && boundsOverlap(c.Smallest, c.Largest, f.smallest, f.largest) {
			return true
		}
	}
	return false
}

// linkIngested hard-links (or copies) the file into the DB unchanged.
func (d *DB) linkIngested(f *ingestFile, num manifest.FileNum) (*manifest.FileMetadata, error) {
	dst := d.tablePath(num)
	if err := d.fs.Link(f.path, dst); err != nil {
		if err := copyFile(d.fs, f.path, dst, -1); err != nil {
			return nil, err
		}
	}
	return &manifest.FileMetadata{
		FileNum: num, Size: f.size, Smallest: f.smallest, Largest: f.largest,
		CreationTime: f.reader.Properties().CreationTime,
	}, nil
}

// rewriteIngested copies the file's entries into a new SST with every
// sequence number set to seq.
func (d *DB) rewriteIngested(f *ingestFile, num manifest.FileNum, seq SeqNum) (*manifest.FileMetadata, error) {
	out, err := d.fs.Create(d.tablePath(num))
	if err != nil {
		return nil, err
	}
	w := sstable.NewWriter(out, d.writerOptions(manifest.NumLevels-1))
	it, err := f.reader.NewIter(nil, nil)
	if err != nil {
		return nil, err
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if err = w.Add(base.MakeInternalKey(k.UserKey, seq, k.Kind()), it.Value()); err != nil {
			break
		}
	}
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var rds []sstable.RangeDel
		if rds, err = f.reader.RangeDels(); err == nil {
			for _, rd := range rds {
				if err = w.AddRangeDel(rd.Start, rd.End, seq); err != nil {
					break
				}
			}
		}
	}
	if err != nil {
		_, _ = w.Finish()
		return nil, fmt.Errorf("rewrite %s: %w", f.path, err)
	}
	md, err := w.Finish()
	if err != nil {
		return nil, fmt.Errorf("rewrite %s: %w", f.path, err)
	}
	sm := f.smallest.Clone()
	lg := f.largest.Clone()
	if !sm.IsExclusiveSentinel() {
		sm.Trailer = base.MakeTrailer(seq, sm.Kind())
	}
	if !lg.IsExclusiveSentinel() {
		lg.Trailer = base.MakeTrailer(seq, lg.Kind())
	}
	return &manifest.FileMetadata{
		FileNum: num, Size: md.Size, Smallest: sm, Largest: lg,
		SmallestSeq: seq, LargestSeq: seq, CreationTime: md.Properties.CreationTime,
	}, nil
}
