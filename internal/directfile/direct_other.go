//go:build !linux

package directfile

import (
	"os"
	"unsafe"
)

// openDirectOS returns nil: direct writes are used on Linux only.
func openDirectOS(string) *os.File { return nil }

// alignOf is the address of b's first byte modulo align.
func alignOf(b []byte) int {
	return int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % align)
}
