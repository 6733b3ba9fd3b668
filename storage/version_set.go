package storage

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

// maxManifestSize is the size past which the MANIFEST is rewritten as a
// fresh snapshot of the current version.
var maxManifestSize int64 = 64 << 20 // a var so crash tests can force frequent rotations

// readState is what a reader needs for a consistent view: the memtables
// (newest first) and the version. Readers hold a reference while reading.
type readState struct {
	db   *DB
	refs atomic.Int32
	mems []*memTable // newest first
	vers *manifest.Version
}

func (rs *readState) unref() {
	if rs.refs.Add(-1) == 0 {
		d := rs.db
		d.mu.Lock()
		d.unrefVersionLocked(rs.vers)
		d.mu.Unlock()
		rs.unrefMems()
	}
}

// unrefMems drops the read state's references to its memtables (once, when
// the read state itself is released).
func (rs *readState) unrefMems() {
	for _, m := range rs.mems {
		m.unref()
	}
}

// loadReadState returns a referenced read state.
func (d *DB) loadReadState() *readState {
	d.rsMu.RLock()
	rs := d.readState
	if rs != nil {
		rs.refs.Add(1)
	}
	d.rsMu.RUnlock()
	return rs
}

// updateReadStateLocked publishes the current memtables and version.
func (d *DB) updateReadStateLocked() {
	rs := &readState{db: d, vers: d.vers}
	rs.refs.Store(1)
	d.liveVersions[d.vers]++
	rs.mems = make([]*memTable, 0, len(d.imm)+1)
	if d.mem != nil {
		rs.mems = append(rs.mems, d.mem)
	}
	for i := len(d.imm) - 1; i >= 0; i-- {
		rs.mems = append(rs.mems, d.imm[i])
	}
	for _, m := range rs.mems {
		m.refs.Add(1)
	}
	d.rsMu.Lock()
	old := d.readState
	d.readState = rs
	d.rsMu.Unlock()
	if old != nil {
		// Drop the DB's own reference without taking mu again.
		if old.refs.Add(-1) == 0 {
			d.unrefVersionLocked(old.vers)
			old.unrefMems()
		}
	}
}

// unrefVersionLocked drops a reference to v; once no reader, iterator or
// compaction uses it, its obsolete files may be deleted.
func (d *DB) unrefVersionLocked(v *manifest.Version) {
	n := d.liveVersions[v] - 1
	if n > 0 {
		d.liveVersions[v] = n
		return
	}
	delete(d.liveVersions, v)
	if v != d.vers && !d.closed {
		d.deleteObsoleteFilesLocked()
	}
}

// refVersionLocked adds a reference to the current version and returns it.
func (d *DB) refVersionLocked() *manifest.Version {
	d.liveVersions[d.vers]++
	return d.vers
}

// applyEdit returns the version that results from applying ve to v.
func applyEdit(v *manifest.Version, ve *manifest.VersionEdit) (*manifest.Version, error) {
	var bve manifest.BulkVersionEdit
	if err := bve.Accumulate(ve); err != nil {
		return nil, err
	}
	return bve.Apply(v)
}

// logAndApply records ve in the MANIFEST (synced) and installs the resulting
// version. The caller must not hold d.mu. On a MANIFEST write failure the DB
// enters the background-error state: the edit's files are not installed.
//
// onInstall, if not nil, runs under d.mu just before the new version is
// published, so that changes it makes (a flush dropping the memtables it
// wrote) reach readers in the same read state as the version. Publishing them
// separately would let a reader see the same entries twice, which double
// counts merge operands.
func (d *DB) logAndApply(ve *manifest.VersionEdit, onInstall func()) error {
	d.manifestMu.Lock()
	defer d.manifestMu.Unlock()

	d.mu.Lock()
	if d.bgErr != nil {
		err := d.bgErr
		d.mu.Unlock()
		return err
	}
	ve.NextFileNum = d.nextFileNum
	ve.LastSeqNum = d.logSeq
	// Every edit records the horizon: the files it adds may lack what
	// only reads below it saw, and a reopen must not go back below it.
	ve.HistoryHorizon = d.HistoryHorizon()
	if ve.MinUnflushedLogNum == 0 {
		ve.MinUnflushedLogNum = d.minUnflushed
	}
	cur := d.vers
	rotate := d.manifestSize == 0 || d.manifestSize > maxManifestSize
	if d.opts.HistoryHorizon && (d.reclaimsDirty || rotate) {
		// A new MANIFEST starts from this edit's summary fields.
		ve.Reclaims, ve.ReclaimsSet = d.reclaimRecordsLocked(), true
		d.reclaimsDirty = false
	}
	var newManifestNum manifest.FileNum
	if rotate {
		newManifestNum = d.nextFileNum
		d.nextFileNum++
		ve.NextFileNum = d.nextFileNum
	}
	d.mu.Unlock()

	nv, err := applyEdit(cur, ve)
	if err != nil {
		d.mu.Lock()
		d.setBackgroundErrorLocked(fmt.Errorf("apply version edit: %w", err))
		d.mu.Unlock()
		return err
	}
	if rotate {
		err = d.writeManifestFile(newManifestNum, nv, ve)
	} else {
		err = d.appendManifest(ve)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.setBackgroundErrorLocked(err)
		return err
	}
	if ve.MinUnflushedLogNum > d.minUnflushed {
		d.minUnflushed = ve.MinUnflushedLogNum
	}
	if onInstall != nil {
		onInstall()
	}
	d.installVersionLocked(nv)
	return nil
}

