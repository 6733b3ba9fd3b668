//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package vfs

import (
	"io"
	"os"
	"path/filepath"
	"sync"
)

// On platforms without flock the lock only excludes other Lock calls in this
// process (keyed by absolute path); it does not protect against other
// processes.
var processLocks struct {
	sync.Mutex
	held map[string]bool
}

func lockFile(name string) (io.Closer, error) {
	abs, err := filepath.Abs(name)
	if err != nil {
		return nil, &os.PathError{Op: "lock", Path: name, Err: err}
	}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, &os.PathError{Op: "lock", Path: name, Err: underlying(err)}
	}
	processLocks.Lock()
	defer processLocks.Unlock()
	if processLocks.held[abs] {
		f.Close()
		return nil, &os.PathError{Op: "lock", Path: name, Err: ErrLocked}
	}
	if processLocks.held == nil {
		processLocks.held = make(map[string]bool)
	}
	processLocks.held[abs] = true
	return &processLock{abs: abs, f: f}, nil
}

type processLock struct {
	once sync.Once
	abs  string
	f    *os.File
	err  error
}

func (l *processLock) Close() error {
	l.once.Do(func() {
		processLocks.Lock()
		delete(processLocks.held, l.abs)
		processLocks.Unlock()
		l.err = l.f.Close()
	})
	return l.err
}
