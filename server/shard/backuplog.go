package shard

import (
	"bytes"
	"errors"
	"fmt"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

// ErrLogUnavailable is matched (errors.Is) by ReadLogAfter's error when the
// shard's WAL no longer holds every entry it was asked for (trimmed, or
// replaced by a snapshot).
var ErrLogUnavailable = errors.New("shard: the log does not reach back that far")

// LoggedEntry is one applied Raft entry as the shard's WAL holds it: its
// mark, its writes to user data (engine keys), and its new descriptor when
// it changed the shard's range or merge state.
type LoggedEntry struct {
	Mark  EntryMark
	Ops   []LoggedOp
	Range *shalev1.ShardDescriptor
}

// LoggedOp is one write to user data: a storage.KindSet (Key, Value), a
// storage.KindDelete (Key) or a storage.KindRangeDelete ([Key, Value)).
type LoggedOp struct {
	Kind       storage.Kind
	Key, Value []byte
}

// logCursor is a place in the change log just after entry index.
type logCursor struct {
	index uint64
	pos   ChangeLogPosition
}

// ReadLogAfter calls fn with every entry the shard applied after Raft index
// after, in order, up to its last applied entry when the call started. The
// entries are consecutive from after+1: when the WAL no longer reaches back
// that far (its oldest files were removed, or a snapshot replaced the
// engine), it fails with an error matching ErrLogUnavailable. fn's errors
// are returned as they are. Entries passed to fn are not reused.
func (s *Shard) ReadLogAfter(after uint64, fn func(*LoggedEntry) error) error {
	until := s.AppliedState().Index
	if until <= after {
		return nil
	}
	var r *ChangeReader
	if c := s.logCursor.Load(); c != nil && c.index <= after {
		// Where the previous read stopped (a backup stream's last round),
		// or the log's end when a backup's checkpoint was taken (the
		// entries up to after are skipped); a position gone stale (a
		// snapshot, the WAL deleted) falls back.
		r, _ = s.ReadChanges(c.pos)
	}
	if r == nil {
		var err error
		if r, err = s.ReadOldestChanges(); err != nil {
			return err
		}
	}
	defer r.Close()
	next := after + 1
	for next <= until && r.Next() {
		s.logBatchesRead.Add(1)
		trailing, err := walkEntries(r.Batch(), func(e *entryRecords) error {
			if e.mark.Index < next {
				return nil
			}
			if e.mark.Index != next {
				return fmt.Errorf("%w: shard %d's log continues at entry %d, not %d", ErrLogUnavailable, e.mark.ShardID, e.mark.Index, next)
			}
			le := &LoggedEntry{Mark: e.mark, Ops: make([]LoggedOp, len(e.ops))}
			for i, op := range e.ops {
				le.Ops[i] = LoggedOp{Kind: op.Kind, Key: bytes.Clone(op.Key), Value: bytes.Clone(op.Value)}
			}
			if e.rng != nil {
				d, err := decodeRange(e.rng)
				if err != nil {
					return err
				}
				le.Range = d
			}
			if err := fn(le); err != nil {
				return err
			}
			next++
			return nil
		})
		if err != nil {
			return err
		}
		if trailing > 0 && next > after+1 && next <= until {
			// Writes with no entry after what was read: the engine's
			// state was replaced (a snapshot, a split's initial state).
			return fmt.Errorf("%w: the log of entries after %d was reset", ErrLogUnavailable, next-1)
		}
	}
	if err := r.Error(); err != nil {
		if errors.Is(err, storage.ErrUpdatesUnavailable) {
			return fmt.Errorf("%w: %v", ErrLogUnavailable, err)
		}
		return err
	}
	if next <= until {
		return fmt.Errorf("%w: the log ends before entry %d (applied %d)", ErrLogUnavailable, next, until)
	}
	// Every batch read ended with an entry's mark (entry batches do; any
	// other fails above), so the next entry starts right after them.
	s.logCursor.Store(&logCursor{index: next - 1, pos: r.Position()})
	return nil
}
