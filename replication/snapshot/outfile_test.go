package snapshot

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestOutFile writes files of sizes around the direct-write alignment and
// buffer size in pieces of several sizes, and reads them back whole: the
// padded last block is cut off and nothing is lost between buffers. It
// writes them directly where the system and the test's temporary directory
// take it (Linux), and through the page cache, as where they do not.
func TestOutFile(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		testOutFile(t, t.TempDir(), runtime.GOOS == "linux")
	})
	t.Run("page cache", func(t *testing.T) {
		defer func(f func(string) *os.File) { openDirect = f }(openDirect)
		openDirect = func(string) *os.File { return nil }
		testOutFile(t, t.TempDir(), false)
	})
}

func testOutFile(t *testing.T, dir string, wantDirect bool) {
	rnd := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, directAlign - 1, directAlign, directAlign + 1, directBuffer - 1, directBuffer, directBuffer + 1, 3*directBuffer + 5}
	for _, size := range sizes {
		for _, piece := range []int{7, directAlign, 100_000, directBuffer + 3} {
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(rnd.Uint32())
			}
			path := filepath.Join(dir, fmt.Sprintf("f-%d-%d", size, piece))
			w, err := createFile(path)
			if err != nil {
				t.Fatal(err)
			}
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
			if err := w.Close(); err != nil {
				t.Fatal(err)
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
	if _, err := createFile(filepath.Join(dir, "f-0-7")); !os.IsExist(err) {
		t.Fatalf("creating an existing file: %v", err)
	}
}
