package vfs_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// eachFS runs the test against every FS implementation, giving it a fresh
// FS and an existing, empty directory to work in.
func eachFS(t *testing.T, fn func(t *testing.T, fs vfs.FS, dir string)) {
	t.Run("os", func(t *testing.T) { fn(t, vfs.Default, t.TempDir()) })
	t.Run("mem", func(t *testing.T) {
		fs := vfs.NewMem()
		mustOK(t, fs.MkdirAll("/db", 0o755))
		fn(t, fs, "/db")
	})
	t.Run("crashable-mem", func(t *testing.T) {
		fs := vfs.NewCrashableMem()
		mustOK(t, fs.MkdirAll("/db", 0o755))
		fn(t, fs, "/db")
	})
}

func mustOK(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, fs vfs.FS, name, data string) {
	t.Helper()
	f, err := fs.Create(name)
	mustOK(t, err)
	_, err = f.Write([]byte(data))
	mustOK(t, err)
	mustOK(t, f.Sync())
	mustOK(t, f.Close())
}

func readFile(t testing.TB, fs vfs.FS, name string) string {
	t.Helper()
	f, err := fs.Open(name)
	mustOK(t, err)
	defer f.Close()
	b, err := io.ReadAll(f)
	mustOK(t, err)
	return string(b)
}

func wantNotExist(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: got %v, want an error matching os.ErrNotExist", what, err)
	}
}

func TestCreateWriteReadStat(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		name := fs.Join(dir, "000001.log")
		f, err := fs.Create(name)
		mustOK(t, err)
		for _, s := range []string{"hello ", "world"} {
			n, err := f.Write([]byte(s))
			mustOK(t, err)
			if n != len(s) {
				t.Fatalf("short write %d", n)
			}
		}
		fi, err := f.Stat()
		mustOK(t, err)
		if fi.Size() != 11 || fi.Name() != "000001.log" || fi.IsDir() {
			t.Fatalf("File.Stat: name %q size %d dir %v", fi.Name(), fi.Size(), fi.IsDir())
		}
		mustOK(t, f.Sync())
		mustOK(t, f.Close())

		if got := readFile(t, fs, name); got != "hello world" {
			t.Fatalf("read %q", got)
		}
		fi, err = fs.Stat(name)
		mustOK(t, err)
		if fi.Size() != 11 || fi.Name() != "000001.log" || fi.IsDir() || fi.ModTime().IsZero() {
			t.Fatalf("FS.Stat: %+v", fi)
		}
		fi, err = fs.Stat(dir)
		mustOK(t, err)
		if !fi.IsDir() {
			t.Fatal("dir not a dir")
		}

		r, err := fs.Open(name)
		mustOK(t, err)
		defer r.Close()
		buf := make([]byte, 5)
		n, err := r.ReadAt(buf, 6)
		if n != 5 || string(buf) != "world" || err != nil {
			t.Fatalf("ReadAt = %d %q %v", n, buf, err)
		}
		n, err = r.ReadAt(buf, 8)
		if n != 3 || err != io.EOF || string(buf[:n]) != "rld" {
			t.Fatalf("ReadAt past end = %d %v", n, err)
		}
		n, err = r.ReadAt(buf, 100)
		if n != 0 || err != io.EOF {
			t.Fatalf("ReadAt far past end = %d %v", n, err)
		}
		if _, err := r.Write([]byte("x")); err == nil {
			t.Fatal("Write on a file opened with Open succeeded")
		}
	})
}

func TestCreateTruncates(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		name := fs.Join(dir, "CURRENT")
		writeFile(t, fs, name, "a long first version")
		writeFile(t, fs, name, "v2")
		if got := readFile(t, fs, name); got != "v2" {
			t.Fatalf("got %q", got)
		}
	})
}

func TestOpenAppend(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		name := fs.Join(dir, "MANIFEST-000001")
		writeFile(t, fs, name, "first;")
		f, err := fs.OpenAppend(name)
		mustOK(t, err)
		b := make([]byte, 5)
		_, err = io.ReadFull(f, b)
		mustOK(t, err)
		if string(b) != "first" {
			t.Fatalf("read through the append handle: %q", b)
		}
		_, err = f.Write([]byte("second;"))
		mustOK(t, err)
		mustOK(t, f.Sync())
		mustOK(t, f.Close())
		if got := readFile(t, fs, name); got != "first;second;" {
			t.Fatalf("got %q", got)
		}
		if fi, err := fs.Stat(name); err != nil || fi.Size() != int64(len("first;second;")) {
			t.Fatalf("stat: %v, %v", fi, err)
		}
		if _, err := fs.OpenAppend(dir); err == nil {
			t.Fatal("OpenAppend of a directory succeeded")
		}
	})
}

