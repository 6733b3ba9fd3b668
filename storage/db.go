// Package storage is Shale's LSM storage engine, built after RocksDB: a WAL
// with group commit, pipelined skiplist memtables, checksummed SST files,
// a MANIFEST of version edits, and leveled compaction with dynamic level
// sizing, paced writes and resources shared between many DB instances.
//
// A DB is safe for concurrent use by many goroutines. Writes are applied
// atomically in batches; reads see a consistent snapshot.
package storage

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/internal/compact"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

// ErrNotFound is returned by Get for a key with no value.
var ErrNotFound = errors.New("storage: not found")

// ErrClosed is returned by calls on a closed DB.
var ErrClosed = errors.New("storage: closed")

// ErrReadOnly is returned by writes to a DB opened with OpenReadOnly.
var ErrReadOnly = errors.New("storage: read-only")

// archiveDirName is the subdirectory holding obsolete WAL files kept for
// UpdatesSince.
const archiveDirName = "archive"

// DB is an open database.
type DB struct {
	dirname  string
	opts     *Options
	fs       vfs.FS
	shared   *Shared
	ownsShrd bool
	cacheID  uint64
	lock     io.Closer
	readOnly bool
	log      *slog.Logger
	picker   *compact.Picker
	wc       *writeController

	// visibleSeq is the highest sequence number readers may see: every
	// batch at or below it is fully applied.
	visibleSeq atomic.Uint64

	// walMu serialises I/O on the current WAL between the commit leader,
	// the background WAL flusher and rotation.
	walMu sync.Mutex
	// walFlushC wakes the background WAL flusher (capacity 1).
	walFlushC chan struct{}
	// walHeldC tells the flusher that a commit left bytes buffered under
	// WALFlushThreshold (capacity 1); it writes them out walHoldLimit
	// later if nothing else has.
	walHeldC chan struct{}
	// walHeldTold, under walMu, is set once a commit told the flusher of
	// held bytes and cleared when the flusher writes the buffer out
	// (flushWAL): until then the flusher's hold is armed or about to be,
	// and later held commits need not wake it again.
	walHeldTold bool
	// heldWakes counts the flusher's wake-ups by walHeldC, for tests.
	heldWakes atomic.Uint64
	// flusherDone is closed when the flusher exits.
	flusherDone chan struct{}
	// periodicTimer offers the compaction scheduler a chance every
	// periodicEvery, so that files come due for a periodic compaction
	// (Options.PeriodicCompaction) also on a DB nobody writes; nil when
	// there is none. A timer, not a goroutine: a process may host
	// thousands of DBs. Guarded by mu.
	periodicTimer *time.Timer
	periodicEvery time.Duration
	// atRestTimer, while atRestArmed, checks AtRestCompactionDelay after
	// it was armed whether the DB has had no write since (LastSeq still
	// atRestSeq); then atRestDue lets the scheduler merge L0 down
	// (Picker.PickAtRest) until L0 is within its at-rest bound or a flush
	// shows writes again. Armed when a version leaves L0 above that bound.
	// Guarded by mu.
	atRestTimer *time.Timer
	atRestArmed bool
	atRestDue   bool
	atRestSeq   SeqNum
	// opened is set once Open has recovered and written its OPTIONS file:
	// no at-rest timer is armed and no reclaim starts before (recovery may
	// raise the history horizon past recorded reclaims, and open's own
	// steps still run unguarded by mu), and a DB that failed to open
	// starts neither.
	opened bool

	// rsMu guards readState, the consistent set of memtables and version
	// that readers take a reference on.
	rsMu      sync.RWMutex
	readState *readState

	// horizon is the history horizon (Options.HistoryHorizon; 0 when off).
	// It only grows; it is stored under mu, and flushes and compactions
	// read it under mu when they start.
	horizon atomic.Uint64

	// manifestMu serialises version edits (held around MANIFEST I/O, never
	// while waiting for mu to be released by someone holding manifestMu).
	manifestMu sync.Mutex

	// mu guards everything below.
	mu   sync.Mutex
	cond *sync.Cond // broadcast when background work finishes or fails

	// commit pipeline
	writers []*commitWriter // queue; the head is the leader
	logSeq  SeqNum          // last sequence number assigned
	logNum  manifest.FileNum
	// logFile and logWriter are swapped under both mu and walMu; their I/O
	// happens under walMu alone (never take mu while holding walMu).
	logFile     vfs.File
	logBuf      *walBuffer // between logWriter and logFile
	logWriter   *wal.Writer
	walBytes    atomic.Uint64
	walSyncs    atomic.Uint64
	mem         *memTable
	imm         []*memTable // oldest first
	memRamp     uint64      // capacity of the next memtable (see nextMemTableSizeLocked)
	nextFileNum manifest.FileNum

	vers         *manifest.Version
	liveVersions map[*manifest.Version]int // version -> references
	manifestNum  manifest.FileNum
	// optionsNum is the number of the OPTIONS file recording this DB's
	// options (0 in read-only mode); older ones are obsolete.
	optionsNum manifest.FileNum
	// manifestSize is the length of the MANIFEST this DB wrote and appends
	// to, which is closed between edits (a node hosting thousands of
	// engines cannot spare a descriptor each); 0 until one is written.
	manifestSize int64
	minUnflushed manifest.FileNum
	pendingOut   map[manifest.FileNum]struct{}
	snapshots    snapshotList
	// walStart holds a lower bound of the first sequence number of each
	// WAL file this DB created (the next sequence number when it was
	// created) or replayed (its first batch's), for the history horizon
	// (HistoryHorizon only).
	walStart      map[manifest.FileNum]SeqNum
	flushing      bool
	compactions   []*compact.Compaction
	bgErr         error
	noDeletions   int // DisableFileDeletions depth
	closed        bool
	bgRunning     int // scheduled or running background jobs
	manualWaiters int
	ingesting     int // IngestSST calls placing files; compactions and snapshots wait

	// historySamples (oldest first, at most maxHistorySamples) and
	// historyTimer, which takes one every historySampleEvery while the DB
	// is written to and otherwise fires only when a sample passes the
	// window (historyTick), move the horizon by Options.HistoryWindow and
	// HistoryWindowBytes (sampleHistoryLocked); nil without a window.
	// historyWake is set while the timer waits for no write: the next
	// commit rearms it (historyWokenLocked).
	historySamples []historySample
	historyTimer   *time.Timer
	historyWake    bool
	// reclaims are the deleted spans to compact once the horizon passes
	// them (CompactAfterHorizon, range deletions); reclaimRunning is set
	// while runReclaims works through the due ones, reclaimsInRun. Both
	// are recorded in the MANIFEST (reclaimRecordsLocked), so a reopen
	// keeps them: reclaimsDirty is set when they changed since the last
	// edit that recorded them.
	reclaims       []manifest.Reclaim
	reclaimsInRun  []manifest.Reclaim
	reclaimRunning bool
	reclaimsDirty  bool

	// batchPool recycles the one-record batches of Set, Delete,
	// DeleteRange and Merge.
	batchPool sync.Pool

	metrics    dbMetrics
	tombstones tombstoneCache
}

