package storage

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// slowSyncFile is a WAL file whose syncs take delay while slow is set.
type slowSyncFile struct {
	vfs.File
	mu    sync.Mutex
	slow  bool
	delay time.Duration
}

func (f *slowSyncFile) setSlow(slow bool) {
	f.mu.Lock()
	f.slow = slow
	f.mu.Unlock()
}

func (f *slowSyncFile) Sync() error {
	f.mu.Lock()
	slow := f.slow
	f.mu.Unlock()
	if slow {
		time.Sleep(f.delay)
	}
	return f.File.Sync()
}

// TestWALSyncHeldOnlyAfterQuickSyncs: a WAL's sync holds its thread's P
// (vfs.SyncDataHeld) while the previous sync took at most heldSyncMax; after
// a slow one the next sync is an ordinary one, and holding resumes after a
// quick one again. A sync of more than heldSyncBytes is never held.
func TestWALSyncHeldOnlyAfterQuickSyncs(t *testing.T) {
	fs := vfs.NewMem()
	f, err := fs.Create("wal")
	if err != nil {
		t.Fatal(err)
	}
	sf := &slowSyncFile{File: f, delay: 3 * heldSyncMax}
	bufs := &sync.Pool{New: func() any { b := make([]byte, 0, walBufferSize); return &b }}
	b := newWALBuffer(sf, bufs, 0)
	record := []byte("record")
	check := func(want bool, why string) {
		t.Helper()
		before := b.held.Load()
		if _, err := b.Write(record); err != nil {
			t.Fatal(err)
		}
		if err := b.sync(); err != nil {
			t.Fatal(err)
		}
		if got := b.held.Load() > before; got != want {
			t.Fatalf("%s: sync held its P = %v, want %v (last sync took %v)", why, got, want, time.Duration(b.lastSync.Load()))
		}
	}
	check(true, "the first sync")
	check(true, "after a quick sync")
	sf.setSlow(true)
	check(true, "the slow sync itself (the one before it was quick)")
	sf.setSlow(false)
	check(false, "after a slow sync")
	check(true, "after a quick sync again")
	record = make([]byte, heldSyncBytes+1)
	check(false, "a sync of more than heldSyncBytes")
	record = []byte("record")
	check(true, "a small sync after a quick large one")
}

// TestSyncDataHeld: vfs.SyncDataHeld syncs an operating-system file and
// reports a failure as fdatasync's, with the file's path.
func TestSyncDataHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := vfs.SyncDataHeld(f); err != nil {
		t.Fatalf("SyncDataHeld: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := vfs.SyncDataHeld(f); err == nil {
		t.Fatal("SyncDataHeld of a closed file: no error")
	}
}
