package storage

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
)

// copyDirRaw copies every regular file of src into dst byte for byte, as a
// crash would leave them if the page cache had reached the disk: a WAL
// preallocated past its data keeps its zeroed tail.
func copyDirRaw(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == "LOCK" {
			continue
		}
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		out.Close()
	}
}

// liveWAL returns the name and size of the only WAL in dir.
func liveWAL(t *testing.T, dir string) (name string, size int64) {
	t.Helper()
	sizes := walSizes(t, dir)
	if len(sizes) != 1 {
		t.Fatalf("%d WAL files in %s, want 1: %v", len(sizes), dir, sizes)
	}
	for n, s := range sizes {
		name, size = n, s
	}
	return name, size
}

// setKeys writes key00000 ... key<n-1>, each with a 100-byte value, with wo.
// checkCrashImage copies dir/db as a crash would leave it (copyDirRaw) to
// dir/crash, opens the copy and checks that it holds the n keys setKeys
// wrote; what names the WAL's state in failures.
func checkCrashImage(t *testing.T, dir string, n int, what string) {
	t.Helper()
	copyDirRaw(t, filepath.Join(dir, "db"), filepath.Join(dir, "crash"))
	crashed := apiMustOpen(t, filepath.Join(dir, "crash"), &Options{Logger: crashQuietLogger})
	defer apiMustClose(t, crashed)
	for i := range n {
		if _, err := crashed.Get([]byte(fmt.Sprintf("key%05d", i))); err != nil {
			t.Fatalf("after a crash with %s: key%05d: %v", what, i, err)
		}
	}
}

func setKeys(t *testing.T, db *DB, n int, wo WriteOptions) {
	t.Helper()
	for i := range n {
		if err := db.Set([]byte(fmt.Sprintf("key%05d", i)), make([]byte, 100), wo); err != nil {
			t.Fatal(err)
		}
	}
}

func walSizes(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if ft, _, ok := manifest.ParseFilename(e.Name()); ok && ft == manifest.FileTypeLog {
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = fi.Size()
		}
	}
	return out
}

// TestWALPreallocation: on Linux the live WAL is preallocated ahead of its
// data; a crash image with the zeroed tail recovers every synced write, a
// checkpoint copies only the written part, and a clean close gives the
// unused space back.
func TestWALPreallocation(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("preallocation is implemented with fallocate(2) on Linux")
	}
	dir := t.TempDir()
	db := apiMustOpen(t, filepath.Join(dir, "db"), &Options{WALPreallocateSize: 256 << 10, Logger: crashQuietLogger})
	const n = 300
	setKeys(t, db, n, Sync)
	live, liveSize := liveWAL(t, filepath.Join(dir, "db"))
	written := db.logBuf.writtenBytes()
	if liveSize != 256<<10 || written >= liveSize || written < n*100 {
		t.Fatalf("live WAL %s is %d bytes with %d written; want it preallocated to %d", live, liveSize, written, 256<<10)
	}

	// A crash image: every synced write is recovered past the zeroed tail.
	checkCrashImage(t, dir, n, "a preallocated WAL")

	// A checkpoint copies the written bytes of the live WAL, not the zeros.
	if _, err := db.Checkpoint(filepath.Join(dir, "ckpt")); err != nil {
		t.Fatal(err)
	}
	if got := walSizes(t, filepath.Join(dir, "ckpt"))[live]; got != written {
		t.Fatalf("checkpoint copied %d bytes of %s; want the %d written", got, live, written)
	}
	files, err := db.WALFiles()
	if err != nil || len(files) != 1 || files[0].Size != written {
		t.Fatalf("WALFiles = %+v, %v; want %s with size %d", files, err, live, written)
	}

	// Clean close trims the WAL to its data, and the DB reopens intact.
	apiMustClose(t, db)
	if got := walSizes(t, filepath.Join(dir, "db"))[live]; got != written {
		t.Fatalf("after Close %s is %d bytes; want %d", live, got, written)
	}
	db = apiMustOpen(t, filepath.Join(dir, "db"), &Options{Logger: crashQuietLogger})
	defer apiMustClose(t, db)
	for i := range n {
		if _, err := db.Get([]byte(fmt.Sprintf("key%05d", i))); err != nil {
			t.Fatalf("after reopen: key%05d: %v", i, err)
		}
	}
}

