package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pipe is an in-memory ChunkSender/ChunkReceiver pair: Send blocks until the
// receiver takes the chunk or the pipe is closed.
type pipe struct {
	ch     chan *shalev1.SnapshotChunk
	done   chan struct{} // closed by the receiver when it stops reading
	once   sync.Once
	err    error // returned by Recv after the channel is closed (default io.EOF)
	errSet bool
}

func newPipe() *pipe {
	return &pipe{ch: make(chan *shalev1.SnapshotChunk), done: make(chan struct{})}
}

func (p *pipe) Send(c *shalev1.SnapshotChunk) error {
	select {
	case p.ch <- c:
		return nil
	case <-p.done:
		return errors.New("pipe: receiver gone")
	}
}

// CloseSend ends the stream: Recv returns io.EOF after the chunks sent.
func (p *pipe) CloseSend() { close(p.ch) }

func (p *pipe) Recv() (*shalev1.SnapshotChunk, error) {
	c, ok := <-p.ch
	if !ok {
		if p.errSet {
			return nil, p.err
		}
		return nil, io.EOF
	}
	return c, nil
}

func (p *pipe) stopReading() { p.once.Do(func() { close(p.done) }) }

// sliceReceiver replays a fixed chunk sequence, then returns end (io.EOF if
// nil).
type sliceReceiver struct {
	chunks []*shalev1.SnapshotChunk
	end    error
}

func (s *sliceReceiver) Recv() (*shalev1.SnapshotChunk, error) {
	if len(s.chunks) == 0 {
		if s.end != nil {
			return nil, s.end
		}
		return nil, io.EOF
	}
	c := s.chunks[0]
	s.chunks = s.chunks[1:]
	return c, nil
}

// collector is a ChunkSender that keeps every chunk.
type collector struct{ chunks []*shalev1.SnapshotChunk }

