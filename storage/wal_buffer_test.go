package storage

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// TestWALBufferChunks appends random-sized writes, some larger than a
// chunk, with drains in between, and checks that the file holds exactly
// the bytes appended, in order, and that pendingBytes counts what is not
// yet drained.
func TestWALBufferChunks(t *testing.T) {
	fs := vfs.Default
	path := filepath.Join(t.TempDir(), "wal")
	f, err := fs.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	bufs := &sync.Pool{}
	b := newWALBuffer(f, bufs, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	var want []byte
	pending := 0
	for i := range 400 {
		n := rng.IntN(3 * walBufferSize)
		if i%7 == 0 {
			n = rng.IntN(100)
		}
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(rng.Uint32())
		}
		if w, err := b.Write(p); err != nil || w != n {
			t.Fatalf("write %d bytes: %d, %v", n, w, err)
		}
		want = append(want, p...)
		pending += n
		if got := b.pendingBytes(); got != pending {
			t.Fatalf("after write %d: %d bytes pending, want %d", i, got, pending)
		}
		if rng.IntN(4) == 0 {
			if err := b.drain(); err != nil {
				t.Fatal(err)
			}
			pending = 0
			if got := b.pendingBytes(); got != 0 {
				t.Fatalf("after a drain: %d bytes pending", got)
			}
		}
	}
	if err := b.drain(); err != nil {
		t.Fatal(err)
	}
	if got := b.writtenBytes(); got != int64(len(want)) {
		t.Fatalf("%d bytes written, want %d", got, len(want))
	}
	checkWALFile(t, f, path, want)
}

// TestWALBufferConcurrentDrains appends from one goroutine while another
// drains, as the commit path and the background flusher do, and checks
// that the file holds the bytes in the order appended.
func TestWALBufferConcurrentDrains(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	f, err := vfs.Default.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	b := newWALBuffer(f, &sync.Pool{}, 0)
	var want []byte
	done := make(chan struct{})
	drained := make(chan error, 1)
	go func() {
		for {
			select {
			case <-done:
				drained <- b.drain()
				return
			default:
				if err := b.drain(); err != nil {
					drained <- err
					return
				}
			}
		}
	}()
	for i := range 600 {
		p := bytes.Repeat([]byte{byte(i)}, 1+i%(2*walBufferSize/100)*100)
		if _, err := b.Write(p); err != nil {
			t.Fatal(err)
		}
		want = append(want, p...)
	}
	close(done)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	checkWALFile(t, f, path, want)
}

// checkWALFile closes f and fails t unless the file at path holds want.
func checkWALFile(t *testing.T, f vfs.File, path string, want []byte) {
	t.Helper()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the file's %d bytes differ from the %d appended", len(got), len(want))
	}
}