// TestWALPreallocationDisabled: a negative size leaves the WAL at its data.
func TestWALPreallocationDisabled(t *testing.T) {
	dir := t.TempDir()
	db := apiMustOpen(t, dir, &Options{WALPreallocateSize: -1, Logger: crashQuietLogger})
	defer apiMustClose(t, db)
	if err := db.Set([]byte("k"), []byte("v"), Sync); err != nil {
		t.Fatal(err)
	}
	for name, size := range walSizes(t, dir) {
		if size != db.logBuf.writtenBytes() {
			t.Fatalf("%s is %d bytes with %d written; want no preallocation", name, size, db.logBuf.writtenBytes())
		}
	}
}

func TestPreallocateUnsupported(t *testing.T) {
	fs := vfs.NewMem()
	f, err := fs.Create("x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := vfs.Preallocate(f, 0, 4096); err != vfs.ErrUnsupported {
		t.Fatalf("Preallocate on a memory file: %v, want ErrUnsupported", err)
	}
}

// TestWALFlushThreshold: unsynced writes stay buffered (readable, not yet in
// the file) until the threshold is reached or the WAL is synced.
func TestWALFlushThreshold(t *testing.T) {
	dir := t.TempDir()
	db := apiMustOpen(t, dir, &Options{WALFlushThreshold: 8 << 10, WALPreallocateSize: -1, Logger: crashQuietLogger})
	defer apiMustClose(t, db)
	if err := db.Set([]byte("a"), make([]byte, 100), NoSync); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Get([]byte("a")); err != nil {
		t.Fatalf("buffered write not readable: %v", err)
	}
	if n := db.logBuf.pendingBytes(); n == 0 {
		t.Fatalf("a 100-byte write under an 8 KiB threshold was handed to the file")
	}
	if err := db.SyncWAL(); err != nil {
		t.Fatal(err)
	}
	if n := db.logBuf.pendingBytes(); n != 0 {
		t.Fatalf("%d bytes still buffered after SyncWAL", n)
	}
	// Past the threshold the flusher is woken.
	for i := range 100 {
		if err := db.Set([]byte(fmt.Sprintf("b%03d", i)), make([]byte, 200), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for db.logBuf.pendingBytes() >= 8<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes buffered past the threshold", db.logBuf.pendingBytes())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWALHeldBytesWrittenWhenIdle: bytes held under WALFlushThreshold reach
// the file about walHoldLimit after the DB stops writing, and the DB then
// holds no WAL buffer (pending bytes and the framing block go back to the
// Shared pools).
func TestWALHeldBytesWrittenWhenIdle(t *testing.T) {
	dir := t.TempDir()
	shared := NewShared(nil)
	defer shared.Close()
	db := apiMustOpen(t, dir, &Options{Shared: shared, WALFlushThreshold: 64 << 10, WALPreallocateSize: -1, Logger: crashQuietLogger})
	defer apiMustClose(t, db)
	for i := range 10 {
		if err := db.Set([]byte(fmt.Sprintf("k%d", i)), make([]byte, 100), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	held := func() bool {
		db.logBuf.mu.Lock()
		defer db.logBuf.mu.Unlock()
		return db.logBuf.pendingLen != 0
	}
	if !held() {
		t.Fatal("1 KB of writes under a 64 KiB threshold was handed to the file at once")
	}
	start := time.Now()
	for held() {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("held WAL bytes not written %s after the last write", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if db.logBuf.writtenBytes() < 10*100 {
		t.Fatalf("only %d bytes reached the WAL file", db.logBuf.writtenBytes())
	}
	db.walMu.Lock()
	defer db.walMu.Unlock()
	if db.logWriter.Size() != db.logBuf.writtenBytes() {
		t.Fatalf("framed %d bytes, wrote %d", db.logWriter.Size(), db.logBuf.writtenBytes())
	}
}

// TestWALWriteback: a WAL written steadily without syncs has its writing to
// the disk started every walWritebackBytes (on Linux), so a rotation's sync
// finds little left to write; a memory file, which cannot, turns it off
// and keeps working.
func TestWALWriteback(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("writeback is started with sync_file_range(2) on Linux")
	}
	dir := t.TempDir()
	db := apiMustOpen(t, dir, &Options{Logger: crashQuietLogger})
	defer apiMustClose(t, db)
	value := make([]byte, 1000)
	for i := range 3000 { // about 3 MB of WAL
		if err := db.Set([]byte(fmt.Sprintf("key%05d", i)), value, NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.flushWAL(); err != nil {
		t.Fatal(err)
	}
	b := db.logBuf
	b.drainMu.Lock()
	written, back, off := b.written, b.writtenBack, b.noWriteback
	b.drainMu.Unlock()
	if off || back < 2*walWritebackBytes || written-back >= walWritebackBytes+64<<10 {
		t.Fatalf("%d WAL bytes written, writeback started up to %d (off %v); want it within %d of the end", written, back, off, walWritebackBytes)
	}

	memOpts := apiSmallOptions(vfs.NewMem())
	memOpts.MemTableSize, memOpts.MemTableInitialSize = 16<<20, 16<<20 // one WAL for the 3 MB
	mem := apiMustOpen(t, "db", memOpts)
	defer apiMustClose(t, mem)
	for i := range 3000 {
		if err := mem.Set([]byte(fmt.Sprintf("key%05d", i)), value, NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := mem.flushWAL(); err != nil {
		t.Fatal(err)
	}
	mem.mu.Lock()
	mb := mem.logBuf
	mem.mu.Unlock()
	mb.drainMu.Lock()
	off = mb.noWriteback
	mb.drainMu.Unlock()
	if !off {
		t.Fatal("a memory file's WAL still tries to start writeback")
	}
	if _, err := mem.Get([]byte("key02999")); err != nil {
		t.Fatal(err)
	}
}

// TestWALHeldCommitsWakeFlusherOnce: commits held under WALFlushThreshold
// wake the background flusher once per hold, not once each, and the bytes
// of every one of them still reach the file within the hold.
func TestWALHeldCommitsWakeFlusherOnce(t *testing.T) {
	dir := t.TempDir()
	db := apiMustOpen(t, dir, &Options{WALFlushThreshold: 1 << 20, WALPreallocateSize: -1, Logger: crashQuietLogger})
	defer apiMustClose(t, db)
	const writes = 200
	start := time.Now()
	for i := range writes {
		if err := db.Set([]byte(fmt.Sprintf("k%03d", i)), make([]byte, 100), NoSync); err != nil {
			t.Fatal(err)
		}
		// Let the flusher run between commits, as between applies.
		runtime.Gosched()
	}
	// One wake-up per hold, and a hold lasts walHoldLimit.
	if n, most := db.heldWakes.Load(), 2+uint64(time.Since(start)/walHoldLimit); n > most {
		t.Fatalf("%d held commits woke the flusher %d times, want at most %d", writes, n, most)
	}
	deadline := time.Now().Add(5 * time.Second)
	for db.logBuf.writtenBytes() < writes*100 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d bytes of %d held commits reached the WAL file", db.logBuf.writtenBytes(), writes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A hold that ended lets the next held commit tell the flusher again.
	before := db.heldWakes.Load()
	if err := db.Set([]byte("after"), make([]byte, 100), NoSync); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for db.heldWakes.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("a commit held after the flush did not wake the flusher")
		}
		time.Sleep(time.Millisecond)
	}
}