func (c *collector) Send(ch *shalev1.SnapshotChunk) error {
	c.chunks = append(c.chunks, proto.Clone(ch).(*shalev1.SnapshotChunk))
	return nil
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// makeCheckpoint creates a storage engine under t.TempDir(), writes n keys
// (part flushed to SSTs, part left in the WAL), checkpoints it and returns the
// checkpoint directory and the written key/values.
func makeCheckpoint(t testing.TB, n int) (string, map[string]string) {
	t.Helper()
	root := t.TempDir()
	db, err := storage.Open(filepath.Join(root, "db"), &storage.Options{
		MemTableSize: 256 << 10,
		Logger:       quietLogger,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	kv := make(map[string]string, n)
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("key-%08d", i)
		v := fmt.Sprintf("value-%d-%s", i, bytes.Repeat([]byte{'x'}, i%200))
		if err := db.Set([]byte(k), []byte(v), storage.NoSync); err != nil {
			t.Fatal(err)
		}
		kv[k] = v
		if i == n/2 {
			if err := db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	ckpt := filepath.Join(root, "ckpt")
	if _, err := db.Checkpoint(ckpt); err != nil {
		t.Fatal(err)
	}
	return ckpt, kv
}

// verifyDB opens dir as a storage engine and checks it holds exactly kv.
func verifyDB(t testing.TB, dir string, kv map[string]string) {
	t.Helper()
	db, err := storage.Open(dir, &storage.Options{Logger: quietLogger, ErrorIfNotExists: true})
	if err != nil {
		t.Fatalf("open received checkpoint: %v", err)
	}
	defer db.Close()
	for k, v := range kv {
		got, err := db.Get([]byte(k))
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		if string(got) != v {
			t.Fatalf("get %s = %q, want %q", k, got, v)
		}
	}
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	if n != len(kv) {
		t.Fatalf("received DB has %d keys, want %d", n, len(kv))
	}
}

// sameFiles checks that dirs a and b hold the same files with the same bytes.
func sameFiles(t testing.TB, a, b string) {
	t.Helper()
	ea, err := os.ReadDir(a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := os.ReadDir(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(ea) != len(eb) {
		t.Fatalf("%s has %d files, %s has %d", a, len(ea), b, len(eb))
	}
	for i := range ea {
		if ea[i].Name() != eb[i].Name() {
			t.Fatalf("file %d: %s vs %s", i, ea[i].Name(), eb[i].Name())
		}
		da, _ := os.ReadFile(filepath.Join(a, ea[i].Name()))
		db, _ := os.ReadFile(filepath.Join(b, eb[i].Name()))
		if !bytes.Equal(da, db) {
			t.Fatalf("file %s differs", ea[i].Name())
		}
	}
}

func assertEmptyDir(t testing.TB, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("staging dir %s not empty: %v", dir, entries)
	}
}

// transfer sends dir with Send through a pipe and receives it with Receive
// under staging.
func transfer(t testing.TB, dir, staging string, opts Options) (*shalev1.SnapshotHeader, string, int64, error) {
	t.Helper()
	return transferWith(t, dir, staging, opts, func(p *pipe) ChunkSender { return cloningSender{p} }, Send, Receive)
}

// transferWith sends dir with send through a pipe (wrapped by sender) and
// receives it with receive under staging.
func transferWith(t testing.TB, dir, staging string, opts Options, sender func(*pipe) ChunkSender,
	send func(context.Context, ChunkSender, *shalev1.SnapshotHeader, string, Options) (int64, error),
	receive func(context.Context, ChunkReceiver, string) (*shalev1.SnapshotHeader, string, error)) (*shalev1.SnapshotHeader, string, int64, error) {
	t.Helper()
	p := newPipe()
	header := &shalev1.SnapshotHeader{ClusterId: "c1", ShardId: 7, FromNodeId: 1, ToNodeId: 2, RaftMessage: []byte("msgsnap")}
	type result struct {
		n   int64
		err error
	}
	res := make(chan result, 1)
	go func() {
		n, err := send(context.Background(), sender(p), header, dir, opts)
		p.CloseSend()
		res <- result{n, err}
	}()
	hdr, got, err := receive(context.Background(), p, staging)
	p.stopReading()
	for range p.ch { // unblock a sender still sending
	}
	r := <-res
	if r.err != nil && err == nil {
		t.Fatalf("send: %v", r.err)
	}
	if len(header.Files) != 0 {
		t.Fatal("the send modified the caller's header")
	}
	return hdr, got, r.n, err
}

// transferFunc sends a directory through a pipe and receives it (transfer,
// transferInterleaved).
type transferFunc func(t testing.TB, dir, staging string, opts Options) (*shalev1.SnapshotHeader, string, int64, error)

// formats are the stream formats to test, with their options.
var formats = []struct {
	name     string
	transfer transferFunc
	opts     Options
}{
	{"ordered", transfer, Options{}},
	{"interleaved", transferInterleaved, Options{}},
	{"interleaved, 1 file at once", transferInterleaved, Options{Parallel: 1}},
	{"interleaved, 100 files at once", transferInterleaved, Options{Parallel: 100}},
}

func TestRoundTripCheckpoint(t *testing.T) {
	ckpt, kv := makeCheckpoint(t, 5000)
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			staging := filepath.Join(t.TempDir(), "staging")
			// A small chunk size gives many chunks per file.
			opts := f.opts
			opts.ChunkSize = 4096
			hdr, dir, n, err := f.transfer(t, ckpt, staging, opts)
			if err != nil {
				t.Fatal(err)
			}
			if hdr.ShardId != 7 || hdr.ClusterId != "c1" || string(hdr.RaftMessage) != "msgsnap" {
				t.Fatalf("header not carried: %v", hdr)
			}
			var total uint64
			for _, f := range hdr.Files {
				total += f.Size
				data := readFile(t, filepath.Join(dir, f.Name))
				if f.Crc32C != CRC32C(data) {
					t.Fatalf("returned header lists %q with crc %08x, the file's is %08x", f.Name, f.Crc32C, CRC32C(data))
				}
			}
			if uint64(n) != total || n == 0 {
				t.Fatalf("sent %d bytes, files total %d", n, total)
			}
			if filepath.Dir(dir) != staging {
				t.Fatalf("received dir %s not under %s", dir, staging)
			}
			sameFiles(t, ckpt, dir)
			verifyDB(t, dir, kv)
		})
	}
}

func TestRoundTripDefaultChunkAndEmptyFiles(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "EMPTY", nil)
	writeFile(t, src, "big", bytes.Repeat([]byte("0123456789"), 300_000)) // 3 MB: 3 chunks
	writeFile(t, src, "small", []byte("hello"))
	writeFile(t, src, "zz-empty-last", nil)
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			hdr, dir, _, err := f.transfer(t, src, filepath.Join(t.TempDir(), "staging"), f.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(hdr.Files) != 4 {
				t.Fatalf("header lists %d files", len(hdr.Files))
			}
			sameFiles(t, src, dir)
		})
	}
}

