package storage

import (
	"errors"
	"fmt"
	"github.com/shale-db/shale/storage/internal/compact"
	"log/slog"
	"time"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/sstable"
	"github.com/shale-db/shale/storage/vfs"
)

// DefaultAtRestCompactionDelay is the default Options.AtRestCompactionDelay.
const DefaultAtRestCompactionDelay = 5 * time.Second

// SeqNum is a sequence number: every write consumes one, and a snapshot sees
// the writes with sequence numbers at or below its own.
type SeqNum = base.SeqNum

// Kind says what a batch record does (set, delete, merge, range delete, log
// data).
type Kind = base.Kind

// The record kinds a Batch holds.
const (
	KindSet         = base.KindSet
	KindDelete      = base.KindDelete
	KindMerge       = base.KindMerge
	KindRangeDelete = base.KindRangeDelete
	KindLogData     = base.KindLogData
)

// MergeOperator folds Merge operands into values; see base.Merger for the
// contract.
type MergeOperator = base.Merger

// CompactionFilter decides, during compactions, whether to keep, drop or
// rewrite values; see base.CompactionFilter for the contract.
type CompactionFilter = base.CompactionFilter

// FilterDecision is what a CompactionFilter decides for one entry.
type FilterDecision = base.FilterDecision

// The decisions a CompactionFilter returns.
const (
	FilterKeep        = base.FilterKeep
	FilterRemove      = base.FilterRemove
	FilterChangeValue = base.FilterChangeValue
)

// Compression selects how SST blocks are compressed.
type Compression = sstable.Compression

// The block compression algorithms.
const (
	NoCompression     = sstable.NoCompression
	SnappyCompression = sstable.SnappyCompression
	ZstdCompression   = sstable.ZstdCompression
	// ZstdDictCompression is zstd with a dictionary made per file from
	// samples of its first data blocks and stored in it: worth it for the
	// large files of the last levels, whose blocks share much content.
	ZstdDictCompression = sstable.ZstdDictCompression
)

// PrefixExtractor maps a key to its prefix, for prefix bloom filters and
// prefix iteration. Prefix returns nil when the key has no prefix (it is
// outside the extractor's domain). It must be deterministic: it is recorded
// by Name in every SST.
type PrefixExtractor interface {
	Name() string
	Prefix(key []byte) []byte
}

// FixedPrefix is a PrefixExtractor taking the first N bytes of keys that
// have at least N bytes.
type FixedPrefix int

// Name returns "fixed:N".
func (p FixedPrefix) Name() string { return fmt.Sprintf("fixed:%d", int(p)) }

// Prefix returns key[:N], or nil when the key is shorter.
func (p FixedPrefix) Prefix(key []byte) []byte {
	if len(key) < int(p) {
		return nil
	}
	return key[:int(p)]
}

// LevelOptions are the SST settings of one level.
type LevelOptions struct {
	// BlockSize is the target uncompressed size of data blocks. Default 4 KiB.
	BlockSize int
	// BlockRestartInterval is the number of keys between restart points in
	// data blocks. Default 16.
	BlockRestartInterval int
	// Compression is the block compression. Default snappy.
	Compression Compression
	// ZstdLevel is the zstd level (1..22, mapped onto the encoder's speed
	// presets) of ZstdCompression and ZstdDictCompression. Default 3.
	ZstdLevel int
	// FilterBitsPerKey sizes the bloom filter; 0 disables it. Default 10.
	// Set it negative to disable the filter explicitly (the zero value means
	// "default").
	FilterBitsPerKey int
	// TargetFileSize is the size at which compaction output files are cut.
	// Default 2 MiB at L0/L1, doubling per level.
	TargetFileSize uint64
}

