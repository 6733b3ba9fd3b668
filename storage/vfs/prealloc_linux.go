package vfs

import (
	"os"
	"syscall"
)

func preallocate(f *os.File, offset, n int64) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = syscall.Fallocate(int(fd), 0, offset, n)
			if ferr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if ferr == syscall.EOPNOTSUPP || ferr == syscall.ENOSYS {
		return ErrUnsupported
	}
	if ferr != nil {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: ferr}
	}
	return nil
}

func syncData(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}
