package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

// ErrChangeLogReset is returned by ReadChanges for a position taken before
// the engine was replaced by a snapshot (Restore): the log it pointed into
// is gone, and the new engine's log starts after the snapshot.
var ErrChangeLogReset = errors.New("shard: change log reset by a snapshot")

// ChangeLogPosition is a place in the shard's change log (its engine's
// WAL) between two batches.
type ChangeLogPosition struct {
	pos storage.UpdatesPosition
	gen uint64
}

// ChangeReader reads the shard's change log from a position on: WAL batches
// for DecodeBatch. It ends at the last batch written when it was opened.
type ChangeReader struct {
	it  *storage.UpdatesIterator
	sh  *Shard
	gen uint64
}

// Next moves to the next batch and reports whether there is one.
func (r *ChangeReader) Next() bool { return r.it.Next() }

// Batch returns the current batch.
func (r *ChangeReader) Batch() *storage.Batch { return r.it.Batch() }

// Error returns the error that stopped the reader, if any.
func (r *ChangeReader) Error() error { return r.it.Error() }

// Position returns where a later ReadChanges continues: just after the last
// batch returned by Next.
func (r *ChangeReader) Position() ChangeLogPosition {
	return ChangeLogPosition{pos: r.it.Position(), gen: r.gen}
}

// Close releases the reader.
func (r *ChangeReader) Close() error { return r.it.Close() }

// ReadPrev sets ev.Prev, for an event decoded from a batch this reader
// returned whose previous value the change log does not hold
// (ev.PrevUnread), to the key's value in the engine just before the
// change (as of ev.Seq-1, decoded as the log's previous values are: an
// expired record an expiry deleted is returned as it was), and clears
// ev.PrevUnread; other events are left as they are. It may be called after
// Close. It fails, leaving ev as it is, with an error matching
// storage.ErrHistoryUnavailable once the engine's history horizon has
// passed ev.Seq (see Shard.HistoryHorizon), ErrChangeLogReset when a
// snapshot replaced the engine since the reader was opened, ErrClosed, and
// ErrCorruptChangeLog when the engine holds no value there.
func (r *ChangeReader) ReadPrev(ev *Event) error {
	if !ev.PrevUnread {
		return nil
	}
	s := r.sh
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	if r.gen != s.logGen {
		return ErrChangeLogReset
	}
	key := ev.KV.GetKey()
	if ev.Seq == 0 {
		return fmt.Errorf("%w: the previous value of %q: no sequence number", ErrCorruptChangeLog, key)
	}
	raw, err := s.db.GetAt(dataKey(key), ev.Seq-1)
	if errors.Is(err, storage.ErrNotFound) {
		return fmt.Errorf("%w: the previous value of %q at sequence number %d is not in the engine", ErrCorruptChangeLog, key, ev.Seq-1)
	}
	if err != nil {
		return fmt.Errorf("shard %s: the previous value of %q: %w", s.dir, key, err)
	}
	sv, err := decodeValue(raw)
	if err != nil {
		return fmt.Errorf("%w: the previous value of %q: %v", ErrCorruptChangeLog, key, err)
	}
	ev.Prev, ev.PrevUnread = keyValue(key, &sv, false), false
	return nil
}

// HistoryHorizon returns the engine's history horizon: ChangeReader.ReadPrev
// reads the previous value of an event whose Seq is at least this, and
// fails for one below it. It only grows (the history window moves it, see
// Options.HistoryWindow); 0 when the shard is closed.
func (s *Shard) HistoryHorizon() storage.SeqNum {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return 0
	}
	return s.db.HistoryHorizon()
}

// NextSeq returns the engine sequence number of the first write after the
// position: every event read from the log after it has a Seq at least
// this.
func (p ChangeLogPosition) NextSeq() storage.SeqNum { return p.pos.NextSeq() }

// Changed returns a channel closed when the shard next applies entries,
// restores a snapshot or closes.
func (s *Shard) Changed() <-chan struct{} {
	for {
		if p := s.changed.Load(); p != nil {
			return *p
		}
		ch := make(chan struct{})
		if s.changed.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// notifyChanged closes the channel Changed handed out, if any. It is on
// Apply's path: without a waiter it costs one atomic load. A waiter that
// subscribes just after the load reads the log after this change anyway
// (the change is written before notifyChanged runs).
func (s *Shard) notifyChanged() {
	if s.changed.Load() == nil {
		return
	}
	if p := s.changed.Swap(nil); p != nil {
		close(*p)
	}
}

// ChangeLogEnd returns the position after the last applied entry with the
// revision and the descriptor after it: reading from there yields exactly
// the entries applied later.
func (s *Shard) ChangeLogEnd() (ChangeLogPosition, uint64, *shalev1.ShardDescriptor, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if s.db == nil {
		return ChangeLogPosition{}, 0, nil, ErrClosed
	}
	it, err := s.db.UpdatesSince(s.db.LastSeq() + 1)
	if err != nil {
		return ChangeLogPosition{}, 0, nil, fmt.Errorf("shard %s: change log end: %w", s.dir, err)
	}
	defer it.Close()
	st := s.st.Load()
	return ChangeLogPosition{pos: it.Position(), gen: s.logGen}, st.rev, cloneDesc(st.desc), nil
}

// ReadChanges opens a reader of the change log after p. It fails with
// ErrChangeLogReset when a snapshot replaced the engine since p was taken,
// and with an error matching storage.ErrUpdatesUnavailable when the WAL
// holding p is gone.
func (s *Shard) ReadChanges(p ChangeLogPosition) (*ChangeReader, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return nil, ErrClosed
	}
	if p.gen != s.logGen {
		return nil, ErrChangeLogReset
	}
	it, err := s.db.UpdatesFrom(p.pos)
	if err != nil {
		return nil, fmt.Errorf("shard %s: read change log: %w", s.dir, err)
	}
	return &ChangeReader{it: it, sh: s, gen: s.logGen}, nil
}

// ReadOldestChanges opens a reader of the change log from the oldest batch
// still in the WAL.
func (s *Shard) ReadOldestChanges() (*ChangeReader, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return nil, ErrClosed
	}
	seq := storage.SeqNum(1)
	for attempt := 0; ; attempt++ {
		it, err := s.db.UpdatesSince(seq)
		var gone *storage.UpdatesUnavailableError
		if errors.As(err, &gone) && gone.Earliest > seq && attempt < 3 {
			seq = gone.Earliest // (the oldest file may go meanwhile: retry)
			continue
		}
		if errors.As(err, &gone) && gone.Earliest == 0 {
			// No WAL file holds a batch: read from the end.
			it, err = s.db.UpdatesSince(s.db.LastSeq() + 1)
		}
		if err != nil {
			return nil, fmt.Errorf("shard %s: read change log: %w", s.dir, err)
		}
		return &ChangeReader{it: it, sh: s, gen: s.logGen}, nil
	}
}

