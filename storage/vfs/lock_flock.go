//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package vfs

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
)

// lockFile takes flock(LOCK_EX|LOCK_NB) on name. flock locks belong to the
// open file description, so a second open of the same file, even in the same
// process, conflicts with the first and fails here rather than blocking.
func lockFile(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, &os.PathError{Op: "lock", Path: name, Err: underlying(err)}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &os.PathError{Op: "lock", Path: name, Err: ErrLocked}
		}
		return nil, &os.PathError{Op: "lock", Path: name, Err: err}
	}
	return &osLock{f: f}, nil
}

type osLock struct {
	once sync.Once
	f    *os.File
	err  error
}

// Close releases the lock by closing the descriptor; later calls return the
// first call's result.
func (l *osLock) Close() error {
	l.once.Do(func() { l.err = l.f.Close() })
	return l.err
}
