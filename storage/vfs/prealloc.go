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
// nor the allocation, so SyncData after them need not commit file metadata:
// on Linux this makes each synced append to a write-ahead log one data
// write and a cache flush instead of a filesystem journal commit. Only
// operating-system files support it (fallocate(2) on Linux); others return
// ErrUnsupported and are unchanged.
func Preallocate(f File, offset, n int64) error {
	of, ok := f.(*os.File)
	if !ok {
		return ErrUnsupported
	}
	return preallocate(of, offset, n)
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
