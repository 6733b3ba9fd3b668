package snapshot

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/shale-db/shale/internal/directfile"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// format is a stream format (see the package comment).
type format uint8

const (
	ordered format = iota + 1
	interleaved
)

// Receive reads an ordered snapshot stream from r (see the package comment)
// and writes its files into a new directory under stagingDir (created if
// missing). It verifies every chunk's CRC-32C, that each file's pieces are
// contiguous from offset 0 and in file order, and each file's final size
// and whole-file CRC-32C against the header; it fsyncs every file, the new
// directory and stagingDir. On success it returns the header and the
// directory, which the caller then owns.
//
// It writes and checksums the chunks on goroutines of its own while it
// reads the next ones (up to 32 MiB ahead), and syncs a finished file while
// the next one is written.
//
// On any error it removes the partial directory and returns an error naming
// what was wrong (file name, index and offset where it applies); errors caused
// by the stream's content wrap ErrCorrupt. It never returns a directory whose
// contents do not match the header. ctx is checked between chunks; to
// interrupt a Recv that blocks, cancel the stream itself (for gRPC, its
// context). Its goroutines have ended when it returns.
func Receive(ctx context.Context, r ChunkReceiver, stagingDir string) (*shalev1.SnapshotHeader, string, error) {
	return receive(ctx, r, stagingDir, ordered)
}

// ReceiveInterleaved is Receive for an interleaved stream (see the package
// comment): the chunks of up to MaxFilesInFlight files may come interleaved,
// each file's in order from offset 0, and each chunk carries the running
// CRC-32C of its file, which it verifies; a file's checksum listed in the
// header (non-zero) must equal its last chunk's. The header it returns lists
// every file's CRC-32C. Up to MaxFilesInFlight files are written at once.
func ReceiveInterleaved(ctx context.Context, r ChunkReceiver, stagingDir string) (*shalev1.SnapshotHeader, string, error) {
	return receive(ctx, r, stagingDir, interleaved)
}

func receive(ctx context.Context, r ChunkReceiver, stagingDir string, f format) (*shalev1.SnapshotHeader, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	first, err := r.Recv()
	if err == io.EOF {
		return nil, "", corruptf("stream ended before the header")
	}
	if err != nil {
		return nil, "", fmt.Errorf("snapshot: receive header: %w", err)
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return nil, "", corruptf("first chunk has no header")
	}
	if first.FileIndex != 0 || first.Offset != 0 || len(first.Data) != 0 || first.Crc32C != 0 || first.RunningCrc32C != 0 {
		return nil, "", corruptf("header chunk also carries file data")
	}
	if err := checkHeader(hdr); err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(stagingDir, 0o755); err != nil {
		return nil, "", fmt.Errorf("snapshot: staging dir: %w", err)
	}
	dir, err := os.MkdirTemp(stagingDir, fmt.Sprintf("snap-%d-", hdr.ShardId))
	if err != nil {
		return nil, "", fmt.Errorf("snapshot: staging dir: %w", err)
	}
	rc := newReceiver(ctx, dir, hdr.Files, f)
	_, rc.pooled = r.(PooledReceiver)
	defer rc.cancel()
	if err := rc.run(r); err != nil {
		rc.abort()
		return nil, "", err
	}
	for i, f := range hdr.Files {
		f.Crc32C = rc.crcs[i]
	}
	return hdr, dir, nil
}

func checkHeader(hdr *shalev1.SnapshotHeader) error {
	if len(hdr.Files) > MaxFiles {
		return corruptf("header lists %d files, more than %d", len(hdr.Files), MaxFiles)
	}
	seen := make(map[string]int, len(hdr.Files))
	for i, f := range hdr.Files {
		if f == nil {
			return corruptf("header file %d is null", i)
		}
		if err := checkName(f.Name); err != nil {
			return corruptf("header file %d: %v", i, err)
		}
		if j, dup := seen[f.Name]; dup {
			return corruptf("header lists file %q twice (index %d and %d)", f.Name, j, i)
		}
		seen[f.Name] = i
		if f.Size > 1<<62 {
			return corruptf("header file %q: size %d is absurd", f.Name, f.Size)
		}
	}
	return nil
}

const (
	// budgetUnit is the granularity of the receive buffer's accounting.
	budgetUnit = 64 << 10
	// writerQueue is how many chunks a file's writer may have queued.
	writerQueue = 64
	// maxWriters bounds the file writers running at once: the files in
	// progress plus some that finished arriving and are being synced.
	maxWriters = MaxFilesInFlight + 8
)

