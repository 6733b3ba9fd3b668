package memtable

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestLargeArenaAdvisedHugePages: a large arena's whole 2-MiB pages are
// advised as huge pages (the mapping holding them carries the "hg" VmFlag
// in /proc/self/smaps), whatever the machine's THP setting does with the
// advice.
func TestLargeArenaAdvisedHugePages(t *testing.T) {
	a := newArena(16 << 20)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(a.buf)))
	start := (p + hugePageSize - 1) &^ (hugePageSize - 1)
	flags, ok := vmFlagsAt(t, start)
	if !ok {
		t.Fatalf("no mapping in /proc/self/smaps holds the arena at %#x", start)
	}
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Fatalf("the mapping holding a 16-MiB arena's first whole huge page has VmFlags %q, want hg", flags)
	}
}

// vmFlagsAt returns the VmFlags of the mapping of /proc/self/smaps that
// holds addr.
func vmFlagsAt(t *testing.T, addr uintptr) (string, bool) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := mappingRange(line); ok {
			in = addr >= lo && addr < hi
			continue
		}
		if in {
			if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok {
				return strings.TrimSpace(rest), true
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return "", false
}

// mappingRange parses the "lo-hi perms ..." header line of a mapping.
func mappingRange(line string) (lo, hi uintptr, ok bool) {
	field, _, _ := strings.Cut(line, " ")
	l, h, found := strings.Cut(field, "-")
	if !found {
		return 0, 0, false
	}
	a, err1 := strconv.ParseUint(l, 16, 64)
	b, err2 := strconv.ParseUint(h, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(a), uintptr(b), true
}