func TestMissing(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		missing := fs.Join(dir, "nope")
		_, err := fs.Open(missing)
		wantNotExist(t, "Open", err)
		_, err = fs.OpenDir(missing)
		wantNotExist(t, "OpenDir", err)
		_, err = fs.OpenAppend(missing)
		wantNotExist(t, "OpenAppend", err)
		_, err = fs.Stat(missing)
		wantNotExist(t, "Stat", err)
		_, err = fs.List(missing)
		wantNotExist(t, "List", err)
		wantNotExist(t, "Remove", fs.Remove(missing))
		wantNotExist(t, "Rename", fs.Rename(missing, fs.Join(dir, "x")))
		wantNotExist(t, "Link", fs.Link(missing, fs.Join(dir, "x")))
		_, err = fs.Create(fs.Join(dir, "nodir", "f"))
		wantNotExist(t, "Create in missing dir", err)
		mustOK(t, fs.RemoveAll(missing))
		mustOK(t, fs.RemoveAll(fs.Join(dir, "nodir", "deeper")))
		if _, err := fs.Open(missing); !strings.Contains(err.Error(), missing) {
			t.Fatalf("error %q does not name the path", err)
		}
	})
}

func TestListSorted(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		for _, n := range []string{"b.sst", "a.log", "MANIFEST-1", "c"} {
			writeFile(t, fs, fs.Join(dir, n), n)
		}
		mustOK(t, fs.MkdirAll(fs.Join(dir, "archive", "x"), 0o755))
		got, err := fs.List(dir)
		mustOK(t, err)
		want := []string{"MANIFEST-1", "a.log", "archive", "b.sst", "c"}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("List = %v, want %v", got, want)
		}
		if _, err := fs.List(fs.Join(dir, "c")); err == nil {
			t.Fatal("List of a file succeeded")
		}
	})
}

func TestMkdirAllRemove(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		sub := fs.Join(dir, "a", "b", "c")
		mustOK(t, fs.MkdirAll(sub, 0o755))
		mustOK(t, fs.MkdirAll(sub, 0o755))
		writeFile(t, fs, fs.Join(sub, "f"), "x")
		if err := fs.MkdirAll(fs.Join(sub, "f", "g"), 0o755); err == nil {
			t.Fatal("MkdirAll through a file succeeded")
		}
		if err := fs.Remove(fs.Join(dir, "a")); err == nil {
			t.Fatal("Remove of a non-empty directory succeeded")
		}
		mustOK(t, fs.Remove(fs.Join(sub, "f")))
		mustOK(t, fs.Remove(sub))
		mustOK(t, fs.RemoveAll(fs.Join(dir, "a")))
		_, err := fs.Stat(fs.Join(dir, "a"))
		wantNotExist(t, "Stat after RemoveAll", err)
	})
}

func TestRename(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		a, b := fs.Join(dir, "CURRENT.tmp"), fs.Join(dir, "CURRENT")
		writeFile(t, fs, b, "old")
		writeFile(t, fs, a, "new")
		mustOK(t, fs.Rename(a, b))
		if got := readFile(t, fs, b); got != "new" {
			t.Fatalf("got %q", got)
		}
		_, err := fs.Stat(a)
		wantNotExist(t, "old name after Rename", err)

		// Into another directory.
		mustOK(t, fs.MkdirAll(fs.Join(dir, "archive"), 0o755))
		c := fs.Join(dir, "archive", "CURRENT")
		mustOK(t, fs.Rename(b, c))
		if got := readFile(t, fs, c); got != "new" {
			t.Fatalf("got %q", got)
		}
	})
}

func TestLinkSharesContents(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		a, b := fs.Join(dir, "a.sst"), fs.Join(dir, "b.sst")
		f, err := fs.Create(a)
		mustOK(t, err)
		_, err = f.Write([]byte("one"))
		mustOK(t, err)
		mustOK(t, fs.Link(a, b))
		_, err = f.Write([]byte("two"))
		mustOK(t, err)
		mustOK(t, f.Close())
		if got := readFile(t, fs, b); got != "onetwo" {
			t.Fatalf("link reads %q", got)
		}
		if err := fs.Link(a, b); !errors.Is(err, os.ErrExist) {
			t.Fatalf("Link onto existing name: %v", err)
		}
		mustOK(t, fs.Remove(a))
		if got := readFile(t, fs, b); got != "onetwo" {
			t.Fatalf("after removing other name: %q", got)
		}
	})
}

