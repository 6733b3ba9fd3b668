package proctest

import "syscall"

// serverSysProcAttr makes a server die with the test process (Linux's parent
// death signal), so that a test binary killed by its timeout leaves no
// servers behind.
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
