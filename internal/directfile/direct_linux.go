//go:build linux

package directfile

import (
	"os"
	"syscall"
	"unsafe"
)

// openDirectOS opens the existing file path for direct writes (O_DIRECT),
// or returns nil where its filesystem does not take them.
func openDirectOS(path string) *os.File {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_DIRECT, 0)
	if err != nil {
		return nil
	}
	return f
}

// alignOf is the address of b's first byte modulo align.
func alignOf(b []byte) int {
	return int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % align)
}
