// Package vfs is the engine's only door to the filesystem. Everything the
// engine reads or writes goes through an FS, so tests can swap the operating
// system for an in-memory filesystem that simulates crashes (NewCrashableMem)
// or for a wrapper that injects errors and latency (package vfs/errorfs).
package vfs

import (
	"fmt"
	"io"
	"os"
)

// File is an open file. Writes go to the end of the file (files are written
// sequentially and never rewritten in place). Data written is durable only
// after Sync returns nil; a crash may drop any unsynced suffix.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	io.Closer
	// Sync makes all data written so far durable. For a directory opened with
	// OpenDir it makes the directory's entries (creations, renames, removals)
	// durable.
	Sync() error
	// Stat returns the file's metadata; Size is the number of bytes written.
	Stat() (os.FileInfo, error)
}

// FS is a filesystem. Paths use the host's separator; use Join to build them.
//
// Durability contract, mirrored by the crash-simulating filesystem: file
// contents survive a crash only up to the last Sync of that file, and a
// file's existence under a name (after Create, Rename, Link or Remove)
// survives only after Sync of its parent directory opened with OpenDir.
type FS interface {
	// Create creates or truncates the named file for writing.
	Create(name string) (File, error)
	// Open opens the named file for reading.
	Open(name string) (File, error)
	// OpenAppend opens the existing named file for writing at its end,
	// keeping its contents; it fails if the file does not exist. Reads
	// through the handle start at offset 0.
	OpenAppend(name string) (File, error)
	// OpenDir opens a directory so its entries can be synced.
	OpenDir(name string) (File, error)
	// Remove removes the named file or empty directory.
	Remove(name string) error
	// RemoveAll removes name and everything under it; a missing name is not
	// an error.
	RemoveAll(name string) error
	// Rename atomically renames oldname to newname, replacing newname.
	Rename(oldname, newname string) error
	// Link makes newname a hard link to oldname: both names share contents.
	Link(oldname, newname string) error
	// MkdirAll creates a directory and any missing parents.
	MkdirAll(dir string, perm os.FileMode) error
	// List returns the names (not paths) of the entries in dir, sorted.
	List(dir string) ([]string, error)
	// Stat returns metadata for the named file.
	Stat(name string) (os.FileInfo, error)
	// Lock takes an exclusive lock on the named file, creating it if needed,
	// so that two processes (or two opens in one process) cannot use the same
	// database at once. Close the returned closer to release it.
	Lock(name string) (io.Closer, error)
	// Join joins path elements with the filesystem's separator.
	Join(elem ...string) string
}

// SyncDir makes the entries of directory dir (files created, renamed or
// removed in it) durable by syncing the directory itself.
func SyncDir(fs FS, dir string) error {
	f, err := fs.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
