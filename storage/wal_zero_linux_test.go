//go:build linux

package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// seekHole returns the offset of the first hole of the file at path at or
// after off (lseek(2) SEEK_HOLE): the file's size if none. Preallocated
// space that nothing wrote yet (an unwritten extent, no cached page) counts
// as a hole on ext4 and XFS.
func seekHole(t *testing.T, path string, off int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const seekHole = 4 // SEEK_HOLE
	pos, err := syscall.Seek(int(f.Fd()), off, seekHole)
	if err != nil {
		t.Fatalf("SEEK_HOLE %s at %d: %v", path, off, err)
	}
	return pos
}

// skipUnlessUnwrittenIsHole skips the test on a filesystem in dir whose
// preallocated space does not read back as a hole (one that cannot tell
// zeroed preallocated space from space only reserved).
func skipUnlessUnwrittenIsHole(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "probe")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	defer f.Close()
	if err := vfs.Preallocate(f, 0, 1<<20); err != nil {
		t.Skipf("no preallocation here: %v", err)
	}
	if got := seekHole(t, path, 0); got != 0 {
		t.Skipf("preallocated space is not a hole on this filesystem (SEEK_HOLE = %d)", got)
	}
	if err := vfs.ZeroPreallocated(f, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if got := seekHole(t, path, 0); got != 1<<20 {
		t.Fatalf("after ZeroPreallocated of 1 MiB the first hole is at %d; want none (1 MiB)", got)
	}
}

// TestWALZeroedAheadWhenSyncedOften: a WAL synced at least walZeroSyncs
// times per preallocation step has the next steps' space zeroed half a step
// ahead of its writes (no unwritten extent left for its syncs to convert),
// a crash image of it recovers every synced write, and a clean close trims
// the zeros.
func TestWALZeroedAheadWhenSyncedOften(t *testing.T) {
	dir := t.TempDir()
	skipUnlessUnwrittenIsHole(t, dir)
	const step = 64 << 10
	db := apiMustOpen(t, filepath.Join(dir, "db"), &Options{WALPreallocateSize: step, Logger: crashQuietLogger})
	const n = 2000 // about 250 KiB of WAL, each write synced
	setKeys(t, db, n, Sync)
	live, size := liveWAL(t, filepath.Join(dir, "db"))
	path := filepath.Join(dir, "db", live)
	written := db.logBuf.writtenBytes()
	// The first step was only preallocated (no syncs seen yet); every later
	// one was zeroed when the writes were half a step before it.
	if size < written+step/2 {
		t.Fatalf("live WAL is %d bytes with %d written; want at least half a step (%d) ahead", size, written, step/2)
	}
	if hole := seekHole(t, path, step); hole != size {
		t.Fatalf("first hole of the synced WAL past its first step at %d (written %d, size %d); want none: the space ahead zeroed", hole, written, size)
	}

	checkCrashImage(t, dir, n, "a zeroed WAL tail")

	apiMustClose(t, db)
	if got := walSizes(t, filepath.Join(dir, "db"))[live]; got != written {
		t.Fatalf("after Close %s is %d bytes; want %d", live, got, written)
	}
}

// TestWALNotZeroedWhenSyncedRarely: a WAL written without syncs is only
// preallocated: the space past its data stays unwritten.
func TestWALNotZeroedWhenSyncedRarely(t *testing.T) {
	dir := t.TempDir()
	skipUnlessUnwrittenIsHole(t, dir)
	const step = 64 << 10
	db := apiMustOpen(t, dir, &Options{WALPreallocateSize: step, WALFlushThreshold: 4 << 10, Logger: crashQuietLogger})
	defer apiMustClose(t, db)
	// Stop a third of the way into the fourth step, so that most of the
	// step is past the data.
	for i := 0; int64(db.logBuf.pendingBytes())+db.logBuf.writtenBytes() < 3*step+step/3; i++ {
		if err := db.Set([]byte(fmt.Sprintf("key%05d", i)), make([]byte, 100), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.SyncWAL(); err != nil {
		t.Fatal(err)
	}
	live, size := liveWAL(t, dir)
	written := db.logBuf.writtenBytes()
	// Past the written bytes' last block, the rest of the step is a hole.
	from := (written + 4095) / 4096 * 4096
	if from >= size {
		t.Skipf("the WAL's data ends at its preallocated end (%d of %d)", written, size)
	}
	if hole := seekHole(t, filepath.Join(dir, live), from); hole != from {
		t.Fatalf("unsynced WAL: first hole at or after %d is at %d (size %d); want the preallocated space left unwritten", from, hole, size)
	}
}

func TestZeroPreallocatedUnsupported(t *testing.T) {
	f, err := vfs.NewMem().Create("x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := vfs.ZeroPreallocated(f, 0, 4096); err != vfs.ErrUnsupported {
		t.Fatalf("ZeroPreallocated on a memory file: %v, want ErrUnsupported", err)
	}
}