// Open opens the database in dirname, creating it unless
// opts.ErrorIfNotExists. It recovers from the MANIFEST and replays the WAL,
// so every write acknowledged with Sync before a crash is present. Only one
// DB may have a directory open for writing at a time.
func Open(dirname string, opts *Options) (*DB, error) {
	return open(dirname, opts, false)
}

// OpenReadOnly opens an existing database for reading. It writes nothing to
// the directory: WAL contents are replayed into memory. Writes, flushes and
// compactions return ErrReadOnly.
func OpenReadOnly(dirname string, opts *Options) (*DB, error) {
	return open(dirname, opts, true)
}

func open(dirname string, o *Options, readOnly bool) (_ *DB, err error) {
	opts := o.ensureDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("open %s: invalid options: %w", dirname, err)
	}
	d := &DB{
		dirname:      dirname,
		opts:         opts,
		fs:           opts.FS,
		shared:       opts.Shared,
		readOnly:     readOnly,
		log:          opts.Logger.With("db", dirname),
		liveVersions: make(map[*manifest.Version]int),
		pendingOut:   make(map[manifest.FileNum]struct{}),
		walStart:     make(map[manifest.FileNum]SeqNum),
	}
	d.cond = sync.NewCond(&d.mu)
	d.snapshots.init()
	if d.shared == nil {
		d.shared = NewShared(nil)
		d.ownsShrd = true
	}
	d.cacheID = d.shared.BlockCache.NewID()
	d.picker = compact.NewPicker(d.compactOptions())
	d.wc = newWriteController(opts.MaxConcurrentCompactions)
	defer func() {
		if err != nil {
			d.abandon()
		}
	}()

	if !readOnly && opts.ErrorIfNotExists {
		// Check before creating anything, so a mistyped path leaves nothing.
		if _, err := d.fs.Stat(d.fs.Join(dirname, "CURRENT")); err != nil {
			return nil, fmt.Errorf("open %s: no database (CURRENT missing): %w", dirname, err)
		}
	}
	if !readOnly {
		if err := mkdirAllDurable(d.fs, dirname); err != nil {
			return nil, fmt.Errorf("open %s: create directory: %w", dirname, err)
		}
		var lock io.Closer
		if opts.SkipLockFile {
			lock, err = d.shared.lockDir(d.fs.Join(dirname))
		} else {
			lock, err = d.fs.Lock(d.fs.Join(dirname, "LOCK"))
		}
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dirname, err)
		}
		d.lock = lock
	}

	_, statErr := d.fs.Stat(d.fs.Join(dirname, "CURRENT"))
	exists := statErr == nil
	switch {
	case exists && opts.ErrorIfExists:
		return nil, fmt.Errorf("open %s: database already exists", dirname)
	case !exists && (opts.ErrorIfNotExists || readOnly):
		return nil, fmt.Errorf("open %s: no database (CURRENT missing): %w", dirname, statErr)
	case !exists:
		if err := d.createNew(); err != nil {
			return nil, fmt.Errorf("open %s: create: %w", dirname, err)
		}
	}
	optNum, optText, hasOpt, err := d.checkStoredOptions()
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dirname, err)
	}
	if err := d.recover(); err != nil {
		return nil, fmt.Errorf("open %s: %w", dirname, err)
	}
	if !readOnly {
		if err := d.writeOptionsFile(optNum, optText, hasOpt); err != nil {
			return nil, fmt.Errorf("open %s: %w", dirname, err)
		}
	}
	if !readOnly {
		d.walFlushC = make(chan struct{}, 1)
		d.walHeldC = make(chan struct{}, 1)
		d.flusherDone = make(chan struct{})
		go d.walFlusher()
		if opts.PeriodicCompaction > 0 {
			d.mu.Lock()
			d.periodicEvery = min(max(opts.PeriodicCompaction/16, time.Second), 10*time.Minute)
			d.periodicTimer = time.AfterFunc(d.periodicEvery, d.periodicCheck)
			d.mu.Unlock()
		}
		if d.historyWindowOn() {
			d.mu.Lock()
			d.startHistoryTimerLocked()
			d.mu.Unlock()
		}
	}
	d.mu.Lock()
	d.updateReadStateLocked()
	if !readOnly {
		d.deleteObsoleteFiles(true)
		d.maybeScheduleFlushLocked()
		d.maybeScheduleCompactionLocked()
		d.opened = true
		d.armAtRestLocked()
		d.maybeStartReclaimsLocked() // those the MANIFEST and the WALs recorded
	}
	d.updatePacingLocked()
	d.mu.Unlock()
	return d, nil
}