// receiver is the state of one Receive or ReceiveInterleaved. Its receiving
// goroutine (run) checks each chunk's place in its file and hands it to
// the file's writer goroutine, which checks the checksum, writes the bytes,
// and syncs and closes the file once the receiving goroutine has handed it
// every byte and closed its queue.
type receiver struct {
	format format
	dir    string
	files  []*shalev1.SnapshotFile
	pooled bool // chunks' Data go back to directfile's pool once written

	// The receiving goroutine's state.
	got     []uint64      // bytes of each file handed to its writer
	writers []*fileWriter // nil until the file's first chunk
	done    []bool        // every byte handed over, queue closed
	active  int           // files started and not done
	cur     int           // ordered: the file the stream is in
	last    int           // the file of the last chunk (for messages)

	ctx     context.Context // cancelled on the first failure
	cancel  context.CancelFunc
	budget  chan struct{} // one token per budgetUnit bytes queued
	running chan struct{} // one token per running writer
	wg      sync.WaitGroup

	mu   sync.Mutex
	err  error    // a writer's failure, the first
	crcs []uint32 // each file's CRC-32C, set by its writer
}

// fileWriter is one file's writer: chunks come in order on queue.
type fileWriter struct {
	index int
	queue chan *shalev1.SnapshotChunk
}

func newReceiver(ctx context.Context, dir string, files []*shalev1.SnapshotFile, f format) *receiver {
	ctx, cancel := context.WithCancel(ctx)
	return &receiver{
		format: f, dir: dir, files: files,
		got: make([]uint64, len(files)), writers: make([]*fileWriter, len(files)), done: make([]bool, len(files)),
		ctx: ctx, cancel: cancel,
		budget: make(chan struct{}, receiveBuffer/budgetUnit), running: make(chan struct{}, maxWriters),
		crcs: make([]uint32, len(files)),
	}
}

func (rc *receiver) run(r ChunkReceiver) error {
	for {
		if err := rc.ctx.Err(); err != nil {
			return rc.failure(err)
		}
		c, err := r.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return rc.failure(fmt.Errorf("snapshot: receive %s: %w", rc.position(), err))
		}
		if err := rc.chunk(c); err != nil {
			return rc.failure(err)
		}
	}
	// End of stream: every file must be complete (only empty files may
	// be missing).
	for i := range rc.files {
		if err := rc.complete(i); err != nil {
			return rc.failure(err)
		}
	}
	rc.wg.Wait()
	if err := rc.writerErr(); err != nil {
		return err
	}
	if err := syncDir(rc.dir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(rc.dir))
}

// failure returns the error a failed Receive reports: a writer's, which
// came first (the receiving goroutine then sees the cancel), or err.
func (rc *receiver) failure(err error) error {
	if werr := rc.writerErr(); werr != nil {
		return werr
	}
	return err
}

func (rc *receiver) writerErr() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.err
}

// fail records a writer's failure and stops everything else.
func (rc *receiver) fail(err error) {
	rc.mu.Lock()
	if rc.err == nil {
		rc.err = err
	}
	rc.mu.Unlock()
	rc.cancel()
}

func (rc *receiver) position() string {
	if len(rc.files) == 0 {
		return "after the header"
	}
	i := rc.last
	return fmt.Sprintf("file %q (index %d) at offset %d", rc.files[i].Name, i, rc.got[i])
}

func (rc *receiver) chunk(c *shalev1.SnapshotChunk) error {
	if c == nil {
		return corruptf("null chunk at %s", rc.position())
	}
	if c.Header != nil {
		return corruptf("second header at %s", rc.position())
	}
	if uint64(c.FileIndex) >= uint64(len(rc.files)) {
		return corruptf("chunk for file index %d at offset %d: the header lists %d files", c.FileIndex, c.Offset, len(rc.files))
	}
	idx := int(c.FileIndex)
	f := rc.files[idx]
	switch {
	case rc.format == ordered && idx < rc.cur, rc.format == interleaved && rc.done[idx]:
		return corruptf("chunk for file %q (index %d) at offset %d after the file was complete", f.Name, idx, c.Offset)
	case rc.format == ordered:
		// Moving on to a later file: the files in between must be complete.
		for rc.cur < idx {
			if err := rc.complete(rc.cur); err != nil {
				return err
			}
			rc.cur++
		}
	}
	rc.last = idx
	if c.Offset != rc.got[idx] {
		return corruptf("file %q (index %d): chunk at offset %d, expected offset %d", f.Name, idx, c.Offset, rc.got[idx])
	}
	n := uint64(len(c.Data))
	if n > f.Size-rc.got[idx] {
		return corruptf("file %q (index %d): chunk at offset %d of %d bytes runs past the file size %d", f.Name, idx, c.Offset, n, f.Size)
	}
	if n == 0 {
		if rc.format == interleaved {
			return corruptf("file %q (index %d): empty chunk at offset %d", f.Name, idx, c.Offset)
		}
		if c.Crc32C != 0 {
			return corruptf("file %q (index %d): chunk at offset %d: checksum %08x, chunk says %08x", f.Name, idx, c.Offset, 0, c.Crc32C)
		}
		return nil
	}
	w := rc.writers[idx]
	if w == nil {
		if rc.active >= MaxFilesInFlight {
			return corruptf("chunk for file %q (index %d) while %d other files are in progress; at most %d may be", f.Name, idx, rc.active, MaxFilesInFlight)
		}
		var err error
		if w, err = rc.start(idx); err != nil {
			return err
		}
	}
	if err := rc.acquire(len(c.Data)); err != nil {
		return err
	}
	select {
	case w.queue <- c:
	case <-rc.ctx.Done():
		return rc.ctx.Err()
	}
	rc.got[idx] += n
	if rc.got[idx] == f.Size {
		rc.finish(idx)
	}
	return nil
}

