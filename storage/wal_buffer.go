package storage

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// walBuffer sits between the WAL's record framing and its file. Commits
// append framed bytes to it (a memory copy under a short lock); drain writes
// what is pending to the file. Commit leaders therefore never wait for a
// write system call made on behalf of earlier commits: the background
// flusher, or a synced commit, drains while the next group is framed.
//
// Pending bytes are held in fixed-size chunks borrowed from a pool shared by
// the process's DBs and given back by drain, so a DB that is not writing
// holds none (a node hosting thousands of mostly idle shard engines would
// otherwise keep 64 KiB or more per engine), and a burst that outruns the
// drains (a log replayed into a restored engine) takes more chunks instead
// of growing one buffer by copying it into ever larger fresh memory.
type walBuffer struct {
	f    vfs.File
	bufs *sync.Pool // of *[]byte, walBufferSize capacity

	mu sync.Mutex // guards pending, pendingLen, spare and err
	// pending are the chunks holding the bytes appended and not yet
	// drained, in order; only the last may have room left.
	pending    []*[]byte
	pendingLen int
	// spare is a drained chunk list kept for reuse as pending.
	spare []*[]byte
	err   error

	// drainMu serialises drains so bytes reach the file in order.
	drainMu sync.Mutex
	written int64 // bytes written to the file, under drainMu
	// prealloc is the preallocation step (0: none); reserved is how far the
	// file is preallocated. Both under drainMu.
	prealloc, reserved int64
	// syncs counts the syncs since the last preallocation step; once a
	// step saw walZeroSyncs of them, the next steps are zeroed ahead
	// (reserve). noZero is set once zeroing failed. syncs is atomic (a
	// sync may run beside a drain); noZero is under drainMu.
	syncs  atomic.Int64
	noZero bool
	// writtenBack is how far the file's writing to the disk has been
	// started (StartWriteback), under drainMu; noWriteback is set once the
	// file turned out not to support it.
	writtenBack int64
	noWriteback bool
	// lastSync is how long the last sync took (ns), syncedTo how many
	// written bytes it covered; held counts the syncs made holding the
	// thread's P (vfs.SyncDataHeld, see sync).
	lastSync atomic.Int64
	syncedTo atomic.Int64
	held     atomic.Int64
}

// heldSyncMax is the longest the previous sync of a WAL may have taken for
// the next one to hold its thread's P (vfs.SyncDataHeld), and heldSyncBytes
// the most bytes written since that sync. The Raft log's syncs, one per Raft
// cycle, cover a few KiB and take 0.3-1.4 ms on this project's benchmark
// machine; a disk turning slow (a sync past the bound) makes the next syncs
// ordinary ones, so that a stop-the-world does not wait for them, until one
// is quick again, and a rare sync of much data (a shard engine's at a
// memtable rotation) is always an ordinary one.
const (
	heldSyncMax   = 2 * time.Millisecond
	heldSyncBytes = 256 << 10
)

// walWritebackBytes is how many written WAL bytes may wait in the page cache
// before drain asks the operating system to start writing them out. Without
// it, the sync at a memtable rotation wrote out the whole WAL written since
// the last sync (up to the memtable's 64 MiB) with the commit path stopped:
// 36-55 ms per rotation in a 2M-key overwrite (2026-11-28). RocksDB and
// Pebble offer the same as wal_bytes_per_sync / WALBytesPerSync.
const walWritebackBytes = 1 << 20

// walBufferSize is the capacity of a pooled WAL buffer chunk.
const walBufferSize = 64 << 10

// walZeroSyncs is how many syncs a preallocation step of the WAL must have
// seen for the next steps to be zeroed ahead of the writes
// (vfs.ZeroPreallocated). A WAL synced this often (the Raft log's, synced
// once per Raft cycle) saves an extent change per sync for one extra
// page-cache write of each step; one synced rarely (a shard engine's, at a
// flush or for log truncation) is only preallocated, as writing its zeros
// would cost more than its few syncs save.
const walZeroSyncs = 16

// newWALBuffer buffers writes to f, borrowing buffers from bufs, and
// preallocating the file in steps of prealloc bytes (none if prealloc <= 0).
func newWALBuffer(f vfs.File, bufs *sync.Pool, prealloc int64) *walBuffer {
	return &walBuffer{f: f, bufs: bufs, prealloc: max(prealloc, 0)}
}

