package manifest

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/shale-db/shale/storage/internal/base"
)

// VersionEdit is a delta between two versions: the unit logged, one per wal
// record, to the MANIFEST. Applying the edits of a MANIFEST in order to an
// empty version (see BulkVersionEdit) rebuilds the database's file set.
//
// # Encoding, format version 1
//
// An encoded edit is a sequence of fields, each a uvarint tag followed by
// the tag's payload. "bytes" below means a uvarint length followed by that
// many bytes; "key" is bytes holding an encoded internal key (user key then
// the 8-byte little-endian trailer, see base.InternalKey.Encode).
//
//	tag  field               payload
//	1    ComparatorName      bytes
//	2    MinUnflushedLogNum  uvarint
//	3    NextFileNum         uvarint
//	4    LastSeqNum          uvarint
//	5    deleted file        uvarint level, uvarint file number
//	6    new file            uvarint level, uvarint file number, uvarint size,
//	                         key smallest, key largest, uvarint smallest seq,
//	                         uvarint largest seq, then optional file fields
//	7|TagSafeToIgnore        bytes holding uvarint WAL number, uvarint size:
//	     clean close         the DB closed cleanly with that WAL complete at
//	                         that size
//	8|TagSafeToIgnore        bytes holding uvarint seqnum: the DB's history
//	     history horizon     horizon when the edit was written
//	9|TagSafeToIgnore        bytes holding uvarint count, then per reclaim:
//	     reclaims            a flags byte (1: start set, 2: end set), bytes
//	                         start and bytes end when set, uvarint seq,
//	                         uvarint deleted-at seqnum
//
// Optional file fields follow the fixed fields of a new file: a sequence of
// (uvarint subtag, bytes payload) pairs ended by subtag 0. Subtag 1 is
// CreationTime (payload: a varint, written only when nonzero).
//
// Forward compatibility: a tag or subtag with bit TagSafeToIgnore (1<<13)
// set always carries a bytes payload and may be skipped by readers that do
// not know it. Any other unknown tag or subtag is an error, so a newer
// writer can add fields that an older reader must not silently drop.
//
// The scalar fields use 0 for "not set": only nonzero values are written,
// and a decoded edit leaves absent fields at 0. Deleted files are written in
// (level, file number) order, new files in slice order.
type VersionEdit struct {
	// ComparatorName names the user-key comparator. It is set in the first
	// edit of every MANIFEST.
	ComparatorName string
	// MinUnflushedLogNum is the number of the oldest WAL whose contents may
	// not yet be in an SST; WALs below it are obsolete. 0 means unset.
	MinUnflushedLogNum FileNum
	// NextFileNum is the next unallocated file number. 0 means unset.
	NextFileNum FileNum
	// LastSeqNum is the last sequence number in use. 0 means unset.
	LastSeqNum base.SeqNum
	// DeletedFiles are the files removed from a level. The value is the
	// file's metadata when the writer had it; decoding leaves it nil (see
	// BulkVersionEdit.Apply, which resolves it).
	DeletedFiles map[DeletedFileEntry]*FileMetadata
	// NewFiles are the files added to a level. Deletions of an edit apply
	// before its additions, so deleting a file from one level and adding it
	// to another moves it.
	NewFiles []NewFileEntry
	// CleanCloseLogNum and CleanCloseLogSize, when set, record that the DB
	// was closed cleanly: its last WAL is CleanCloseLogNum and is complete
	// at CleanCloseLogSize bytes, so recovery must read it intact (a damaged
	// tail is then corruption, not an interrupted write).
	CleanCloseLogNum  FileNum
	CleanCloseLogSize uint64
	// HistoryHorizon, when set, is the DB's history horizon (see
	// storage.Options.HistoryHorizon) when the edit was written: the files
	// of this and earlier edits may lack versions only reads below
	// HistoryHorizon-1 saw, so a reopened DB must not start below it. 0
	// means unset.
	HistoryHorizon base.SeqNum
	// Reclaims, when ReclaimsSet, are the DB's deleted spans waiting for
	// their compaction when the edit was written (see Reclaim); they
	// replace those of earlier edits. ReclaimsSet with no Reclaims says
	// that none wait.
	Reclaims    []Reclaim
	ReclaimsSet bool
}

