//go:build !linux

package snapshot

import (
	"os"
	"unsafe"
)

// openDirectOS returns nil: direct writes are used on Linux only.
func openDirectOS(string) *os.File { return nil }

// alignOf is the address of b's first byte modulo directAlign.
func alignOf(b []byte) int {
	return int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % directAlign)
}
