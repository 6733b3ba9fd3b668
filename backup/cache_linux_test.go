//go:build linux

package backup

import (
	"bytes"
	"context"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentShare is the share of path's pages in the page cache.
func residentShare(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return float64(in) / float64(len(vec))
}

// TestRestoredFilesStayInPageCache: a backup's file is written around the
// page cache (it is read only by a restore or a verify, and must not push
// a serving node's data out), while the copy a restore places in a node's
// data directory is written through it, since the node opens it next.
func TestRestoredFilesStayInPageCache(t *testing.T) {
	ctx := context.Background()
	loc, err := Open(ctx, filepath.Join(t.TempDir(), "loc"), true)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 8<<20)
	rnd := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(rnd.Uint32())
	}
	crc := crc32.Checksum(data, castagnoli)
	f := File{Name: "000007.sst", Size: uint64(len(data)), CRC32C: crc, Path: storedPath(5, "000007.sst", uint64(len(data)), crc)}
	if err := loc.st.put(ctx, f.Path, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	stored := loc.st.(*dirStore).where(f.Path)
	if share := residentShare(t, stored); share > 0.5 {
		t.Skipf("the stored file is %.0f%% in the page cache: this file system takes no direct writes", 100*share)
	}
	dir := filepath.Join(t.TempDir(), "part-5")
	if err := loc.CopyParts(ctx, []*Part{{ShardID: 5, Files: []File{f}}}, []string{dir}, 1); err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(dir, f.Name)
	if share := residentShare(t, copied); share < 0.9 {
		t.Fatalf("the restored copy is %.0f%% in the page cache, want all of it", 100*share)
	}
	got, err := os.ReadFile(copied)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the restored copy differs (%d bytes, %v)", len(got), err)
	}
}