// appendManifest appends one synced edit to the current MANIFEST, which it
// opens for the purpose and closes again. Caller holds manifestMu.
func (d *DB) appendManifest(ve *manifest.VersionEdit) error {
	if len(ve.NewFiles) > 0 {
		// The new files' directory entries must be durable before the
		// edit naming them is, or a crash could leave the MANIFEST
		// pointing at files that are gone.
		if err := vfs.SyncDir(d.fs, d.dirname); err != nil {
			return fmt.Errorf("write manifest %s: %w", d.manifestNum, err)
		}
	}
	path := d.fs.Join(d.dirname, manifest.MakeFilename(manifest.FileTypeManifest, d.manifestNum))
	f, err := d.fs.OpenAppend(path)
	if err != nil {
		return fmt.Errorf("write manifest %s: %w", d.manifestNum, err)
	}
	w := wal.NewWriterAt(f, d.manifestSize)
	if err = writeEdit(w, ve); err == nil {
		err = w.Flush()
	}
	if err == nil {
		if err = f.Sync(); err != nil {
			err = fmt.Errorf("sync: %w", err)
		}
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("write manifest %s: %w", d.manifestNum, err)
	}
	d.manifestSize = w.Size()
	return nil
}

// writeManifestFile writes a new MANIFEST holding a snapshot of v (with the
// summary fields of ve), switches CURRENT to it atomically and makes it the
// one later edits append to. Caller holds manifestMu.
func (d *DB) writeManifestFile(num manifest.FileNum, v *manifest.Version, ve *manifest.VersionEdit) error {
	snap := &manifest.VersionEdit{
		ComparatorName:     comparatorName,
		MinUnflushedLogNum: ve.MinUnflushedLogNum,
		NextFileNum:        ve.NextFileNum,
		LastSeqNum:         ve.LastSeqNum,
		HistoryHorizon:     ve.HistoryHorizon,
		Reclaims:           ve.Reclaims,
		ReclaimsSet:        ve.ReclaimsSet,
	}
	for level := range v.Levels {
		for _, f := range v.Levels[level] {
			snap.NewFiles = append(snap.NewFiles, manifest.NewFileEntry{Level: level, Meta: f})
		}
	}
	name := manifest.MakeFilename(manifest.FileTypeManifest, num)
	path := d.fs.Join(d.dirname, name)
	f, err := d.fs.Create(path)
	if err != nil {
		return fmt.Errorf("create manifest %s: %w", name, err)
	}
	w := wal.NewWriter(f)
	if err = writeEdit(w, snap); err == nil {
		if err = w.Flush(); err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = vfs.SyncDir(d.fs, d.dirname)
	}
	if err == nil {
		err = manifest.SetCurrentFile(d.fs, d.dirname, num)
	}
	if err != nil {
		return fmt.Errorf("write manifest %s: %w", name, err)
	}
	d.mu.Lock()
	d.manifestNum, d.manifestSize = num, w.Size()
	d.mu.Unlock()
	return nil
}

// writeNewManifestLocked is writeManifestFile for recovery, which holds d.mu
// and runs before any other goroutine uses the DB.
func (d *DB) writeNewManifestLocked(v *manifest.Version, ve *manifest.VersionEdit) error {
	num := d.nextFileNum
	d.nextFileNum++
	ve.NextFileNum = d.nextFileNum
	ve.LastSeqNum = d.logSeq
	ve.HistoryHorizon = d.HistoryHorizon()
	if d.opts.HistoryHorizon {
		ve.Reclaims, ve.ReclaimsSet = d.reclaimRecordsLocked(), true
		d.reclaimsDirty = false
	}
	d.mu.Unlock()
	err := d.writeManifestFile(num, v, ve)
	d.mu.Lock()
	return err
}

// installVersionLocked makes v current and republishes the read state.
func (d *DB) installVersionLocked(v *manifest.Version) {
	old := d.vers
	d.vers = v
	d.liveVersions[v]++
	d.updateReadStateLocked()
	if old != nil {
		d.unrefVersionLocked(old)
	}
	d.updatePacingLocked()
	d.armAtRestLocked()
}

// allocFileNumLocked reserves a file number for an output file, protecting
// it from obsolete-file deletion until released.
func (d *DB) allocFileNumLocked() manifest.FileNum {
	n := d.nextFileNum
	d.nextFileNum++
	d.pendingOut[n] = struct{}{}
	return n
}

