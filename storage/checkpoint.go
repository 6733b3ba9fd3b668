package storage

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

// CheckpointInfo describes a finished checkpoint.
type CheckpointInfo struct {
	// SeqNum is the last sequence number the checkpoint contains: opening
	// it gives exactly the writes at or below SeqNum, and
	// UpdatesSince(SeqNum+1) on the source replays everything after.
	SeqNum SeqNum
	// Files are the names of the files written into the checkpoint.
	Files []string
	// Lengths is set only by CheckpointToSend: for each WAL file hard-linked
	// into the checkpoint, the number of its first bytes that belong to it
	// (the file may be longer, and the live WAL grows on). Those bytes
	// never change.
	Lengths map[string]int64
}

// Checkpoint writes an openable copy of the DB into destDir, which must not
// exist. SSTs are hard-linked when the filesystem allows (copied otherwise);
// the WAL files still needed are copied up to the checkpoint's cut; a new
// MANIFEST describes exactly the live files. Writes continue during the
// checkpoint except for a brief pause while the cut is taken.
func (d *DB) Checkpoint(destDir string) (*CheckpointInfo, error) {
	info, _, err := d.checkpoint(destDir, false, false)
	return info, err
}

// CheckpointAndSnapshot is Checkpoint that also returns a Snapshot of this
// DB at the checkpoint's SeqNum: it reads exactly what the checkpoint
// holds, without opening the copy. The caller closes the snapshot.
func (d *DB) CheckpointAndSnapshot(destDir string) (*CheckpointInfo, *Snapshot, error) {
	return d.checkpoint(destDir, true, false)
}

// CheckpointToSend is CheckpointAndSnapshot for a checkpoint that is read
// and sent elsewhere, never opened where it is: the WAL files are
// hard-linked like the SSTs (copied where the filesystem cannot link), and
// CheckpointInfo.Lengths says how many of each linked WAL's first bytes are
// the checkpoint's. Whoever reads the directory must read no more than
// that; the bytes read are then exactly Checkpoint's copy. A WAL file is
// never rewritten (the engine always makes a new one), so the linked bytes
// stay as they were while the directory exists. This saves copying and
// syncing the live WAL, most of a small shard's data.
func (d *DB) CheckpointToSend(destDir string) (*CheckpointInfo, *Snapshot, error) {
	return d.checkpoint(destDir, true, true)
}

