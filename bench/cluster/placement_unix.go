//go:build unix

package cluster

import (
	"io/fs"
	"syscall"
)

// allocatedBytes is the disk space a file takes (its allocated blocks, as
// du counts them).
func allocatedBytes(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return info.Size()
}

// RaiseFileLimit raises this process's open-file limit (RLIMIT_NOFILE),
// which the servers it starts inherit, to at least want if it can (the
// hard limit too when privileged, else up to the hard limit), and returns
// the soft limit in effect.
func RaiseFileLimit(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: max(lim.Max, want)})
	if err != nil && lim.Cur < lim.Max {
		err = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: min(want, lim.Max), Max: lim.Max})
	}
	if e := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); e != nil {
		return 0, e
	}
	return lim.Cur, err
}