func TestOpenFileSurvivesRemove(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		name := fs.Join(dir, "000007.sst")
		writeFile(t, fs, name, "contents")
		r, err := fs.Open(name)
		mustOK(t, err)
		defer r.Close()
		mustOK(t, fs.Remove(name))
		buf := make([]byte, 8)
		n, err := r.ReadAt(buf, 0)
		if err != nil || string(buf[:n]) != "contents" {
			t.Fatalf("ReadAt after Remove: %q %v", buf[:n], err)
		}
		// Replacing the name leaves the open handle on the old file.
		writeFile(t, fs, name, "replaced")
		b, err := io.ReadAll(r)
		mustOK(t, err)
		if string(b) != "contents" {
			t.Fatalf("Read after replacement: %q", b)
		}
	})
}

func TestReadWhileAppending(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		name := fs.Join(dir, "000002.log")
		w, err := fs.Create(name)
		mustOK(t, err)
		defer w.Close()
		r, err := fs.Open(name)
		mustOK(t, err)
		defer r.Close()
		var want []byte
		buf := make([]byte, 4096)
		for i := 0; i < 50; i++ {
			rec := bytes.Repeat([]byte{byte('a' + i%26)}, i+1)
			_, err := w.Write(rec)
			mustOK(t, err)
			want = append(want, rec...)
			n, err := r.ReadAt(buf, 0)
			if n != len(want) || err != io.EOF || !bytes.Equal(buf[:n], want) {
				t.Fatalf("after %d appends ReadAt = %d, %v; want %d", i+1, n, err, len(want))
			}
			// The sequential reader picks up where it left off.
			got, err := io.ReadAll(r)
			mustOK(t, err)
			if !bytes.Equal(got, rec) {
				t.Fatalf("Read after append %d: %q", i, got)
			}
		}
	})
}

func TestOpenDirSync(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		writeFile(t, fs, fs.Join(dir, "f"), "x")
		d, err := fs.OpenDir(dir)
		mustOK(t, err)
		mustOK(t, d.Sync())
		fi, err := d.Stat()
		mustOK(t, err)
		if !fi.IsDir() {
			t.Fatal("OpenDir handle is not a directory")
		}
		mustOK(t, d.Close())
		if d, err := fs.OpenDir(fs.Join(dir, "f")); err == nil {
			d.Close()
			t.Fatal("OpenDir of a file succeeded")
		}
	})
}

func TestCloseTwice(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		f, err := fs.Create(fs.Join(dir, "f"))
		mustOK(t, err)
		mustOK(t, f.Close())
		if err := f.Close(); !errors.Is(err, os.ErrClosed) {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := f.Write([]byte("x")); err == nil {
			t.Fatal("Write after Close succeeded")
		}
	})
}

func TestLock(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		name := fs.Join(dir, "LOCK")
		l, err := fs.Lock(name)
		mustOK(t, err)
		if _, err := fs.Stat(name); err != nil {
			t.Fatalf("Lock did not create the file: %v", err)
		}
		_, err = fs.Lock(name)
		if !errors.Is(err, vfs.ErrLocked) {
			t.Fatalf("second Lock: %v, want ErrLocked", err)
		}
		if want := "lock " + name + ": already held by another process"; err.Error() != want {
			t.Fatalf("second Lock error %q, want %q", err, want)
		}
		mustOK(t, l.Close())
		mustOK(t, l.Close()) // idempotent
		l2, err := fs.Lock(name)
		mustOK(t, err)
		mustOK(t, l2.Close())
	})
}

func TestConcurrentLock(t *testing.T) {
	eachFS(t, func(t *testing.T, fs vfs.FS, dir string) {
		name := fs.Join(dir, "LOCK")
		var wg sync.WaitGroup
		var inside, acquired atomic.Int32
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 50; j++ {
					l, err := fs.Lock(name)
					if err != nil {
						if !errors.Is(err, vfs.ErrLocked) {
							t.Error(err)
						}
						continue
					}
					acquired.Add(1)
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					inside.Add(-1)
					if err := l.Close(); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		if acquired.Load() == 0 {
			t.Fatal("nobody got the lock")
		}
	})
}
