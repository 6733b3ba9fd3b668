package vfs

import (
	"errors"
	"os"
)

// ErrUnsupported is matched by errors.Is for the error Preallocate and
// Truncate return for files that cannot do it (files of in-memory or
// wrapping filesystems, or an OS or filesystem without the system call).
var ErrUnsupported = errors.New("vfs: not supported for this file")

// Preallocate reserves disk space for bytes [offset, offset+n) of f and
// extends f's size to cover them. The reserved bytes read as zeros until
// written. Later writes inside the reserved range change neither the size
// nor the allocation. Filesystems that keep reserved space as unwritten
// extents (ext4, XFS) still change the extent map at the first write into
// each, which the SyncData after that write must commit; ZeroPreallocated
// makes that change once for a whole range ahead of the writes. Only
// operating-system files support it (fallocate(2) on Linux); others return
// ErrUnsupported and are unchanged.
func Preallocate(f File, offset, n int64) error {
	of, ok := f.(*os.File)
	if !ok {
		return ErrUnsupported
	}
	return preallocate(of, offset, n)
}

// zeroChunk is what ZeroPreallocated writes, one chunk at a time.
var zeroChunk [64 << 10]byte

// ZeroPreallocated writes zeros over bytes [offset, offset+n) of f, which
// Preallocate reserved and nothing wrote yet, and starts writing them to
// the disk (StartWriteback). On filesystems that keep reserved space as
// unwritten extents, the zeros turn the range's extents into written ones
// once, so that a synced write there later is a data write and a cache
// flush, with no extent change for SyncData to commit: on this project's
// ext4 disk, 3 writers each appending 1,400 bytes and syncing, beside 2
// busy threads, made 5,260-5,480 syncs a second against 3,950-4,100 with
// the space only reserved, at 36-41 against 53-63 us of kernel CPU a sync
// (BENCHMARKS.md). It keeps the range reading as zeros across a crash: a
// filesystem marks an unwritten extent written only once the data written
// into it is on the disk. The zeros are written in f's page cache, as many
// bytes again as the range. Only operating-system files support it; others
// return ErrUnsupported and are unchanged.
func ZeroPreallocated(f File, offset, n int64) error {
	of, ok := f.(*os.File)
	if !ok {
		return ErrUnsupported
	}
	for done := int64(0); done < n; {
		c := min(n-done, int64(len(zeroChunk)))
		if _, err := of.WriteAt(zeroChunk[:c], offset+done); err != nil {
			return err
		}
		done += c
	}
	// Only an optimisation: a later sync writes the zeros itself.
	_ = startWriteback(of, offset, n)
	return nil
}

// SyncData makes the data written to f durable, and of its metadata only
// what is needed to read that data back (fdatasync(2) on Linux: the size,
// but not the modification time). Files without such a call are synced
// with Sync.
func SyncData(f File) error {
	if of, ok := f.(*os.File); ok {
		return syncData(of)
	}
	return f.Sync()
}

// SyncDataHeld is SyncData made without letting go of the calling thread's
// place in the Go scheduler (its P): on Linux a raw fdatasync(2), which the
// runtime does not see as a blocking system call, so no other thread is
// woken to take the P over while the disk syncs and none hands it back
// after. It suits a sync that is short and frequent (the Raft log's, once
// per Raft cycle): a system call lasting past the scheduler monitor's 20 µs
// check has its P handed to another thread, a wake-up and a context switch
// per sync, after which the monitor polls every 20 µs for the next
// millisecond. While it is held, a stop-the-world (a garbage collection's
// start or end) waits for the sync to end, and the goroutines queued on the
// P run only once another P takes them; so a caller holds only syncs it
// expects to be short. Files without such a call are synced with Sync.
func SyncDataHeld(f File) error {
	if of, ok := f.(*os.File); ok {
		return syncDataHeld(of)
	}
	return f.Sync()
}

// StartWriteback asks the operating system to start writing bytes
// [offset, offset+n) of f to the disk, without waiting for the writes and
// without syncing any metadata (sync_file_range(2) with
// SYNC_FILE_RANGE_WRITE on Linux). It makes nothing durable: it only
// spreads the writing of a file that is appended to steadily, so that a
// later Sync or SyncData finds little left to write. Files of other
// filesystems, and other operating systems, return ErrUnsupported.
func StartWriteback(f File, offset, n int64) error {
	of, ok := f.(*os.File)
	if !ok {
		return ErrUnsupported
	}
	return startWriteback(of, offset, n)
}

// Truncate sets f's size to size (dropping, for example, the unused part of
// a preallocation). Only operating-system files support it; others return
// ErrUnsupported.
func Truncate(f File, size int64) error {
	of, ok := f.(*os.File)
	if !ok {
		return ErrUnsupported
	}
	return of.Truncate(size)
}
