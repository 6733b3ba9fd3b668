//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package backup

import (
	"errors"
	"os"
	"syscall"
)

// processGone reports whether no process with this PID runs on this host
// (kill(pid, 0) finds none). A process of another user counts as running.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// hostLock takes flock(LOCK_EX|LOCK_NB) on name, a file of this host
// (created if absent), without waiting: ok is false when another open file
// holds it, even in this process. release gives it back.
func hostLock(name string) (release func(), ok bool) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, false
	}
	return func() { _ = f.Close() }, true
}
