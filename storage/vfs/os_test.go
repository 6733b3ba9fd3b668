package vfs_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// TestOSLockAcrossProcesses checks that a lock held here makes Lock fail in
// another process, and that closing it lets the other process in.
func TestOSLockAcrossProcesses(t *testing.T) {
	if name := os.Getenv("SHALE_VFS_LOCK_CHILD"); name != "" {
		l, err := vfs.Default.Lock(name)
		if err != nil {
			if errors.Is(err, vfs.ErrLocked) {
				os.Stdout.WriteString("LOCKED: " + err.Error())
				os.Exit(3)
			}
			os.Stdout.WriteString(err.Error())
			os.Exit(4)
		}
		l.Close()
		os.Exit(0)
	}
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" || runtime.GOOS == "js" || runtime.GOOS == "wasip1" {
		t.Skip("no cross-process lock on this platform")
	}
	name := filepath.Join(t.TempDir(), "LOCK")
	child := func() (int, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOSLockAcrossProcesses$")
		cmd.Env = append(os.Environ(), "SHALE_VFS_LOCK_CHILD="+name)
		out, err := cmd.Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		mustOK(t, err)
		return 0, string(out)
	}
	l, err := vfs.Default.Lock(name)
	mustOK(t, err)
	code, out := child()
	if code != 3 || !strings.Contains(out, "already held by another process") {
		t.Fatalf("child while locked: exit %d, %q", code, out)
	}
	mustOK(t, l.Close())
	if code, out := child(); code != 0 {
		t.Fatalf("child after unlock: exit %d, %q", code, out)
	}
}

func TestOSOpenDirOfFile(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	writeFile(t, vfs.Default, name, "x")
	_, err := vfs.Default.OpenDir(name)
	if err == nil || !strings.Contains(err.Error(), name) {
		t.Fatalf("OpenDir of a file: %v", err)
	}
}
