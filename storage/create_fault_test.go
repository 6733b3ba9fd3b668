package storage

import (
	"errors"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// TestCreateNewManifestWriteFailure: when writing a new database's first
// MANIFEST fails, Open reports that error and leaves nothing that stops a
// later Open from creating the database (CURRENT is not switched to a
// MANIFEST that was never written).
func TestCreateNewManifestWriteFailure(t *testing.T) {
	mem := vfs.NewMem()
	toggle := errorfs.NewToggle(errorfs.Filter(
		errorfs.And(errorfs.Ops(errorfs.OpWrite), errorfs.PathSuffix("MANIFEST-000001")),
		errorfs.InjectorFunc(func(errorfs.Op, string) error { return errorfs.ErrEIO })))
	toggle.Enable()
	fs := errorfs.Wrap(mem, toggle)
	if _, err := Open("db", &Options{FS: fs}); !errors.Is(err, errorfs.ErrEIO) {
		t.Fatalf("Open with a failing MANIFEST write: %v, want the injected EIO", err)
	}
	toggle.Disable()
	d, err := Open("db", &Options{FS: fs})
	if err != nil {
		t.Fatalf("Open after the fault cleared: %v", err)
	}
	if err := d.Set([]byte("k"), []byte("v"), Sync); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}
