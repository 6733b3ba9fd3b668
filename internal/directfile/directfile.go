package directfile

import (
	"fmt"
	"os"
	"sync"
)

const (
	// align is the alignment of direct writes: their memory, file offset
	// and length (the largest logical block size in use).
	align = 4096
	// bufferSize is the size of a direct write (a multiple of align).
	bufferSize = 1 << 20
)

// BufferSize is the size of the buffers GetBuffer takes from the Writers'
// pool (1 MiB).
const BufferSize = bufferSize

// buffers are aligned buffers of bufferSize bytes.
var buffers = sync.Pool{New: func() any { return alignedBuffer(bufferSize) }}

// alignedBuffer returns a new buffer of n bytes (and capacity) whose first
// byte is aligned.
func alignedBuffer(n int) *[]byte {
	b := make([]byte, n+align)
	off := 0
	if r := alignOf(b); r != 0 {
		off = align - r
	}
	b = b[off : off+n : off+n]
	return &b
}

// GetBuffer returns a buffer of length n whose first byte is aligned for
// direct writes: one of the Writers' pool when n <= BufferSize, a new one
// otherwise. Bytes a Writer is handed in such a buffer, in a multiple of
// the alignment and at an aligned place in the file, are written straight
// from it without a copy. Give it back with PutBuffer once nothing refers
// to it; a buffer not given back is garbage like any other.
func GetBuffer(n int) *[]byte {
	if n > bufferSize || n < 0 {
		return alignedBuffer(max(n, 0))
	}
	b := buffers.Get().(*[]byte)
	*b = (*b)[:n]
	return b
}

// PutBuffer gives a buffer back to the Writers' pool for GetBuffer and
// Writers to reuse, if it is one they could have taken: aligned, of
// capacity BufferSize (any length); it drops anything else. The caller
// must not use the buffer afterwards, nor anyone else refer to it.
func PutBuffer(b []byte) {
	if cap(b) != bufferSize {
		return
	}
	b = b[:bufferSize]
	if alignOf(b) != 0 {
		return
	}
	buffers.Put(&b)
}

// Writer writes one new file from offset 0 to its end. It is not safe for
// concurrent use.
type Writer struct {
	f      *os.File // the file, opened for buffered writes
	direct *os.File // the same file opened for direct writes; nil: none
	buf    *[]byte  // with direct: the bytes not written yet, from off
	n      int      // bytes in *buf
	off    int64    // bytes written to the file
}

// Create creates path, which must not exist, and returns a Writer of it
// that writes directly where the file system takes it.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	return newWriter(f, openDirectOS), nil
}

// New returns a Writer of f, an empty file the caller just created (with
// os.CreateTemp, say) and opened for writing; the Writer owns f from then
// on: Close closes it.
func New(f *os.File) *Writer { return newWriter(f, openDirectOS) }

// newWriter opens f's path for direct writes with openDirect (nil: none).
func newWriter(f *os.File, openDirect func(string) *os.File) *Writer {
	w := &Writer{f: f}
	if d := openDirect(f.Name()); d != nil {
		w.direct, w.buf = d, buffers.Get().(*[]byte)
	}
	return w
}

// Write appends p to the file.
func (w *Writer) Write(p []byte) (int, error) {
	if w.direct == nil {
		return w.f.Write(p)
	}
	written := len(p)
	if w.n == 0 && len(p) >= align && alignOf(p) == 0 {
		// Aligned memory at an aligned place in the file (nothing
		// buffered): write its whole blocks straight from it.
		k := len(p) / align * align
		if _, err := w.direct.WriteAt(p[:k], w.off); err != nil {
			return 0, fmt.Errorf("direct write at %d: %w", w.off, err)
		}
		w.off += int64(k)
		p = p[k:]
	}
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

// flush writes the first n bytes of the buffer (a multiple of align) at
// off, directly.
func (w *Writer) flush(n int) error {
	if _, err := w.direct.WriteAt((*w.buf)[:n], w.off); err != nil {
		return fmt.Errorf("direct write at %d: %w", w.off, err)
	}
	w.off += int64(min(n, w.n))
	w.n = 0
	return nil
}

// Sync writes what is buffered, cuts the file to its length (a direct
// write's last block is padded) and syncs the file: once it returns, every
// byte written is durable and the file's size is the bytes written.
func (w *Writer) Sync() error {
	if w.direct != nil && w.n > 0 {
		size := w.off + int64(w.n)
		padded := (w.n + align - 1) / align * align
		clear((*w.buf)[w.n:padded])
		if err := w.flush(padded); err != nil {
			return err
		}
		if err := w.f.Truncate(size); err != nil {
			return fmt.Errorf("cut to %d bytes: %w", size, err)
		}
	}
	return w.f.Sync()
}

// Close closes the file without syncing it (bytes written since the last
// Sync may be lost) and gives the Writer's buffer back. It may be called
// more than once.
func (w *Writer) Close() error {
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	if w.direct != nil {
		if derr := w.direct.Close(); err == nil {
			err = derr
		}
		buffers.Put(w.buf)
		w.direct, w.buf = nil, nil
	}
	return err
}