// deleteObsoleteFilesLocked removes SSTs no live version uses, MANIFESTs
// other than the current one, and moves fully flushed WALs to the archive
// (or deletes them when archiving is off). Nothing is removed while file
// deletions are disabled, nor after a background error: a failed MANIFEST
// write or sync may still have reached the disk, naming outputs that no
// version in memory holds, so until the next Open decides from the files
// what is live, no file is obsolete.
func (d *DB) deleteObsoleteFilesLocked() {
	d.deleteObsoleteFiles(false)
}

// deleteObsoleteFiles is deleteObsoleteFilesLocked; atOpen also removes
// leftover temporary files, which at any other time may belong to a
// MANIFEST switch in progress. Called with d.mu held.
func (d *DB) deleteObsoleteFiles(atOpen bool) {
	if d.noDeletions > 0 || d.readOnly || d.bgErr != nil {
		return
	}
	live := make(map[manifest.FileNum]struct{})
	for v := range d.liveVersions {
		for level := range v.Levels {
			for _, f := range v.Levels[level] {
				live[f.FileNum] = struct{}{}
			}
		}
	}
	for level := range d.vers.Levels {
		for _, f := range d.vers.Levels[level] {
			live[f.FileNum] = struct{}{}
		}
	}
	names, err := d.fs.List(d.dirname)
	if err != nil {
		d.log.Warn("list for obsolete files", "err", err)
		return
	}
	var archived, walGone bool
	for _, name := range names {
		ft, num, ok := manifest.ParseFilename(name)
		if !ok {
			continue
		}
		if _, pending := d.pendingOut[num]; pending {
			continue
		}
		path := d.fs.Join(d.dirname, name)
		switch ft {
		case manifest.FileTypeTable:
			if _, ok := live[num]; ok {
				continue
			}
			d.shared.tables.evict(tableKey{d.cacheID, num})
			d.shared.BlockCache.EvictFile(d.cacheID, uint64(num))
			d.tombstones.m.Delete(num)
		case manifest.FileTypeLog:
			if num >= d.minUnflushed || num == d.logNum {
				continue
			}
			if d.opts.WALArchiveMaxBytes > 0 {
				if err := d.archiveWAL(name); err != nil {
					d.log.Warn("archive wal", "wal", name, "err", err)
				} else {
					archived = true
				}
				continue
			}
			walGone = true
		case manifest.FileTypeManifest:
			if num >= d.manifestNum {
				continue
			}
		case manifest.FileTypeTemp:
			if !atOpen {
				continue
			}
		case manifest.FileTypeOptions:
			if num >= d.optionsNum {
				continue
			}
		default:
			continue
		}
		if err := d.fs.Remove(path); err != nil {
			d.log.Warn("remove obsolete file", "file", name, "err", err)
		}
	}
	if archived {
		d.pruneArchiveLocked()
	}
	if archived || walGone {
		d.refreshHorizonLocked()
	}
}

// archiveWAL moves an obsolete WAL into the archive directory and syncs that
// directory at once, so that the file's new name is durable before the next
// flush's sync of the data directory makes its removal from there durable:
// otherwise a crash could keep neither name, and the change feed would lose the WAL's batches
// (TestCrashKeepsArchivedWAL). A crash before the sync leaves the WAL in the
// data directory, where the next open archives it again.
func (d *DB) archiveWAL(name string) error {
	dir := d.fs.Join(d.dirname, archiveDirName)
	if err := mkdirAllDurable(d.fs, dir); err != nil {
		return err
	}
	if err := d.fs.Rename(d.fs.Join(d.dirname, name), d.fs.Join(dir, name)); err != nil {
		return err
	}
	if err := vfs.SyncDir(d.fs, dir); err != nil {
		return fmt.Errorf("sync %s after archiving %s: %w", dir, name, err)
	}
	return nil
}

// pruneArchiveLocked removes archived WALs beyond the size or age limits,
// oldest first.
func (d *DB) pruneArchiveLocked() {
	dir := d.fs.Join(d.dirname, archiveDirName)
	names, err := d.fs.List(dir)
	if err != nil {
		return
	}
	type arch struct {
		name string
		size int64
		mod  time.Time
	}
	var files []arch
	var total int64
	for _, n := range names {
		if ft, _, ok := manifest.ParseFilename(n); !ok || ft != manifest.FileTypeLog {
			continue
		}
		fi, err := d.fs.Stat(d.fs.Join(dir, n))
		if err != nil {
			continue
		}
		files = append(files, arch{n, fi.Size(), fi.ModTime()})
		total += fi.Size()
	}
	now := time.Now()
	for _, f := range files { // names sort by file number: oldest first
		if total <= d.opts.WALArchiveMaxBytes && now.Sub(f.mod) <= d.opts.WALArchiveTTL {
			break
		}
		if err := d.fs.Remove(d.fs.Join(dir, f.name)); err == nil {
			total -= f.size
		}
	}
}