// reserve preallocates the file past end when it is not yet. A file or
// filesystem that cannot preallocate, or a failed preallocation, turns
// preallocation off: the write then simply extends the file (and reports
// any real problem, such as a full disk, itself). A WAL synced often
// (walZeroSyncs) is preallocated half a step ahead of end, and the new
// space zeroed at once, so that its syncs find the zeros written by then;
// a failure to zero leaves the space preallocated, and zeroing off.
func (b *walBuffer) reserve(end int64) {
	if b.prealloc == 0 {
		return
	}
	zero := !b.noZero && b.syncs.Load() >= walZeroSyncs
	if zero {
		end += b.prealloc / 2
	}
	if end <= b.reserved {
		return
	}
	n := (end - b.reserved + b.prealloc - 1) / b.prealloc * b.prealloc
	if err := vfs.Preallocate(b.f, b.reserved, n); err != nil {
		b.prealloc = 0
		return
	}
	if zero {
		if err := vfs.ZeroPreallocated(b.f, b.reserved, n); err != nil {
			b.noZero = true
		}
	}
	b.reserved += n
	b.syncs.Store(0)
}

// writtenBytes returns how many bytes reached the file (the file may be
// longer: preallocated).
func (b *walBuffer) writtenBytes() int64 {
	b.drainMu.Lock()
	defer b.drainMu.Unlock()
	return b.written
}

// trimReserved gives back the preallocated space past the written bytes
// (before the file is synced and closed), so the file's size is what was
// written.
func (b *walBuffer) trimReserved() error {
	b.drainMu.Lock()
	defer b.drainMu.Unlock()
	if b.reserved <= b.written {
		return nil
	}
	if err := vfs.Truncate(b.f, b.written); err != nil {
		return fmt.Errorf("trim preallocated wal: %w", err)
	}
	b.reserved = b.written
	return nil
}

// Write appends p to the pending bytes. It fails once a drain has failed:
// nothing appended after a failed file write could ever be made durable in
// order.
func (b *walBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	n := len(p)
	for len(p) > 0 {
		var last *[]byte
		if k := len(b.pending); k > 0 && len(*b.pending[k-1]) < cap(*b.pending[k-1]) {
			last = b.pending[k-1]
		} else {
			last = b.chunk()
			b.pending = append(b.pending, last)
		}
		room := min(len(p), cap(*last)-len(*last))
		*last = append(*last, p[:room]...)
		p = p[room:]
	}
	b.pendingLen += n
	return n, nil
}

// chunk borrows an empty chunk from the pool (a new one when it has none).
func (b *walBuffer) chunk() *[]byte {
	if c, ok := b.bufs.Get().(*[]byte); ok && cap(*c) == walBufferSize {
		*c = (*c)[:0]
		return c
	}
	c := make([]byte, 0, walBufferSize)
	return &c
}

// pendingBytes returns how many appended bytes have not reached the file.
func (b *walBuffer) pendingBytes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pendingLen
}

// drain writes every byte appended so far to the file (no sync).
func (b *walBuffer) drain() error {
	b.drainMu.Lock()
	defer b.drainMu.Unlock()
	b.mu.Lock()
	if b.err != nil || b.pendingLen == 0 {
		err := b.err
		b.mu.Unlock()
		return err
	}
	// Writes made during the file writes go to other chunks.
	chunks, total := b.pending, b.pendingLen
	b.pending, b.pendingLen, b.spare = b.spare, 0, nil
	b.mu.Unlock()

	b.reserve(b.written + int64(total))
	var err error
	for i, c := range chunks {
		if err == nil {
			var n int
			n, err = b.f.Write(*c)
			b.written += int64(n)
		}
		b.bufs.Put(c)
		chunks[i] = nil
	}
	b.mu.Lock()
	if b.spare == nil {
		b.spare = chunks[:0]
	}
	b.mu.Unlock()
	if err == nil && !b.noWriteback && b.written-b.writtenBack >= walWritebackBytes {
		// Only an optimisation: a failure to start the writing changes
		// nothing that the next sync would not report itself.
		if werr := vfs.StartWriteback(b.f, b.writtenBack, b.written-b.writtenBack); werr != nil {
			b.noWriteback = true
		}
		b.writtenBack = b.written
	}

	if err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.err = fmt.Errorf("write wal at offset %d: %w", b.written, err)
		return b.err
	}
	return nil
}

// sync drains and then syncs the file's data: on success everything
// appended before the call is durable. The sync holds the thread's P
// (vfs.SyncDataHeld) while the previous one took at most heldSyncMax and at
// most heldSyncBytes were written since it.
func (b *walBuffer) sync() error {
	if err := b.drain(); err != nil {
		return err
	}
	b.drainMu.Lock()
	written := b.written
	b.drainMu.Unlock()
	syncData := vfs.SyncData
	if time.Duration(b.lastSync.Load()) <= heldSyncMax && written-b.syncedTo.Load() <= heldSyncBytes {
		syncData = vfs.SyncDataHeld
		b.held.Add(1)
	}
	start := time.Now()
	err := syncData(b.f)
	b.lastSync.Store(int64(time.Since(start)))
	if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = fmt.Errorf("sync wal: %w", err)
		}
		b.mu.Unlock()
		return err
	}
	b.syncs.Add(1)
	b.syncedTo.Store(written)
	return nil
}