// abandon releases what a failed open acquired.
func (d *DB) abandon() {
	d.mu.Lock()
	d.closed = true
	for d.bgRunning > 0 {
		d.cond.Wait()
	}
	d.mu.Unlock()
	if d.logFile != nil {
		_ = d.logFile.Close()
	}
	d.shared.tables.evictDB(d.cacheID)
	if d.lock != nil {
		_ = d.lock.Close()
	}
	if d.ownsShrd {
		_ = d.shared.Close()
	}
}

// createNew writes the first MANIFEST and CURRENT of an empty database.
func (d *DB) createNew() error {
	const manifestNum = 1
	ve := &manifest.VersionEdit{
		ComparatorName: comparatorName,
		NextFileNum:    manifestNum + 1,
	}
	path := d.fs.Join(d.dirname, manifest.MakeFilename(manifest.FileTypeManifest, manifestNum))
	f, err := d.fs.Create(path)
	if err != nil {
		return err
	}
	w := wal.NewWriter(f)
	err = writeEdit(w, ve)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := vfs.SyncDir(d.fs, d.dirname); err != nil {
		return err
	}
	return manifest.SetCurrentFile(d.fs, d.dirname, manifestNum)
}

// comparatorName is recorded in every MANIFEST and SST.
const comparatorName = "shale.bytewise"

func writeEdit(w *wal.Writer, ve *manifest.VersionEdit) error {
	var buf bytesBuffer
	if err := ve.Encode(&buf); err != nil {
		return err
	}
	_, err := w.WriteRecord(buf.b)
	return err
}

// bytesBuffer is a minimal io.Writer into a slice.
type bytesBuffer struct{ b []byte }

func (b *bytesBuffer) Write(p []byte) (int, error) { b.b = append(b.b, p...); return len(p), nil }

