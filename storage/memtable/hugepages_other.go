//go:build !linux

package memtable

// adviseHugePages does nothing where transparent huge pages cannot be
// asked for (see the Linux version).
func adviseHugePages([]byte) {}