func writeFile(t testing.TB, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSendRejectsNonRegularFiles(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "a", []byte("x"))
	if err := os.Mkdir(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	var c collector
	if _, err := Send(context.Background(), &c, nil, src, Options{}); err == nil {
		t.Fatal("Send of a directory with a subdirectory succeeded")
	}
	if len(c.chunks) != 0 {
		t.Fatal("Send sent chunks before failing the listing")
	}
	if _, err := Send(context.Background(), &c, nil, filepath.Join(src, "missing"), Options{}); err == nil {
		t.Fatal("Send of a missing directory succeeded")
	}
}

// validChunks returns the chunks Send produces for a small synthetic
// directory: files "a" (20 bytes: 3 chunks), "b" (empty), "c" (10 bytes: 2
// chunks), with a chunk size of 8.
func validChunks(t testing.TB) []*shalev1.SnapshotChunk {
	t.Helper()
	src := t.TempDir()
	writeFile(t, src, "a", []byte("aaaaaaaaAAAAAAAAaaaa"))
	writeFile(t, src, "b", nil)
	writeFile(t, src, "c", []byte("cccccccccc"))
	var c collector
	if _, err := Send(context.Background(), &c, &shalev1.SnapshotHeader{ShardId: 1}, src, Options{ChunkSize: 8}); err != nil {
		t.Fatal(err)
	}
	// header, a@0, a@8, a@16, c@0, c@8
	if len(c.chunks) != 6 {
		t.Fatalf("got %d chunks", len(c.chunks))
	}
	return c.chunks
}

func cloneChunks(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
	out := make([]*shalev1.SnapshotChunk, len(cs))
	for i, c := range cs {
		out[i] = proto.Clone(c).(*shalev1.SnapshotChunk)
	}
	return out
}

func TestReceiveValidSequence(t *testing.T) {
	staging := t.TempDir()
	hdr, dir, err := Receive(context.Background(), &sliceReceiver{chunks: validChunks(t)}, staging)
	if err != nil {
		t.Fatal(err)
	}
	if len(hdr.Files) != 3 {
		t.Fatal(hdr)
	}
	for name, want := range map[string]string{"a": "aaaaaaaaAAAAAAAAaaaa", "b": "", "c": "cccccccccc"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Fatalf("%s = %q, %v", name, got, err)
		}
	}
}

