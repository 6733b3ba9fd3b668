package storage

import (
	"fmt"
	"strings"
	"time"

	"github.com/shale-db/shale/storage/cache"
	"github.com/shale-db/shale/storage/manifest"
)

// levelCounters are the cumulative per-level compaction counters.
type levelCounters struct {
	bytesIn      uint64 // bytes read from this level and the one above
	bytesWritten uint64 // bytes written into this level
	bytesMoved   uint64 // bytes moved into this level without rewriting
}

// dbMetrics are the cumulative counters kept under DB.mu.
type dbMetrics struct {
	stallTime              time.Duration
	stalls                 int64
	flushes                int64
	flushInBytes           uint64
	flushOutBytes          uint64
	compactions            int64
	periodicCompactions    int64
	atRestCompactions      int64
	moves                  int64
	compactInBytes         uint64
	compactOutBytes        uint64
	pendingCompactionBytes uint64
	peakCompactions        int
	ingestedBytes          uint64
	horizonReclaims        int64
	levels                 [manifest.NumLevels]levelCounters
}

// writeAmp is (flushed + compacted bytes) / flushed bytes, 1 when nothing
// has been flushed.
func (m *dbMetrics) writeAmp() float64 {
	if m.flushOutBytes == 0 {
		return 1
	}
	return float64(m.flushOutBytes+m.compactOutBytes) / float64(m.flushOutBytes)
}

// LevelMetrics describe one LSM level.
type LevelMetrics struct {
	// Files and Bytes are the level's current contents.
	Files int
	Bytes uint64
	// Score is the compaction score (>= 1 means the level needs compacting).
	Score float64
	// TargetBytes is the level's target size (0 above the base level).
	TargetBytes uint64
	// BytesIn is the cumulative input of compactions into this level.
	BytesIn uint64
	// BytesWritten is the cumulative bytes written into the level by
	// flushes (L0) or compactions.
	BytesWritten uint64
	// BytesMoved is the cumulative bytes moved in without rewriting.
	BytesMoved uint64
}

// Metrics is a point-in-time report of a DB's state and cumulative counters.
type Metrics struct {
	Levels [manifest.NumLevels]LevelMetrics
	// BaseLevel is the level L0 compacts into (dynamic level sizing).
	BaseLevel int

	Flushes       int64  // memtable flushes
	FlushBytesIn  uint64 // memtable bytes flushed
	FlushBytesOut uint64 // SST bytes written by flushes (L0's BytesWritten)
	// Compactions counts the compactions that rewrote files; moves, which
	// relink a file into the next level without reading it, are
	// CompactionMoves.
	Compactions     int64
	CompactionMoves int64
	// PeriodicCompactions counts the compactions (of Compactions) that
	// Options.PeriodicCompaction started.
	PeriodicCompactions int64
	// AtRestCompactions counts the compactions and moves of L0 that
	// Options.AtRestCompactionDelay started on a DB whose writes had
	// stopped.
	AtRestCompactions int64
	// CompactionBytesIn is the size of the files compactions read (their
	// inputs), and CompactionBytesOut of those they wrote; moves count in
	// neither. They are the sums of the levels' BytesIn and of the
	// BytesWritten of the levels below L0.
	CompactionBytesIn  uint64
	CompactionBytesOut uint64
	// CompactionsRunning counts the compactions running now.
	CompactionsRunning int
	// PeakConcurrentCompactions is the most compactions that ran at once.
	PeakConcurrentCompactions int
	PendingCompactionBytes    uint64
	// AtRestCompactionBytes is the size of L0 while it holds more than
	// 1/LevelMultiplier of the bytes below it: what an at-rest compaction
	// (Options.AtRestCompactionDelay) merges down once the DB has had no
	// write for that long, or is merging now. 0 when L0 is within that
	// bound, and when the option is off or the style is Universal. A
	// caller waiting for background work to settle waits for it too.
	AtRestCompactionBytes uint64
	// HorizonReclaimsPending counts the deleted spans waiting for the
	// history horizon to pass them before they are compacted
	// (CompactAfterHorizon, range deletions under Options.HistoryHorizon);
	// HorizonReclaims counts the span compactions run for them.
	HorizonReclaimsPending int
	HorizonReclaims        int64
	// WriteAmp is (flush + compaction bytes written) / flush bytes written.
	WriteAmp float64

	// WritePressure is the write controller's pressure in [0, 1].
	WritePressure float64
	// PacingAbsorbRate is the measured user bytes/s background work absorbs.
	PacingAbsorbRate float64
	// PacingDelay is the cumulative time writes were paced.
	PacingDelay time.Duration
	// StallTime is the cumulative time writes waited at hard limits.
	StallTime time.Duration
	// Stalls counts write stalls at hard limits.
	Stalls int64

	// MemTables counts memtables (mutable plus immutable).
	MemTables int
	// MemTableBytes is the memory in use by this DB's memtables.
	MemTableBytes uint64
	// SharedMemTableBytes is the memtable memory of all DBs sharing resources.
	SharedMemTableBytes int64

	WALFiles  int
	WALBytes  uint64 // cumulative bytes written to the WAL
	WALSyncs  uint64 // cumulative WAL syncs
	LastSeq   SeqNum
	Snapshots int

	BlockCache       cache.Metrics
	TableCacheHits   int64
	TableCacheMisses int64
	IngestedBytes    uint64
	// BackgroundError is non-nil once the DB refuses writes after an I/O
	// failure.
	BackgroundError error
}