// mkdirAllDurable is MkdirAll that also syncs the parent of every directory
// it creates: a new directory's entry survives a crash only once its parent
// is synced, and without it a crash could lose the whole new database.
func mkdirAllDurable(fs vfs.FS, dir string) error {
	var created []string
	for p := filepath.Clean(dir); ; {
		if _, err := fs.Stat(p); !errors.Is(err, os.ErrNotExist) {
			break
		}
		created = append(created, p)
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := len(created) - 1; i >= 0; i-- {
		if err := vfs.SyncDir(fs, filepath.Dir(created[i])); err != nil {
			return err
		}
	}
	return nil
}

// recover loads the MANIFEST named by CURRENT, replays the WAL files it does
// not cover, and (unless read-only) flushes what it replayed and starts a
// fresh WAL and MANIFEST.
func (d *DB) recover() error {
	t0 := time.Now()
	manifestNum, err := manifest.ReadCurrentFile(d.fs, d.dirname)
	if err != nil {
		return err
	}
	mpath := d.fs.Join(d.dirname, manifest.MakeFilename(manifest.FileTypeManifest, manifestNum))
	v, summary, err := manifest.ReplayManifest(d.fs, mpath)
	if err != nil {
		return err
	}
	if summary.ComparatorName != "" && summary.ComparatorName != comparatorName {
		return fmt.Errorf("database uses comparator %q, this engine has %q", summary.ComparatorName, comparatorName)
	}
	d.mu.Lock()
	d.vers = v
	d.liveVersions[v]++
	d.nextFileNum = max(summary.NextFileNum, manifestNum+1)
	d.logSeq = summary.LastSeqNum
	d.minUnflushed = summary.MinUnflushedLogNum
	d.manifestNum = manifestNum
	// Started once the DB is open (maybeStartReclaimsLocked); the
	// replay adds its range deletions'.
	d.reclaims = summary.Reclaims
	d.mu.Unlock()

	// Find WAL files to replay and the highest file number in use.
	names, err := d.fs.List(d.dirname)
	if err != nil {
		return fmt.Errorf("list %s: %w", d.dirname, err)
	}
	var logs []manifest.FileNum
	for _, name := range names {
		ft, num, ok := manifest.ParseFilename(name)
		if !ok {
			continue
		}
		if num >= d.nextFileNum {
			d.nextFileNum = num + 1
		}
		if ft == manifest.FileTypeLog && num >= d.minUnflushed {
			logs = append(logs, num)
		}
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i] < logs[j] })
	if d.opts.HistoryHorizon {
		// Until the replay has found where the WALs start, the replay's
		// flushes use the highest horizon the MANIFEST recorded, below
		// which earlier flushes and compactions may have dropped versions
		// (a horizon below the true one only keeps more); then the
		// horizon is computed (refreshHorizonLocked).
		d.horizon.Store(uint64(max(summary.HistoryHorizon, 1)))
	}

	// Replay into memtables. Recovery applies the WAL's writes in order;
	// full memtables are flushed to L0 as they fill (not in read-only mode,
	// where they simply queue in memory).
	var edit manifest.VersionEdit
	// The last log is the last one holding anything: recovery that crashed
	// after creating its new, empty log leaves the previous last log (and
	// its possibly torn tail) before it.
	lastData := 0
	allClean := true // every log read to its end without a torn tail
	var logBytes uint64
	sizes := make([]int64, len(logs))
	for i, num := range logs {
		fi, err := d.fs.Stat(d.fs.Join(d.dirname, manifest.MakeFilename(manifest.FileTypeLog, num)))
		if err != nil {
			return fmt.Errorf("stat wal %s: %w", num, err)
		}
		sizes[i] = fi.Size()
		if fi.Size() > 0 {
			lastData = i
		}
		logBytes += uint64(fi.Size())
	}
	t1 := time.Now()
	d.mem = newMemTable(d.recoveryMemTableSize(logBytes), 0, d.shared, false, d.opts.MemTable)
	for i, num := range logs {
		// Only the tail of the last log holding data may be torn by a
		// crash, and not even that one if the DB was closed cleanly with
		// this log complete: then it must be read intact.
		tolerateTail := i >= lastData
		if summary.CleanCloseLogNum == num {
			tolerateTail = false
			if uint64(sizes[i]) != summary.CleanCloseLogSize {
				path := d.fs.Join(d.dirname, manifest.MakeFilename(manifest.FileTypeLog, num))
				return base.Corruptf(path, sizes[i], "log was closed cleanly at %d bytes but is now %d bytes",
					summary.CleanCloseLogSize, sizes[i])
			}
		}
		cleanEnd, err := d.replayWAL(num, tolerateTail, &edit)
		if err != nil {
			return err
		}
		allClean = allClean && cleanEnd
	}
	d.visibleSeq.Store(uint64(d.logSeq))
	d.mu.Lock()
	d.refreshHorizonLocked()
	d.mu.Unlock()
	if d.readOnly {
		return nil
	}
	t2 := time.Now()

	// Persist what was replayed: flush the recovered memtables to L0 (or
	// keep the last one, see keepRecovered), then a new WAL and a new
	// MANIFEST (a full snapshot of the version) that no longer needs the
	// replayed logs it does not keep.
	// Closed cleanly with its last log complete (checked above), the DB's
	// logs are all durable: Close synced the last, each switch to a new
	// log the one before.
	closedCleanly := len(logs) > 0 && summary.CleanCloseLogNum == logs[len(logs)-1]
	kept, err := d.keepRecovered(logs, allClean, closedCleanly, &edit)
	if err != nil {
		return err
	}
	mems := d.imm
	if kept == nil {
		mems = append(mems, d.mem)
	}
	d.imm = nil
	for _, m := range mems {
		if m.empty() {
			m.release()
			continue
		}
		meta, err := d.writeL0(m)
		if err != nil {
			return err
		}
		if meta != nil {
			edit.NewFiles = append(edit.NewFiles, manifest.NewFileEntry{Level: 0, Meta: meta})
		}
		m.release()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.newLogLocked(); err != nil {
		return err
	}
	if kept != nil {
		// The kept memtable goes on taking writes, which go to the new
		// WAL; its replayed logs stay live until it is flushed.
		d.mem = kept
		edit.MinUnflushedLogNum = kept.logNum
	} else {
		d.mem = newMemTable(d.nextMemTableSizeLocked(), d.logNum, d.shared, false, d.opts.MemTable)
		edit.MinUnflushedLogNum = d.logNum
	}
	nv, err := applyEdit(d.vers, &edit)
	if err != nil {
		return fmt.Errorf("recovery edit: %w", err)
	}
	if err := d.writeNewManifestLocked(nv, &edit); err != nil {
		return err
	}
	d.installVersionLocked(nv)
	d.minUnflushed = edit.MinUnflushedLogNum
	for _, e := range edit.NewFiles {
		delete(d.pendingOut, e.Meta.FileNum)
	}
	t3 := time.Now()
	d.log.Debug("recovered", "took", t3.Sub(t0), "manifest", t1.Sub(t0), "logs", len(logs), "log_bytes", logBytes,
		"replay", t2.Sub(t1), "memtable_kept", kept != nil, "l0_flushed", len(edit.NewFiles), "persist", t3.Sub(t2))
	return nil
}

