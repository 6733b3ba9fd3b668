package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// cloningCollector keeps a copy of every chunk sent (SendInterleaved reuses
// a chunk's Data buffer once Send returns). Before the first data chunk it
// waits for pause, so that the readers queue pieces of several files.
type cloningCollector struct {
	mu     sync.Mutex
	chunks []*shalev1.SnapshotChunk
	pause  time.Duration
}

func (c *cloningCollector) Send(ch *shalev1.SnapshotChunk) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.chunks) == 1 {
		time.Sleep(c.pause)
	}
	c.chunks = append(c.chunks, proto.Clone(ch).(*shalev1.SnapshotChunk))
	return nil
}

// transferInterleaved sends dir with SendInterleaved through a pipe and
// receives it with ReceiveInterleaved under staging; the pipe's receiving
// end gets a copy of each chunk, as a gRPC stream decodes a fresh message.
func transferInterleaved(t testing.TB, dir, staging string, opts Options) (*shalev1.SnapshotHeader, string, int64, error) {
	t.Helper()
	return transferWith(t, dir, staging, opts, func(p *pipe) ChunkSender { return cloningSender{p} }, SendInterleaved, ReceiveInterleaved)
}

// cloningSender passes a copy of each chunk to s.
type cloningSender struct{ s ChunkSender }

func (c cloningSender) Send(ch *shalev1.SnapshotChunk) error {
	return c.s.Send(proto.Clone(ch).(*shalev1.SnapshotChunk))
}

