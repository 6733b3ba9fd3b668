package memtable

import (
	"syscall"
	"unsafe"
)

// hugePageSize is the size of a transparent huge page on Linux (x86-64 and
// arm64 with 4-KiB base pages).
const hugePageSize = 2 << 20

// adviseHugePages asks the kernel to back the whole 2-MiB pages inside buf
// with transparent huge pages (madvise MADV_HUGEPAGE), before anything
// touches them: filling a fresh arena then takes one page fault per 2 MiB
// instead of one per 4 KiB, which on a virtual machine costs more than
// the copying itself. It is advice: where THP is off ("never") or the
// kernel has no huge page free, the pages stay small, and errors are
// ignored. Arenas under minHugeArena are left alone, so an idle shard's
// small memtable does not pin 2-MiB pages.
func adviseHugePages(buf []byte) {
	if len(buf) < minHugeArena {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	start := (p + hugePageSize - 1) &^ (hugePageSize - 1)
	end := (p + uintptr(len(buf))) &^ (hugePageSize - 1)
	if end <= start {
		return
	}
	_ = syscall.Madvise(buf[start-p:end-p], syscall.MADV_HUGEPAGE)
}
