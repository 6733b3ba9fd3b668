package cluster

import "syscall"

// memberSysProcAttr puts a member process in its own process group (a
// terminal's Ctrl-C reaches only shale-bench, which stops the members in
// order) and has the kernel send it SIGTERM should shale-bench die without
// stopping it.
func memberSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