// BlockCacheHitRate returns hits / (hits + misses), 0 with no lookups.
func (m *Metrics) BlockCacheHitRate() float64 {
	total := m.BlockCache.Hits + m.BlockCache.Misses
	if total == 0 {
		return 0
	}
	return float64(m.BlockCache.Hits) / float64(total)
}

// Metrics returns the DB's current metrics.
func (d *DB) Metrics() *Metrics {
	m := &Metrics{}
	// Count WAL files before taking d.mu: directory I/O must not hold up
	// writers.
	if names, err := d.fs.List(d.dirname); err == nil {
		for _, n := range names {
			if ft, _, ok := manifest.ParseFilename(n); ok && ft == manifest.FileTypeLog {
				m.WALFiles++
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	lv := levelsView(d.vers)
	scores := d.picker.Scores(lv)
	baseLevel, targets := d.picker.LevelTargets(lv)
	m.BaseLevel = baseLevel
	for i := range m.Levels {
		l := &m.Levels[i]
		l.Files = len(d.vers.Levels[i])
		for _, f := range d.vers.Levels[i] {
			l.Bytes += f.Size
		}
		l.Score = scores[i]
		l.TargetBytes = targets[i]
		c := d.metrics.levels[i]
		l.BytesIn, l.BytesWritten, l.BytesMoved = c.bytesIn, c.bytesWritten, c.bytesMoved
	}
	dm := &d.metrics
	m.Flushes, m.FlushBytesIn, m.FlushBytesOut = dm.flushes, dm.flushInBytes, dm.flushOutBytes
	m.Compactions, m.CompactionMoves = dm.compactions, dm.moves
	m.PeriodicCompactions = dm.periodicCompactions
	m.AtRestCompactions = dm.atRestCompactions
	if d.atRestEnabled() {
		m.AtRestCompactionBytes = d.picker.AtRestL0Bytes(lv)
	}
	m.CompactionBytesIn, m.CompactionBytesOut = dm.compactInBytes, dm.compactOutBytes
	m.CompactionsRunning = len(d.compactions)
	m.PeakConcurrentCompactions = dm.peakCompactions
	m.PendingCompactionBytes = dm.pendingCompactionBytes
	m.HorizonReclaimsPending, m.HorizonReclaims = len(d.reclaims), dm.horizonReclaims
	m.WriteAmp = dm.writeAmp()
	m.WritePressure, m.PacingAbsorbRate, m.PacingDelay = d.wc.stats()
	m.StallTime, m.Stalls = dm.stallTime, dm.stalls
	m.MemTables = len(d.imm) + 1
	m.MemTableBytes = d.mem.approxBytes()
	for _, im := range d.imm {
		m.MemTableBytes += im.approxBytes()
	}
	m.SharedMemTableBytes = d.shared.MemTableBytes()
	m.WALBytes, m.WALSyncs = d.walBytes.Load(), d.walSyncs.Load()
	m.LastSeq = SeqNum(d.visibleSeq.Load())
	m.Snapshots = d.snapshots.l.Len()
	m.BlockCache = d.shared.BlockCache.Metrics()
	m.TableCacheHits, m.TableCacheMisses = d.shared.tables.hits.Load(), d.shared.tables.misses.Load()
	m.IngestedBytes = dm.ingestedBytes
	m.BackgroundError = d.bgErr
	return m
}

// String formats the metrics as a per-level table followed by totals.
func (m *Metrics) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "level  files       size     score     target   written\n")
	for i, l := range m.Levels {
		fmt.Fprintf(&b, "L%d    %6d %10s %9.2f %10s %9s\n", i, l.Files, humanBytes(l.Bytes), l.Score, humanBytes(l.TargetBytes), humanBytes(l.BytesWritten))
	}
	fmt.Fprintf(&b, "base level L%d, flushes %d, compactions %d (+%d moves), w-amp %.2f, pending %s\n",
		m.BaseLevel, m.Flushes, m.Compactions, m.CompactionMoves, m.WriteAmp, humanBytes(m.PendingCompactionBytes))
	fmt.Fprintf(&b, "wal %s in %d syncs; memtables %d (%s); stalls %d (%s); paced %s at pressure %.2f\n",
		humanBytes(m.WALBytes), m.WALSyncs, m.MemTables, humanBytes(m.MemTableBytes), m.Stalls, m.StallTime, m.PacingDelay, m.WritePressure)
	fmt.Fprintf(&b, "block cache %s, hit rate %.1f%%; table cache hits %d misses %d\n",
		humanBytes(uint64(m.BlockCache.Size)), 100*m.BlockCacheHitRate(), m.TableCacheHits, m.TableCacheMisses)
	return b.String()
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
