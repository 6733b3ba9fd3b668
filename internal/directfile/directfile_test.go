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

// TestWriterAlignedBuffers writes a file from buffers of GetBuffer mixed
// with unaligned pieces: the whole aligned blocks of an aligned buffer are
// written straight from it when nothing is buffered (nothing left in the
// Writer's buffer afterwards), everything else goes through the buffer,
// and the file reads back as written either way. PutBuffer keeps buffers
// of the pool's shape and drops others.
func TestWriterAlignedBuffers(t *testing.T) {
	dir := t.TempDir()
	rnd := rand.New(rand.NewPCG(3, 4))
	f, err := os.OpenFile(filepath.Join(dir, "f"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	w := newWriter(f, openDirectOS)
	if w.direct == nil {
		t.Skip("the filesystem takes no direct writes")
	}
	var data []byte
	write := func(b []byte, wantBuffered int) {
		t.Helper()
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		data = append(data, b...)
		if n, err := w.Write(b); err != nil || n != len(b) {
			t.Fatalf("write %d bytes: %d, %v", len(b), n, err)
		}
		if w.n != wantBuffered {
			t.Fatalf("after writing %d bytes: %d buffered, want %d", len(b), w.n, wantBuffered)
		}
	}
	a := GetBuffer(BufferSize)
	if len(*a) != BufferSize || alignOf(*a) != 0 {
		t.Fatalf("GetBuffer(%d): %d bytes at alignment %d", BufferSize, len(*a), alignOf(*a))
	}
	write(*a, 0)                              // straight from the buffer
	b := GetBuffer(3*align + 5)               // three blocks straight, 5 bytes buffered
	write(*b, 5)                              //
	write((*GetBuffer(2 * align)), 5+2*align) // buffered: something is
	write(make([]byte, BufferSize-5-2*align), 0)
	big := GetBuffer(2*BufferSize + align)
	if len(*big) != 2*BufferSize+align || alignOf(*big) != 0 {
		t.Fatalf("GetBuffer(%d): %d bytes at alignment %d", 2*BufferSize+align, len(*big), alignOf(*big))
	}
	write(*big, 0)
	write(make([]byte, 17), 17)
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, wrote %d", len(got), len(data))
	}
	PutBuffer(*a)
	PutBuffer((*a)[1:]) // unaligned: dropped
	PutBuffer(*big)     // another size: dropped
	for range 10 {
		if c := GetBuffer(BufferSize); cap(*c) != BufferSize || alignOf(*c) != 0 {
			t.Fatalf("GetBuffer after PutBuffer: capacity %d at alignment %d", cap(*c), alignOf(*c))
		}
	}
}