// Reclaim is a deleted span whose compaction waits for the DB's history
// horizon to pass its deletions (storage.DB.CompactAfterHorizon).
type Reclaim struct {
	// Start and End bound the span [Start, End); nil is unbounded.
	Start, End []byte
	// Seq is the last sequence number of the span's deletions.
	Seq base.SeqNum
	// DeletedAt, when nonzero, is the sequence number of a range deletion
	// covering the whole span.
	DeletedAt base.SeqNum
}

// DeletedFileEntry names a file removed from a level.
type DeletedFileEntry struct {
	Level   int
	FileNum FileNum
}

// NewFileEntry is a file added to a level.
type NewFileEntry struct {
	Level int
	Meta  *FileMetadata
}

// TagSafeToIgnore is the bit that marks a VersionEdit tag or new-file
// subtag as skippable by readers that do not know it. Such fields always
// carry a length-prefixed payload.
const TagSafeToIgnore = 1 << 13

const (
	tagComparator         = 1
	tagMinUnflushedLogNum = 2
	tagNextFileNum        = 3
	tagLastSeqNum         = 4
	tagDeletedFile        = 5
	tagNewFile            = 6

	tagCleanClose     = 7 | TagSafeToIgnore
	tagHistoryHorizon = 8 | TagSafeToIgnore
	tagReclaims       = 9 | TagSafeToIgnore

	subtagEnd          = 0
	subtagCreationTime = 1
)

// validateLevel reports an out-of-range level.
func validateLevel(level int) error {
	if level < 0 || level >= NumLevels {
		return fmt.Errorf("level %d out of range [0,%d)", level, NumLevels)
	}
	return nil
}

// validateFile checks what every file in a version must satisfy on its own:
// ordered bounds and sequence numbers within range.
func validateFile(m *FileMetadata) error {
	if m == nil {
		return errors.New("nil file metadata")
	}
	if base.CompareInternal(m.Smallest, m.Largest) > 0 {
		return fmt.Errorf("file %s: smallest key %s > largest key %s", m.FileNum, m.Smallest, m.Largest)
	}
	if m.SmallestSeq > m.LargestSeq {
		return fmt.Errorf("file %s: smallest seqnum %d > largest seqnum %d", m.FileNum, m.SmallestSeq, m.LargestSeq)
	}
	if m.LargestSeq > base.MaxSeqNum {
		return fmt.Errorf("file %s: seqnum %d exceeds the maximum", m.FileNum, m.LargestSeq)
	}
	return nil
}

// Encode writes the encoding of ve to w in a single Write. It fails without
// writing anything if ve holds an out-of-range level, a nil or invalid file,
// or a LastSeqNum beyond base.MaxSeqNum: everything Encode writes, Decode
// accepts.
func (ve *VersionEdit) Encode(w io.Writer) error {
	buf, err := ve.AppendEncoded(nil)
	if err != nil {
		return err
	}
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("manifest: writing version edit: %w", err)
	}
	return nil
}

