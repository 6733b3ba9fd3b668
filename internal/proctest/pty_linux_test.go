//go:build linux

package proctest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// openPTY opens a new pseudo-terminal: its controlling side (writing
// "\x03" to it is a Ctrl-C typed at the terminal) and the terminal a
// process gets as its stdin, stdout and stderr.
func openPTY() (control, terminal *os.File, err error) {
	control, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, control.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		control.Close()
		return nil, nil, fmt.Errorf("unlock the pseudo-terminal: %w", e)
	}
	var num uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, control.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&num))); e != 0 {
		control.Close()
		return nil, nil, fmt.Errorf("number of the pseudo-terminal: %w", e)
	}
	terminal, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(num), 10), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		control.Close()
		return nil, nil, err
	}
	return control, terminal, nil
}

// sessionProcesses returns the pids of the live processes in session sid
// (zombies excluded), read from /proc.
func sessionProcesses(sid int) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...; comm may hold spaces.
		rest := string(b)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 4 || f[0] == "Z" {
			continue
		}
		if s, err := strconv.Atoi(f[3]); err == nil && s == sid {
			pids = append(pids, pid)
		}
	}
	return pids
}
