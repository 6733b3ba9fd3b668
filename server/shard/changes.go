package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

// The shard's change-log records: LogData blobs written to the engine's WAL
// with every applied entry, told apart by their first byte.
const (
	// logKindMark is a format 3 EntryMark (entryMarkVersion), read only.
	logKindMark = entryMarkVersion
	// logKindChanges lists an entry's user-visible changes with the values
	// they replaced (see appendChange); format 3, read only.
	logKindChanges = 2
	// logKindRange holds the shard's descriptor after an entry that changed
	// its range or merge state (a split or a merge step).
	logKindRange = 3
	// logKindEntry is the entry record (appendEntryRecord) that ends every
	// applied entry's records since format 4: its mark and its changes in
	// one record.
	logKindEntry = 4
)

// Change kinds in a logKindChanges record and items of an entry record.
const (
	// changePut and changeDelete items hold the key's previous stored
	// value (appendPrev): formats 3 to 7, read only.
	changePut    = 1
	changeDelete = 2
	// changeRevision is no change: the deletes after it, up to the next
	// one, are at the revision it holds (a uvarint), not the entry's
	// (format 5; entry records only).
	changeRevision = 3
	// Format 8's items hold no previous value: the engine keeps it, as the
	// key's version just before the item's write (ChangeReader.ReadPrev).
	// changePutNew is a put of a key that had no live value (absent,
	// deleted or expired).
	changePutNew = 4
	// changePutOver is a put that replaced a live value.
	changePutOver = 5
	// changeDeleteOf is the deletion of a key that had a stored value: a
	// live one, or an expired one that an expiry deleted.
	changeDeleteOf = 6
)

// ErrCorruptChangeLog is matched (errors.Is) by the errors of DecodeBatch
// for change-log records that are damaged or do not match the entry's
// writes.
var ErrCorruptChangeLog = errors.New("shard: corrupt change log")

// appendChange appends one item of a format 3 logKindChanges record to b:
// the change kind, the user key and the key's previous stored value
// (appendPrev). Only tests write such records now.
func appendChange(b []byte, kind byte, userKey, prev []byte) []byte {
	b = append(b, kind)
	b = binary.AppendUvarint(b, uint64(len(userKey)))
	b = append(b, userKey...)
	return appendPrev(b, prev)
}

// appendChangeItem appends one change item of a format 8 entry record to
// b: the change kind (changePutNew, changePutOver or changeDeleteOf), then
// the user key of a delete (a put's key is its Set's, the entry's puts and
// Sets of user keys matching one for one, in order). No previous value: a
// reader that wants it reads the key in the engine just before the item's
// write.
func appendChangeItem(b []byte, kind byte, userKey []byte) []byte {
	b = append(b, kind)
	if kind == changeDeleteOf {
		b = binary.AppendUvarint(b, uint64(len(userKey)))
		b = append(b, userKey...)
	}
	return b
}

// appendRevisionItem appends a revision item (changeRevision) to b.
func appendRevisionItem(b []byte, rev uint64) []byte {
	return binary.AppendUvarint(append(b, changeRevision), rev)
}

// appendPrev appends a key's previous stored value to a change item of
// format 7 or older: its length+1 as a uvarint (0 when the key was absent
// or expired), then its bytes. Only tests write such items now.
func appendPrev(b, prev []byte) []byte {
	if prev == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(prev))+1)
	return append(b, prev...)
}

// sealRecord appends the CRC-32C of rec[start:] to rec. Every change-log
// record (marks included) is a kind byte, a body and this checksum.
func sealRecord(rec []byte, start int) []byte {
	return binary.BigEndian.AppendUint32(rec, crc32.Checksum(rec[start:], castagnoli))
}

// unsealRecord checks a sealed record's kind byte and checksum and returns
// its body.
func unsealRecord(b []byte, kind byte) ([]byte, error) {
	if len(b) < 1+4 || b[0] != kind {
		return nil, fmt.Errorf("record of kind %d: %d bytes", kind, len(b))
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("record of kind %d: checksum mismatch", kind)
	}
	return body[1:], nil
}

// openRecord is unsealRecord for the changes and range records.
func openRecord(b []byte, kind byte) ([]byte, error) {
	body, err := unsealRecord(b, kind)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptChangeLog, err)
	}
	return body, nil
}

// EventKind says what a change did to a key.
type EventKind uint8

const (
	// EventPut wrote a value.
	EventPut EventKind = 1
	// EventDelete removed a live key (a point or a range deletion).
	EventDelete EventKind = 2
)

