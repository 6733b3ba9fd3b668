//go:build unix && !linux

package proctest

import "syscall"

// serverSysProcAttr: only Linux has a parent death signal; elsewhere the
// tests' cleanups kill the servers.
func serverSysProcAttr() *syscall.SysProcAttr { return nil }