// Options configure a DB. The zero value is usable: every field documents its
// default, applied by Open.
type Options struct {
	// FS is the filesystem. Default: the operating system's.
	FS vfs.FS
	// Shared holds the resources this DB shares with other DBs in the process
	// (block cache, table cache, background workers, memtable budget).
	// Default: a private set sized by NewShared's defaults.
	Shared *Shared
	// SkipLockFile makes Open take no LOCK file in the directory. Only a
	// second Open of the same directory with the same Shared is then
	// refused (with an error matching vfs.ErrLocked); other processes are
	// not kept out, so set it only when something else does, as a Shale
	// node's lock on its data directory does. It saves the descriptor a LOCK
	// holds for as long as the DB is open, which matters to a process
	// hosting thousands of engines. Requires Shared. Default false.
	SkipLockFile bool
	// KeepRecoveredMemTable makes Open keep the memtable it replays from the
	// WAL as the mutable memtable, with its WAL files, instead of flushing it
	// to a new L0 file (RocksDB's avoid_flush_during_recovery). A DB opened
	// from a checkpoint of another DB then has the same levels as its source
	// and takes writes into the same memtable: the flush at open would add
	// an L0 file the source does not have, and with it often a compaction of
	// L0 into the levels below (the whole database, for a small one) right
	// after the open. It keeps the memtable only when the replay made one
	// memtable and read every log to its end; otherwise Open flushes as
	// without it. The kept logs are synced before new writes are taken
	// (unless the DB was closed cleanly, which synced them). The memtable
	// replayed into is then sized to the WAL (twice its bytes, at least
	// MemTableInitialSize, at most MemTableSize), so that a DB with little
	// in its WAL keeps no full-size memtable. Default false.
	KeepRecoveredMemTable bool
	// ErrorIfNotExists makes Open fail when no database exists in the
	// directory. Default false: a missing database is created.
	ErrorIfNotExists bool
	// ErrorIfExists makes Open fail when a database already exists.
	ErrorIfExists bool
	// MemTableSize is the size of one memtable. Default 64 MiB.
	MemTableSize uint64
	// MemTableInitialSize is the capacity of a DB's first memtable; each
	// later one doubles it, up to MemTableSize. A DB that is written little
	// then reserves little memory. Default MemTableSize/16, at least 1 MiB
	// (never above MemTableSize); at least 64 KiB when set.
	MemTableInitialSize uint64
	// MemTable selects how memtables store point entries: SkiplistMemTable
	// (the default) or VectorMemTable, for bulk loads that read little.
	MemTable MemTableKind
	// MaxMemTables is the number of memtables (mutable plus those waiting to
	// flush) before writes are held until a flush completes. Writes are
	// paced long before that point. Default 4.
	MaxMemTables int
	// L0CompactionTrigger is the number of L0 files that starts an L0
	// compaction. Default 4.
	L0CompactionTrigger int
	// L0SlowdownTrigger is the number of L0 files at which write pacing
	// reaches its strongest delay. Default 20.
	L0SlowdownTrigger int
	// L0StopTrigger is the number of L0 files at which writes wait for
	// compactions (the last resort; pacing is meant to avoid it). Default 36.
	L0StopTrigger int
	// LBaseMaxBytes is the target size of the base level, and L0's byte
	// budget: L0 is due for compaction once its files hold this many
	// bytes (or number L0CompactionTrigger). Default 256 MiB (RocksDB's
	// default), so that L0 gathers about four flushes of 64 MiB memtables
	// before it is merged into the base level: at 64 MiB it was merged
	// every second flush, and an overwrite wrote 10% more SST bytes.
	LBaseMaxBytes uint64
	// LevelMultiplier is the size ratio between adjacent levels. Default 10.
	LevelMultiplier float64
	// DisableDynamicLevelBytes turns off the paper's dynamic level sizing
	// (targets computed from the last level down). Default false (dynamic).
	DisableDynamicLevelBytes bool
	// MaxConcurrentCompactions bounds this DB's simultaneous compactions.
	// Default 2.
	MaxConcurrentCompactions int
	// Compaction is the compaction style. LeveledCompaction (the default)
	// keeps each level below L0 a fixed multiple of the one above: space
	// amplification near 1.1, each byte rewritten about once per level.
	// UniversalCompaction treats each L0 file and each non-empty level as
	// a sorted run and merges runs of similar size whole: fewer rewrites,
	// at the cost of up to Universal.MaxSizeAmplificationPercent of extra
	// space before a full compaction, and more runs for a read to check;
	// L0CompactionTrigger then counts sorted runs, and the level sizing
	// options (LBaseMaxBytes, LevelMultiplier, DisableDynamicLevelBytes)
	// only pace writes. A DB may be reopened with the other style: both
	// keep the same on-disk invariants.
	Compaction CompactionStyle
	// Universal tunes UniversalCompaction; zero fields take the defaults
	// described in UniversalOptions.
	Universal UniversalOptions
	// Levels holds per-level SST settings; Levels[0] also applies to flushes.
	// Zero fields take the defaults described in LevelOptions; a level whose
	// options are entirely zero inherits the previous level's.
	Levels [manifest.NumLevels]LevelOptions
	// PrefixExtractor enables prefix bloom filters and prefix iteration.
	// Default nil (none).
	PrefixExtractor PrefixExtractor
	// MergeOperator is required to read or compact Merge records. Default nil.
	MergeOperator MergeOperator
	// CompactionFilter is consulted during compactions. Default nil.
	CompactionFilter CompactionFilter
	// WALArchiveMaxBytes, when positive, keeps obsolete WAL files (those
	// whose writes are all in SSTs) in the archive subdirectory for
	// UpdatesSince, up to this many bytes in all; the oldest are removed
	// first. Default 0: no archive, obsolete WALs are deleted at once, and
	// UpdatesSince serves only the writes still in live WALs (a DB whose
	// WAL is tailed sets it; a Shale node's shard engines keep 256 MiB).
	// Negative is the same as 0.
	WALArchiveMaxBytes int64
	// WALArchiveTTL removes archived WAL files older than this. Default 1 h.
	WALArchiveTTL time.Duration
	// HistoryHorizon, when true, keeps the history the WAL still holds
	// readable from the SSTs: flushes and compactions keep every version
	// visible at some sequence number >= H-1, where the history horizon H
	// (DB.HistoryHorizon) is the first sequence number of the oldest WAL
	// file still on disk, live or archived (so every batch UpdatesSince or
	// UpdatesFrom can still return). It is as if a snapshot were open at
	// every sequence number from H-1 on, and DB.GetAt reads at any of them.
	// The cost is space: the versions overwritten or deleted within the WAL
	// window (WALArchiveMaxBytes, WALArchiveTTL) stay in SSTs until the
	// horizon passes them. One exception to "as if a snapshot": the
	// CompactionFilter may still remove or change a key's newest version
	// when no open snapshot sees it, and reads at or above that version
	// then see the filtered result. Default false: no horizon.
	HistoryHorizon bool
	// HistoryWindow, when positive, bounds the history HistoryHorizon
	// keeps by time apart from the WAL: H also moves up to the first
	// sequence number written after now-HistoryWindow, so versions
	// overwritten or deleted longer ago than the window go at the next
	// flush or compaction, also on a DB nobody writes. The DB samples
	// (time, last sequence number, WAL bytes) about once a second while it
	// is written to and when a flush or compaction starts, so the bound
	// holds to within about a second (or a flush's writes); a DB nobody
	// writes wakes only when a sample passes the window. Needs HistoryHorizon. Default
	// 0: no time bound. Negative is an error.
	HistoryWindow time.Duration
	// HistoryWindowBytes, when positive, bounds the history HistoryHorizon
	// keeps by WAL bytes: H also moves up to the first sequence number
	// written after the point where more than this many bytes of batches
	// were written to the WAL since, to within one sample's writes (a
	// second's or a flush's, see HistoryWindow). With both bounds set, the tighter one wins. Needs
	// HistoryHorizon. Default 0: no bytes bound. Negative is an error.
	HistoryWindowBytes int64
	// WALFlushThreshold lets unsynced writes accumulate in memory until this
	// many bytes are buffered before the background flusher writes them to
	// the WAL file. Default 0: after every commit. Bytes buffered for a
	// second without reaching the threshold are written then. A process
	// crash loses what is buffered (a synced write, SyncWAL, a memtable
	// rotation, Close, Checkpoint and UpdatesSince write it out first), so
	// set it only for a DB whose writes are also recorded elsewhere, such as
	// a state machine behind a Raft log; it saves a write system call per
	// commit.
	WALFlushThreshold int
	// WALPreallocateSize reserves disk space ahead of the WAL's writes in
	// steps of this many bytes, so that a synced write inside the reserved
	// space commits no file metadata (see vfs.Preallocate): synced writes
	// get cheaper, at the cost of up to this much unused space per open WAL
	// (given back when the WAL is rotated or the DB closed). Default 1 MiB;
	// negative disables it. Filesystems without preallocation ignore it.
	WALPreallocateSize int64
	// DisableWritePacing turns off the write controller's pacing (writes
	// still wait at the hard limits). Default false.
	DisableWritePacing bool
	// PeriodicCompaction, when positive, compacts every SST written more
	// than this long ago, when no other compaction is due: a file above the
	// last level goes down a level, a last-level file is rewritten in place.
	// Every byte of data is then read and rewritten at least about once per
	// period, so a CompactionFilter (such as a TTL) reaches cold data and
	// deleted data's space comes back even where nothing is written
	// (RocksDB's periodic_compaction_seconds and ttl). Files of a database
	// written before SSTs recorded their creation time are never chosen.
	// The DB also checks for such files every PeriodicCompaction/16 (at
	// least a second, at most 10 minutes). Default 0: off.
	PeriodicCompaction time.Duration
	// AtRestCompactionDelay is how long a DB must go without a write before
	// it merges L0 into the levels below, when L0 holds more than
	// 1/LevelMultiplier of their bytes. While writes go on, L0 gathers up
	// to L0CompactionTrigger flushes before it is merged, which saves
	// rewriting the levels below at every flush; a DB whose writes stop
	// would otherwise keep those flushes' overwritten data twice (space
	// amplification past the leveled bound of about 1.11) and check every
	// L0 file on each read until the next writes came. Default 5 s;
	// negative disables it. Leveled style only (Universal bounds its space
	// by MaxSizeAmplificationPercent).
	AtRestCompactionDelay time.Duration
	// now is the clock of file creation times, PeriodicCompaction and
	// HistoryWindow (time.Now when nil); tests set it.
	now func() time.Time
	// Logger receives the DB's logs. Default slog.Default().
	Logger *slog.Logger
}

