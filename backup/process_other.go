//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package backup

// processGone reports whether no process with this PID runs on this host.
// Without kill(2) it cannot tell, and says the process runs: a lock it left
// is removed by hand.
func processGone(int) bool { return false }

// hostLock would take a host-wide lock on name; without flock it takes
// none and says so.
func hostLock(string) (release func(), ok bool) { return nil, false }
