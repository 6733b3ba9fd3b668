package storage

import (
	"errors"
	"fmt"

	"github.com/shale-db/shale/storage/manifest"
)

// ErrHistoryUnavailable is matched (errors.Is) by the error GetAt returns
// when the sequence number read at is below the history horizon's reach
// (HistoryHorizon()-1), before or during the read, or when the DB keeps no
// history horizon (Options.HistoryHorizon off).
var ErrHistoryUnavailable = errors.New("storage: history no longer available at that sequence number")

// HistoryHorizon returns the history horizon H (Options.HistoryHorizon):
// every version visible at a sequence number >= H-1 is kept, and GetAt
// reads at any of them. H is the first sequence number of the oldest WAL
// file still on disk (a lower bound of it for the WAL files this DB
// created), or one past the last sequence number when no WAL holds a
// batch. It only grows. It returns 0 when the DB keeps no horizon.
func (d *DB) HistoryHorizon() SeqNum { return SeqNum(d.horizon.Load()) }

// GetAt returns a copy of key's value as of sequence number seq (what a
// snapshot taken at seq would read), or ErrNotFound. seq must be at most
// LastSeq() and at least HistoryHorizon()-1; the horizon is checked after
// the read as well, so a read that a compaction may have raced with fails
// instead of returning a wrong value. Either failure matches
// ErrHistoryUnavailable. The one exception to "as a snapshot would read":
// see Options.HistoryHorizon on the CompactionFilter.
func (d *DB) GetAt(key []byte, seq SeqNum) ([]byte, error) {
	if !d.opts.HistoryHorizon {
		return nil, fmt.Errorf("read at %d: no history horizon kept: %w", seq, ErrHistoryUnavailable)
	}
	if last := d.LastSeq(); seq > last {
		return nil, fmt.Errorf("read at %d: beyond the last sequence number %d", seq, last)
	}
	if err := d.checkHorizon(seq); err != nil {
		return nil, err
	}
	v, err := d.getAt(key, seq, false)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	// Flushes and compactions take the horizon when they start, and it
	// only grows: if it still allows seq now, every one whose output the
	// read could have met kept the versions seq sees.
	if herr := d.checkHorizon(seq); herr != nil {
		return nil, herr
	}
	return v, err
}

// AdvanceHistoryHorizon moves the history horizon up to h (it never moves
// back): the caller gives up the history before h-1, so that flushes,
// compactions and DeleteFilesInRange may drop what only reads below h-1
// saw, such as the data a range deletion at a sequence number below h
// removed. Reads below h-1 fail from now on (GetAt). h is capped at
// LastSeq()+1. It does nothing when the DB keeps no horizon.
func (d *DB) AdvanceHistoryHorizon(h SeqNum) {
	if !d.opts.HistoryHorizon {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	h = min(h, SeqNum(d.visibleSeq.Load())+1)
	if h > d.HistoryHorizon() {
		d.horizon.Store(uint64(h))
	}
}

// checkHorizon fails, matching ErrHistoryUnavailable, when the horizon no
// longer keeps what a read at seq sees.
func (d *DB) checkHorizon(seq SeqNum) error {
	if h := d.HistoryHorizon(); seq+1 < h {
		return fmt.Errorf("read at %d: history horizon %d: %w", seq, h, ErrHistoryUnavailable)
	}
	return nil
}

// refreshHorizonLocked moves the history horizon up to the first sequence
// number of the oldest WAL file still on disk (see HistoryHorizon): called
// after the recovery's replay and whenever WAL files were deleted. For the
// WAL files this DB created or replayed it uses the sequence number they
// start at (walStart); older ones are read. A WAL that holds no batch does
// not count. Called with d.mu held.
func (d *DB) refreshHorizonLocked() {
	if !d.opts.HistoryHorizon {
		return
	}
	files, err := d.listWALFiles()
	if err != nil {
		// Keep the horizon where it is: too low only keeps more.
		d.log.Warn("list wal files for the history horizon", "err", err)
		return
	}
	onDisk := make(map[manifest.FileNum]bool, len(files))
	for _, f := range files {
		onDisk[manifest.FileNum(f.Num)] = true
	}
	for num := range d.walStart {
		if !onDisk[num] {
			delete(d.walStart, num)
		}
	}
	h := d.logSeq + 1
	for _, f := range files {
		if s, ok := d.walStart[manifest.FileNum(f.Num)]; ok {
			h = s
			break
		}
		s, ok, err := d.firstSeqOf(f)
		if err != nil {
			d.log.Warn("read wal for the history horizon", "wal", f.Name, "err", err)
			return
		}
		if ok {
			h = s
			break
		}
	}
	if h > d.HistoryHorizon() {
		d.horizon.Store(uint64(h))
	}
}
