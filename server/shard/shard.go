package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/replication/hlc"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

var _ replication.StateMachine = (*Shard)(nil)

// DefaultDedupCapacity is the number of request IDs the deduplication table
// keeps when Options.DedupCapacity is zero.
const DefaultDedupCapacity = 100_000

// Errors returned by the read methods and lifecycle calls.
var (
	// ErrClosed is returned by calls on a closed Shard.
	ErrClosed = errors.New("shard: closed")
	// ErrUninitialized is returned by reads of a replica that has no
	// descriptor yet (opened with OpenEmpty and not yet Restored).
	ErrUninitialized = errors.New("shard: uninitialized replica (no descriptor)")
	// ErrKeyOutsideShard is returned by reads of keys or ranges that are not
	// inside the shard's [start, end) (and by user reads of the system shard,
	// which has no user keys).
	ErrKeyOutsideShard = errors.New("shard: key outside shard")
	// ErrNotSystemShard is returned by Nodes and Shards on a user shard.
	ErrNotSystemShard = errors.New("shard: not the system shard")
	// ErrNoMetadata is returned by Open (and Restore) when the engine holds no
	// shard metadata (it was never bootstrapped or restored).
	ErrNoMetadata = errors.New("shard: no shard metadata")
)

// DefaultWALArchiveBytes is how many bytes of obsolete engine WAL a shard
// keeps (storage.Options.WALArchiveMaxBytes, when its Storage options leave
// it 0), so that Watch, the change feed and incremental backups, which tail
// the WAL, can resume from writes already flushed to SSTs.
const DefaultWALArchiveBytes = 256 << 20

// DefaultPeriodicCompaction is how old a shard engine's SST may grow before
// it is compacted though nothing else is due (storage.Options.
// PeriodicCompaction, when its Storage options leave it 0): the engine's
// compaction filter then drops the evicted deduplication entries of shards
// that are no longer written, and their deleted and expired keys' space
// comes back.
const DefaultPeriodicCompaction = 7 * 24 * time.Hour

// Options configure a Shard.
type Options struct {
	// Storage is the template of the engine's options; it is copied, never
	// modified. The caller sets Shared (the node's shared caches and
	// workers) and FS. Nil means storage defaults. Every directory operation
	// of the Shard (Restore's renames included) goes through Storage.FS.
	Storage *storage.Options
	// DedupCapacity bounds the request-deduplication table; the oldest entry
	// is evicted first. Every replica of a shard must use the same value, or
	// replicas would disagree on which retried requests are duplicates.
	// Default DefaultDedupCapacity.
	DedupCapacity int
	// Logger receives the shard's logs. Default slog.Default(). It is also
	// the engine's logger when Storage.Logger is nil.
	Logger *slog.Logger
	// ShardsDir is the directory holding the node's shard engines, each in
	// Dir(ShardsDir, its ID). A split creates its new right-hand shard's
	// engine there and asks the Store to host it (replication.HostShard).
	// Without it split commands are rejected (FailedPrecondition).
	ShardsDir string
	// RecordCache, shared by a node's shards, spares the apply of a write
	// the engine read of the key's previous record when the key was
	// written recently. Nil: no cache.
	RecordCache *RecordCache
	// HistoryWindow and HistoryWindowBytes bound the history the engine
	// keeps (storage.Options.HistoryWindow and HistoryWindowBytes; the
	// engine always keeps a history horizon, whatever Storage says): the
	// values that writes replaced or deleted within the last HistoryWindow
	// and the last HistoryWindowBytes of the engine's WAL, the tighter
	// bound winning. Watch reads the previous values of changes there
	// (ChangeReader.ReadPrev), and the space of deleted, overwritten and
	// expired values comes back once it passes them. 0 means
	// DefaultHistoryWindow and DefaultHistoryWindowBytes; negative means no
	// such bound (the WAL archive still bounds the history).
	HistoryWindow      time.Duration
	HistoryWindowBytes int64
}

// DefaultHistoryWindow is the time bound of the history a shard engine
// keeps (Options.HistoryWindow), when its options leave it 0.
const DefaultHistoryWindow = 5 * time.Minute

// DefaultHistoryWindowBytes is the bound, in bytes of the engine's WAL, of
// the history a shard engine keeps (Options.HistoryWindowBytes), when its
// options leave it 0.
const DefaultHistoryWindowBytes = 8 << 20

// Dir returns the directory of the engine of shard id among a node's
// shards (in shardsDir).
func Dir(shardsDir string, id uint64) string {
	return filepath.Join(shardsDir, strconv.FormatUint(id, 10))
}

// DirShardID returns the shard whose engine an entry of a node's shards
// directory holds: the entry named by Dir, or the old engine a Restore set
// aside (which Open of the shard's Dir puts back when a crash left the
// engine directory missing). ok is false for any other entry.
func DirShardID(name string) (id uint64, ok bool) {
	id, err := strconv.ParseUint(strings.TrimSuffix(name, restoreOldSuffix), 10, 64)
	return id, err == nil
}

// state is the applied state of a shard: an immutable value, replaced as a
// whole after every successful Apply (readers load it without locks).
type state struct {
	index, term uint64
	conf        *raftpb.ConfState        // never nil; never mutated once published
	desc        *shalev1.ShardDescriptor // nil until initialized; never mutated once published
	rev         uint64
	// dedupOldest and dedupNext bound the live insertion sequence numbers of
	// the dedup table: [dedupOldest, dedupNext).
	dedupOldest, dedupNext uint64
	// dedupLegacyEnd bounds the sequences of the dedup entries an older
	// format wrote (under legacyDedupPrefix): none of them is live once
	// dedupOldest reaches it. 0 when the engine holds none.
	dedupLegacyEnd uint64
	// hlc dates the last applied entry: dates grow with the index.
	hlc hlc.Timestamp
	// absorbed are the ranges merges added to the shard, each with the
	// revision after its merge, oldest first (at most maxAbsorbed): the
	// shard holds no change to such a range at or below that revision.
	absorbed []absorbedRange
	// confBytes and descBytes cache the encodings of conf and desc.
	confBytes, descBytes []byte
	// legacy is set for a state read from a format 1 engine: its next
	// metadata write is a full one, which moves the engine to the current
	// format.
	legacy bool
	// format is the engine's format version as read (0: never written);
	// the next metadata write sets it to formatVersion.
	format byte
	// noTTL: no record with an expiry was ever written into the shard's
	// user data (keyNoTTL). Only Bootstrap sets it; an Apply or a replayed
	// log that writes such a record clears it.
	noTTL bool
}

var marshalOpts = proto.MarshalOptions{Deterministic: true}

func (st *state) setConf(cs *raftpb.ConfState) error {
	b, err := marshalOpts.Marshal(cs)
	if err != nil {
		return fmt.Errorf("shard: encode conf state: %w", err)
	}
	st.conf, st.confBytes = cs, b
	return nil
}