func TestReceiveCorruption(t *testing.T) {
	fixCRC := func(c *shalev1.SnapshotChunk) { c.Crc32C = CRC32C(c.Data) }
	cases := []struct {
		name    string
		mutate  func([]*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk
		wantMsg string
	}{
		{"flipped data byte", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[2].Data[3] ^= 0x40
			return cs
		}, `file "a" (index 0): chunk at offset 8: checksum`},
		{"wrong chunk crc", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[4].Crc32C++
			return cs
		}, `file "c" (index 2): chunk at offset 0: checksum`},
		{"data changed with matching chunk crc", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[1].Data[0] = 'z'
			fixCRC(cs[1])
			return cs
		}, `file "a" (index 0): whole-file checksum`},
		{"truncated stream", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			return cs[:5]
		}, `file "c" (index 2): stream has 8 of its 10 bytes`},
		{"truncated inside a chunk", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[5].Data = cs[5].Data[:1]
			fixCRC(cs[5])
			return cs
		}, `stream has 9 of its 10 bytes`},
		{"missing file", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			return cs[:4]
		}, `file "c" (index 2): stream has 0 of its 10 bytes`},
		{"missing middle chunk", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			return append(cs[:2], cs[3:]...)
		}, `chunk at offset 16, expected offset 8`},
		{"duplicate offset", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			return append(cs[:3], cs[2:]...)
		}, `chunk at offset 8, expected offset 16`},
		{"chunk for a finished file", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			return append(cs[:5], cs[1], cs[5])
		}, `after the file was complete`},
		{"data past file size", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[5].Data = append(cs[5].Data, 'x')
			fixCRC(cs[5])
			return cs
		}, `runs past the file size`},
		{"file index out of range", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[4].FileIndex = 9
			return cs
		}, `file index 9`},
		{"no header", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			return cs[1:]
		}, `first chunk has no header`},
		{"empty stream", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			return nil
		}, `before the header`},
		{"second header", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[3].Header = cs[0].Header
			return cs
		}, `second header`},
		{"header chunk with data", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[0].Data = []byte("x")
			return cs
		}, `header chunk also carries file data`},
		{"header size wrong", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[0].Header.Files[2].Size = 11
			return cs
		}, `file "c" (index 2): stream has 10 of its 11 bytes`},
		{"header crc wrong", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[0].Header.Files[2].Crc32C ^= 1
			return cs
		}, `file "c" (index 2): whole-file checksum`},
		{"empty file given data", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			extra := &shalev1.SnapshotChunk{FileIndex: 1, Data: []byte("x")}
			fixCRC(extra)
			return append(cs[:4], append([]*shalev1.SnapshotChunk{extra}, cs[4:]...)...)
		}, `file "b" (index 1): chunk at offset 0 of 1 bytes runs past the file size 0`},
		{"duplicate file name", func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[0].Header.Files[2].Name = "a"
			return cs
		}, `lists file "a" twice`},
	}
	for _, bad := range []string{"", ".", "..", "../etc", "a/b", "/abs", `a\b`, "x..y", "nul\x00"} {
		cases = append(cases, struct {
			name    string
			mutate  func([]*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk
			wantMsg string
		}{"bad file name " + fmt.Sprintf("%q", bad), func(cs []*shalev1.SnapshotChunk) []*shalev1.SnapshotChunk {
			cs[0].Header.Files[1].Name = bad
			return cs
		}, "header file 1"})
	}
	base := validChunks(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectCorrupt(t, Receive, tc.mutate(cloneChunks(base)), tc.wantMsg)
		})
	}
}

// expectCorrupt checks that receive refuses the stream cs with an error
// wrapping ErrCorrupt that says wantMsg, returns no header or directory and
// leaves nothing in the staging directory.
func expectCorrupt(t *testing.T, receive func(context.Context, ChunkReceiver, string) (*shalev1.SnapshotHeader, string, error), cs []*shalev1.SnapshotChunk, wantMsg string) {
	t.Helper()
	staging := filepath.Join(t.TempDir(), "staging")
	hdr, dir, err := receive(context.Background(), &sliceReceiver{chunks: cs}, staging)
	if err == nil {
		t.Fatalf("the stream was received: %v %s", hdr, dir)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("error %v does not wrap ErrCorrupt", err)
	}
	if !bytes.Contains([]byte(err.Error()), []byte(wantMsg)) {
		t.Fatalf("error %q does not say %q", err, wantMsg)
	}
	if dir != "" || hdr != nil {
		t.Fatal("a failed receive returned a header or directory")
	}
	assertEmptyDir(t, staging)
}

func TestReceiveTransportError(t *testing.T) {
	staging := t.TempDir()
	boom := errors.New("connection reset")
	cs := validChunks(t)[:3]
	_, _, err := Receive(context.Background(), &sliceReceiver{chunks: cs, end: boom}, staging)
	if !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("err = %v", err)
	}
	assertEmptyDir(t, staging)
}

func TestReceiveContextCancel(t *testing.T) {
	staging := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cs := validChunks(t)
	r := &cancelAfter{sliceReceiver: sliceReceiver{chunks: cs}, n: 2, cancel: cancel}
	_, _, err := Receive(ctx, r, staging)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	assertEmptyDir(t, staging)
}

type cancelAfter struct {
	sliceReceiver
	n      int
	cancel func()
}

func (c *cancelAfter) Recv() (*shalev1.SnapshotChunk, error) {
	c.n--
	if c.n == 0 {
		c.cancel()
	}
	return c.sliceReceiver.Recv()
}