// Event is one user-visible change made by an applied entry.
type Event struct {
	Kind EventKind
	// KV is the key after the change: its new value and revisions for a
	// put; for a delete, the key with ModRevision set to the change's
	// revision and nothing else.
	KV *shalev1.KeyValue
	// Revision is the revision of the change: the entry's (its Mark's),
	// or, in a packed Raft entry, its command's (at most the entry's).
	Revision uint64
	// Prev is the key's value before the change, nil when it was absent
	// (never written, deleted or expired), or while PrevUnread is set.
	Prev *shalev1.KeyValue
	// PrevUnread is set when the key had a value before the change that
	// the change log does not hold (format 8): Prev is nil until
	// ChangeReader.ReadPrev reads it from the engine, as of Seq-1.
	PrevUnread bool
	// Seq is the engine sequence number of the write that made the change
	// (for each key a range deletion removed, the range deletion's). It is
	// 0 only for a delete of format 7 or older whose write the decoder did
	// not find among the entry's; such a delete holds its previous value.
	Seq storage.SeqNum
}

// AppliedEntry is what one applied Raft entry left in the shard's WAL. A
// packed entry (several commands) is one AppliedEntry whose events may be
// at several revisions, each its command's (Event.Revision), in increasing
// order.
type AppliedEntry struct {
	// Mark identifies and dates the entry.
	Mark EntryMark
	// Events are the entry's changes to user keys, in the order its
	// operations ran (several for one key when a transaction wrote it more
	// than once). Keys moved in or out by a split or merge are not events:
	// they did not change.
	Events []Event
	// Range, when not nil, is the shard's descriptor after the entry: the
	// entry changed the shard's range or merge state (a split, a merge
	// freezing or absorbing a shard).
	Range *shalev1.ShardDescriptor
}

// DecodeBatch calls fn with every entry recorded in a batch of the shard
// engine's WAL (storage.DB.UpdatesSince), in order. Batches that are not
// applied entries (a snapshot's or a split's initial state) yield none. It
// fails, matching ErrCorruptChangeLog, when a change-log record is damaged
// or does not match the writes of its entry; fn's errors are returned as
// they are.
func DecodeBatch(b *storage.Batch, fn func(*AppliedEntry) error) error {
	_, err := walkEntries(b, func(r *entryRecords) error {
		e, err := decodeEntry(r)
		if err != nil {
			return fmt.Errorf("entry %d: %w", r.mark.Index, err)
		}
		return fn(e)
	})
	return err
}

// entryRecords are one applied entry's records in a WAL batch, up to its
// mark: its writes to user data and its change-log records (all aliasing
// the batch).
type entryRecords struct {
	mark EntryMark
	ops  []LoggedOp
	// seqs are the engine sequence numbers of ops, one for one.
	seqs []storage.SeqNum
	// changes are the entry's change items: an entry record's (keyed
	// false), or a format 3 logKindChanges record, still sealed (keyed
	// true: its put items name their keys).
	changes []byte
	keyed   bool
	rng     []byte
}

// walkEntries calls fn with the records of every entry in b, in order; the
// value passed is reused by the next call. It returns how many writes to
// user data follow the last mark: a batch that is no applied entry's (a
// snapshot's or a split's initial state) holds only those. A damaged mark
// or batch is an error matching ErrCorruptChangeLog; fn's errors are
// returned as they are.
func walkEntries(b *storage.Batch, fn func(*entryRecords) error) (trailing int, err error) {
	r := b.Reader()
	var e entryRecords
	// seq is the sequence number of the next record that takes one (every
	// record but LogData, in order from the batch's).
	seq := b.SeqNum()
	for {
		kind, key, value, ok := r.Next()
		if !ok {
			break
		}
		if kind != storage.KindLogData {
			seq++
		}
		switch kind {
		case storage.KindSet, storage.KindDelete, storage.KindRangeDelete:
			if isDataKey(key) {
				e.ops = append(e.ops, LoggedOp{Kind: kind, Key: key, Value: value})
				e.seqs = append(e.seqs, seq-1)
			}
		case storage.KindLogData:
			if len(key) == 0 {
				continue
			}
			var err error
			switch key[0] {
			case logKindChanges:
				e.changes, e.keyed = key, true
				continue
			case logKindRange:
				e.rng = key
				continue
			case logKindMark:
				e.mark, err = decodeMarkV1(key)
			case logKindEntry:
				if e.keyed {
					return 0, fmt.Errorf("%w: a format 3 changes record before an entry record", ErrCorruptChangeLog)
				}
				e.mark, e.changes, err = decodeEntryRecord(key)
			default:
				continue
			}
			if err != nil {
				return 0, fmt.Errorf("%w: %v", ErrCorruptChangeLog, err)
			}
			if err := fn(&e); err != nil {
				return 0, err
			}
			e.ops, e.seqs, e.changes, e.keyed, e.rng = e.ops[:0], e.seqs[:0], nil, false, nil
		}
	}
	if err := r.Err(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrCorruptChangeLog, err)
	}
	return len(e.ops), nil
}