// recoveryMemTableSize is the capacity of the first memtable recovery
// replays logBytes of WAL into: a full memtable, except where the memtable
// may be kept (KeepRecoveredMemTable), which sizes it to the logs (twice
// their bytes, for the skiplist's per-entry overhead; at least
// MemTableInitialSize) so that a DB with little in its WAL does not keep a
// full memtable's arena. Data that does not fit fills it and is flushed as
// it goes, as in any replay, and then nothing is kept.
func (d *DB) recoveryMemTableSize(logBytes uint64) uint64 {
	if !d.opts.KeepRecoveredMemTable || d.readOnly {
		return d.opts.MemTableSize
	}
	return min(d.opts.MemTableSize, max(d.opts.MemTableInitialSize, 2*logBytes))
}

// keepRecovered decides whether recovery keeps the memtable it replayed
// (Options.KeepRecoveredMemTable) instead of flushing it to L0, and returns
// it if so, with its logNum set to the first replayed log, which stays live
// (with every later one) until the memtable is flushed. It keeps it only
// when the replay made exactly that memtable (no memtable filled and was
// flushed meanwhile), it holds data, and every log was read to its end
// with no torn tail: a torn log kept behind a newer one would no longer be
// the last and would fail the next recovery. Unless the DB was closed
// cleanly (durable says its logs are synced), the replayed logs are
// synced first: the writes that follow go to a new log, so a crash must
// not keep those and lose these.
func (d *DB) keepRecovered(logs []manifest.FileNum, allClean, durable bool, edit *manifest.VersionEdit) (*memTable, error) {
	if !d.opts.KeepRecoveredMemTable || !allClean || len(logs) == 0 || len(edit.NewFiles) > 0 ||
		len(d.imm) > 0 || d.mem.empty() || d.mem.unlogged.Load() {
		return nil, nil
	}
	if !durable {
		for _, num := range logs {
			if err := d.syncLog(num); err != nil {
				return nil, err
			}
		}
	}
	d.mem.logNum = logs[0]
	return d.mem, nil
}

