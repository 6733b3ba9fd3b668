package storage

import "container/list"

// Snapshot is a consistent, read-only view of the DB at a sequence number.
// While it is open, compactions keep every version it can see. Close it when
// done; an open snapshot pins old data.
type Snapshot struct {
	db   *DB
	seq  SeqNum
	elem *list.Element
}

// snapshotList holds the open snapshots in creation (and so sequence) order.
type snapshotList struct{ l list.List }

func (s *snapshotList) init() { s.l.Init() }

// seqs returns the distinct sequence numbers of open snapshots, ascending.
func (s *snapshotList) seqs() []SeqNum {
	var out []SeqNum
	for e := s.l.Front(); e != nil; e = e.Next() {
		seq := e.Value.(*Snapshot).seq
		if len(out) == 0 || out[len(out)-1] != seq {
			out = append(out, seq)
		}
	}
	return out
}

// NewSnapshot returns a snapshot of the DB's current state.
func (d *DB) NewSnapshot() *Snapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.ingesting > 0 {
		d.cond.Wait() // see ingestLocked
	}
	s := &Snapshot{db: d, seq: SeqNum(d.visibleSeq.Load())}
	s.elem = d.snapshots.l.PushBack(s)
	return s
}

// SeqNum returns the snapshot's sequence number: it sees every write at or
// below it.
func (s *Snapshot) SeqNum() SeqNum { return s.seq }

// Get returns a copy of key's value as of the snapshot, or ErrNotFound.
func (s *Snapshot) Get(key []byte) ([]byte, error) { return s.db.getAt(key, s.seq, false) }

// MultiGet reads keys as of the snapshot (see DB.MultiGet).
func (s *Snapshot) MultiGet(keys [][]byte) (vals [][]byte, errs []error) {
	return s.db.multiGetAt(keys, s.seq, false)
}

// MultiGetWithOptions is MultiGet with read options (see
// DB.MultiGetWithOptions).
func (s *Snapshot) MultiGetWithOptions(keys [][]byte, ro ReadOptions) (vals [][]byte, errs []error) {
	return s.db.multiGetAt(keys, s.seq, ro.CacheOnly)
}

// GetWithOptions is Get with read options (see DB.GetWithOptions).
func (s *Snapshot) GetWithOptions(key []byte, ro ReadOptions) ([]byte, error) {
	return s.db.getAt(key, s.seq, ro.CacheOnly)
}

// NewIter returns an iterator over the snapshot (opts.Snapshot is ignored).
func (s *Snapshot) NewIter(opts *IterOptions) (*Iterator, error) {
	var o IterOptions
	if opts != nil {
		o = *opts
	}
	return s.db.newIterAt(o, s.seq)
}

// Close releases the snapshot. Closing twice is a no-op.
func (s *Snapshot) Close() error {
	d := s.db
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.elem != nil {
		d.snapshots.l.Remove(s.elem)
		s.elem = nil
	}
	return nil
}
