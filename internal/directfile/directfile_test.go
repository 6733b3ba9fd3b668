package directfile

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestWriter writes files of sizes around the direct-write alignment and
// buffer size in pieces of several sizes, and reads them back whole: the
// padded last block is cut off and nothing is lost between buffers. It
// writes them directly where the system and the test's temporary directory
// take it (Linux), and through the page cache, as where they do not.
func TestWriter(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		testWriter(t, t.TempDir(), openDirectOS, runtime.GOOS == "linux")
	})
	t.Run("page cache", func(t *testing.T) {
		testWriter(t, t.TempDir(), func(string) *os.File { return nil }, false)
	})
}

func testWriter(t *testing.T, dir string, openDirect func(string) *os.File, wantDirect bool) {
	rnd := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, align - 1, align, align + 1, bufferSize - 1, bufferSize, bufferSize + 1, 3*bufferSize + 5}
	for _, size := range sizes {
		for _, piece := range []int{7, align, 100_000, bufferSize + 3} {
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(rnd.Uint32())
			}
			path := filepath.Join(dir, fmt.Sprintf("f-%d-%d", size, piece))
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			w := newWriter(f, openDirect)
			switch direct := w.direct != nil; {
			case !wantDirect && direct:
				t.Fatalf("%s: direct writes", path)
			case wantDirect && !direct:
				t.Skipf("%s: the filesystem takes no direct writes", path)
			}
			for rest := data; len(rest) > 0; {
				n := min(piece, len(rest))
				if k, err := w.Write(rest[:n]); err != nil || k != n {
					t.Fatalf("%s: write %d bytes: %d, %v", path, n, k, err)
				}
				rest = rest[n:]
			}
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			if st, err := os.Stat(path); err != nil || st.Size() != int64(size) {
				t.Fatalf("%s: after Sync: %v, %v; want %d bytes", path, st.Size(), err, size)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatalf("a second Close: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("%s: read back %d bytes, wrote %d", path, len(got), len(data))
			}
		}
	}
	if _, err := Create(filepath.Join(dir, "f-0-7")); !os.IsExist(err) {
		t.Fatalf("creating an existing file: %v", err)
	}
	w, err := Create(filepath.Join(dir, "new"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "new")); err != nil || string(got) != "x" {
		t.Fatalf("Create: read back %q, %v", got, err)
	}
}