func (st *state) setDesc(d *shalev1.ShardDescriptor) error {
	if d == nil {
		st.desc, st.descBytes = nil, nil
		return nil
	}
	b, err := marshalOpts.Marshal(d)
	if err != nil {
		return fmt.Errorf("shard: encode descriptor: %w", err)
	}
	st.desc, st.descBytes = d, b
	return nil
}

// fixedAppliedRecordLen is the size of keyApplied's value in format 2:
// index, term, revision and dedup bounds as 8 bytes big-endian each, then
// the entry date (hlc encoding).
const fixedAppliedRecordLen = 5*8 + hlc.EncodedLen

// compactAppliedTag is the first byte of keyApplied's value from format 3
// on. A format 2 record starts with the top byte of a big-endian applied
// index, which is 0 for any index below 2^56, so the two are told apart by
// their first byte.
const compactAppliedTag = 3

// maxAppliedRecordLen bounds the compact encoding: the tag, seven uvarints.
const maxAppliedRecordLen = 1 + 7*binary.MaxVarintLen64

// appliedRecord encodes the state that changes with every Apply (format
// 3): compactAppliedTag, then index, term, revision, oldest live and next
// dedup sequence, the entry date's wall nanoseconds and logical counter as
// uvarints (about 24 bytes, against format 2's 52; the engine's WAL and
// table checksums cover it).
func (st *state) appliedRecord(buf []byte) []byte {
	buf = append(buf, compactAppliedTag)
	for _, v := range [...]uint64{st.index, st.term, st.rev, st.dedupOldest, st.dedupNext, uint64(st.hlc.WallNanos), uint64(st.hlc.Logical)} {
		buf = binary.AppendUvarint(buf, v)
	}
	return buf
}

// decodeAppliedRecord decodes keyApplied's value in format 3's compact
// encoding or format 2's fixed one into st's index, term, revision, dedup
// bounds and entry date.
func decodeAppliedRecord(b []byte, st *state) error {
	if len(b) == fixedAppliedRecordLen && b[0] == 0 {
		st.index = binary.BigEndian.Uint64(b[:8])
		st.term = binary.BigEndian.Uint64(b[8:])
		st.rev = binary.BigEndian.Uint64(b[16:])
		st.dedupOldest = binary.BigEndian.Uint64(b[24:])
		st.dedupNext = binary.BigEndian.Uint64(b[32:])
		ts, err := hlc.Decode(b[40:])
		if err != nil {
			return fmt.Errorf("%w: entry date: %v", ErrCorrupt, err)
		}
		st.hlc = ts
		return nil
	}
	if len(b) == 0 || b[0] != compactAppliedTag {
		return fmt.Errorf("%w: applied state record of %d bytes is in no known encoding", ErrCorrupt, len(b))
	}
	var wall, logical uint64
	p := b[1:]
	for _, f := range [...]*uint64{&st.index, &st.term, &st.rev, &st.dedupOldest, &st.dedupNext, &wall, &logical} {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return fmt.Errorf("%w: applied state record: bad varint", ErrCorrupt)
		}
		*f, p = v, p[n:]
	}
	if len(p) != 0 || wall > math.MaxInt64 || logical > math.MaxUint32 {
		return fmt.Errorf("%w: applied state record: %d trailing bytes, date %d.%d", ErrCorrupt, len(p), wall, logical)
	}
	st.hlc = hlc.Timestamp{WallNanos: int64(wall), Logical: uint32(logical)}
	return nil
}

// writeMeta stages the metadata records of st into b: those that differ
// from old, the state the engine holds, or all of them when old is nil or
// the engine is of format 1 (old or st read from one; then it deletes what
// format 1 kept apart).
func (st *state) writeMeta(b *storage.Batch, old *state) {
	legacy := st.legacy || (old != nil && old.legacy)
	full := old == nil || legacy
	var buf [maxAppliedRecordLen]byte
	b.Set(keyApplied, st.appliedRecord(buf[:0]))
	if full || !bytes.Equal(st.confBytes, old.confBytes) {
		b.Set(keyConfState, st.confBytes)
	}
	if st.desc != nil && (full || !bytes.Equal(st.descBytes, old.descBytes)) {
		b.Set(keyDescriptor, st.descBytes)
	}
	// appendAbsorbed makes a new list: the same list is the same backing array.
	if len(st.absorbed) > 0 && (full || len(st.absorbed) != len(old.absorbed) || &st.absorbed[0] != &old.absorbed[0]) {
		b.Set(keyAbsorbed, encodeAbsorbed(st.absorbed))
	}
	if full || st.format != formatVersion {
		b.Set(keyFormat, []byte{formatVersion})
	}
	switch {
	case st.dedupLegacyEnd == 0:
	case st.dedupOldest >= st.dedupLegacyEnd:
		// The table evicted the last entry of an older format: drop them
		// all (the compaction filter would, one compaction at a time).
		b.DeleteRange(legacyDedupPrefix, prefixEnd(legacyDedupPrefix))
		b.Delete(keyDedupLegacyEnd)
		st.dedupLegacyEnd = 0
	case full || st.format != formatVersion:
		b.Set(keyDedupLegacyEnd, binary.AppendUvarint(nil, st.dedupLegacyEnd))
	}
	switch {
	case st.noTTL && (full || !old.noTTL):
		b.Set(keyNoTTL, nil)
	case !st.noTTL && (full || old.noTTL):
		b.Delete(keyNoTTL)
	}
	st.format = formatVersion
	if legacy {
		b.Delete(keyRevision)
		b.Delete(keyDedupBounds)
		b.Delete(keyHLC)
		b.DeleteRange(dedupSeqPrefix, prefixEnd(dedupSeqPrefix))
	}
	st.legacy = false
}

// appliedInfo is what readers need of the applied state at one point.
type appliedInfo struct {
	index, rev uint64
	// dedupOldest is the oldest live sequence of the dedup table.
	dedupOldest uint64
}

// readApplied reads the applied state's index, revision and oldest live
// dedup sequence (either format); zero when the engine has no metadata.
func readApplied(g getter) (appliedInfo, error) {
	b, ok, err := getOpt(g, keyApplied)
	if err != nil || !ok {
		return appliedInfo{}, err
	}
	var st state
	if len(b) == 16 { // format 1
		if err := loadLegacyState(g, &st); err != nil {
			return appliedInfo{}, err
		}
		return appliedInfo{index: binary.BigEndian.Uint64(b), rev: st.rev, dedupOldest: st.dedupOldest}, nil
	}
	if err := decodeAppliedRecord(b, &st); err != nil {
		return appliedInfo{}, err
	}
	return appliedInfo{index: st.index, rev: st.rev, dedupOldest: st.dedupOldest}, nil
}