// ensureDefaults returns a copy of o with every zero field defaulted.
func (o *Options) ensureDefaults() *Options {
	var n Options
	if o != nil {
		n = *o
	}
	if n.FS == nil {
		n.FS = vfs.Default
	}
	if n.MemTableSize == 0 {
		n.MemTableSize = 64 << 20
	}
	if n.MemTableInitialSize == 0 {
		n.MemTableInitialSize = max(n.MemTableSize/16, 1<<20)
	}
	n.MemTableInitialSize = min(n.MemTableInitialSize, n.MemTableSize)
	if n.MaxMemTables == 0 {
		n.MaxMemTables = 4
	}
	if n.WALPreallocateSize == 0 {
		n.WALPreallocateSize = 1 << 20
	}
	if n.L0CompactionTrigger == 0 {
		n.L0CompactionTrigger = 4
	}
	if n.L0SlowdownTrigger == 0 {
		n.L0SlowdownTrigger = 20
	}
	if n.L0StopTrigger == 0 {
		n.L0StopTrigger = 36
	}
	if n.LBaseMaxBytes == 0 {
		n.LBaseMaxBytes = compact.DefaultLBaseMaxBytes
	}
	if n.LevelMultiplier == 0 {
		n.LevelMultiplier = 10
	}
	n.Universal.EnsureDefaults()
	if n.MaxConcurrentCompactions == 0 {
		n.MaxConcurrentCompactions = 2
	}
	for i := range n.Levels {
		l := &n.Levels[i]
		if *l == (LevelOptions{}) && i > 0 {
			*l = n.Levels[i-1]
			if l.TargetFileSize != 0 {
				l.TargetFileSize *= 2
			}
			continue
		}
		if l.BlockSize == 0 {
			l.BlockSize = 4 << 10
		}
		if l.BlockRestartInterval == 0 {
			l.BlockRestartInterval = 16
		}
		if l.Compression == 0 {
			l.Compression = SnappyCompression
		}
		if l.FilterBitsPerKey == 0 {
			l.FilterBitsPerKey = 10
		}
		if l.ZstdLevel == 0 {
			l.ZstdLevel = sstable.DefaultZstdLevel
		}
	}
	for i := range n.Levels {
		if n.Levels[i].TargetFileSize == 0 {
			if i == 0 {
				n.Levels[i].TargetFileSize = 2 << 20
			} else {
				n.Levels[i].TargetFileSize = n.Levels[i-1].TargetFileSize * 2
				if i == 1 {
					n.Levels[i].TargetFileSize = n.Levels[0].TargetFileSize
				}
			}
		}
	}
	n.WALArchiveMaxBytes = max(n.WALArchiveMaxBytes, 0)
	if n.WALArchiveTTL == 0 {
		n.WALArchiveTTL = time.Hour
	}
	if n.Logger == nil {
		n.Logger = slog.Default()
	}
	if n.now == nil {
		n.now = time.Now
	}
	n.PeriodicCompaction = max(n.PeriodicCompaction, 0)
	if n.AtRestCompactionDelay == 0 {
		n.AtRestCompactionDelay = DefaultAtRestCompactionDelay
	}
	return &n
}

