package storage

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

// ErrUpdatesUnavailable is matched (errors.Is) by the error UpdatesSince
// returns when the WAL holding the requested sequence number is gone: the
// caller must resynchronise from a checkpoint.
var ErrUpdatesUnavailable = errors.New("storage: updates no longer available in the WAL")

// UpdatesUnavailableError reports the oldest sequence number still served.
type UpdatesUnavailableError struct {
	Requested SeqNum
	// Earliest is the first sequence number available (0 if none).
	Earliest SeqNum
}

// Error describes the gap.
func (e *UpdatesUnavailableError) Error() string {
	return fmt.Sprintf("storage: updates since %d no longer available (earliest available: %d); resync from a checkpoint",
		e.Requested, e.Earliest)
}

// Is makes errors.Is(err, ErrUpdatesUnavailable) true.
func (e *UpdatesUnavailableError) Is(target error) bool { return target == ErrUpdatesUnavailable }

func sortWALFiles(files []WALFile) {
	sort.Slice(files, func(i, j int) bool { return files[i].Num < files[j].Num })
}

// UpdatesIterator returns the batches committed since a sequence number, in
// commit order, each with its sequence number and LogData records, read
// from the live and archived WAL files. It ends at the last batch visible
// when it was created; call UpdatesSince again to continue from there.
// Batches written with DisableWAL are not in the WAL and so not returned.
type UpdatesIterator struct {
	d      *DB
	files  []WALFile
	idx    int
	f      vfs.File
	r      *wal.Reader
	start  SeqNum
	limit  SeqNum
	batch  *Batch
	err    error
	closed bool
}

// UpdatesSince returns an iterator over the batches containing sequence
// numbers >= seq (the first may start before seq if seq falls inside it).
// It fails with an error matching ErrUpdatesUnavailable when the WAL that
// held seq has been deleted.
func (d *DB) UpdatesSince(seq SeqNum) (*UpdatesIterator, error) {
	if seq == 0 {
		seq = 1
	}
	limit := SeqNum(d.visibleSeq.Load())
	it := &UpdatesIterator{d: d, start: seq, limit: limit}
	if seq > limit {
		return it, nil // nothing yet
	}
	// Make every visible batch readable from the WAL file.
	if err := d.flushWAL(); err != nil {
		return nil, err
	}
	files, err := d.WALFiles()
	if err != nil {
		return nil, err
	}
	// Find the newest file whose first batch starts at or before seq.
	first := -1
	var earliest SeqNum
	for i, f := range files {
		s, ok, err := d.firstSeqOf(f)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if earliest == 0 {
			earliest = s
		}
		if s <= seq {
			first = i
		} else {
			break
		}
	}
	if first < 0 {
		return nil, &UpdatesUnavailableError{Requested: seq, Earliest: earliest}
	}
	it.files = files[first:]
	return it, nil
}

// firstSeqOf returns the sequence number of the first batch in f.
func (d *DB) firstSeqOf(f WALFile) (SeqNum, bool, error) {
	file, path, err := d.openWAL(f)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, false, nil
		}
		return 0, false, err
	}
	defer file.Close()
	rec, err := wal.NewReader(file, path).Next()
	if err != nil || len(rec) < batchHeaderLen {
		return 0, false, nil // empty or torn: holds nothing to serve
	}
	b := Batch{data: rec}
	return b.SeqNum(), true, nil
}

// openWAL opens f, looking in the archive if it was moved there meanwhile.
func (d *DB) openWAL(f WALFile) (vfs.File, string, error) {
	file, err := d.fs.Open(f.Path)
	if err == nil || f.Archived || !errors.Is(err, os.ErrNotExist) {
		return file, f.Path, err
	}
	path := d.fs.Join(d.dirname, archiveDirName, f.Name)
	file, err = d.fs.Open(path)
	return file, path, err
}

// Next moves to the next batch and reports whether there is one.
func (it *UpdatesIterator) Next() bool {
	if it.err != nil || it.closed {
		return false
	}
	for {
		if it.r == nil {
			if it.idx >= len(it.files) {
				return false
			}
			f, path, err := it.d.openWAL(it.files[it.idx])
			if err != nil {
				it.err = fmt.Errorf("updates: open wal %s: %w", it.files[it.idx].Name, err)
				return false
			}
			it.f, it.r = f, wal.NewReader(f, path)
		}
		rec, err := it.r.Next()
		if err != nil {
			last := it.idx == len(it.files)-1
			_ = it.f.Close()
			it.f, it.r = nil, nil
			it.idx++
			if err == io.EOF || errors.Is(err, wal.ErrTornTail) {
				continue
			}
			if last {
				// The live tail may be mid-write; stop here.
				return false
			}
			it.err = fmt.Errorf("updates: %w", err)
			return false
		}
		b, err := decodeBatch(append([]byte(nil), rec...))
		if err != nil {
			it.err = fmt.Errorf("updates: wal %s: %w", it.files[it.idx].Name, err)
			return false
		}
		seq := b.SeqNum()
		if seq > it.limit {
			return false
		}
		if end := seq + b.seqSpan() - 1; end < it.start {
			continue
		}
		it.batch = b
		return true
	}
}

// Batch returns the current batch; its SeqNum is the sequence number of its
// first record. It stays valid after Next.
func (it *UpdatesIterator) Batch() *Batch { return it.batch }

// Error returns the error that stopped the iterator, if any.
func (it *UpdatesIterator) Error() error { return it.err }

// Close releases the iterator.
func (it *UpdatesIterator) Close() error {
	if it.closed {
		return nil
	}
	it.closed = true
	if it.f != nil {
		return it.f.Close()
	}
	return nil
}
