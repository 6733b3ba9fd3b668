package storage

import (
	"errors"
	"fmt"
	"io"
	"math"
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
	// Earliest is the first sequence number available (0 if none or
	// unknown).
	Earliest SeqNum
	// Cause, when set, says how the updates went missing.
	Cause error
}

// Error describes the gap.
func (e *UpdatesUnavailableError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("storage: updates since %d no longer available: %v; resync from a checkpoint", e.Requested, e.Cause)
	}
	return fmt.Sprintf("storage: updates since %d no longer available (earliest available: %d); resync from a checkpoint",
		e.Requested, e.Earliest)
}

// Is makes errors.Is(err, ErrUpdatesUnavailable) true.
func (e *UpdatesUnavailableError) Is(target error) bool { return target == ErrUpdatesUnavailable }

func sortWALFiles(files []WALFile) {
	sort.Slice(files, func(i, j int) bool { return files[i].Num < files[j].Num })
}

// UpdatesPosition is a place in the WAL stream where an UpdatesIterator
// stopped: the WAL file and the offset in it just past the last batch the
// iterator returned, and the sequence number that batch was followed by.
// UpdatesFrom continues there without searching the WAL files and without
// re-reading the file from its start.
//
// A position is a plain value, usable from any goroutine and across
// reopens of the DB (a WAL file is only appended to while it is the live
// one, never rewritten), until the WAL file it names is deleted; see
// UpdatesFrom for what happens then. The zero UpdatesPosition is the start
// of the stream: UpdatesFrom then behaves like UpdatesSince(1).
type UpdatesPosition struct {
	walNum  uint64 // WAL file number; 0 when no file is known yet
	offset  int64  // record boundary in that file
	nextSeq SeqNum // batches below it are never returned from here
}

// NextSeq returns the smallest sequence number a continuation from p may
// return: one past the last sequence number of the last batch returned
// before p (the sequence number the iterator started from if it returned
// none, and 1 for the zero UpdatesPosition). A batch numbered below it is
// never returned by UpdatesFrom(p).
func (p UpdatesPosition) NextSeq() SeqNum { return max(p.nextSeq, 1) }

// UpdatesIterator returns the batches committed since a sequence number, in
// commit order, each with its sequence number and LogData records, read
// from the live and archived WAL files. It ends at the last batch visible
// when it was created; call UpdatesFrom(it.Position()) to continue from
// there. Batches written with DisableWAL are not in the WAL and so not
// returned.
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
	// done is set once Next met a batch beyond limit: later calls must not
	// read past it (pos stays before it).
	done bool
	// pos is where a continuation starts (see Position).
	pos UpdatesPosition
	// strict (iterators of UpdatesFrom) skips every batch numbered below
	// pos.nextSeq, so nothing before the position is returned again.
	strict bool
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
	it := &UpdatesIterator{d: d, start: seq, limit: limit, pos: UpdatesPosition{nextSeq: seq}}
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
	it.pos.walNum = it.files[0].Num
	return it, nil
}