// getter is what loadState reads from: a DB or a snapshot.
type getter interface {
	Get(key []byte) ([]byte, error)
}

// getOpt reads key, returning nil, false for an absent key.
func getOpt(g getter, key []byte) ([]byte, bool, error) {
	v, err := g.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

// loadState reads the applied state from the engine. found is false when
// the engine holds no shard metadata.
func loadState(g getter) (_ *state, found bool, _ error) {
	f, ok, err := getOpt(g, keyFormat)
	if err != nil {
		return nil, false, fmt.Errorf("shard: read metadata: %w", err)
	}
	if !ok {
		return nil, false, nil
	}
	if len(f) != 1 || f[0] < 1 || f[0] > formatVersion {
		return nil, false, fmt.Errorf("%w: unsupported metadata format %x", ErrCorrupt, f)
	}
	st := &state{legacy: f[0] == 1, format: f[0]}
	applied, ok, err := getOpt(g, keyApplied)
	if err != nil {
		return nil, false, fmt.Errorf("shard: read applied state: %w", err)
	}
	if !ok {
		return nil, false, fmt.Errorf("%w: applied state record missing", ErrCorrupt)
	}
	if st.legacy {
		if len(applied) != 16 {
			return nil, false, fmt.Errorf("%w: format 1 applied state record of %d bytes", ErrCorrupt, len(applied))
		}
		st.index = binary.BigEndian.Uint64(applied[:8])
		st.term = binary.BigEndian.Uint64(applied[8:])
		if err := loadLegacyState(g, st); err != nil {
			return nil, false, err
		}
	} else if err := decodeAppliedRecord(applied, st); err != nil {
		return nil, false, err
	}
	if st.dedupOldest > st.dedupNext {
		return nil, false, fmt.Errorf("%w: dedup bounds [%d, %d)", ErrCorrupt, st.dedupOldest, st.dedupNext)
	}
	if st.format < dedupFormat {
		// Every entry of the table was written in the old layout.
		st.dedupLegacyEnd = st.dedupNext
	} else if b, ok, err := getOpt(g, keyDedupLegacyEnd); err != nil {
		return nil, false, fmt.Errorf("shard: read the dedup table's legacy bound: %w", err)
	} else if ok {
		end, n := binary.Uvarint(b)
		if n <= 0 || n != len(b) || end > st.dedupNext {
			return nil, false, fmt.Errorf("%w: dedup legacy bound record %x (next sequence %d)", ErrCorrupt, b, st.dedupNext)
		}
		st.dedupLegacyEnd = end
	}

	cs := &raftpb.ConfState{}
	if b, ok, err := getOpt(g, keyConfState); err != nil {
		return nil, false, fmt.Errorf("shard: read conf state: %w", err)
	} else if ok {
		if err := proto.Unmarshal(b, cs); err != nil {
			return nil, false, fmt.Errorf("%w: conf state: %v", ErrCorrupt, err)
		}
	}
	if err := st.setConf(cs); err != nil {
		return nil, false, err
	}
	if b, ok, err := getOpt(g, keyDescriptor); err != nil {
		return nil, false, fmt.Errorf("shard: read descriptor: %w", err)
	} else if ok {
		d := &shalev1.ShardDescriptor{}
		if err := proto.Unmarshal(b, d); err != nil {
			return nil, false, fmt.Errorf("%w: descriptor: %v", ErrCorrupt, err)
		}
		if err := st.setDesc(d); err != nil {
			return nil, false, err
		}
	}
	if _, st.noTTL, err = getOpt(g, keyNoTTL); err != nil {
		return nil, false, fmt.Errorf("shard: read the no-TTL mark: %w", err)
	}
	if b, ok, err := getOpt(g, keyAbsorbed); err != nil {
		return nil, false, fmt.Errorf("shard: read absorbed ranges: %w", err)
	} else if ok {
		if st.absorbed, err = decodeAbsorbed(b); err != nil {
			return nil, false, err
		}
	}
	return st, true, nil
}

// loadLegacyState reads the records a format 1 engine kept apart from
// keyApplied: revision, dedup bounds and entry date.
func loadLegacyState(g getter, st *state) error {
	if b, ok, err := getOpt(g, keyRevision); err != nil {
		return fmt.Errorf("shard: read revision: %w", err)
	} else if ok {
		if len(b) != 8 {
			return fmt.Errorf("%w: revision record is %d bytes", ErrCorrupt, len(b))
		}
		st.rev = binary.BigEndian.Uint64(b)
	}
	if b, ok, err := getOpt(g, keyDedupBounds); err != nil {
		return fmt.Errorf("shard: read dedup bounds: %w", err)
	} else if ok {
		if len(b) != 16 {
			return fmt.Errorf("%w: dedup bounds record is %d bytes", ErrCorrupt, len(b))
		}
		st.dedupOldest = binary.BigEndian.Uint64(b[:8])
		st.dedupNext = binary.BigEndian.Uint64(b[8:])
	}
	if b, ok, err := getOpt(g, keyHLC); err != nil {
		return fmt.Errorf("shard: read entry date: %w", err)
	} else if ok {
		if len(b) != hlc.EncodedLen {
			return fmt.Errorf("%w: entry date record is %d bytes", ErrCorrupt, len(b))
		}
		if st.hlc, err = hlc.Decode(b); err != nil {
			return fmt.Errorf("%w: entry date: %v", ErrCorrupt, err)
		}
	}
	return nil
}

// emptyState is the state of an uninitialized replica.
func emptyState() *state {
	st := &state{}
	_ = st.setConf(&raftpb.ConfState{})
	return st
}

// Shard is one shard replica's state machine: a storage engine holding the
// shard's data and metadata, with the deterministic apply logic of KV and
// system commands. It implements replication.StateMachine.
//
// Apply, Restore and Close are serialised with each other; Flush,
// Checkpoint and AppliedState may run concurrently with Apply (they wait
// for Restore and Close). The read methods (Get, MultiGet, Scan, Nodes,
// Shards, Checksum, ...) are safe to call concurrently with all of them and
// with each other; each read sees the engine at a single point in its
// history.
type Shard struct {
	dir      string
	opts     Options // as given (the right-hand shards of splits reuse them)
	fs       vfs.FS
	engOpts  storage.Options
	log      *slog.Logger
	dedupCap uint64

	// applyMu serialises Apply, Restore and Close.
	applyMu sync.Mutex
	// applyBatch and applyWrites are Apply's batch and overlay, kept (under
	// applyMu) so a busy shard does not grow new ones on every call.
	applyBatch  *storage.Batch
	applyWrites map[string]ovWrite
	// recordSpace is the shard's namespace in opts.RecordCache (under
	// applyMu; nil without a cache): a new one forgets every record cached
	// before. recordKeyBuf is the buffer its cache keys are built in.
	recordSpace  *recordSpace
	recordKeyBuf []byte

	// failMu guards failed, the error that stopped the Shard: every later
	// Apply, Flush and Checkpoint returns it.
	failMu sync.Mutex
	failed error

	// dbMu guards the db pointer: readers, Flush and Checkpoint hold it
	// shared while they use the engine; Restore and Close hold it
	// exclusively to swap or close it. Apply reads db under applyMu alone
	// (only applyMu holders change it).
	dbMu sync.RWMutex
	db   *storage.DB

	// ttlWrites counts records with an expiry this Shard applied (puts
	// with a TTL, absorbed records), since it was opened.
	ttlWrites atomic.Uint64
	// logGen counts the engines Restore moved in: a change-log position
	// of an earlier engine is void. Guarded like db.
	logGen uint64

	// dedupFloor is the oldest live dedup sequence of the state of the
	// engine open now (0 while an engine opens): compactions drop the
	// dedup entries below it (dedupFilter).
	dedupFloor atomic.Uint64

	// changed is the channel Changed handed out (nil when none is
	// waiting), closed at the next change.
	changed atomic.Pointer[chan struct{}]

	// logCursor is where the last ReadLogAfter stopped, or the log's end
	// when the last backup checkpoint was taken: the next backup of the
	// shard asks for the entries after that index (or a little later),
	// and reads from there instead of from the oldest WAL batch.
	logCursor atomic.Pointer[logCursor]
	// logBatchesRead counts the WAL batches ReadLogAfter read (tests).
	logBatchesRead atomic.Int64

	st atomic.Pointer[state]
}

// failure returns the error that stopped the Shard, if any.
func (s *Shard) failure() error {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failed
}

// fail records err as the error that stops the Shard and returns it.
func (s *Shard) fail(err error) error {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	s.failed = err
	return err
}

func newShard(dir string, opts Options) *Shard {
	s := &Shard{dir: filepath.Clean(dir), opts: opts, log: opts.Logger, recordSpace: opts.RecordCache.namespace()}
	if s.log == nil {
		s.log = slog.Default()
	}
	if opts.Storage != nil {
		s.engOpts = *opts.Storage
	}
	if s.engOpts.Logger == nil {
		s.engOpts.Logger = s.log
	}
	s.fs = s.engOpts.FS
	if s.fs == nil {
		s.fs = vfs.Default
	}
	s.dedupCap = DefaultDedupCapacity
	if opts.DedupCapacity > 0 {
		s.dedupCap = uint64(opts.DedupCapacity)
	}
	if s.engOpts.WALArchiveMaxBytes == 0 {
		s.engOpts.WALArchiveMaxBytes = DefaultWALArchiveBytes
	}
	if s.engOpts.PeriodicCompaction == 0 {
		s.engOpts.PeriodicCompaction = DefaultPeriodicCompaction
	}
	s.engOpts.HistoryHorizon = true
	s.engOpts.HistoryWindow = historyBound(opts.HistoryWindow, DefaultHistoryWindow)
	s.engOpts.HistoryWindowBytes = historyBound(opts.HistoryWindowBytes, DefaultHistoryWindowBytes)
	s.engOpts.CompactionFilter = dedupFilter{s: s, next: s.engOpts.CompactionFilter}
	return s
}

// historyBound maps a history bound of Options to the engine's: 0 is def,
// negative is none (0 for the engine).
func historyBound[T time.Duration | int64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// publish makes st the shard's applied state.
func (s *Shard) publish(st *state) {
	s.st.Store(st)
	s.dedupFloor.Store(st.dedupOldest)
}

// dedupFilter drops, in compactions, the dedup entries the table evicted
// (below its oldest live sequence), and hands every other entry to next.
// Evicting writes nothing (see dedupStore): this is where the space goes.
type dedupFilter struct {
	s    *Shard
	next storage.CompactionFilter
}

func (f dedupFilter) Name() string { return "shard.dedup" }

func (f dedupFilter) Filter(level int, key, value []byte) (storage.FilterDecision, []byte) {
	if legacy := bytes.HasPrefix(key, legacyDedupPrefix); legacy || bytes.HasPrefix(key, dedupPrefix) {
		if seq, _, ok := splitDedupEntry(value, legacy); ok && seq < f.s.dedupFloor.Load() {
			return storage.FilterRemove, nil
		}
		return storage.FilterKeep, nil
	}
	if f.next != nil {
		return f.next.Filter(level, key, value)
	}
	return storage.FilterKeep, nil
}

// engineOptions returns a fresh copy of the engine options.
func (s *Shard) engineOptions() *storage.Options {
	o := s.engOpts
	return &o
}

// Bootstrap creates a new shard engine in dir, which must not exist, with
// the applied state st (index, term, configuration and descriptor; the
// descriptor is required) written durably (synced) before it returns. It is
// used for the initial shards of a new cluster.
func Bootstrap(dir string, st replication.AppliedState, opts Options) (*Shard, error) {
	if st.Descriptor == nil {
		return nil, fmt.Errorf("shard: bootstrap %s: a descriptor is required", dir)
	}
	s := newShard(dir, opts)
	if err := s.checkAbsent(); err != nil {
		return nil, err
	}
	o := s.engineOptions()
	o.ErrorIfExists = true
	db, err := storage.Open(s.dir, o)
	if err != nil {
		return nil, fmt.Errorf("shard: bootstrap %s: %w", dir, err)
	}
	// The new engine holds no user record, so none with an expiry.
	ns := &state{index: st.Index, term: st.Term, noTTL: true}
	err = ns.setConf(cloneConfState(st.ConfState))
	if err == nil {
		err = ns.setDesc(cloneDesc(st.Descriptor))
	}
	if err == nil {
		b := storage.NewBatch()
		ns.writeMeta(b, nil)
		err = db.Apply(b, storage.Sync)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("shard: bootstrap %s: %w", dir, err)
	}
	s.db = db
	s.publish(ns)
	if s.recordSpace != nil {
		// The new engine holds no user key, and every later write of one
		// is an Apply's, which leaves it in the record cache.
		s.recordSpace.complete.Store(true)
	}
	return s, nil
}

// replayLog writes the entries replay passes after ns's applied index into
// the engine, and moves ns's revision and date to the last one's.
func (s *Shard) replayLog(ns *state, replay func(apply func(*LoggedEntry) error) error) error {
	next := ns.index + 1
	// Consecutive entries' writes go into one batch of up to
	// replayBatchBytes (a batch keeps its writes' order, each at its own
	// sequence number), not one engine write per entry.
	b := storage.NewBatch()
	err := replay(func(e *LoggedEntry) error {
		if e.Mark.Index != next {
			return fmt.Errorf("replay: entry %d where %d was due", e.Mark.Index, next)
		}
		if e.Range != nil {
			return fmt.Errorf("replay: entry %d changed the shard's range", e.Mark.Index)
		}
		for _, op := range e.Ops {
			if !isDataKey(op.Key) {
				return fmt.Errorf("replay: entry %d writes %q, outside user data", e.Mark.Index, op.Key)
			}
			switch op.Kind {
			case storage.KindSet:
				if ns.noTTL {
					v, err := decodeValue(op.Value)
					if err != nil {
						return fmt.Errorf("replay: entry %d: key %q: %w", e.Mark.Index, op.Key[1:], err)
					}
					ns.noTTL = v.expire == 0
				}
				b.Set(op.Key, op.Value)
			case storage.KindDelete:
				b.Delete(op.Key)
			case storage.KindRangeDelete:
				if !isDataKey(op.Value) || bytes.Compare(op.Key, op.Value) >= 0 {
					return fmt.Errorf("replay: entry %d deletes the range [%q, %q)", e.Mark.Index, op.Key, op.Value)
				}
				b.DeleteRange(op.Key, op.Value)
			default:
				return fmt.Errorf("replay: entry %d holds a write of kind %d", e.Mark.Index, op.Kind)
			}
		}
		if b.Len() >= replayBatchBytes {
			if err := s.db.Apply(b, storage.NoSync); err != nil {
				return err
			}
			b.Reset()
		}
		ns.rev, ns.hlc = e.Mark.Revision, e.Mark.HLC
		next++
		return nil
	})
	if err == nil && !b.Empty() {
		err = s.db.Apply(b, storage.NoSync)
	}
	return err
}

// replayBatchBytes is the size at which a log replay writes its batch:
// large enough that an engine write's fixed cost is spread over hundreds of
// entries, small enough that the batch stays in memory the replay already
// touched (at 4 MiB each part's replay grew it, and the engine's WAL buffer
// then, into fresh pages: at 256 KiB a restore's nodes spent 0.88x the CPU;
// docs/BENCHMARKS.md, "Smaller log-replay batches").
const replayBatchBytes = 256 << 10

// checkAbsent fails unless the shard's directory does not exist yet.
func (s *Shard) checkAbsent() error {
	if _, err := s.fs.Stat(s.dir); err == nil {
		return fmt.Errorf("shard: bootstrap %s: directory already exists", s.dir)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("shard: bootstrap %s: %w", s.dir, err)
	}
	return nil
}

// restoreMarker is a file in a shard's directory while BootstrapFrom
// creates it from a backup's part. A directory holding it is unfinished:
// Open refuses it (ErrUnfinishedRestore), and it may be deleted and the
// part restored again.
const restoreMarker = "RESTORING"

// ErrUnfinishedRestore is returned by Open for the directory of a shard
// that BootstrapFrom did not finish creating (its node stopped during a
// restore); the directory may be deleted and the shard restored again.
var ErrUnfinishedRestore = errors.New("shard: an unfinished restore's copy")

// BootstrapFrom creates the shard in dir from src, a checkpoint of a shard
// of another cluster (a backup's part), which it moves into dir (so src
// must be on dir's filesystem). The checkpoint's data, revision, dates and
// deduplication table are kept; its applied state (index, term,
// configuration, descriptor) becomes st, the new Raft group's initial
// state. st's descriptor must cover the checkpoint's key range exactly.
//
// replay, when set, carries the checkpoint forward before that: it calls
// apply with the entries applied after the checkpoint, in order (a
// backup's log), whose writes go into the engine; the revision and date
// become the last entry's. An entry that changed the range, or one out of
// order, fails the bootstrap. Until the new state is durable, dir carries
// a marker that makes Open refuse it (ErrUnfinishedRestore), so a node
// stopped mid-bootstrap never opens a shard with part of its log replayed.
func BootstrapFrom(dir, src string, st replication.AppliedState, opts Options, replay func(apply func(*LoggedEntry) error) error) (*Shard, error) {
	if st.Descriptor == nil {
		return nil, fmt.Errorf("shard: bootstrap %s: a descriptor is required", dir)
	}
	s := newShard(dir, opts)
	if err := s.checkAbsent(); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := s.fs.MkdirAll(filepath.Dir(s.dir), 0o755); err != nil {
		return nil, fmt.Errorf("shard: bootstrap %s: %w", dir, err)
	}
	// The directory carries restoreMarker until its new applied state is
	// durable: a node stopped before that finds it unfinished at its next
	// start (Open: ErrUnfinishedRestore), not a shard with the backup's
	// state and part of its log replayed.
	marker, err := s.fs.Create(s.fs.Join(src, restoreMarker))
	if err == nil {
		err = marker.Close()
	}
	if err == nil {
		err = vfs.SyncDir(s.fs, src)
	}
	if err != nil {
		return nil, fmt.Errorf("shard: bootstrap %s: mark %s unfinished: %w", dir, src, err)
	}
	if err := s.fs.Rename(src, s.dir); err != nil {
		return nil, fmt.Errorf("shard: bootstrap %s from %s: %w", dir, src, err)
	}
	if err := vfs.SyncDir(s.fs, filepath.Dir(s.dir)); err != nil {
		return nil, fmt.Errorf("shard: bootstrap %s: %w", dir, err)
	}
	t1 := time.Now()
	o := s.engineOptions()
	o.ErrorIfNotExists = true
	if err := s.openEngine(o, true); err != nil {
		return nil, fmt.Errorf("shard: bootstrap %s from a checkpoint: %w", dir, err)
	}
	t2 := time.Now()
	old := s.st.Load()
	if !bytes.Equal(old.desc.GetStartKey(), st.Descriptor.GetStartKey()) || !bytes.Equal(old.desc.GetEndKey(), st.Descriptor.GetEndKey()) {
		_ = s.db.Close()
		return nil, fmt.Errorf("shard: bootstrap %s: the checkpoint holds [%q, %q), not [%q, %q)", dir,
			old.desc.GetStartKey(), old.desc.GetEndKey(), st.Descriptor.GetStartKey(), st.Descriptor.GetEndKey())
	}
	ns := *old
	if replay != nil {
		if err := s.replayLog(&ns, replay); err != nil {
			_ = s.db.Close()
			return nil, fmt.Errorf("shard: bootstrap %s: %w", dir, err)
		}
	}
	t3 := time.Now()
	ns.index, ns.term = st.Index, st.Term
	err = ns.setConf(cloneConfState(st.ConfState))
	if err == nil {
		err = ns.setDesc(cloneDesc(st.Descriptor))
	}
	if err == nil {
		b := storage.NewBatch()
		ns.writeMeta(b, nil)
		err = s.db.Apply(b, storage.Sync)
	}
	if err == nil {
		err = s.fs.Remove(s.fs.Join(s.dir, restoreMarker))
	}
	if err == nil {
		err = vfs.SyncDir(s.fs, s.dir)
	}
	if err != nil {
		_ = s.db.Close()
		return nil, fmt.Errorf("shard: bootstrap %s: %w", dir, err)
	}
	s.publish(&ns)
	t4 := time.Now()
	s.log.Debug("shard bootstrapped from a copy", "shard", s.dir, "took", t4.Sub(t0), "move", t1.Sub(t0),
		"open", t2.Sub(t1), "replay", t3.Sub(t2), "persist", t4.Sub(t3))
	return s, nil
}

// Open opens an existing shard engine in dir and loads its applied state.
// It fails with an error wrapping ErrNoMetadata when the engine holds no
// shard metadata, with ErrUnfinishedSplit when dir is the copy of a split
// that did not finish, with ErrUnfinishedRestore when dir is a shard
// BootstrapFrom did not finish, and with the engine's error when dir holds no
// engine. It first completes or rolls back a Restore interrupted by a
// crash (see Restore).
func Open(dir string, opts Options) (*Shard, error) {
	s := newShard(dir, opts)
	if err := s.recoverRestore(); err != nil {
		return nil, err
	}
	for marker, unfinished := range map[string]error{splitMarker: ErrUnfinishedSplit, restoreMarker: ErrUnfinishedRestore} {
		if _, err := s.fs.Stat(s.fs.Join(s.dir, marker)); err == nil {
			return nil, fmt.Errorf("shard: open %s: %w", s.dir, unfinished)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("shard: open %s: %w", s.dir, err)
		}
	}
	o := s.engineOptions()
	o.ErrorIfNotExists = true
	if err := s.openEngine(o, true); err != nil {
		return nil, err
	}
	return s, nil
}

// OpenEmpty opens the engine in dir, creating it if needed, for a replica
// created on demand (a new learner receiving its first message). Until a
// snapshot is Restored, AppliedState is zero with a nil descriptor. If the
// engine already holds shard metadata (the replica was restored before a
// restart), that state is loaded, as Open does.
func OpenEmpty(dir string, opts Options) (*Shard, error) {
	s := newShard(dir, opts)
	if err := s.recoverRestore(); err != nil {
		return nil, err
	}
	if err := s.openEngine(s.engineOptions(), false); err != nil {
		return nil, err
	}
	return s, nil
}

// openEngine opens the engine in s.dir and loads its state; with
// requireMeta, missing metadata is an error.
func (s *Shard) openEngine(o *storage.Options, requireMeta bool) error {
	db, st, err := s.loadEngine(o, requireMeta)
	if err != nil {
		return err
	}
	s.db = db
	s.publish(st)
	return nil
}

// loadEngine opens the engine in s.dir and reads its state, without making
// either the shard's; with requireMeta, missing metadata is an error.
func (s *Shard) loadEngine(o *storage.Options, requireMeta bool) (*storage.DB, *state, error) {
	// Until its state is loaded, the compactions of the engine opening
	// (a recovery's flushes) drop no dedup entry.
	s.dedupFloor.Store(0)
	db, err := storage.Open(s.dir, o)
	if err != nil {
		return nil, nil, fmt.Errorf("shard: open %s: %w", s.dir, err)
	}
	st, found, err := loadState(db)
	if err == nil && !found {
		if requireMeta {
			err = ErrNoMetadata
		} else {
			st = emptyState()
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("shard: open %s: %w", s.dir, err)
	}
	return db, st, nil
}

// AppliedState reports the last applied entry, the configuration and the
// descriptor after it, as last made visible by Apply, Bootstrap, Open or
// Restore. The returned values are copies the caller may keep and modify.
func (s *Shard) AppliedState() replication.AppliedState {
	st := s.st.Load()
	return replication.AppliedState{
		Index:      st.index,
		Term:       st.term,
		ConfState:  cloneConfState(st.conf),
		Descriptor: cloneDesc(st.desc),
		Retired:    st.desc.GetRetired(),
	}
}

// AppliedDescriptor returns the shard's current descriptor, shared: the
// caller must not modify it. It is the same pointer until the descriptor
// changes (nil for an uninitialized replica).
func (s *Shard) AppliedDescriptor() *shalev1.ShardDescriptor { return s.st.Load().desc }

// Descriptor returns a copy of the shard's current descriptor, nil for an
// uninitialized replica.
func (s *Shard) Descriptor() *shalev1.ShardDescriptor { return cloneDesc(s.st.Load().desc) }

// Revision returns the shard's revision after the last applied command: the
// number of applied commands that wrote something.
func (s *Shard) Revision() uint64 { return s.st.Load().rev }

// Dir returns the directory of the shard's engine.
func (s *Shard) Dir() string { return s.dir }

// Flush makes every applied command durable without the Raft log (by
// syncing the engine's WAL, which Apply writes without syncing) and returns
// the applied index that is now durable: the Raft log may be truncated up to
// it. It may run concurrently with Apply; commands applied meanwhile may or
// may not be covered, but the returned index always is.
func (s *Shard) Flush() (uint64, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if err := s.failure(); err != nil {
		return 0, err
	}
	if s.db == nil {
		return 0, ErrClosed
	}
	// Apply publishes an index only after its batch is acknowledged by the
	// engine (in its WAL), and SyncWAL covers every write acknowledged
	// before it starts, so the index read here is covered.
	index := s.st.Load().index
	if err := s.db.SyncWAL(); err != nil {
		return 0, fmt.Errorf("shard: sync wal %s: %w", s.dir, err)
	}
	return index, nil
}

// FlushMemTables writes what the engine holds in memory to SSTs and waits
// until they are durable. A split's apply checkpoints the engine after
// flushing it, inside the shard's apply: a leader calls this before it
// proposes a split, so that the apply flushes only what was written since
// and requests behind the split wait less. It may run concurrently with
// Apply and changes no applied state.
func (s *Shard) FlushMemTables() error {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if err := s.failure(); err != nil {
		return err
	}
	if s.db == nil {
		return ErrClosed
	}
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("shard: flush %s: %w", s.dir, err)
	}
	return nil
}

// Checkpoint writes an openable copy of the engine into dir (which must not
// exist; on the same filesystem) and returns the applied state the copy
// holds, read at the copy's cut (from a snapshot of the engine taken with
// it), so the state and the data always describe the same applied index. It may run concurrently with
// Apply, which it pauses only while the engine takes its cut (SSTs are
// hard-linked).
func (s *Shard) Checkpoint(dir string) (replication.AppliedState, error) {
	st, _, err := s.checkpoint(dir, false)
	if err != nil {
		return replication.AppliedState{}, err
	}
	return st.applied(), nil
}

// BackupCheckpoint is Checkpoint for a backup: it also returns the date of
// the last entry the copy holds.
//
// It also leaves a log cursor at the end of the change log as it was just
// before the copy, so that the first incremental backup after it (which
// asks for the entries after the copy's index) reads the log from there
// rather than from its oldest batch.
//
// The copy is only to be read and sent, not opened where it is: its WAL
// files are hard-linked, not copied (storage.DB.CheckpointToSend), and
// lengths gives, for each of them, the number of its first bytes the
// checkpoint holds (snapshot.Options.Lengths sends just those).
func (s *Shard) BackupCheckpoint(dir string) (_ replication.AppliedState, _ hlc.Timestamp, lengths map[string]int64, _ error) {
	if pos, index, err := s.logEnd(); err == nil {
		s.logCursor.Store(&logCursor{index: index, pos: pos})
	}
	st, lengths, err := s.checkpoint(dir, true)
	if err != nil {
		return replication.AppliedState{}, hlc.Timestamp{}, nil, err
	}
	return st.applied(), st.hlc, lengths, nil
}

// logEnd returns the position after the last batch of the change log and
// the index of the last entry applied, which that batch ends with.
func (s *Shard) logEnd() (ChangeLogPosition, uint64, error) {
	s.applyMu.Lock() // as ChangeLogEnd: no entry applies meanwhile
	defer s.applyMu.Unlock()
	if s.db == nil {
		return ChangeLogPosition{}, 0, ErrClosed
	}
	it, err := s.db.UpdatesSince(s.db.LastSeq() + 1)
	if err != nil {
		return ChangeLogPosition{}, 0, fmt.Errorf("shard %s: change log end: %w", s.dir, err)
	}
	defer it.Close()
	return ChangeLogPosition{pos: it.Position(), gen: s.logGen}, s.st.Load().index, nil
}

// checkpoint copies the shard into dir; toSend links its WALs and returns
// their lengths (BackupCheckpoint).
func (s *Shard) checkpoint(dir string, toSend bool) (*state, map[string]int64, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if err := s.failure(); err != nil {
		return nil, nil, err
	}
	if s.db == nil {
		return nil, nil, ErrClosed
	}
	// The state is read from a snapshot of the live engine at the
	// checkpoint's cut, which holds what the copy holds: opening the copy
	// would replay its WAL into a memtable, most of a small shard's data.
	take := s.db.CheckpointAndSnapshot
	if toSend {
		take = s.db.CheckpointToSend
	}
	info, snap, err := take(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("shard: checkpoint %s into %s: %w", s.dir, dir, err)
	}
	defer func() { _ = snap.Close() }()
	st, err := checkpointState(snap, dir)
	return st, info.Lengths, err
}

// checkpointState reads the applied state of the checkpoint in dir from g
// (the copy, or the engine as of its cut); a copy without shard metadata
// is an error.
func checkpointState(g getter, dir string) (*state, error) {
	st, found, err := loadState(g)
	if err != nil {
		return nil, fmt.Errorf("shard: checkpoint %s: %w", dir, err)
	}
	if !found || st.desc == nil {
		return nil, fmt.Errorf("shard: checkpoint %s: %w", dir, ErrNoMetadata)
	}
	return st, nil
}

// applied is the replication view of st.
func (st *state) applied() replication.AppliedState {
	return replication.AppliedState{
		Index:      st.index,
		Term:       st.term,
		ConfState:  st.conf,
		Descriptor: st.desc,
	}
}

// restoreOldSuffix names the old engine directory set aside by Restore.
const restoreOldSuffix = ".restore-old"

// restoreRejectedSuffix names a checkpoint Restore moved into place and
// then refused (or found unfinished after a crash), on its way out.
const restoreRejectedSuffix = ".restore-rejected"

// installMarker is a file in a checkpoint while Restore installs it: an
// engine directory holding it has not been validated, and is rolled back
// (the old engine, set aside, put back) rather than opened.
const installMarker = "INSTALLING"

// Restore replaces the shard's whole state with the checkpoint in dir (made
// by Checkpoint on another replica of the same shard). The checkpoint is
// opened once, in place of the old engine: Restore marks dir unfinished
// (installMarker), closes the engine, renames its directory aside, renames
// dir into its place and syncs the parents, then opens it and checks that
// it holds shard metadata for the same shard ID. If it does, the mark is
// removed (synced) and the old directory deleted, and after the nil return
// AppliedState reports the copy's state; if it does not, or the open
// fails, the copy is deleted, the old engine put back and reopened, and
// the error returned. A crash in the middle leaves either the old engine
// or the validated new one in place, which the next Open or OpenEmpty
// completes. An error after the engine was closed leaves the Shard failed
// (every Apply returns an error), unless the old engine could be reopened.
func (s *Shard) Restore(dir string) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.recordSpace = s.opts.RecordCache.namespace() // the records change under it
	if s.db == nil {
		return ErrClosed
	}
	dir = filepath.Clean(dir)
	if dir == s.dir {
		return fmt.Errorf("shard: restore %s: checkpoint is the engine directory", dir)
	}
	if err := s.markInstalling(dir); err != nil {
		if rerr := s.fs.RemoveAll(dir); rerr != nil {
			s.log.Warn("shard: removing rejected checkpoint", "dir", dir, "err", rerr)
		}
		return err
	}

	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	s.logGen++
	defer s.notifyChanged()
	if err := s.db.Close(); err != nil {
		// The old engine is discarded anyway.
		s.log.Warn("shard: closing engine for restore", "dir", s.dir, "err", err)
	}
	s.db = nil
	// An uninitialized replica's old engine holds no metadata.
	oldHasMeta := s.st.Load().desc != nil
	if movedIn, err := s.swapDirs(dir); err != nil {
		if !movedIn {
			// The old engine is still (or again) in place: keep serving it.
			if oerr := s.openEngine(s.engineOptions(), oldHasMeta); oerr == nil {
				return err
			}
		}
		return s.fail(err)
	}
	o := s.engineOptions()
	o.ErrorIfNotExists = true
	db, st, err := s.loadEngine(o, true)
	if err == nil {
		if err = s.checkSameShard(st, dir); err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		// Refused: the old engine goes back in place and serves again.
		err = fmt.Errorf("shard: restore from %s: %w", dir, err)
		if rerr := s.rollBackInstall(); rerr != nil {
			return s.fail(errors.Join(err, rerr))
		}
		if oerr := s.openEngine(s.engineOptions(), oldHasMeta); oerr != nil {
			return s.fail(errors.Join(err, oerr))
		}
		return err
	}
	if err := s.finishInstall(); err != nil {
		_ = db.Close()
		return s.fail(err)
	}
	s.db = db
	s.publish(st)
	s.fail(nil) // a restored engine is healthy again
	return nil
}

// checkSameShard checks that st, a checkpoint's state, has a descriptor
// of the shard's own shard ID (any shard's for an uninitialized replica).
func (s *Shard) checkSameShard(st *state, dir string) error {
	if st.desc == nil {
		return fmt.Errorf("checkpoint %s: %w", dir, ErrNoMetadata)
	}
	if cur := s.st.Load().desc; cur != nil && cur.ShardId != st.desc.ShardId {
		return fmt.Errorf("checkpoint %s of shard %d into shard %d", dir, st.desc.ShardId, cur.ShardId)
	}
	return nil
}

// markInstalling writes installMarker into the checkpoint in dir, durably,
// before Restore moves it into place.
func (s *Shard) markInstalling(dir string) error {
	f, err := s.fs.Create(s.fs.Join(dir, installMarker))
	if err == nil {
		err = f.Close()
	}
	if err == nil {
		err = vfs.SyncDir(s.fs, dir)
	}
	if err != nil {
		return fmt.Errorf("shard: restore: mark %s: %w", dir, err)
	}
	return nil
}

// finishInstall makes the validated engine in place final: it removes its
// installMarker (synced), after which a crash keeps it, then deletes the
// old engine set aside.
func (s *Shard) finishInstall() error {
	if err := s.fs.Remove(s.fs.Join(s.dir, installMarker)); err != nil {
		return fmt.Errorf("shard: restore: %w", err)
	}
	if err := vfs.SyncDir(s.fs, s.dir); err != nil {
		return fmt.Errorf("shard: restore: %w", err)
	}
	old := s.dir + restoreOldSuffix
	if err := s.fs.RemoveAll(old); err != nil {
		s.log.Warn("shard: restore: removing old engine", "dir", old, "err", err)
	}
	return nil
}

// rollBackInstall replaces the unvalidated engine directory (still marked
// installMarker) with the old one set aside: it renames the engine
// directory to restoreRejectedSuffix, renames the old one back, syncs the
// parent and deletes the rejected one. A crash at any point leaves the old
// engine in place or set aside, which recoverRestore puts back.
func (s *Shard) rollBackInstall() error {
	rejected := s.dir + restoreRejectedSuffix
	if err := s.fs.RemoveAll(rejected); err != nil {
		return fmt.Errorf("shard: roll back restore: remove stale %s: %w", rejected, err)
	}
	if err := s.fs.Rename(s.dir, rejected); err != nil {
		return fmt.Errorf("shard: roll back restore: set aside %s: %w", s.dir, err)
	}
	if err := s.fs.Rename(s.dir+restoreOldSuffix, s.dir); err != nil {
		return fmt.Errorf("shard: roll back restore: put old engine back: %w", err)
	}
	if err := vfs.SyncDir(s.fs, filepath.Dir(s.dir)); err != nil {
		return fmt.Errorf("shard: roll back restore: %w", err)
	}
	if err := s.fs.RemoveAll(rejected); err != nil {
		s.log.Warn("shard: restore: removing rejected checkpoint", "dir", rejected, "err", err)
	}
	return nil
}

// swapDirs moves the engine directory aside and moves dir into its place,
// and syncs the parents; the old directory stays until finishInstall or
// rollBackInstall. movedIn reports whether dir replaced the engine
// directory (on error, false means the old engine is back in place).
func (s *Shard) swapDirs(dir string) (movedIn bool, _ error) {
	old := s.dir + restoreOldSuffix
	if err := s.fs.RemoveAll(old); err != nil {
		return false, fmt.Errorf("shard: restore: remove stale %s: %w", old, err)
	}
	if err := s.fs.Rename(s.dir, old); err != nil {
		return false, fmt.Errorf("shard: restore: set aside %s: %w", s.dir, err)
	}
	if err := s.fs.Rename(dir, s.dir); err != nil {
		err = fmt.Errorf("shard: restore: move %s into place: %w", dir, err)
		// Put the old engine back.
		if rerr := s.fs.Rename(old, s.dir); rerr != nil {
			return true, errors.Join(err, fmt.Errorf("put old engine back: %w", rerr))
		}
		return false, err
	}
	parents := []string{filepath.Dir(s.dir)}
	if p := filepath.Dir(dir); p != parents[0] {
		parents = append(parents, p)
	}
	for _, p := range parents {
		if err := vfs.SyncDir(s.fs, p); err != nil {
			return true, fmt.Errorf("shard: restore: %w", err)
		}
	}
	return true, nil
}

// recoverRestore finishes a Restore interrupted by a crash: a rejected
// copy left behind is deleted; if the engine directory is missing but the
// old one set aside exists, the old one is put back; if both exist, the
// engine directory is kept if it was validated (no installMarker) and the
// set-aside one deleted, and otherwise rolled back (rollBackInstall).
func (s *Shard) recoverRestore() error {
	if err := s.fs.RemoveAll(s.dir + restoreRejectedSuffix); err != nil {
		return fmt.Errorf("shard: open %s: %w", s.dir, err)
	}
	old := s.dir + restoreOldSuffix
	if _, err := s.fs.Stat(old); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("shard: open %s: %w", s.dir, err)
	}
	if _, err := s.fs.Stat(s.dir); errors.Is(err, os.ErrNotExist) {
		s.log.Warn("shard: rolling back an interrupted restore", "dir", s.dir)
		if err := s.fs.Rename(old, s.dir); err != nil {
			return fmt.Errorf("shard: open %s: roll back restore: %w", s.dir, err)
		}
		return vfs.SyncDir(s.fs, filepath.Dir(s.dir))
	} else if err != nil {
		return fmt.Errorf("shard: open %s: %w", s.dir, err)
	}
	if _, err := s.fs.Stat(s.fs.Join(s.dir, installMarker)); err == nil {
		s.log.Warn("shard: rolling back an interrupted restore of an unvalidated checkpoint", "dir", s.dir)
		if err := s.rollBackInstall(); err != nil {
			return fmt.Errorf("shard: open %s: %w", s.dir, err)
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("shard: open %s: %w", s.dir, err)
	}
	if err := s.fs.RemoveAll(old); err != nil {
		return fmt.Errorf("shard: open %s: remove %s: %w", s.dir, old, err)
	}
	return nil
}

// Close closes the engine (its WAL is synced, so a clean Close loses
// nothing applied). Reads afterwards return ErrClosed; closing twice is a
// no-op.
func (s *Shard) Close() error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.db == nil {
		return nil
	}
	defer s.notifyChanged()
	err := s.db.Close()
	s.db = nil
	if err != nil {
		return fmt.Errorf("shard: close %s: %w", s.dir, err)
	}
	return nil
}

func cloneDesc(d *shalev1.ShardDescriptor) *shalev1.ShardDescriptor {
	return codec.Clone(d) // nil for nil
}

func cloneConfState(cs *raftpb.ConfState) *raftpb.ConfState {
	if cs == nil {
		return &raftpb.ConfState{}
	}
	return codec.Clone(cs)
}