// syncLog syncs the WAL file num, which the DB does not have open.
func (d *DB) syncLog(num manifest.FileNum) error {
	name := manifest.MakeFilename(manifest.FileTypeLog, num)
	f, err := d.fs.OpenAppend(d.fs.Join(d.dirname, name))
	if err != nil {
		return fmt.Errorf("open wal %s to sync: %w", name, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync recovered wal %s: %w", name, err)
	}
	d.walSyncs.Add(1)
	return nil
}

// replayWAL applies the batches of log num to the memtables. With
// tolerateTail, a damaged tail (what a crash leaves in the last log) ends
// replay; damage followed by intact records, or any damage without
// tolerateTail, is a corruption error naming the file. cleanEnd reports
// that the log was read to its end with no damaged tail ignored.
func (d *DB) replayWAL(num manifest.FileNum, tolerateTail bool, edit *manifest.VersionEdit) (cleanEnd bool, _ error) {
	name := manifest.MakeFilename(manifest.FileTypeLog, num)
	path := d.fs.Join(d.dirname, name)
	f, err := d.fs.Open(path)
	if err != nil {
		return false, fmt.Errorf("open wal %s: %w", name, err)
	}
	defer f.Close()
	r := wal.NewReader(f, path)
	for {
		rec, err := r.Next()
		if err == io.EOF {
			if r.ValidRecordFollows() {
				return false, base.Corruptf(path, r.ValidOffset(), "zeroed chunk header before intact records")
			}
			return true, nil
		}
		if err != nil {
			// Only the tail of the last log may be torn or garbled (by a
			// crash during an append), and only if nothing intact follows.
			// Anywhere else it is corruption, and an I/O error is never a
			// tail to ignore.
			torn := errors.Is(err, wal.ErrTornTail)
			if (torn || errors.Is(err, base.ErrCorruption)) && tolerateTail && !r.ValidRecordFollows() {
				if !torn {
					d.log.Warn("ignoring damaged tail of last WAL (crash during write)", "wal", name, "err", err)
				}
				return false, nil
			}
			if torn {
				err = base.Corruptf(path, r.ValidOffset(), "%v", err)
			}
			return false, fmt.Errorf("replay wal %s: %w", name, err)
		}
		// rec is valid until the next record is read, and nothing keeps
		// b past this one: the memtable copies its keys and values, the
		// reclaims clone theirs.
		b, err := decodeBatch(rec)
		if err != nil {
			return false, base.Corruptf(path, -1, "batch: %v", err)
		}
		seq := b.SeqNum()
		if _, ok := d.walStart[num]; !ok && d.opts.HistoryHorizon {
			d.walStart[num] = seq // (recovery runs alone: no d.mu needed)
		}
		if b.hasRangeDel && d.opts.HistoryHorizon {
			// As when it was applied (noteRangeDeletions): an edit may
			// not have recorded it before the crash.
			for _, r := range rangeDeletionReclaims(b) {
				d.addReclaimQuietlyLocked(r)
			}
		}
		if b.count == 0 {
			// LogData alone: nothing for the memtable, one sequence number.
			d.logSeq = max(d.logSeq, seq)
			continue
		}
		if !d.mem.hasRoom(batchFootprint(b)) && d.mem.empty() {
			// A batch larger than a memtable gets a memtable of its own,
			// as when it was committed.
			d.mem.release()
			d.mem = newMemTable(max(d.opts.MemTableSize, batchFootprint(b)), 0, d.shared, false, d.opts.MemTable)
		}
		if !d.mem.hasRoom(batchFootprint(b)) {
			d.mem.immutable.Store(true)
			d.imm = append(d.imm, d.mem)
			if !d.readOnly {
				// Bound recovery memory: flush as we go.
				for _, m := range d.imm {
					meta, err := d.writeL0(m)
					if err != nil {
						return false, err
					}
					if meta != nil {
						edit.NewFiles = append(edit.NewFiles, manifest.NewFileEntry{Level: 0, Meta: meta})
					}
					m.release()
				}
				d.imm = nil
			}
			d.mem = newMemTable(max(d.opts.MemTableSize, batchFootprint(b)), 0, d.shared, false, d.opts.MemTable)
		}
		if err := d.mem.apply(b, seq); err != nil {
			return false, fmt.Errorf("replay wal %s: %w", name, err)
		}
		if end := seq + SeqNum(b.count) - 1; end > d.logSeq {
			d.logSeq = end
		}
	}
}

// newLogLocked creates a new WAL file and makes it the current one. The
// previous WAL is synced first, so a crash can never keep later synced
// writes while losing earlier unsynced ones.
func (d *DB) newLogLocked() error {
	d.walMu.Lock()
	defer d.walMu.Unlock()
	if d.logWriter != nil {
		if err := d.logWriter.Flush(); err != nil {
			return fmt.Errorf("flush wal %s: %w", d.logNum, err)
		}
		if err := d.logBuf.drain(); err != nil {
			return fmt.Errorf("write wal %s: %w", d.logNum, err)
		}
		if err := d.logBuf.trimReserved(); err != nil {
			return fmt.Errorf("wal %s: %w", d.logNum, err)
		}
		if err := d.logFile.Sync(); err != nil {
			return fmt.Errorf("sync wal %s: %w", d.logNum, err)
		}
		d.walSyncs.Add(1)
		if err := d.logFile.Close(); err != nil {
			return fmt.Errorf("close wal %s: %w", d.logNum, err)
		}
		d.logWriter, d.logBuf, d.logFile = nil, nil, nil
	}
	num := d.nextFileNum
	d.nextFileNum++
	path := d.fs.Join(d.dirname, manifest.MakeFilename(manifest.FileTypeLog, num))
	f, err := d.fs.Create(path)
	if err != nil {
		return fmt.Errorf("create wal: %w", err)
	}
	if err := vfs.SyncDir(d.fs, d.dirname); err != nil {
		_ = f.Close()
		return err
	}
	d.logNum, d.logFile, d.logBuf = num, f, newWALBuffer(f, &d.shared.walBufs, d.opts.WALPreallocateSize)
	if d.opts.HistoryHorizon {
		d.walStart[num] = d.logSeq + 1
	}
	d.logWriter = wal.NewWriter(d.logBuf)
	d.logWriter.SetBlockPool(&d.shared.walBlocks)
	return nil
}

// walHoldLimit bounds how long commits may sit in the WAL buffer under
// WALFlushThreshold before the flusher writes them out: a DB that stops
// writing then holds no WAL buffer (and a process crash loses at most this
// much of such a DB's unsynced writes).
const walHoldLimit = time.Second

// periodicCheck runs the compaction scheduler, so that files come due for
// a periodic compaction also when no write or flush would schedule one, and
// rearms periodicTimer, until the DB is closed.
func (d *DB) periodicCheck() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.maybeScheduleCompactionLocked()
	d.periodicTimer.Reset(d.periodicEvery)
}