// AppendEncoded appends the encoding of ve to dst and returns the extended
// slice. It fails, returning dst unchanged, in the cases Encode does.
func (ve *VersionEdit) AppendEncoded(dst []byte) ([]byte, error) {
	if ve.LastSeqNum > base.MaxSeqNum {
		return dst, fmt.Errorf("manifest: encoding version edit: last seqnum %d exceeds the maximum", ve.LastSeqNum)
	}
	if ve.HistoryHorizon > base.MaxSeqNum+1 {
		return dst, fmt.Errorf("manifest: encoding version edit: history horizon %d exceeds the maximum", ve.HistoryHorizon)
	}
	for i, r := range ve.Reclaims {
		if r.Seq > base.MaxSeqNum || r.DeletedAt > base.MaxSeqNum {
			return dst, fmt.Errorf("manifest: encoding version edit: reclaim %d: seqnum exceeds the maximum", i)
		}
	}
	for de := range ve.DeletedFiles {
		if err := validateLevel(de.Level); err != nil {
			return dst, fmt.Errorf("manifest: encoding version edit: deleted file %s: %w", de.FileNum, err)
		}
	}
	for i, nf := range ve.NewFiles {
		if err := validateLevel(nf.Level); err != nil {
			return dst, fmt.Errorf("manifest: encoding version edit: new file %d: %w", i, err)
		}
		if err := validateFile(nf.Meta); err != nil {
			return dst, fmt.Errorf("manifest: encoding version edit: new file %d: %w", i, err)
		}
	}

	b := dst
	if ve.ComparatorName != "" {
		b = binary.AppendUvarint(b, tagComparator)
		b = appendBytes(b, []byte(ve.ComparatorName))
	}
	if ve.MinUnflushedLogNum != 0 {
		b = binary.AppendUvarint(b, tagMinUnflushedLogNum)
		b = binary.AppendUvarint(b, uint64(ve.MinUnflushedLogNum))
	}
	if ve.NextFileNum != 0 {
		b = binary.AppendUvarint(b, tagNextFileNum)
		b = binary.AppendUvarint(b, uint64(ve.NextFileNum))
	}
	if ve.LastSeqNum != 0 {
		b = binary.AppendUvarint(b, tagLastSeqNum)
		b = binary.AppendUvarint(b, uint64(ve.LastSeqNum))
	}
	for _, de := range sortedDeleted(ve.DeletedFiles) {
		b = binary.AppendUvarint(b, tagDeletedFile)
		b = binary.AppendUvarint(b, uint64(de.Level))
		b = binary.AppendUvarint(b, uint64(de.FileNum))
	}
	for _, nf := range ve.NewFiles {
		m := nf.Meta
		b = binary.AppendUvarint(b, tagNewFile)
		b = binary.AppendUvarint(b, uint64(nf.Level))
		b = binary.AppendUvarint(b, uint64(m.FileNum))
		b = binary.AppendUvarint(b, m.Size)
		b = binary.AppendUvarint(b, uint64(m.Smallest.Size()))
		b = m.Smallest.AppendEncoded(b)
		b = binary.AppendUvarint(b, uint64(m.Largest.Size()))
		b = m.Largest.AppendEncoded(b)
		b = binary.AppendUvarint(b, uint64(m.SmallestSeq))
		b = binary.AppendUvarint(b, uint64(m.LargestSeq))
		if m.CreationTime != 0 {
			var tmp [binary.MaxVarintLen64]byte
			n := binary.PutVarint(tmp[:], m.CreationTime)
			b = binary.AppendUvarint(b, subtagCreationTime)
			b = appendBytes(b, tmp[:n])
		}
		b = binary.AppendUvarint(b, subtagEnd)
	}
	if ve.CleanCloseLogNum != 0 {
		var p []byte
		p = binary.AppendUvarint(p, uint64(ve.CleanCloseLogNum))
		p = binary.AppendUvarint(p, ve.CleanCloseLogSize)
		b = binary.AppendUvarint(b, tagCleanClose)
		b = appendBytes(b, p)
	}
	if ve.HistoryHorizon != 0 {
		b = binary.AppendUvarint(b, tagHistoryHorizon)
		b = appendBytes(b, binary.AppendUvarint(nil, uint64(ve.HistoryHorizon)))
	}
	if ve.ReclaimsSet {
		b = binary.AppendUvarint(b, tagReclaims)
		b = appendBytes(b, appendReclaims(nil, ve.Reclaims))
	}
	return b, nil
}

// Flags of a reclaim in the reclaims field.
const (
	reclaimStartSet = 1
	reclaimEndSet   = 2
)

// appendReclaims appends the payload of the reclaims field to b.
func appendReclaims(b []byte, rs []Reclaim) []byte {
	b = binary.AppendUvarint(b, uint64(len(rs)))
	for _, r := range rs {
		var flags byte
		if r.Start != nil {
			flags |= reclaimStartSet
		}
		if r.End != nil {
			flags |= reclaimEndSet
		}
		b = append(b, flags)
		if r.Start != nil {
			b = appendBytes(b, r.Start)
		}
		if r.End != nil {
			b = appendBytes(b, r.End)
		}
		b = binary.AppendUvarint(b, uint64(r.Seq))
		b = binary.AppendUvarint(b, uint64(r.DeletedAt))
	}
	return b
}