func (d *DB) checkpoint(destDir string, withSnapshot, linkWALs bool) (_ *CheckpointInfo, snapshot *Snapshot, _ error) {
	if _, err := d.fs.Stat(destDir); err == nil {
		return nil, nil, fmt.Errorf("checkpoint %s: destination already exists", destDir)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("checkpoint %s: %w", destDir, err)
	}

	// Take the cut between commit groups: every batch at or below seq is in
	// the WAL files below, at the recorded sizes.
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, nil, ErrClosed
	}
	barrier := d.acquireCommitBarrierLocked()
	// Writes made with DisableWAL live only in memtables: flush them, under
	// the barrier so no new ones commit meanwhile, so that the checkpoint
	// holds every write at or below its sequence number.
	if err := d.flushUnloggedLocked(); err != nil {
		d.releaseCommitBarrierLocked(barrier)
		d.mu.Unlock()
		return nil, nil, fmt.Errorf("checkpoint %s: flush unlogged writes: %w", destDir, err)
	}
	type walCut struct {
		num  manifest.FileNum
		size int64
	}
	var wals []walCut
	var cutErr error
	cutErr = d.flushWAL()
	seq := d.logSeq
	if withSnapshot && cutErr == nil {
		// Under the barrier every batch at or below seq is visible, and
		// no ingestion is placing files (it holds the barrier too).
		if vis := SeqNum(d.visibleSeq.Load()); vis != seq {
			cutErr = fmt.Errorf("visible sequence number %d is not the logged %d under the commit barrier", vis, seq)
		} else {
			snapshot = &Snapshot{db: d, seq: seq}
			snapshot.elem = d.snapshots.l.PushBack(snapshot)
		}
	}
	v := d.refVersionLocked()
	minUnflushed := d.minUnflushed
	nextFileNum := d.nextFileNum
	d.noDeletions++
	if cutErr == nil {
		var names []string
		names, cutErr = d.fs.List(d.dirname)
		for _, name := range names {
			ft, num, ok := manifest.ParseFilename(name)
			if !ok || ft != manifest.FileTypeLog || num < minUnflushed {
				continue
			}
			if num == d.logNum && d.logBuf != nil {
				// The live WAL may be preallocated past its data: cut at
				// what was written (flushed above, under the barrier).
				wals = append(wals, walCut{num, d.logBuf.writtenBytes()})
				continue
			}
			fi, err := d.fs.Stat(d.fs.Join(d.dirname, name))
			if err != nil {
				cutErr = err
				break
			}
			wals = append(wals, walCut{num, fi.Size()})
		}
	}
	d.releaseCommitBarrierLocked(barrier)
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.noDeletions--
		d.unrefVersionLocked(v)
		d.deleteObsoleteFilesLocked()
		d.mu.Unlock()
	}()
	fail := func(err error) (*CheckpointInfo, *Snapshot, error) {
		_ = d.fs.RemoveAll(destDir)
		if snapshot != nil {
			_ = snapshot.Close()
		}
		return nil, nil, fmt.Errorf("checkpoint %s: %w", destDir, err)
	}
	if cutErr != nil {
		return fail(cutErr)
	}

	info := &CheckpointInfo{SeqNum: seq}
	if err := mkdirAllDurable(d.fs, destDir); err != nil {
		return fail(err)
	}
	for level := range v.Levels {
		for _, f := range v.Levels[level] {
			name := manifest.MakeFilename(manifest.FileTypeTable, f.FileNum)
			src, dst := d.fs.Join(d.dirname, name), d.fs.Join(destDir, name)
			if err := d.fs.Link(src, dst); err != nil {
				if err := copyFile(d.fs, src, dst, -1); err != nil {
					return fail(err)
				}
			}
			info.Files = append(info.Files, name)
		}
	}
	for _, w := range wals {
		name := manifest.MakeFilename(manifest.FileTypeLog, w.num)
		src, dst := d.fs.Join(d.dirname, name), d.fs.Join(destDir, name)
		if linkWALs && d.fs.Link(src, dst) == nil {
			if info.Lengths == nil {
				info.Lengths = map[string]int64{}
			}
			info.Lengths[name] = w.size
		} else if err := copyFile(d.fs, src, dst, w.size); err != nil {
			return fail(err)
		}
		info.Files = append(info.Files, name)
	}
	// The MANIFEST: a snapshot of the version at the cut.
	manifestNum := nextFileNum
	snap := &manifest.VersionEdit{
		ComparatorName:     comparatorName,
		MinUnflushedLogNum: minUnflushed,
		NextFileNum:        manifestNum + 1,
		LastSeqNum:         seq,
	}
	for level := range v.Levels {
		for _, f := range v.Levels[level] {
			snap.NewFiles = append(snap.NewFiles, manifest.NewFileEntry{Level: level, Meta: f})
		}
	}
	mname := manifest.MakeFilename(manifest.FileTypeManifest, manifestNum)
	mf, err := d.fs.Create(d.fs.Join(destDir, mname))
	if err != nil {
		return fail(err)
	}
	mw := wal.NewWriter(mf)
	if err = writeEdit(mw, snap); err == nil {
		if err = mw.Flush(); err == nil {
			err = mf.Sync()
		}
	}
	if cerr := mf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	info.Files = append(info.Files, mname)
	if err := vfs.SyncDir(d.fs, destDir); err != nil {
		return fail(err)
	}
	if err := manifest.SetCurrentFile(d.fs, destDir, manifestNum); err != nil {
		return fail(err)
	}
	info.Files = append(info.Files, "CURRENT")
	return info, snapshot, nil
}

// flushUnloggedLocked flushes every memtable holding DisableWAL writes and
// waits for it. The caller holds d.mu and the commit barrier.
func (d *DB) flushUnloggedLocked() error {
	if d.mem.unlogged.Load() {
		if err := d.rotateMemTableLocked(d.nextMemTableSizeLocked(), false); err != nil {
			d.setBackgroundErrorLocked(err)
			return err
		}
	}
	for {
		pending := false
		for _, m := range d.imm {
			pending = pending || m.unlogged.Load()
		}
		switch {
		case !pending:
			return nil
		case d.bgErr != nil:
			return d.bgErr
		case d.closed:
			return ErrClosed
		}
		d.maybeScheduleFlushLocked()
		d.cond.Wait()
	}
}

// copyFile copies the first n bytes of src (all when n < 0) to a new synced
// file dst.
func copyFile(fs vfs.FS, src, dst string, n int64) error {
	in, err := fs.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := fs.Create(dst)
	if err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	var r io.Reader = in
	if n >= 0 {
		r = io.LimitReader(in, n)
	}
	if _, err = io.Copy(out, r); err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// DisableFileDeletions stops the DB from deleting or archiving obsolete
// files (SSTs, WALs, MANIFESTs) until a matching EnableFileDeletions, so that
// a backup can copy the files LiveFiles and WALFiles name. Calls nest.
func (d *DB) DisableFileDeletions() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.noDeletions++
	return nil
}