// atRestEnabled reports whether this DB merges L0 down once its writes stop
// (Options.AtRestCompactionDelay).
func (d *DB) atRestEnabled() bool {
	return !d.readOnly && d.opts.AtRestCompactionDelay > 0 && d.opts.Compaction != UniversalCompaction
}

// armAtRestLocked starts the at-rest check when L0 is above its at-rest
// bound and no check is pending or due.
func (d *DB) armAtRestLocked() {
	if !d.atRestEnabled() || !d.opened || d.closed || d.atRestArmed || d.atRestDue || d.vers == nil {
		return
	}
	if d.picker.AtRestL0Bytes(levelsView(d.vers)) == 0 {
		return
	}
	d.atRestArmed = true
	d.atRestSeq = d.LastSeq()
	if d.atRestTimer == nil {
		d.atRestTimer = time.AfterFunc(d.opts.AtRestCompactionDelay, d.atRestCheck)
	} else {
		d.atRestTimer.Reset(d.opts.AtRestCompactionDelay)
	}
}

// atRestCheck runs AtRestCompactionDelay after armAtRestLocked: with no
// write in between it lets the scheduler merge L0 down; otherwise it checks
// again a delay later.
func (d *DB) atRestCheck() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.atRestArmed = false
	if d.closed {
		return
	}
	if d.LastSeq() != d.atRestSeq {
		d.armAtRestLocked()
		return
	}
	d.atRestDue = true
	d.maybeScheduleCompactionLocked()
}

// walFlusher writes buffered WAL data of unsynced commits to the file in the
// background, so the commit leader does not make a write system call per
// group. It exits when walFlushC is closed.
func (d *DB) walFlusher() {
	defer close(d.flusherDone)
	hold := time.NewTimer(walHoldLimit)
	hold.Stop()
	defer hold.Stop()
	var holdC <-chan time.Time // non-nil while hold is armed
	for {
		select {
		case _, ok := <-d.walFlushC:
			if !ok {
				return
			}
		case <-d.walHeldC:
			d.heldWakes.Add(1)
			if holdC == nil {
				hold.Reset(walHoldLimit)
				holdC = hold.C
			}
			continue
		case <-holdC:
			holdC = nil
		}
		if err := d.flushWAL(); err != nil {
			d.mu.Lock()
			d.setBackgroundErrorLocked(err)
			d.mu.Unlock()
		}
	}
}

// flushWAL writes every committed WAL byte to the file (no sync). The write
// system call happens outside walMu, so commits proceed meanwhile.
func (d *DB) flushWAL() error {
	d.walMu.Lock()
	// Commits held after this point are written by a later flush: they
	// tell the flusher again.
	d.walHeldTold = false
	if d.logWriter == nil {
		d.walMu.Unlock()
		return nil
	}
	err := d.logWriter.Flush()
	buf, num := d.logBuf, d.logNum
	d.walMu.Unlock()
	if err == nil {
		err = buf.drain()
	}
	if err != nil {
		return fmt.Errorf("write wal %s: %w", num, err)
	}
	return nil
}