func TestLimiterPacesSend(t *testing.T) {
	src := t.TempDir()
	const size = 3 << 20
	writeFile(t, src, "data", bytes.Repeat([]byte{7}, size))
	const rate = 8 << 20 // 8 MiB/s
	lim := NewLimiter(rate)
	start := time.Now()
	var c collector
	if _, err := Send(context.Background(), &c, nil, src, Options{ChunkSize: 256 << 10, Limiter: lim}); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	// The first DefaultChunkSize bytes pass on the initial burst.
	minWant := time.Duration(float64(size-DefaultChunkSize) / rate * float64(time.Second))
	if elapsed < minWant*9/10 {
		t.Fatalf("sent %d bytes at %d B/s in %v, want at least %v", size, rate, elapsed, minWant)
	}
}

func TestLimiterSharedAcrossSenders(t *testing.T) {
	src := t.TempDir()
	const size = 2 << 20
	writeFile(t, src, "data", bytes.Repeat([]byte{7}, size))
	const rate = 8 << 20
	lim := NewLimiter(rate)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c collector
			_, errs[i] = Send(context.Background(), &c, nil, src, Options{ChunkSize: 128 << 10, Limiter: lim})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	minWant := time.Duration(float64(3*size-DefaultChunkSize) / rate * float64(time.Second))
	if elapsed < minWant*9/10 {
		t.Fatalf("3 senders x %d bytes at a shared %d B/s took %v, want at least %v", size, rate, elapsed, minWant)
	}
}

func TestLimiterUnlimited(t *testing.T) {
	var nilLim *Limiter
	for _, l := range []*Limiter{nilLim, NewLimiter(0), NewLimiter(-5)} {
		start := time.Now()
		for i := 0; i < 100; i++ {
			if err := l.WaitN(context.Background(), 1<<30); err != nil {
				t.Fatal(err)
			}
		}
		if time.Since(start) > time.Second {
			t.Fatal("unlimited limiter waited")
		}
		if l.Rate() != 0 {
			t.Fatal("unlimited limiter has a rate")
		}
	}
}

func TestSendContextCancel(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "data", bytes.Repeat([]byte{7}, 8<<20))
	lim := NewLimiter(1 << 20) // would take ~7s
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(150*time.Millisecond, cancel)
	start := time.Now()
	var c collector
	n, err := Send(ctx, &c, nil, src, Options{ChunkSize: 64 << 10, Limiter: lim})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Fatalf("Send took %v to notice the cancel", elapsed)
	}
	if n >= 8<<20 {
		t.Fatalf("sent everything (%d bytes) despite the cancel", n)
	}
	// An already-cancelled context sends nothing.
	c.chunks = nil
	if _, err := Send(ctx, &c, nil, src, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

// TestChangedFileRejected: a file rewritten in place after Send listed it
// (same size, other bytes) reaches the receiver, which refuses the stream:
// the whole-file checksum is the header's, taken at the listing.
func TestChangedFileRejected(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "data", bytes.Repeat([]byte{7}, 1000))
	s := &mutatingSender{path: filepath.Join(src, "data")}
	if _, err := Send(context.Background(), s, nil, src, Options{ChunkSize: 100}); err != nil {
		t.Fatal(err)
	}
	expectCorrupt(t, Receive, s.chunks, "whole-file checksum")
}

// mutatingSender keeps the chunks sent and, after the header is sent,
// changes the file at path: with change, or by rewriting it whole.
type mutatingSender struct {
	path   string
	change func(path string) error
	chunks []*shalev1.SnapshotChunk
}

func (m *mutatingSender) Send(c *shalev1.SnapshotChunk) error {
	m.chunks = append(m.chunks, proto.Clone(c).(*shalev1.SnapshotChunk))
	switch {
	case len(m.chunks) > 1:
		return nil
	case m.change != nil:
		return m.change(m.path)
	default:
		return os.WriteFile(m.path, bytes.Repeat([]byte{8}, 1000), 0o644)
	}
}

// sliceSender records the chunks sent.
type sliceSender struct{ chunks []*shalev1.SnapshotChunk }

func (s *sliceSender) Send(c *shalev1.SnapshotChunk) error {
	s.chunks = append(s.chunks, proto.Clone(c).(*shalev1.SnapshotChunk))
	return nil
}

