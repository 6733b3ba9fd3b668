package snapshot

import (
	"fmt"
	"os"
	"sync"
)

// Direct I/O. A received file is written once and read only after the
// snapshot is installed, so its bytes need not pass through the page cache:
// where the filesystem supports it (Linux: O_DIRECT), outFile gathers
// them in an aligned buffer and writes whole buffers straight to the disk.
// That spares the kernel allocating and copying a page-cache page per 4 KiB
// (on a virtual machine whose fresh pages cost a fault on the host, most of
// a buffered receiver's CPU), and keeps a snapshot from evicting the node's
// cached data. Elsewhere (tmpfs, other systems) it writes through the page
// cache.
const (
	// directAlign is the alignment of direct writes: their memory, file
	// offset and length (the largest logical block size in use).
	directAlign = 4096
	// directBuffer is the size of a direct write (a multiple of
	// directAlign).
	directBuffer = 1 << 20
)

// openDirect opens an existing file for direct writes, or returns nil
// (openDirectOS; tests replace it).
var openDirect = openDirectOS

// directBuffers are aligned buffers of directBuffer bytes.
var directBuffers = sync.Pool{New: func() any {
	b := make([]byte, directBuffer+directAlign)
	off := 0
	if r := alignOf(b); r != 0 {
		off = directAlign - r
	}
	b = b[off : off+directBuffer : off+directBuffer]
	return &b
}}

// outFile writes one new file from offset 0 to its end.
type outFile struct {
	f      *os.File // the file, opened for buffered writes
	direct *os.File // the same file opened for direct writes; nil: none
	buf    *[]byte  // with direct: the bytes not written yet, from off
	n      int      // bytes in *buf
	off    int64    // bytes written to the file
}

// createFile creates path (it must not exist) for a outFile, with direct
// writes where the filesystem takes them.
func createFile(path string) (*outFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	w := &outFile{f: f}
	if d := openDirect(path); d != nil {
		w.direct, w.buf = d, directBuffers.Get().(*[]byte)
	}
	return w, nil
}

// Write appends p to the file.
func (w *outFile) Write(p []byte) (int, error) {
	if w.direct == nil {
		return w.f.Write(p)
	}
	written := len(p)
	for len(p) > 0 {
		k := copy((*w.buf)[w.n:], p)
		w.n += k
		p = p[k:]
		if w.n == len(*w.buf) {
			if err := w.flush(w.n); err != nil {
				return 0, err
			}
		}
	}
	return written, nil
}

// flush writes the first n bytes of the buffer (a multiple of directAlign)
// at off, directly.
func (w *outFile) flush(n int) error {
	if _, err := w.direct.WriteAt((*w.buf)[:n], w.off); err != nil {
		return fmt.Errorf("direct write at %d: %w", w.off, err)
	}
	w.off += int64(min(n, w.n))
	w.n = 0
	return nil
}

// Sync writes what is buffered, cuts the file to its length (a direct
// write's last block is padded), and syncs the file.
func (w *outFile) Sync() error {
	if w.direct != nil && w.n > 0 {
		size := w.off + int64(w.n)
		padded := (w.n + directAlign - 1) / directAlign * directAlign
		clear((*w.buf)[w.n:padded])
		if err := w.flush(padded); err != nil {
			return err
		}
		if err := w.f.Truncate(size); err != nil {
			return err
		}
	}
	return w.f.Sync()
}

// Close closes the file (without syncing it) and gives its buffer back.
func (w *outFile) Close() error {
	err := w.f.Close()
	if w.direct != nil {
		if derr := w.direct.Close(); err == nil {
			err = derr
		}
		directBuffers.Put(w.buf)
		w.direct, w.buf = nil, nil
	}
	return err
}