// validate reports option combinations that cannot work.
func (o *Options) validate() error {
	var errs []error
	if o.MemTableSize < 64<<10 {
		errs = append(errs, fmt.Errorf("MemTableSize %d is below the 64 KiB minimum", o.MemTableSize))
	}
	if o.MemTableSize > 1<<32-1 {
		errs = append(errs, fmt.Errorf("MemTableSize %d exceeds 4 GiB", o.MemTableSize))
	}
	if o.MemTableSize >= 64<<10 && o.MemTableInitialSize < 64<<10 {
		errs = append(errs, fmt.Errorf("MemTableInitialSize %d is below the 64 KiB minimum", o.MemTableInitialSize))
	}
	if o.MaxMemTables < 2 {
		errs = append(errs, fmt.Errorf("MaxMemTables %d: need at least 2", o.MaxMemTables))
	}
	if !(o.L0CompactionTrigger < o.L0SlowdownTrigger && o.L0SlowdownTrigger < o.L0StopTrigger) {
		errs = append(errs, fmt.Errorf("L0 triggers must satisfy compaction (%d) < slowdown (%d) < stop (%d)",
			o.L0CompactionTrigger, o.L0SlowdownTrigger, o.L0StopTrigger))
	}
	if o.SkipLockFile && o.Shared == nil {
		errs = append(errs, errors.New("SkipLockFile needs a Shared: the in-process lock lives there"))
	}
	if o.MemTable != SkiplistMemTable && o.MemTable != VectorMemTable {
		errs = append(errs, fmt.Errorf("MemTable kind %d unknown", o.MemTable))
	}
	if o.Compaction != LeveledCompaction && o.Compaction != UniversalCompaction {
		errs = append(errs, fmt.Errorf("compaction style %d unknown", o.Compaction))
	}
	if o.HistoryWindow < 0 || o.HistoryWindowBytes < 0 {
		errs = append(errs, fmt.Errorf("HistoryWindow %s and HistoryWindowBytes %d must not be negative", o.HistoryWindow, o.HistoryWindowBytes))
	}
	if (o.HistoryWindow != 0 || o.HistoryWindowBytes != 0) && !o.HistoryHorizon {
		errs = append(errs, errors.New("HistoryWindow and HistoryWindowBytes bound the history HistoryHorizon keeps: set HistoryHorizon"))
	}
	if o.LevelMultiplier < 2 {
		errs = append(errs, fmt.Errorf("LevelMultiplier %.1f: need at least 2", o.LevelMultiplier))
	}
	for i, l := range o.Levels {
		if l.BlockSize < 1 || l.BlockRestartInterval < 1 {
			errs = append(errs, fmt.Errorf("Levels[%d]: block size and restart interval must be positive", i))
		}
		if l.ZstdLevel < 1 || l.ZstdLevel > 22 {
			errs = append(errs, fmt.Errorf("Levels[%d]: zstd level %d outside 1..22", i, l.ZstdLevel))
		}
	}
	return errors.Join(errs...)
}