// Reaches reports whether p is at or after o in the same change log.
func (p ChangeLogPosition) Reaches(o ChangeLogPosition) bool {
	return p.gen == o.gen && p.pos.NextSeq() >= o.pos.NextSeq()
}

// absorbedRange is a range a merge added to the shard, and the shard's
// revision after the merge; from is the shard absorbed (0 in records
// written before it was kept) and fromRev its last revision.
type absorbedRange struct {
	start, end []byte // end empty: the end of the key space
	rev        uint64
	from       uint64
	fromRev    uint64
}

// absorbedV2 starts an absorbed-ranges record that holds from and fromRev.
// A record without it is of the first format: it starts with the length of
// a right shard's start key, which is never empty, so never with a 0 byte.
const absorbedV2 = 0x00

// maxAbsorbed bounds the absorbed ranges a shard remembers.
const maxAbsorbed = 32

// appendAbsorbed returns list with r added (in a new slice: states are
// immutable once published), dropping the oldest past maxAbsorbed.
func appendAbsorbed(list []absorbedRange, r absorbedRange) []absorbedRange {
	out := make([]absorbedRange, 0, len(list)+1)
	out = append(out, list...)
	out = append(out, r)
	if len(out) > maxAbsorbed {
		out = out[len(out)-maxAbsorbed:]
	}
	return out
}

// encodeAbsorbed encodes absorbed ranges: the byte absorbedV2, then for
// each the start and end as uvarint-length-prefixed bytes, then the
// revision, the absorbed shard and its last revision as uvarints.
func encodeAbsorbed(list []absorbedRange) []byte {
	b := []byte{absorbedV2}
	for _, r := range list {
		b = binary.AppendUvarint(b, uint64(len(r.start)))
		b = append(b, r.start...)
		b = binary.AppendUvarint(b, uint64(len(r.end)))
		b = append(b, r.end...)
		b = binary.AppendUvarint(b, r.rev)
		b = binary.AppendUvarint(b, r.from)
		b = binary.AppendUvarint(b, r.fromRev)
	}
	return b
}

func decodeAbsorbed(b []byte) ([]absorbedRange, error) {
	var out []absorbedRange
	v2 := len(b) > 0 && b[0] == absorbedV2
	if v2 {
		b = b[1:]
	}
	readBytes := func() ([]byte, bool) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return nil, false
		}
		s := bytes.Clone(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, true
	}
	readUint := func() (uint64, bool) {
		x, w := binary.Uvarint(b)
		if w <= 0 {
			return 0, false
		}
		b = b[w:]
		return x, true
	}
	for len(b) > 0 {
		var r absorbedRange
		var ok1, ok2, ok3 bool
		r.start, ok1 = readBytes()
		r.end, ok2 = readBytes()
		r.rev, ok3 = readUint()
		ok4, ok5 := true, true
		if v2 {
			r.from, ok4 = readUint()
			r.fromRev, ok5 = readUint()
		}
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
			return nil, fmt.Errorf("%w: absorbed ranges record", ErrCorrupt)
		}
		out = append(out, r)
	}
	return out, nil
}

// AbsorbedShards returns the IDs of the shards the merges this shard
// remembers absorbed (its last 32 merges): shards that no longer exist.
func (s *Shard) AbsorbedShards() []uint64 {
	var ids []uint64
	for _, r := range s.st.Load().absorbed {
		if r.from != 0 {
			ids = append(ids, r.from)
		}
	}
	return ids
}

// Absorbed describes a merge that added a range to the shard.
type Absorbed struct {
	// Rev is the shard's revision after the merge; 0 means no merge.
	Rev uint64
	// From is the shard the merge absorbed (0 in records written before
	// it was kept), and FromRev that shard's last revision: its changes up
	// to FromRev reached this shard without their history.
	From, FromRev uint64
}

// AbsorbedAt returns the latest merge that added a range holding all of
// [start, end) (end nil: to the end of the key space) to the shard, the
// zero Absorbed when none did: the shard's log holds no change to that
// range at or below its Rev, so a watch of the range needs the log only
// from after it.
func (s *Shard) AbsorbedAt(start, end []byte) Absorbed {
	var a Absorbed
	for _, r := range s.st.Load().absorbed {
		if bytes.Compare(start, r.start) < 0 {
			continue
		}
		if len(r.end) > 0 && (end == nil || bytes.Compare(end, r.end) > 0) {
			continue
		}
		if r.rev >= a.Rev {
			a = Absorbed{Rev: r.rev, From: r.from, FromRev: r.fromRev}
		}
	}
	return a
}