// bufferSender records where each chunk's Data starts.
type bufferSender struct{ starts map[*byte]int }

func (b *bufferSender) Send(c *shalev1.SnapshotChunk) error {
	if len(c.GetData()) > 0 {
		b.starts[&c.GetData()[0]]++
	}
	return nil
}

// TestSendReusesItsBuffer: every chunk of every file is read into the same
// buffer (a fresh one per chunk cost a zeroed page per 4 KiB sent).
func TestSendReusesItsBuffer(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "a", bytes.Repeat([]byte("a"), 5000))
	writeFile(t, src, "b", bytes.Repeat([]byte("b"), 3000))
	s := &bufferSender{starts: map[*byte]int{}}
	if _, err := Send(context.Background(), s, nil, src, Options{ChunkSize: 1024}); err != nil {
		t.Fatal(err)
	}
	if len(s.starts) != 1 {
		t.Fatalf("chunks in %d buffers, want 1", len(s.starts))
	}
	for _, n := range s.starts {
		if n != 8 {
			t.Fatalf("%d chunks, want 8", n)
		}
	}
}

// TestSendLengths: a file named in Options.Lengths goes as its first bytes
// (the rest, and what is appended during the send, stay behind); one
// shorter than its length fails the send.
func TestSendLengths(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "wal", bytes.Repeat([]byte("w"), 5000))
	writeFile(t, src, "sst", bytes.Repeat([]byte("s"), 3000))
	s := &mutatingSender{path: filepath.Join(src, "wal"), change: func(path string) error {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = f.Write(bytes.Repeat([]byte("x"), 100))
		return errors.Join(err, f.Close())
	}}
	if _, err := Send(context.Background(), s, nil, src, Options{ChunkSize: 1024, Lengths: map[string]int64{"wal": 2500}}); err != nil {
		t.Fatal(err)
	}
	files := s.chunks[0].GetHeader().GetFiles()
	if len(files) != 2 || files[1].GetName() != "wal" || files[1].GetSize() != 2500 || files[1].GetCrc32C() != CRC32C(bytes.Repeat([]byte("w"), 2500)) {
		t.Fatalf("header files %v", files)
	}
	hdr, got, err := Receive(context.Background(), &sliceReceiver{chunks: s.chunks}, filepath.Join(t.TempDir(), "staging"))
	if err != nil {
		t.Fatal(err)
	}
	if len(hdr.GetFiles()) != 2 {
		t.Fatalf("received header %v", hdr.GetFiles())
	}
	if b, err := os.ReadFile(filepath.Join(got, "wal")); err != nil || !bytes.Equal(b, bytes.Repeat([]byte("w"), 2500)) {
		t.Fatalf("received wal: %d bytes, %v", len(b), err)
	}
	if _, err := Send(context.Background(), &collector{}, nil, src, Options{Lengths: map[string]int64{"sst": 4000}}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("shorter than its length")) {
		t.Fatalf("send of a file shorter than its length: %v", err)
	}
}

// TestSendSkip: a skipped file is listed in the header with its size and
// checksum, and none of its bytes are sent; the others are sent whole.
func TestSendSkip(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "a", bytes.Repeat([]byte("a"), 5000))
	writeFile(t, src, "b", bytes.Repeat([]byte("b"), 7000))
	writeFile(t, src, "c", []byte("c"))
	var s sliceSender
	n, err := Send(context.Background(), &s, nil, src, Options{ChunkSize: 1024, Skip: func(f *shalev1.SnapshotFile) bool {
		return f.Name == "b" && f.Size == 7000 && f.Crc32C == CRC32C(bytes.Repeat([]byte("b"), 7000))
	}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5001 {
		t.Fatalf("sent %d bytes, want 5001", n)
	}
	hdr := s.chunks[0].GetHeader()
	if len(hdr.GetFiles()) != 3 || hdr.GetFiles()[1].GetName() != "b" || hdr.GetFiles()[1].GetSize() != 7000 {
		t.Fatalf("header files %v", hdr.GetFiles())
	}
	for _, c := range s.chunks[1:] {
		if c.GetFileIndex() == 1 {
			t.Fatalf("a chunk of the skipped file was sent (offset %d)", c.GetOffset())
		}
	}
}