// filterBits returns the bloom bits per key of level, 0 meaning none.
func (l LevelOptions) filterBits() int {
	if l.FilterBitsPerKey < 0 {
		return 0
	}
	return l.FilterBitsPerKey
}

// WriteOptions are per-write settings.
type WriteOptions struct {
	// Sync makes Apply return only once the batch is durable in the WAL.
	Sync bool
	// DisableWAL skips the WAL: the batch lives only in the memtable until
	// flushed and is lost by a crash before that. Such batches are not seen
	// by UpdatesSince.
	DisableWAL bool
}

// Sync is the WriteOptions for a durable write.
var Sync = WriteOptions{Sync: true}

// NoSync is the WriteOptions for a write that is durable only after a later
// synced write or flush.
var NoSync = WriteOptions{}

// IterOptions configure an iterator.
type IterOptions struct {
	// LowerBound is the inclusive lower bound; nil = unbounded.
	LowerBound []byte
	// UpperBound is the exclusive upper bound; nil = unbounded.
	UpperBound []byte
	// Prefix restricts the iterator to keys starting with Prefix (combined
	// with the bounds). When it equals what the DB's PrefixExtractor returns
	// for those keys, prefix bloom filters skip files without the prefix.
	Prefix []byte
	// Snapshot reads at the snapshot instead of the latest state.
	Snapshot *Snapshot
	// CacheOnly makes the iterator read nothing from disk, as
	// ReadOptions.CacheOnly does a Get: NewIter fails with an error
	// matching ErrIncomplete when an SST it needs is not open or its range
	// tombstones are not loaded, and positioning fails (Error matching
	// ErrIncomplete) at a data block the block cache does not hold.
	CacheOnly bool
}

// ReadOptions are the settings of one point read (GetWithOptions).
type ReadOptions struct {
	// CacheOnly serves the read from memory only: the memtables, SSTs the
	// table cache holds open (their index and bloom filter), range
	// tombstones already loaded, and data blocks in the block cache. A read
	// that would need anything else fails with an error matching
	// ErrIncomplete and reads nothing from disk (RocksDB's kBlockCacheTier):
	// a caller on a latency-critical path can try memory first and send the
	// read elsewhere, or to a slower path, when it is incomplete. A key the
	// memtables or an open table's bloom filter rule out is reported
	// ErrNotFound as usual. Default false.
	CacheOnly bool
}

// ErrIncomplete is matched (errors.Is) by the error of a cache-only read
// (ReadOptions.CacheOnly, IterOptions.CacheOnly) that needed the disk.
var ErrIncomplete = sstable.ErrIncomplete
