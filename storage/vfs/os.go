package vfs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// Default is the operating system's filesystem. Its files are *os.File
// values, so every error it returns is an *os.PathError or *os.LinkError
// naming the path, and errors.Is(err, os.ErrNotExist) holds for missing
// files. Lock uses flock(2) where available (see Lock on FS).
var Default FS = osFS{}

// ErrLocked is matched by errors.Is for the error Lock returns when the lock
// is already held, by another process or by another Lock call in this one.
// The full message reads "lock <path>: already held by another process".
var ErrLocked = errors.New("already held by another process")

type osFS struct{}

var _ FS = osFS{}

func (osFS) Create(name string) (File, error) { return os.Create(name) }

func (osFS) Open(name string) (File, error) { return os.Open(name) }

func (osFS) OpenAppend(name string) (File, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_APPEND, 0)
}

// OpenDir opens a directory; Sync on the result fsyncs the directory itself,
// which is what makes entries created, renamed or removed in it durable.
func (osFS) OpenDir(name string) (File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.IsDir() {
		f.Close()
		return nil, &os.PathError{Op: "opendir", Path: name, Err: syscall.ENOTDIR}
	}
	return f, nil
}

func (osFS) Remove(name string) error { return os.Remove(name) }

func (osFS) RemoveAll(name string) error { return os.RemoveAll(name) }

func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

func (osFS) Link(oldname, newname string) error { return os.Link(oldname, newname) }

func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

func (osFS) List(dir string) ([]string, error) {
	// os.ReadDir sorts by name.
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

func (osFS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }

func (osFS) Lock(name string) (io.Closer, error) { return lockFile(name) }

func (osFS) Join(elem ...string) string { return filepath.Join(elem...) }

// underlying strips an *os.PathError so it can be rewrapped under another op.
func underlying(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