// decodeReclaims decodes the payload of the reclaims field.
func decodeReclaims(p []byte) ([]Reclaim, error) {
	d := &decoder{data: p}
	n, err := d.uvarint("reclaim count")
	if err != nil {
		return nil, err
	}
	// Each reclaim takes at least 3 bytes: a bound on what to allocate.
	if n > uint64(len(p))/3 {
		return nil, fmt.Errorf("%d reclaims in %d bytes", n, len(p))
	}
	rs := make([]Reclaim, 0, n)
	for i := range n {
		if d.off >= len(d.data) {
			return nil, fmt.Errorf("reclaim %d: truncated", i)
		}
		flags := d.data[d.off]
		d.off++
		if flags&^(reclaimStartSet|reclaimEndSet) != 0 {
			return nil, fmt.Errorf("reclaim %d: unknown flags %#x", i, flags)
		}
		var r Reclaim
		if flags&reclaimStartSet != 0 {
			k, err := d.bytes("reclaim start")
			if err != nil {
				return nil, err
			}
			r.Start = append([]byte{}, k...)
		}
		if flags&reclaimEndSet != 0 {
			k, err := d.bytes("reclaim end")
			if err != nil {
				return nil, err
			}
			r.End = append([]byte{}, k...)
		}
		if r.Seq, err = d.seqNum("reclaim seqnum"); err != nil {
			return nil, err
		}
		if r.DeletedAt, err = d.seqNum("reclaim deleted-at seqnum"); err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	if d.off != len(d.data) {
		return nil, fmt.Errorf("%d bytes after the reclaims", len(d.data)-d.off)
	}
	return rs, nil
}

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// sortedDeleted returns the deleted-file entries in (level, file number)
// order so that encodings are deterministic.
func sortedDeleted(m map[DeletedFileEntry]*FileMetadata) []DeletedFileEntry {
	if len(m) == 0 {
		return nil
	}
	out := make([]DeletedFileEntry, 0, len(m))
	for de := range m {
		out = append(out, de)
	}
	slices.SortFunc(out, func(a, b DeletedFileEntry) int {
		if c := cmp.Compare(a.Level, b.Level); c != 0 {
			return c
		}
		return cmp.Compare(a.FileNum, b.FileNum)
	})
	return out
}

// decoder reads the primitive encodings from a byte slice; every method
// fails instead of reading past the end.
type decoder struct {
	data []byte
	off  int
}

func (d *decoder) uvarint(what string) (uint64, error) {
	v, n := binary.Uvarint(d.data[d.off:])
	if n <= 0 {
		return 0, fmt.Errorf("%s at byte %d: truncated or overlong uvarint", what, d.off)
	}
	d.off += n
	return v, nil
}

func (d *decoder) bytes(what string) ([]byte, error) {
	start := d.off
	n, err := d.uvarint(what + " length")
	if err != nil {
		return nil, err
	}
	if n > uint64(len(d.data)-d.off) {
		return nil, fmt.Errorf("%s at byte %d: length %d exceeds the %d bytes left", what, start, n, len(d.data)-d.off)
	}
	p := d.data[d.off : d.off+int(n)]
	d.off += int(n)
	return p, nil
}

func (d *decoder) level(what string) (int, error) {
	v, err := d.uvarint(what)
	if err != nil {
		return 0, err
	}
	if v >= NumLevels {
		return 0, fmt.Errorf("%s: level %d out of range [0,%d)", what, v, NumLevels)
	}
	return int(v), nil
}

func (d *decoder) seqNum(what string) (base.SeqNum, error) {
	v, err := d.uvarint(what)
	if err != nil {
		return 0, err
	}
	if base.SeqNum(v) > base.MaxSeqNum {
		return 0, fmt.Errorf("%s: seqnum %d exceeds the maximum", what, v)
	}
	return base.SeqNum(v), nil
}

func (d *decoder) key(what string) (base.InternalKey, error) {
	p, err := d.bytes(what)
	if err != nil {
		return base.InternalKey{}, err
	}
	k, ok := base.DecodeInternalKey(p)
	if !ok {
		return base.InternalKey{}, fmt.Errorf("%s: %d bytes is too short for an internal key", what, len(p))
	}
	// Copy: the caller's buffer (a wal record) is reused.
	return k.Clone(), nil
}

// Decode replaces the contents of ve with the edit encoded in data. data is
// not retained. On malformed input it returns a descriptive error (naming
// the field and byte offset) and leaves ve in an unspecified state; it never
// panics. Besides the syntax it checks that levels are in range, that each
// new file's smallest key is <= its largest key and its smallest seqnum <=
// its largest seqnum, and that no seqnum exceeds base.MaxSeqNum. Callers wrap
// the error in a base.CorruptionError naming the MANIFEST.
func (ve *VersionEdit) Decode(data []byte) error {
	*ve = VersionEdit{}
	if err := ve.decode(&decoder{data: data}); err != nil {
		return fmt.Errorf("manifest: decoding version edit: %w", err)
	}
	return nil
}

func (ve *VersionEdit) decode(d *decoder) error {
	for d.off < len(d.data) {
		tagOff := d.off
		tag, err := d.uvarint("tag")
		if err != nil {
			return err
		}
		switch tag {
		case tagComparator:
			p, err := d.bytes("comparator name")
			if err != nil {
				return err
			}
			ve.ComparatorName = string(p)
		case tagMinUnflushedLogNum, tagNextFileNum:
			v, err := d.uvarint(fmt.Sprintf("tag %d value", tag))
			if err != nil {
				return err
			}
			if tag == tagMinUnflushedLogNum {
				ve.MinUnflushedLogNum = FileNum(v)
			} else {
				ve.NextFileNum = FileNum(v)
			}
		case tagLastSeqNum:
			if ve.LastSeqNum, err = d.seqNum("last seqnum"); err != nil {
				return err
			}
		case tagDeletedFile:
			level, err := d.level("deleted file level")
			if err != nil {
				return err
			}
			fn, err := d.uvarint("deleted file number")
			if err != nil {
				return err
			}
			if ve.DeletedFiles == nil {
				ve.DeletedFiles = make(map[DeletedFileEntry]*FileMetadata)
			}
			ve.DeletedFiles[DeletedFileEntry{Level: level, FileNum: FileNum(fn)}] = nil
		case tagNewFile:
			nf, err := decodeNewFile(d)
			if err != nil {
				return fmt.Errorf("new file at byte %d: %w", tagOff, err)
			}
			ve.NewFiles = append(ve.NewFiles, nf)
		case tagCleanClose:
			p, err := d.bytes("clean close")
			if err != nil {
				return err
			}
			num, n := binary.Uvarint(p)
			if n <= 0 || num == 0 {
				return fmt.Errorf("malformed clean-close field at byte %d", tagOff)
			}
			size, m := binary.Uvarint(p[n:])
			if m <= 0 || n+m != len(p) {
				return fmt.Errorf("malformed clean-close field at byte %d", tagOff)
			}
			ve.CleanCloseLogNum, ve.CleanCloseLogSize = FileNum(num), size
		case tagHistoryHorizon:
			p, err := d.bytes("history horizon")
			if err != nil {
				return err
			}
			h, n := binary.Uvarint(p)
			if n <= 0 || n != len(p) || h == 0 || h > uint64(base.MaxSeqNum)+1 {
				return fmt.Errorf("malformed history-horizon field at byte %d", tagOff)
			}
			ve.HistoryHorizon = base.SeqNum(h)
		case tagReclaims:
			p, err := d.bytes("reclaims")
			if err != nil {
				return err
			}
			if ve.Reclaims, err = decodeReclaims(p); err != nil {
				return fmt.Errorf("malformed reclaims field at byte %d: %w", tagOff, err)
			}
			ve.ReclaimsSet = true
		default:
			if tag&TagSafeToIgnore == 0 {
				return fmt.Errorf("unknown tag %d at byte %d", tag, tagOff)
			}
			if _, err := d.bytes(fmt.Sprintf("ignorable tag %d", tag)); err != nil {
				return err
			}
		}
	}
	return nil
}

func decodeNewFile(d *decoder) (NewFileEntry, error) {
	level, err := d.level("level")
	if err != nil {
		return NewFileEntry{}, err
	}
	m := &FileMetadata{}
	fn, err := d.uvarint("file number")
	if err != nil {
		return NewFileEntry{}, err
	}
	m.FileNum = FileNum(fn)
	if m.Size, err = d.uvarint("size"); err != nil {
		return NewFileEntry{}, err
	}
	if m.Smallest, err = d.key("smallest key"); err != nil {
		return NewFileEntry{}, err
	}
	if m.Largest, err = d.key("largest key"); err != nil {
		return NewFileEntry{}, err
	}
	if m.SmallestSeq, err = d.seqNum("smallest seqnum"); err != nil {
		return NewFileEntry{}, err
	}
	if m.LargestSeq, err = d.seqNum("largest seqnum"); err != nil {
		return NewFileEntry{}, err
	}
	for {
		subOff := d.off
		sub, err := d.uvarint("subtag")
		if err != nil {
			return NewFileEntry{}, err
		}
		if sub == subtagEnd {
			break
		}
		p, err := d.bytes(fmt.Sprintf("subtag %d payload", sub))
		if err != nil {
			return NewFileEntry{}, err
		}
		switch {
		case sub == subtagCreationTime:
			v, n := binary.Varint(p)
			if n <= 0 || n != len(p) {
				return NewFileEntry{}, fmt.Errorf("creation time at byte %d: malformed varint", subOff)
			}
			m.CreationTime = v
		case sub&TagSafeToIgnore != 0:
			// Unknown but skippable.
		default:
			return NewFileEntry{}, fmt.Errorf("unknown subtag %d at byte %d", sub, subOff)
		}
	}
	if err := validateFile(m); err != nil {
		return NewFileEntry{}, err
	}
	return NewFileEntry{Level: level, Meta: m}, nil
}

// String renders the edit for debugging, one field per line, deleted files
// in (level, file number) order.
func (ve *VersionEdit) String() string {
	var b []byte
	if ve.ComparatorName != "" {
		b = fmt.Appendf(b, "comparator: %s\n", ve.ComparatorName)
	}
	if ve.MinUnflushedLogNum != 0 {
		b = fmt.Appendf(b, "min-unflushed-log: %s\n", ve.MinUnflushedLogNum)
	}
	if ve.NextFileNum != 0 {
		b = fmt.Appendf(b, "next-file: %s\n", ve.NextFileNum)
	}
	if ve.CleanCloseLogNum != 0 {
		b = fmt.Appendf(b, "clean-close: wal %s at %d bytes\n", ve.CleanCloseLogNum, ve.CleanCloseLogSize)
	}
	if ve.LastSeqNum != 0 {
		b = fmt.Appendf(b, "last-seq: %d\n", ve.LastSeqNum)
	}
	if ve.HistoryHorizon != 0 {
		b = fmt.Appendf(b, "history-horizon: %d\n", ve.HistoryHorizon)
	}
	if ve.ReclaimsSet {
		b = fmt.Appendf(b, "reclaims: %d\n", len(ve.Reclaims))
		for _, r := range ve.Reclaims {
			b = fmt.Appendf(b, "  [%q, %q) seq %d deleted-at %d\n", r.Start, r.End, r.Seq, r.DeletedAt)
		}
	}
	for _, de := range sortedDeleted(ve.DeletedFiles) {
		b = fmt.Appendf(b, "del L%d %s\n", de.Level, de.FileNum)
	}
	for _, nf := range ve.NewFiles {
		if nf.Meta == nil {
			b = fmt.Appendf(b, "add L%d <nil>\n", nf.Level)
			continue
		}
		b = fmt.Appendf(b, "add L%d %s\n", nf.Level, nf.Meta)
	}
	return string(b)
}