// TestSendInterleavedInterleaves: with several readers, the chunks of
// different files alternate on the stream, each file's in order with the
// running checksum of its bytes so far, and every byte is sent once.
func TestSendInterleavedInterleaves(t *testing.T) {
	src := t.TempDir()
	for i := range 4 {
		writeFile(t, src, fmt.Sprintf("f%d", i), bytes.Repeat([]byte{byte('a' + i)}, 10_000+i))
	}
	c := &cloningCollector{pause: 50 * time.Millisecond}
	n, err := SendInterleaved(context.Background(), c, nil, src, Options{ChunkSize: 1000, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	if n != 40_006 {
		t.Fatalf("sent %d bytes, want 40006", n)
	}
	files := c.chunks[0].GetHeader().GetFiles()
	if len(files) != 4 || files[2].GetSize() != 10_002 || files[2].GetCrc32C() != 0 {
		t.Fatalf("header files %v", files)
	}
	next := make([]uint64, 4)
	crc := make([]uint32, 4)
	switches := 0
	for i, ch := range c.chunks[1:] {
		f := ch.GetFileIndex()
		if ch.GetOffset() != next[f] || ch.GetCrc32C() != 0 {
			t.Fatalf("chunk %d: file %d at %d (crc32c %d), want offset %d", i, f, ch.GetOffset(), ch.GetCrc32C(), next[f])
		}
		crc[f] = UpdateCRC32C(crc[f], ch.GetData())
		if ch.GetRunningCrc32C() != crc[f] {
			t.Fatalf("chunk %d: running crc %08x, want %08x", i, ch.GetRunningCrc32C(), crc[f])
		}
		next[f] += uint64(len(ch.GetData()))
		if i > 0 && c.chunks[i].GetFileIndex() != f {
			switches++
		}
	}
	for f, got := range next {
		if got != files[f].GetSize() {
			t.Fatalf("file %d: %d bytes sent of %d", f, got, files[f].GetSize())
		}
	}
	if switches < 4 {
		t.Fatalf("the stream switched files %d times: the files were not interleaved", switches)
	}
}

// interleavedChunks returns the chunks of a hand-made interleaved stream:
// files "a" (20 bytes), "b" (empty), "c" (10 bytes) in chunks of 8, with
// a and c interleaved: header, a@0, c@0, a@8, c@8, a@16.
func interleavedChunks() []*shalev1.SnapshotChunk {
	a, c := []byte("aaaaaaaaAAAAAAAAaaaa"), []byte("cccccccccc")
	hdr := &shalev1.SnapshotHeader{ShardId: 1, Files: []*shalev1.SnapshotFile{{Name: "a", Size: 20}, {Name: "b"}, {Name: "c", Size: 10}}}
	piece := func(idx uint32, data []byte, off int) *shalev1.SnapshotChunk {
		end := min(off+8, len(data))
		return &shalev1.SnapshotChunk{FileIndex: idx, Offset: uint64(off), Data: bytes.Clone(data[off:end]), RunningCrc32C: CRC32C(data[:end])}
	}
	return []*shalev1.SnapshotChunk{{Header: hdr}, piece(0, a, 0), piece(2, c, 0), piece(0, a, 8), piece(2, c, 8), piece(0, a, 16)}
}

func TestReceiveInterleavedValid(t *testing.T) {
	hdr, dir, err := ReceiveInterleaved(context.Background(), &sliceReceiver{chunks: interleavedChunks()}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"aaaaaaaaAAAAAAAAaaaa", "", "cccccccccc"} {
		f := hdr.Files[i]
		if got := string(readFile(t, filepath.Join(dir, f.Name))); got != want {
			t.Fatalf("%s = %q, want %q", f.Name, got, want)
		}
		if f.Crc32C != CRC32C([]byte(want)) {
			t.Fatalf("%s: returned header lists crc %08x", f.Name, f.Crc32C)
		}
	}
	// A checksum listed in the header is checked, and so is the running one
	// across chunks.
	cs := interleavedChunks()
	cs[0].Header.Files[0].Crc32C = CRC32C([]byte("aaaaaaaaAAAAAAAAaaaa"))
	if _, _, err := ReceiveInterleaved(context.Background(), &sliceReceiver{chunks: cs}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

func TestReceiveInterleavedCorruption(t *testing.T) {
	type chunks = []*shalev1.SnapshotChunk
	cases := []struct {
		name    string
		mutate  func(chunks) chunks
		wantMsg string
	}{
		{"flipped data byte", func(cs chunks) chunks {
			cs[3].Data[3] ^= 0x40
			return cs
		}, `file "a" (index 0): chunk at offset 8: checksum`},
		{"chunk crc of the chunk alone", func(cs chunks) chunks {
			cs[3].RunningCrc32C = CRC32C(cs[3].Data)
			return cs
		}, `file "a" (index 0): chunk at offset 8: checksum`},
		{"ordered crc instead of running", func(cs chunks) chunks {
			cs[2].Crc32C, cs[2].RunningCrc32C = cs[2].RunningCrc32C, 0
			return cs
		}, `file "c" (index 2): chunk at offset 0: checksum`},
		{"header crc wrong", func(cs chunks) chunks {
			cs[0].Header.Files[2].Crc32C = 1
			return cs
		}, `file "c" (index 2): whole-file checksum`},
		{"missing middle chunk", func(cs chunks) chunks {
			return append(cs[:3], cs[4:]...)
		}, `file "a" (index 0): chunk at offset 16, expected offset 8`},
		{"truncated stream", func(cs chunks) chunks {
			return cs[:5]
		}, `file "a" (index 0): stream has 16 of its 20 bytes`},
		{"missing file", func(cs chunks) chunks {
			return append(chunks{cs[0], cs[1]}, cs[3], cs[5])
		}, `file "c" (index 2): stream has 0 of its 10 bytes`},
		{"chunk for a finished file", func(cs chunks) chunks {
			return append(cs, cs[2])
		}, `file "c" (index 2) at offset 0 after the file was complete`},
		{"empty chunk", func(cs chunks) chunks {
			return append(cs[:2], append(chunks{{FileIndex: 0, Offset: 8}}, cs[2:]...)...)
		}, `empty chunk at offset 8`},
		{"data past file size", func(cs chunks) chunks {
			cs[4].Data = append(cs[4].Data, 'x')
			return cs
		}, `runs past the file size`},
		{"empty file given data", func(cs chunks) chunks {
			return append(cs, &shalev1.SnapshotChunk{FileIndex: 1, Data: []byte("x"), RunningCrc32C: CRC32C([]byte("x"))})
		}, `file "b" (index 1): chunk at offset 0 of 1 bytes runs past the file size 0`},
		{"second header", func(cs chunks) chunks {
			cs[3].Header = cs[0].Header
			return cs
		}, `second header`},
		{"header chunk with a running crc", func(cs chunks) chunks {
			cs[0].RunningCrc32C = 1
			return cs
		}, `header chunk also carries file data`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectCorrupt(t, ReceiveInterleaved, tc.mutate(interleavedChunks()), tc.wantMsg)
		})
	}
}

// TestReceiveInterleavedFilesInFlight: a stream may have MaxFilesInFlight
// files started and not finished, not one more.
func TestReceiveInterleavedFilesInFlight(t *testing.T) {
	stream := func(files int) []*shalev1.SnapshotChunk {
		hdr := &shalev1.SnapshotHeader{}
		for i := range files {
			hdr.Files = append(hdr.Files, &shalev1.SnapshotFile{Name: fmt.Sprintf("f%02d", i), Size: 2})
		}
		cs := []*shalev1.SnapshotChunk{{Header: hdr}}
		for half := range 2 {
			for i := range files {
				cs = append(cs, &shalev1.SnapshotChunk{FileIndex: uint32(i), Offset: uint64(half), Data: []byte{'x'}, RunningCrc32C: CRC32C([]byte("xx")[:half+1])})
			}
		}
		return cs
	}
	if _, _, err := ReceiveInterleaved(context.Background(), &sliceReceiver{chunks: stream(MaxFilesInFlight)}, t.TempDir()); err != nil {
		t.Fatalf("%d files in flight: %v", MaxFilesInFlight, err)
	}
	staging := t.TempDir()
	_, _, err := ReceiveInterleaved(context.Background(), &sliceReceiver{chunks: stream(MaxFilesInFlight + 1)}, staging)
	if !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte("other files are in progress")) {
		t.Fatalf("%d files in flight: err = %v", MaxFilesInFlight+1, err)
	}
	assertEmptyDir(t, staging)
}

func TestSendInterleavedRefusesSkip(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "a", []byte("x"))
	c := &cloningCollector{}
	if _, err := SendInterleaved(context.Background(), c, nil, src, Options{Skip: func(*shalev1.SnapshotFile) bool { return true }}); err == nil {
		t.Fatal("SendInterleaved took a Skip")
	}
	if len(c.chunks) != 0 {
		t.Fatal("chunks sent")
	}
}

// TestSendInterleavedFailures: a file that shrank or grew since the
// listing, a stream that fails and a cancelled context end the send with an
// error, and SendInterleaved returns only once its readers have stopped
// (goleak in TestMain checks that nothing is left running).
func TestSendInterleavedFailures(t *testing.T) {
	src := t.TempDir()
	for i := range 3 {
		writeFile(t, src, fmt.Sprintf("f%d", i), bytes.Repeat([]byte{'x'}, 100_000))
	}
	path := filepath.Join(src, "f1")
	shrink := &hookSender{onHeader: func() { writeFile(t, src, "f1", []byte("short")) }}
	if _, err := SendInterleaved(context.Background(), shrink, nil, src, Options{ChunkSize: 1000}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("did the file change")) {
		t.Fatalf("shrunk file: err = %v", err)
	}
	writeFile(t, src, "f1", bytes.Repeat([]byte{'x'}, 100_000))
	grow := &hookSender{onHeader: func() { writeFile(t, src, "f1", bytes.Repeat([]byte{'y'}, 100_001)) }}
	if _, err := SendInterleaved(context.Background(), grow, nil, src, Options{ChunkSize: 1000}); err == nil || !bytes.Contains([]byte(err.Error()), []byte(path+" grew")) {
		t.Fatalf("grown file: err = %v", err)
	}
	boom := errors.New("stream reset")
	broken := &hookSender{failAt: 5, err: boom}
	if _, err := SendInterleaved(context.Background(), broken, nil, src, Options{ChunkSize: 1000}); !errors.Is(err, boom) {
		t.Fatalf("broken stream: err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancelling := &hookSender{failAt: -1, onData: cancel}
	if _, err := SendInterleaved(ctx, cancelling, nil, src, Options{ChunkSize: 1000, Limiter: NewLimiter(1 << 20)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}
}

// hookSender runs onHeader after the header, onData after each data chunk,
// and fails the failAt-th chunk (counting the header as 1) with err.
type hookSender struct {
	onHeader, onData func()
	failAt, n        int
	err              error
}

func (h *hookSender) Send(c *shalev1.SnapshotChunk) error {
	h.n++
	if h.n == h.failAt {
		return h.err
	}
	switch {
	case c.GetHeader() != nil && h.onHeader != nil:
		h.onHeader()
	case c.GetHeader() == nil && h.onData != nil:
		h.onData()
	}
	return nil
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
