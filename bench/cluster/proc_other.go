//go:build !linux

package cluster

import "syscall"

// memberSysProcAttr: no process attributes outside Linux (no parent-death
// signal there; a killed shale-bench may leave its members running).
func memberSysProcAttr() *syscall.SysProcAttr { return nil }