// decodeRange decodes a range record: the shard's descriptor after its
// entry.
func decodeRange(rng []byte) (*shalev1.ShardDescriptor, error) {
	body, err := openRecord(rng, logKindRange)
	if err != nil {
		return nil, err
	}
	d := &shalev1.ShardDescriptor{}
	if err := proto.Unmarshal(body, d); err != nil {
		return nil, fmt.Errorf("%w: range record: %v", ErrCorruptChangeLog, err)
	}
	return d, nil
}

// decodeEntry builds an entry's events from its change items and its
// writes of user keys. Items and writes come in the same order: an entry's
// puts and Sets of user keys match one for one, and a delete's write is the
// next Delete of its key or range deletion covering it, before the next
// Set.
func decodeEntry(r *entryRecords) (*AppliedEntry, error) {
	m := r.mark
	e := &AppliedEntry{Mark: m}
	if r.rng != nil {
		d, err := decodeRange(r.rng)
		if err != nil {
			return nil, err
		}
		e.Range = d
	}
	// next is the first write not yet matched to an item.
	next := 0
	// nextSet moves next to the entry's next set (deletes have no value).
	nextSet := func() {
		for next < len(r.ops) && r.ops[next].Kind != storage.KindSet {
			next++
		}
	}
	// deleteOf returns the index of the write that deleted key: the next
	// Delete of it or range deletion covering it, before the next Set; -1
	// when there is none.
	deleteOf := func(key []byte) int {
		for i := next; i < len(r.ops); i++ {
			op := &r.ops[i]
			switch op.Kind {
			case storage.KindSet:
				return -1
			case storage.KindDelete:
				if bytes.Equal(op.Key[1:], key) {
					return i
				}
			case storage.KindRangeDelete:
				if deletesRange(op, key) {
					return i
				}
			}
		}
		return -1
	}
	if len(r.changes) == 0 {
		// No user-visible change (keys a split or merge moves are not).
		return e, nil
	}
	p := r.changes
	if r.keyed {
		var err error
		if p, err = openRecord(r.changes, logKindChanges); err != nil {
			return nil, err
		}
	}
	readBytes := func() ([]byte, bool) {
		n, w := binary.Uvarint(p)
		if w <= 0 || n > uint64(len(p)-w) {
			return nil, false
		}
		s := p[w : w+int(n)]
		p = p[w+int(n):]
		return s, true
	}
	// rev is the revision of the next delete (changeRevision).
	rev := m.Revision
	for len(p) > 0 {
		kind := p[0]
		p = p[1:]
		if kind == changeRevision && !r.keyed {
			v, w := binary.Uvarint(p)
			if w <= 0 || v > m.Revision {
				return nil, fmt.Errorf("%w: bad revision item", ErrCorruptChangeLog)
			}
			rev, p = v, p[w:]
			continue
		}
		format8 := kind == changePutNew || kind == changePutOver || kind == changeDeleteOf
		if format8 && r.keyed {
			return nil, fmt.Errorf("%w: change kind %d in a format 3 changes record", ErrCorruptChangeLog, kind)
		}
		isPut := kind == changePut || kind == changePutNew || kind == changePutOver
		var ev Event
		var key []byte
		var set *LoggedOp
		if isPut {
			nextSet()
			if next >= len(r.ops) {
				return nil, fmt.Errorf("%w: a put has no matching write", ErrCorruptChangeLog)
			}
			set, ev.Seq = &r.ops[next], r.seqs[next]
			next++
			key = set.Key[1:]
		}
		if r.keyed || !isPut {
			k, ok := readBytes()
			if !ok {
				return nil, fmt.Errorf("%w: bad key length", ErrCorruptChangeLog)
			}
			if set != nil && !bytes.Equal(k, key) {
				return nil, fmt.Errorf("%w: put of %q has no matching write", ErrCorruptChangeLog, k)
			}
			key = k
		}
		if !isPut && !r.keyed {
			switch i := deleteOf(key); {
			case i >= 0:
				ev.Seq = r.seqs[i]
				if r.ops[i].Kind == storage.KindDelete {
					next = i + 1 // a range deletion may remove more keys
				}
			case format8:
				return nil, fmt.Errorf("%w: a delete of %q has no matching write", ErrCorruptChangeLog, key)
			}
		}
		if format8 {
			ev.PrevUnread = kind != changePutNew
		} else {
			n, w := binary.Uvarint(p)
			if w <= 0 || (n > 0 && n-1 > uint64(len(p)-w)) {
				return nil, fmt.Errorf("%w: bad previous value length", ErrCorruptChangeLog)
			}
			p = p[w:]
			if n > 0 {
				raw := p[:n-1]
				p = p[n-1:]
				sv, err := decodeValue(raw)
				if err != nil {
					return nil, fmt.Errorf("%w: previous value of %q: %v", ErrCorruptChangeLog, key, err)
				}
				ev.Prev = keyValue(key, &sv, false)
			}
		}
		switch kind {
		case changePut, changePutNew, changePutOver:
			sv, err := decodeValue(set.Value)
			if err != nil {
				return nil, fmt.Errorf("%w: value of %q: %v", ErrCorruptChangeLog, key, err)
			}
			ev.Kind, ev.KV, ev.Revision = EventPut, keyValue(key, &sv, false), sv.modRev
		case changeDelete, changeDeleteOf:
			ev.Kind, ev.KV, ev.Revision = EventDelete, &shalev1.KeyValue{Key: bytes.Clone(key), ModRevision: rev}, rev
		default:
			return nil, fmt.Errorf("%w: change kind %d", ErrCorruptChangeLog, kind)
		}
		e.Events = append(e.Events, ev)
	}
	if nextSet(); next != len(r.ops) {
		return nil, fmt.Errorf("%w: a write of %q with no put recorded", ErrCorruptChangeLog, r.ops[next].Key[1:])
	}
	return e, nil
}

