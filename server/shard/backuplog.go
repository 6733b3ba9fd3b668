package shard

import (
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
	if c := s.logCursor.Load(); c != nil && c.index == after {
		// Where the previous read stopped (a backup stream's last round);
		// a position gone stale (a snapshot, the WAL deleted) falls back.
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
	var cur *LoggedEntry
	var rng []byte
	for next <= until && r.Next() {
		s.logBatchesRead.Add(1)
		rd := r.Batch().Reader()
		cur, rng = &LoggedEntry{}, nil
		for {
			kind, key, value, ok := rd.Next()
			if !ok {
				break
			}
			switch kind {
			case storage.KindSet, storage.KindDelete, storage.KindRangeDelete:
				if isDataKey(key) {
					cur.Ops = append(cur.Ops, LoggedOp{Kind: kind, Key: append([]byte(nil), key...), Value: append([]byte(nil), value...)})
				}
			case storage.KindLogData:
				if len(key) == 0 {
					continue
				}
				switch key[0] {
				case logKindRange:
					rng = key
				case logKindMark:
					m, err := DecodeEntryMark(key)
					if err != nil {
						return fmt.Errorf("%w: %v", ErrCorruptChangeLog, err)
					}
					if m.Index >= next {
						if m.Index != next {
							return fmt.Errorf("%w: shard %d's log continues at entry %d, not %d", ErrLogUnavailable, m.ShardID, m.Index, next)
						}
						cur.Mark = m
						if rng != nil {
							e, err := decodeEntry(m, nil, nil, rng)
							if err != nil {
								return err
							}
							cur.Range = e.Range
						}
						if err := fn(cur); err != nil {
							return err
						}
						next++
					}
					cur, rng = &LoggedEntry{}, nil
				}
			}
		}
		if err := rd.Err(); err != nil {
			return fmt.Errorf("%w: %v", ErrCorruptChangeLog, err)
		}
		if len(cur.Ops) > 0 && next > after+1 && next <= until {
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
