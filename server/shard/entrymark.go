package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/replication/hlc"
)

// EntryMark is the change-log record the shard writes to its engine's WAL,
// as LogData, after the writes of every Raft entry it applies: which entry
// they came from and when. Tailing the WAL (storage.DB.UpdatesSince), the
// records of a batch up to a mark are that entry's writes (none for a
// no-op or a configuration change); a mark is never stored in the engine's
// key space, so reads do not see it.
type EntryMark struct {
	// ShardID is the shard that applied the entry.
	ShardID uint64
	// Index and Term are the entry's position in the shard's Raft log.
	Index, Term uint64
	// HLC dates the entry: its leader's hybrid-logical-clock reading when
	// it was proposed, moved just past the previous entry's date when not
	// later. Every replica dates an entry alike, and dates grow with Index.
	HLC hlc.Timestamp
	// Revision is the shard's revision after the entry.
	Revision uint64
}

// entryMarkVersion is the first byte of a format 3 EntryMark, a record of
// its own after the entry's changes record (logKindChanges). Format 4
// writes entry records (logKindEntry) instead; these are still read.
const entryMarkVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrNotEntryMark is matched (errors.Is) by DecodeEntryMark's error for
// input that is not an EntryMark of a version this build reads.
var ErrNotEntryMark = errors.New("shard: not an entry mark")

// Append appends m's encoding to b: an entry record (appendEntryRecord)
// with no changes.
func (m EntryMark) Append(b []byte) []byte { return appendEntryRecord(b, m, nil) }

// appendEntryRecord appends the entry record of an applied entry to b: the
// kind byte logKindEntry, the mark's shard ID, index, term and revision,
// its date's wall nanoseconds and logical counter, all uvarints, then
// changes (the entry's change items, appendChangeItem) and a CRC-32C of
// everything before it (4 bytes, big-endian).
func appendEntryRecord(b []byte, m EntryMark, changes []byte) []byte {
	start := len(b)
	b = append(b, logKindEntry)
	b = binary.AppendUvarint(b, m.ShardID)
	b = binary.AppendUvarint(b, m.Index)
	b = binary.AppendUvarint(b, m.Term)
	b = binary.AppendUvarint(b, m.Revision)
	b = binary.AppendUvarint(b, uint64(m.HLC.WallNanos))
	b = binary.AppendUvarint(b, uint64(m.HLC.Logical))
	b = append(b, changes...)
	return sealRecord(b, start)
}

// DecodeEntryMark decodes the mark of a LogData blob written by
// EntryMark.Append or appendEntryRecord, or of a format 3 mark. It fails,
// matching ErrNotEntryMark, on any other input: a blob of another version
// or kind, or a truncated or damaged one (its checksum disagrees).
func DecodeEntryMark(b []byte) (EntryMark, error) {
	if len(b) > 0 && b[0] == entryMarkVersion {
		return decodeMarkV1(b)
	}
	m, _, err := decodeEntryRecord(b)
	return m, err
}

// decodeEntryRecord decodes an entry record (appendEntryRecord) into its
// mark and its change items, which alias b and are checked only by their
// decoder (decodeEntry). It fails, matching ErrNotEntryMark, on anything
// else.
func decodeEntryRecord(b []byte) (EntryMark, []byte, error) {
	var m EntryMark
	p, err := unsealRecord(b, logKindEntry)
	if err != nil {
		return m, nil, fmt.Errorf("%w: %v", ErrNotEntryMark, err)
	}
	var wall, logical uint64
	for _, f := range []*uint64{&m.ShardID, &m.Index, &m.Term, &m.Revision, &wall, &logical} {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return EntryMark{}, nil, fmt.Errorf("%w: bad varint", ErrNotEntryMark)
		}
		*f, p = v, p[n:]
	}
	if wall > math.MaxInt64 || logical > math.MaxUint32 {
		return EntryMark{}, nil, fmt.Errorf("%w: date (%d, %d) out of range", ErrNotEntryMark, wall, logical)
	}
	m.HLC = hlc.Timestamp{WallNanos: int64(wall), Logical: uint32(logical)}
	return m, p, nil
}

// decodeMarkV1 decodes a format 3 mark: the version byte, the shard ID,
// index, term and revision as uvarints, the date (hlc.EncodedLen bytes) and
// a CRC-32C of everything before it.
func decodeMarkV1(b []byte) (EntryMark, error) {
	var m EntryMark
	p, err := unsealRecord(b, entryMarkVersion)
	if err != nil {
		return m, fmt.Errorf("%w: %v", ErrNotEntryMark, err)
	}
	for _, f := range []*uint64{&m.ShardID, &m.Index, &m.Term, &m.Revision} {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return EntryMark{}, fmt.Errorf("%w: bad varint", ErrNotEntryMark)
		}
		*f, p = v, p[n:]
	}
	if len(p) != hlc.EncodedLen {
		return EntryMark{}, fmt.Errorf("%w: %d bytes where the %d-byte date belongs", ErrNotEntryMark, len(p), hlc.EncodedLen)
	}
	ts, err := hlc.Decode(p)
	if err != nil {
		return EntryMark{}, fmt.Errorf("%w: %v", ErrNotEntryMark, err)
	}
	m.HLC = ts
	return m, nil
}

// entryDate is the date of an entry applied after one dated prev: the
// proposer's reading when later, else just after prev (a command from a
// leader whose clock is behind its predecessor's, or an entry with no
// reading: a no-op, a configuration change, a command from an older
// version).
func entryDate(prev hlc.Timestamp, proposed *shalev1.HlcTimestamp) hlc.Timestamp {
	if proposed != nil {
		if ts := replication.HLCFromProto(proposed); prev.Less(ts) {
			return ts
		}
	}
	return prev.Next()
}