// Close waits for background work, writes and syncs the WAL (memtables are
// not flushed: the next Open replays them from the WAL), records the clean
// close in the MANIFEST, then releases the directory. Iterators and
// snapshots must be closed first.
func (d *DB) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrClosed
	}
	d.closed = true
	d.cond.Broadcast()
	for d.bgRunning > 0 || len(d.writers) > 0 {
		d.cond.Wait()
	}
	var errs []error
	d.mu.Unlock()
	d.mu.Lock()
	if d.periodicTimer != nil {
		d.periodicTimer.Stop() // a check already fired sees closed
	}
	if d.atRestTimer != nil {
		d.atRestTimer.Stop() // likewise
	}
	if d.historyTimer != nil {
		d.historyTimer.Stop() // likewise
	}
	d.mu.Unlock()
	if d.flusherDone != nil {
		close(d.walFlushC)
		<-d.flusherDone
	}
	d.mu.Lock()
	d.walMu.Lock()
	if d.logWriter != nil {
		if err := d.logWriter.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("flush wal: %w", err))
		} else if err := d.logBuf.drain(); err != nil {
			errs = append(errs, fmt.Errorf("write wal: %w", err))
		} else if err := d.logBuf.trimReserved(); err != nil {
			errs = append(errs, err)
		} else if err := d.logFile.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("sync wal: %w", err))
		}
		cleanSize := uint64(d.logWriter.Size())
		if err := d.logFile.Close(); err != nil {
			errs = append(errs, err)
		}
		if len(errs) == 0 && d.bgErr == nil {
			// Record that this WAL is complete, so the next Open treats any
			// damage to it as corruption instead of a crash's torn tail.
			d.manifestMu.Lock()
			if d.manifestSize > 0 {
				err := d.appendManifest(&manifest.VersionEdit{
					LastSeqNum:        d.logSeq,
					CleanCloseLogNum:  d.logNum,
					CleanCloseLogSize: cleanSize,
					HistoryHorizon:    d.HistoryHorizon(),
					Reclaims:          d.reclaimRecordsLocked(),
					ReclaimsSet:       d.reclaimsDirty && d.opts.HistoryHorizon,
				})
				if err != nil {
					errs = append(errs, err)
				}
			}
			d.manifestMu.Unlock()
		}
		d.logWriter, d.logBuf, d.logFile = nil, nil, nil
	}
	d.walMu.Unlock()
	mems := append([]*memTable{d.mem}, d.imm...)
	d.mu.Unlock()
	for _, m := range mems {
		if m != nil {
			m.release()
		}
	}
	d.rsMu.Lock()
	if d.readState != nil {
		d.readState = nil
	}
	d.rsMu.Unlock()
	d.shared.tables.evictDB(d.cacheID)
	if d.lock != nil {
		if err := d.lock.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if d.ownsShrd {
		_ = d.shared.Close()
	}
	return errors.Join(errs...)
}

// compactOptions translates Options into the picker's options.
func (d *DB) compactOptions() compact.Options {
	o := compact.Options{
		L0CompactionTrigger:      d.opts.L0CompactionTrigger,
		L0SlowdownTrigger:        d.opts.L0SlowdownTrigger,
		L0StopTrigger:            d.opts.L0StopTrigger,
		LBaseMaxBytes:            d.opts.LBaseMaxBytes,
		LevelMultiplier:          d.opts.LevelMultiplier,
		DynamicLevelBytes:        !d.opts.DisableDynamicLevelBytes,
		MaxConcurrentCompactions: d.opts.MaxConcurrentCompactions,
		Style:                    d.opts.Compaction,
		Universal:                d.opts.Universal,
	}
	for i := range o.TargetFileSize {
		o.TargetFileSize[i] = d.opts.Levels[i].TargetFileSize
	}
	o.EnsureDefaults()
	return o
}

// checkWritable returns the error a write must fail with, if any.
func (d *DB) checkWritableLocked() error {
	switch {
	case d.closed:
		return ErrClosed
	case d.readOnly:
		return ErrReadOnly
	case d.bgErr != nil:
		return d.bgErr
	}
	return nil
}

// setBackgroundErrorLocked puts the DB in the failed state: every later
// write returns err. It is called when a WAL, MANIFEST or SST write fails,
// after which no write can be acknowledged safely.
func (d *DB) setBackgroundErrorLocked(err error) {
	if d.bgErr == nil {
		d.bgErr = fmt.Errorf("storage: background error, writes refused until reopen: %w", err)
		d.log.Error("background error", "err", err)
	}
	d.cond.Broadcast()
}