// UpdatesFrom returns an iterator over the batches after pos, a position
// returned by UpdatesIterator.Position of this DB (before or after a
// reopen), up to the last batch visible now: the batches UpdatesSince
// would return after the ones returned before pos, in commit order. It
// never returns a batch numbered below pos.NextSeq(). It reads pos's WAL
// file from pos's offset (also once the file has been archived) and goes
// on into the newer WAL files, so a tailer that continues from each
// iterator's Position reads every WAL byte about once.
//
// The zero UpdatesPosition behaves like UpdatesSince(1). When pos's WAL
// file has been deleted, UpdatesFrom behaves like UpdatesSince(pos.NextSeq()):
// it fails with an error matching ErrUpdatesUnavailable (an
// *UpdatesUnavailableError) unless a newer WAL starts right at
// pos.NextSeq(). It also fails with an error matching ErrUpdatesUnavailable
// when pos's WAL file is shorter than pos's offset (the file lost the
// writes the position was taken after, for example in a crash before they
// were synced).
func (d *DB) UpdatesFrom(pos UpdatesPosition) (*UpdatesIterator, error) {
	if pos.walNum == 0 {
		return d.updatesSinceStrict(pos.NextSeq())
	}
	limit := SeqNum(d.visibleSeq.Load())
	it := &UpdatesIterator{d: d, start: pos.NextSeq(), limit: limit, pos: pos, strict: true}
	if pos.NextSeq() > limit {
		return it, nil // nothing yet
	}
	// Make every visible batch readable from the WAL file.
	if err := d.flushWAL(); err != nil {
		return nil, fmt.Errorf("updates from wal %d: %w", pos.walNum, err)
	}
	files, err := d.WALFiles()
	if err != nil {
		return nil, fmt.Errorf("updates from wal %d: %w", pos.walNum, err)
	}
	i := sort.Search(len(files), func(i int) bool { return files[i].Num >= pos.walNum })
	if i == len(files) || files[i].Num != pos.walNum {
		return d.updatesSinceStrict(pos.NextSeq()) // deleted
	}
	wf := files[i]
	if wf.Size < pos.offset {
		return nil, fmt.Errorf("updates from wal %s at offset %d: the file has only %d bytes: %w",
			wf.Name, pos.offset, wf.Size, ErrUpdatesUnavailable)
	}
	f, path, err := d.openWAL(wf)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return d.updatesSinceStrict(pos.NextSeq()) // deleted since the listing
		}
		return nil, fmt.Errorf("updates: open wal %s: %w", wf.Name, err)
	}
	block := pos.offset - pos.offset%wal.BlockSize
	src := io.NewSectionReader(f, block, math.MaxInt64-block)
	it.files = files[i:]
	it.f, it.r = f, wal.NewReaderAt(src, path, pos.offset)
	return it, nil
}

// updatesSinceStrict is UpdatesSince(seq) whose iterator never returns a
// batch numbered below seq (UpdatesSince returns the batch containing seq
// even when it starts before it).
func (d *DB) updatesSinceStrict(seq SeqNum) (*UpdatesIterator, error) {
	it, err := d.UpdatesSince(seq)
	if err != nil {
		return nil, err
	}
	it.strict = true
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
	if it.err != nil || it.closed || it.done {
		return false
	}
	for {
		if it.r == nil {
			if it.idx >= len(it.files) {
				return false
			}
			f, path, err := it.d.openWAL(it.files[it.idx])
			if errors.Is(err, os.ErrNotExist) {
				// Deleted since the listing: what it held is gone.
				it.err = &UpdatesUnavailableError{Requested: it.pos.NextSeq(), Cause: fmt.Errorf("wal %s deleted while reading: %w", it.files[it.idx].Name, err)}
				return false
			}
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
				if !last {
					// A WAL is complete once a newer one exists (the old
					// one is written out and synced before the new one is
					// created): continuations start at the newer one.
					it.pos = UpdatesPosition{walNum: it.files[it.idx].Num, nextSeq: it.pos.nextSeq}
				}
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
			// Not consumed: a continuation must start before it.
			it.done = true
			return false
		}
		end := seq + b.seqSpan() - 1
		here := UpdatesPosition{walNum: it.files[it.idx].Num, offset: it.r.ValidOffset(), nextSeq: it.pos.nextSeq}
		if end < it.start || (it.strict && seq < it.pos.nextSeq) {
			it.pos = here // skipped for good: continuations need not reread it
			continue
		}
		here.nextSeq = max(here.nextSeq, end+1)
		it.pos = here
		it.batch = b
		return true
	}
}

// Position returns where a continuation of the iterator starts: just past
// the last batch Next returned, or where the iterator started if it
// returned none. UpdatesFrom(it.Position()) returns exactly the batches
// committed after that batch (within what is visible then), none of them
// again. Batches Next read and skipped (those before the start) are behind
// the position; a batch Next read but did not return because it was
// committed after the iterator was created is not. When Next has read past
// the end of a WAL file that is not the newest, the position is the start
// of the next file. Position may be called at any time, also after Close.
func (it *UpdatesIterator) Position() UpdatesPosition { return it.pos }

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