// EnableFileDeletions undoes one DisableFileDeletions; when the last one is
// undone, obsolete files are deleted.
func (d *DB) EnableFileDeletions() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.noDeletions == 0 {
		return errors.New("storage: EnableFileDeletions without DisableFileDeletions")
	}
	d.noDeletions--
	if d.noDeletions == 0 && !d.closed {
		d.deleteObsoleteFilesLocked()
	}
	return nil
}

// LiveFile describes one SST of the current version.
type LiveFile struct {
	Name                    string // file name within the DB directory
	FileNum                 uint64
	Level                   int
	Size                    uint64
	Smallest, Largest       []byte // user-key bounds (Largest may be exclusive, see LargestExclusive)
	LargestExclusive        bool   // Largest is a range tombstone's exclusive end
	SmallestSeq, LargestSeq SeqNum
}

// LiveFiles returns the SSTs of the current version, by level, and the name
// of the current MANIFEST. With file deletions disabled the files stay on
// disk until re-enabled.
func (d *DB) LiveFiles() (files []LiveFile, manifestName string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, "", ErrClosed
	}
	for level := range d.vers.Levels {
		for _, f := range d.vers.Levels[level] {
			files = append(files, LiveFile{
				Name:             manifest.MakeFilename(manifest.FileTypeTable, f.FileNum),
				FileNum:          uint64(f.FileNum),
				Level:            level,
				Size:             f.Size,
				Smallest:         append([]byte(nil), f.Smallest.UserKey...),
				Largest:          append([]byte(nil), f.Largest.UserKey...),
				LargestExclusive: f.Largest.IsExclusiveSentinel(),
				SmallestSeq:      f.SmallestSeq,
				LargestSeq:       f.LargestSeq,
			})
		}
	}
	return files, manifest.MakeFilename(manifest.FileTypeManifest, d.manifestNum), nil
}

// WALFile describes a WAL file, live or archived.
type WALFile struct {
	Name     string // file name
	Path     string // path (under the archive directory when archived)
	Num      uint64
	Size     int64
	Archived bool
}

// WALFiles returns the WAL files on disk, oldest first: archived ones (kept
// for UpdatesSince) and live ones (still needed for recovery).
func (d *DB) WALFiles() ([]WALFile, error) {
	out, err := d.listWALFiles()
	if err != nil {
		return nil, err
	}
	// The live WAL may be preallocated past its data: report what was
	// written to it.
	d.mu.Lock()
	if buf := d.logBuf; buf != nil {
		for i := range out {
			if !out[i].Archived && out[i].Num == uint64(d.logNum) {
				out[i].Size = min(out[i].Size, buf.writtenBytes())
			}
		}
	}
	d.mu.Unlock()
	return out, nil
}

// listWALFiles returns the WAL files on disk, oldest first, with their
// sizes on disk (the live one's may run past its data). It takes no lock.
func (d *DB) listWALFiles() ([]WALFile, error) {
	var out []WALFile
	// List the DB directory before the archive: WALs only ever move from
	// the former to the latter, so a WAL archived while we list is seen at
	// least once (listing the archive first could miss it entirely). One
	// seen in both places is kept once, as archived.
	for _, archived := range []bool{false, true} {
		dir := d.dirname
		if archived {
			dir = d.fs.Join(d.dirname, archiveDirName)
		}
		names, err := d.fs.List(dir)
		if err != nil {
			if archived && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("list wal files: %w", err)
		}
		for _, name := range names {
			ft, num, ok := manifest.ParseFilename(name)
			if !ok || ft != manifest.FileTypeLog {
				continue
			}
			path := d.fs.Join(dir, name)
			fi, err := d.fs.Stat(path)
			if err != nil {
				continue // archived or pruned meanwhile
			}
			out = append(out, WALFile{Name: name, Path: path, Num: uint64(num), Size: fi.Size(), Archived: archived})
		}
	}
	sortWALFiles(out)
	// Drop the live entry of a WAL also listed as archived.
	dedup := out[:0]
	for _, f := range out {
		if n := len(dedup); n > 0 && dedup[n-1].Num == f.Num {
			if f.Archived {
				dedup[n-1] = f
			}
			continue
		}
		dedup = append(dedup, f)
	}
	return dedup, nil
}
