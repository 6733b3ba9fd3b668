package storage

import (
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// TestSnapshotOfEmptyDB: a snapshot taken before any write (at sequence
// number 0) sees nothing, whatever is written later.
func TestSnapshotOfEmptyDB(t *testing.T) {
	d, err := Open("db", &Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s := d.NewSnapshot()
	defer s.Close()
	if err := d.Set([]byte("k"), []byte("v"), NoSync); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get([]byte("k")); err != ErrNotFound {
		t.Fatalf("snapshot at seq 0 sees a later write: %v", err)
	}
	it, err := s.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	if it.First() {
		t.Fatalf("snapshot at seq 0 iterates %q", it.Key())
	}
	if v, err := d.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("latest state: %q, %v", v, err)
	}
}