// deletesRange reports whether the range deletion op (engine keys [Key,
// Value)) covers the user key key.
func deletesRange(op *LoggedOp, key []byte) bool {
	if bytes.Compare(op.Key[1:], key) > 0 || len(op.Value) == 0 {
		return false
	}
	return op.Value[0] > prefixData || (op.Value[0] == prefixData && bytes.Compare(key, op.Value[1:]) < 0)
}

// noteChange records a change of the current entry for the change log. In
// a packed entry, a delete at another revision than the record's last
// revision item gets one first (a put's revision is its value's).
func (a *applier) noteChange(kind byte, userKey []byte) {
	if a.packed && kind == changeDeleteOf && a.logRev != a.st.rev {
		a.logRev = a.st.rev
		a.changes = appendRevisionItem(a.changes, a.st.rev)
	}
	a.changes = appendChangeItem(a.changes, kind, userKey)
}

// endEntryLog writes the current entry's range record, before its entry
// record, if the entry changed the shard's range or merge state.
func (a *applier) endEntryLog(before *shalev1.ShardDescriptor) error {
	after := a.st.desc
	if after == nil || after == before {
		return nil
	}
	if before != nil && bytes.Equal(before.GetStartKey(), after.GetStartKey()) && bytes.Equal(before.GetEndKey(), after.GetEndKey()) &&
		before.GetMergingInto() == after.GetMergingInto() && before.GetRetired() == after.GetRetired() {
		return nil
	}
	enc, err := marshalOpts.Marshal(after)
	if err != nil {
		return fmt.Errorf("encode range record: %w", err)
	}
	rec := append([]byte{logKindRange}, enc...)
	a.b.LogData(sealRecord(rec, 0))
	return nil
}

// noteRangeDeletes records a deletion of every live key in the engine-key
// span [lo, hi), as the current Apply call sees it: the writes staged so
// far over the engine's state before the call.
func (a *applier) noteRangeDeletes(lo, hi []byte, now int64) error {
	var staged []string
	for k := range a.ov.writes {
		if k >= string(lo) && k < string(hi) { // [lo, hi) holds data keys only
			staged = append(staged, k)
		}
	}
	slices.Sort(staged)
	note := func(ek, raw []byte) error {
		v, err := decodeValue(raw)
		if err != nil {
			return fmt.Errorf("key %q: %w", ek[1:], err)
		}
		if live(&v, now) {
			a.noteChange(changeDeleteOf, ek[1:])
		}
		return nil
	}
	it, err := a.ov.db.NewIter(&storage.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("range deletion: %w", err)
	}
	valid := it.First()
	for valid || len(staged) > 0 {
		if len(staged) > 0 && (!valid || staged[0] <= string(it.Key())) {
			k := []byte(staged[0])
			if valid && staged[0] == string(it.Key()) {
				valid = it.Next() // the staged write replaces the engine's record
			}
			staged = staged[1:]
			raw, ok, err := a.ov.get(k)
			if err == nil && ok {
				err = note(k, raw)
			}
			if err != nil {
				it.Close()
				return err
			}
			continue
		}
		if !a.ov.rangeDeleted(it.Key()) {
			if err := note(it.Key(), it.Value()); err != nil {
				it.Close()
				return err
			}
		}
		valid = it.Next()
	}
	if err := it.Error(); err != nil {
		it.Close()
		return fmt.Errorf("range deletion: %w", err)
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("range deletion: %w", err)
	}
	return nil
}