// complete makes sure file i has all its bytes once the stream is past it:
// an empty file that got no chunk is started and finished here.
func (rc *receiver) complete(i int) error {
	if rc.done[i] {
		return nil
	}
	f := rc.files[i]
	if rc.got[i] != f.Size {
		return corruptf("file %q (index %d): stream has %d of its %d bytes (missing from offset %d)", f.Name, i, rc.got[i], f.Size, rc.got[i])
	}
	if rc.writers[i] == nil {
		if _, err := rc.start(i); err != nil {
			return err
		}
	}
	rc.finish(i)
	return nil
}

// start starts file i's writer, once fewer than maxWriters run.
func (rc *receiver) start(i int) (*fileWriter, error) {
	select {
	case rc.running <- struct{}{}:
	case <-rc.ctx.Done():
		return nil, rc.ctx.Err()
	}
	w := &fileWriter{index: i, queue: make(chan *shalev1.SnapshotChunk, writerQueue)}
	rc.writers[i] = w
	rc.active++
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		defer func() { <-rc.running }()
		if err := rc.write(w); err != nil {
			rc.fail(err)
		}
	}()
	return w, nil
}

// finish tells file i's writer that it has every byte.
func (rc *receiver) finish(i int) {
	close(rc.writers[i].queue)
	rc.done[i] = true
	rc.active--
}

func budgetTokens(n int) int {
	return min((n+budgetUnit-1)/budgetUnit, receiveBuffer/budgetUnit)
}

// acquire waits until n more bytes fit in the receive buffer.
func (rc *receiver) acquire(n int) error {
	for range budgetTokens(n) {
		select {
		case rc.budget <- struct{}{}:
		case <-rc.ctx.Done():
			return rc.ctx.Err()
		}
	}
	return nil
}

// release gives back what acquire(n) took.
func (rc *receiver) release(n int) {
	for range budgetTokens(n) {
		<-rc.budget
	}
}

// write creates file w.index, writes the chunks that come on its queue
// after checking their checksums, and once the queue is closed (every byte
// handed over) checks the whole file's checksum, syncs and closes it. It
// returns nil without finishing the file when the receive fails elsewhere.
func (rc *receiver) write(w *fileWriter) error {
	f := rc.files[w.index]
	out, err := directfile.Create(filepath.Join(rc.dir, f.Name))
	if err != nil {
		return fmt.Errorf("snapshot: create %q: %w", f.Name, err)
	}
	defer func() {
		if out != nil {
			_ = out.Close()
		}
	}()
	var crc uint32
	for {
		var c *shalev1.SnapshotChunk
		var more bool
		select {
		case c, more = <-w.queue:
		case <-rc.ctx.Done():
			return nil
		}
		if !more {
			break
		}
		switch rc.format {
		case ordered:
			if sum := CRC32C(c.Data); sum != c.Crc32C {
				return corruptf("file %q (index %d): chunk at offset %d: checksum %08x, chunk says %08x", f.Name, w.index, c.Offset, sum, c.Crc32C)
			}
			crc = UpdateCRC32C(crc, c.Data)
		case interleaved:
			crc = UpdateCRC32C(crc, c.Data)
			if crc != c.RunningCrc32C {
				return corruptf("file %q (index %d): chunk at offset %d: checksum %08x, chunk says %08x", f.Name, w.index, c.Offset, crc, c.RunningCrc32C)
			}
		}
		if _, err := out.Write(c.Data); err != nil {
			return fmt.Errorf("snapshot: write file %q (index %d) at offset %d: %w", f.Name, w.index, c.Offset, err)
		}
		rc.release(len(c.Data))
		if rc.pooled {
			directfile.PutBuffer(c.Data)
			c.Data = nil
		}
	}
	if (rc.format == ordered || f.Crc32C != 0) && crc != f.Crc32C {
		return corruptf("file %q (index %d): whole-file checksum %08x, header says %08x", f.Name, w.index, crc, f.Crc32C)
	}
	rc.crcs[w.index] = crc
	if err := out.Sync(); err != nil {
		return fmt.Errorf("snapshot: sync %q: %w", f.Name, err)
	}
	err = out.Close()
	out = nil
	if err != nil {
		return fmt.Errorf("snapshot: close %q: %w", f.Name, err)
	}
	return nil
}

// abort stops the writers, waits for them and removes the directory.
func (rc *receiver) abort() {
	rc.cancel()
	rc.wg.Wait()
	_ = os.RemoveAll(rc.dir)
}
