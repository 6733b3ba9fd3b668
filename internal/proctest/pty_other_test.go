//go:build unix && !linux

package proctest

import (
	"errors"
	"os"
)

// openPTY is Linux-only here: the pseudo-terminal tests skip elsewhere.
func openPTY() (control, terminal *os.File, err error) {
	return nil, nil, errors.New("pseudo-terminals are only opened on Linux in these tests")
}

// sessionProcesses needs /proc: none are known elsewhere.
func sessionProcesses(sid int) []int { return nil }
