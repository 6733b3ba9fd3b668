package vfs

import (
	"os"
	"syscall"
)

func preallocate(f *os.File, offset, n int64) error {
	err := onFD(f, func(fd int) error { return syscall.Fallocate(fd, 0, offset, n) })
	if err == syscall.EOPNOTSUPP || err == syscall.ENOSYS {
		return ErrUnsupported
	}
	if err != nil {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
	}
	return nil
}

func startWriteback(f *os.File, offset, n int64) error {
	err := onFD(f, func(fd int) error {
		return syscall.SyncFileRange(fd, offset, n, 0x2 /* SYNC_FILE_RANGE_WRITE */)
	})
	if err == syscall.EOPNOTSUPP || err == syscall.ENOSYS {
		return ErrUnsupported
	}
	if err != nil {
		return &os.PathError{Op: "sync_file_range", Path: f.Name(), Err: err}
	}
	return nil
}

func syncData(f *os.File) error {
	if err := onFD(f, syscall.Fdatasync); err != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
	}
	return nil
}

func syncDataHeld(f *os.File) error {
	err := onFD(f, func(fd int) error {
		if _, _, errno := syscall.RawSyscall(syscall.SYS_FDATASYNC, uintptr(fd), 0, 0); errno != 0 {
			return errno
		}
		return nil
	})
	if err != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
	}
	return nil
}

// onFD runs call on f's descriptor (without taking it out of the runtime's
// hands, unlike File.Fd), retrying while it is interrupted, and returns its
// error.
func onFD(f *os.File, call func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var callErr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if callErr = call(int(fd)); callErr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return callErr
}
