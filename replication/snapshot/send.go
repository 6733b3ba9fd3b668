package snapshot

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/internal/filecrc"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Send streams the checkpoint in dir to s: it lists the regular files of dir
// (anything else in dir, such as a subdirectory or a symlink, is an error
// rather than silently left out), reads each to compute its size and CRC-32C,
// sends a copy of header with Files set to that list as the first chunk (the
// caller's header is not modified), then sends every file's bytes in order
// in chunks of opts.ChunkSize, each with its own CRC-32C, waiting on
// opts.Limiter before each chunk. Every chunk's Data is the same buffer,
// refilled once s.Send returns (see ChunkSender). A file named in
// opts.Lengths is listed, checksummed and sent as its first
// opts.Lengths[name] bytes (it may grow meanwhile). The files must not
// change while Send runs otherwise: a file that grew or shrank since the
// listing fails the send, and one rewritten in place fails at the
// receiver, which checks each file against its listed checksum
// (checkpoint files are immutable).
//
// Send returns the number of file bytes sent. It stops with ctx's error once
// ctx is done. It does not close the stream: the caller does (for gRPC,
// CloseAndRecv), which is how the receiver learns the stream is complete.
func Send(ctx context.Context, s ChunkSender, header *shalev1.SnapshotHeader, dir string, opts Options) (sentBytes int64, err error) {
	chunkSize := opts.ChunkSize
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	files, err := sendHeader(ctx, s, header, dir, true, opts.Lengths)
	if err != nil {
		return 0, err
	}
	// One buffer for every chunk (the ChunkSender is done with a chunk's
	// bytes when Send returns): a fresh one per chunk cost a page fault and
	// a zeroed page per 4 KiB sent, and the garbage collector's time.
	var buf []byte
	for i, f := range files {
		if opts.Skip != nil && opts.Skip(f) {
			continue
		}
		if buf == nil && f.Size > 0 {
			buf = make([]byte, chunkSize)
		}
		_, cut := opts.Lengths[f.Name]
		n, err := sendFile(ctx, s, uint32(i), filepath.Join(dir, f.Name), f, buf, opts.Limiter, cut)
		sentBytes += n
		if err != nil {
			return sentBytes, err
		}
	}
	return sentBytes, nil
}

// sendHeader lists dir (listFiles) and sends a copy of header with the
// list as the stream's first chunk; it returns the list.
func sendHeader(ctx context.Context, s ChunkSender, header *shalev1.SnapshotHeader, dir string, checksums bool, lengths map[string]int64) ([]*shalev1.SnapshotFile, error) {
	files, err := listFiles(ctx, dir, checksums, lengths)
	if err != nil {
		return nil, err
	}
	hdr := &shalev1.SnapshotHeader{}
	if header != nil {
		hdr = proto.Clone(header).(*shalev1.SnapshotHeader)
	}
	hdr.Files = files
	if err := s.Send(&shalev1.SnapshotChunk{Header: hdr}); err != nil {
		return nil, fmt.Errorf("snapshot: send header: %w", err)
	}
	return files, nil
}

// ListFiles returns the name and size of every file in dir, sorted by
// name, without checksums; a file named in lengths is listed as its first
// lengths[name] bytes (an error if it is shorter). Anything in dir but a
// regular file is an error, as in Send.
func ListFiles(ctx context.Context, dir string, lengths map[string]int64) ([]*shalev1.SnapshotFile, error) {
	return listFiles(ctx, dir, false, lengths)
}

// listFiles returns name and size of every file in dir, sorted by name, and
// with checksums its CRC-32C, read from the file; a file named in lengths
// is taken as its first lengths[name] bytes.
func listFiles(ctx context.Context, dir string, checksums bool, lengths map[string]int64) ([]*shalev1.SnapshotFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: list %s: %w", dir, err)
	}
	files := make([]*shalev1.SnapshotFile, 0, len(entries))
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("snapshot: %s: %q is not a regular file (%s)", dir, e.Name(), e.Type())
		}
		if err := checkName(e.Name()); err != nil {
			return nil, fmt.Errorf("snapshot: %s: %w", dir, err)
		}
		var size int64
		var crc uint32
		limit, cut := lengths[e.Name()]
		if !cut {
			limit = -1
		}
		if checksums {
			size, crc, err = filecrc.File(ctx, filepath.Join(dir, e.Name()), limit, nil)
			if err != nil {
				err = fmt.Errorf("snapshot: checksum %s: %w", filepath.Join(dir, e.Name()), err)
			}
			if err == nil && cut && size != limit {
				err = fmt.Errorf("snapshot: %s: %d bytes, shorter than its length %d", filepath.Join(dir, e.Name()), size, limit)
			}
		} else {
			var info os.FileInfo
			if info, err = e.Info(); err == nil {
				size = info.Size()
				if cut && size < limit {
					err = fmt.Errorf("snapshot: %s: %d bytes, shorter than its length %d", filepath.Join(dir, e.Name()), size, limit)
				} else if cut {
					size = limit
				}
			}
		}
		if err != nil {
			return nil, err
		}
		files = append(files, &shalev1.SnapshotFile{Name: e.Name(), Size: uint64(size), Crc32C: crc})
	}
	return files, nil
}

// sendFile sends file index (at path, listed as f) in chunks of len(buf)
// bytes, each read into buf; cut says the file may be longer than f.Size
// (Options.Lengths).
func sendFile(ctx context.Context, s ChunkSender, index uint32, path string, f *shalev1.SnapshotFile, buf []byte, lim *Limiter, cut bool) (int64, error) {
	if f.Size == 0 {
		return 0, nil
	}
	file, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	defer file.Close()
	var off uint64
	for off < f.Size {
		if err := ctx.Err(); err != nil {
			return int64(off), err
		}
		data := buf[:min(uint64(len(buf)), f.Size-off)]
		if _, err := io.ReadFull(file, data); err != nil {
			return int64(off), fmt.Errorf("snapshot: read %s at offset %d: %w (did the file change during the send?)", path, off, err)
		}
		if err := lim.WaitN(ctx, len(data)); err != nil {
			return int64(off), err
		}
		if err := s.Send(&shalev1.SnapshotChunk{FileIndex: index, Offset: off, Data: data, Crc32C: CRC32C(data)}); err != nil {
			return int64(off), fmt.Errorf("snapshot: send %s at offset %d: %w", f.Name, off, err)
		}
		off += uint64(len(data))
	}
	// The file must not have grown since it was listed. A file rewritten
	// in place fails at the receiver, which checks every file's bytes
	// against the checksum listed in the header (checkpoint files are
	// immutable: the sender does not checksum them a second time).
	var one [1]byte
	if n, _ := file.Read(one[:]); n != 0 && !cut {
		return int64(off), fmt.Errorf("snapshot: %s grew during the send", path)
	}
	return int64(off), nil
}

// SendInterleaved streams the checkpoint in dir to s in the interleaved
// format (see the package comment): it lists the regular files of dir
// (anything else, such as a subdirectory or a symlink, is an error) with
// their sizes, sends a copy of header with Files set to that list as the
// first chunk (the caller's header is not modified), then reads
// opts.Parallel files at once in chunks of opts.ChunkSize and sends each
// chunk as soon as it is read, with the running CRC-32C of its file,
// waiting on opts.Limiter before each. opts.Skip and opts.Lengths are not
// supported (an error). Each byte is read once and checksummed once. The files must not
// change while SendInterleaved runs: a file that grew or shrank since the
// listing fails the send, and one rewritten in place reaches the receiver
// as the bytes read, under their own checksums (checkpoint files are
// immutable).
//
// SendInterleaved returns the number of file bytes sent. It stops with
// ctx's error once ctx is done, and returns only once its reading
// goroutines have ended. It does not close the stream: the caller does (for
// gRPC, CloseAndRecv), which is how the receiver learns the stream is
// complete.
func SendInterleaved(ctx context.Context, s ChunkSender, header *shalev1.SnapshotHeader, dir string, opts Options) (sentBytes int64, err error) {
	if opts.Skip != nil || opts.Lengths != nil {
		return 0, fmt.Errorf("snapshot: SendInterleaved does not skip files or cut them short")
	}
	chunkSize := opts.ChunkSize
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	parallel := opts.Parallel
	if parallel <= 0 {
		parallel = DefaultParallel
	}
	parallel = min(parallel, MaxFilesInFlight)
	files, err := sendHeader(ctx, s, header, dir, false, nil)
	if err != nil {
		return 0, err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rd := &fileReaders{dir: dir, files: files, chunkSize: chunkSize,
		pieces: make(chan piece, 2*parallel), pool: sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}}
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rd.run(ctx); err != nil {
				rd.fail(err)
				cancel()
			}
		}()
	}
	go func() {
		wg.Wait()
		close(rd.pieces)
	}()
	// Send what the readers produce, in the order it comes; once something
	// failed, only drain (the readers stop at the cancel). A HeldSender
	// gives a piece's buffer back when it is done with it; any other
	// sender is done when Send returns.
	hs, held := s.(HeldSender)
	for p := range rd.pieces {
		if err := rd.failed(); err != nil {
			rd.pool.Put(p.buf)
			continue
		}
		if err := opts.Limiter.WaitN(ctx, p.n); err != nil {
			rd.pool.Put(p.buf)
			rd.fail(err)
			cancel()
			continue
		}
		c := &shalev1.SnapshotChunk{FileIndex: p.index, Offset: p.off, Data: (*p.buf)[:p.n], RunningCrc32C: p.crc}
		if held {
			buf := p.buf
			err = hs.SendHeld(c, func() { rd.pool.Put(buf) })
		} else {
			err = s.Send(c)
			rd.pool.Put(p.buf)
		}
		if err != nil {
			rd.fail(fmt.Errorf("snapshot: send %s at offset %d: %w", files[p.index].Name, p.off, err))
			cancel()
			continue
		}
		sentBytes += int64(p.n)
	}
	if err := rd.failed(); err != nil {
		return sentBytes, err
	}
	return sentBytes, ctx.Err()
}

// piece is one chunk read by a fileReaders goroutine, in a buffer of its
// pool.
type piece struct {
	index uint32
	off   uint64
	buf   *[]byte
	n     int
	crc   uint32 // running CRC-32C of the file through this piece
}

// fileReaders is the reading side of one SendInterleaved: its goroutines
// take the files in order, each reading one file at a time into pieces.
type fileReaders struct {
	dir       string
	files     []*shalev1.SnapshotFile
	chunkSize int
	next      atomic.Int64 // index of the next file to take
	pieces    chan piece
	pool      sync.Pool // of *[]byte of chunkSize

	mu  sync.Mutex
	err error // the first failure
}

func (rd *fileReaders) fail(err error) {
	rd.mu.Lock()
	if rd.err == nil {
		rd.err = err
	}
	rd.mu.Unlock()
}

func (rd *fileReaders) failed() error {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.err
}

// run reads files until none is left, ctx is done or a read fails.
func (rd *fileReaders) run(ctx context.Context) error {
	for {
		i := int(rd.next.Add(1) - 1)
		if i >= len(rd.files) {
			return nil
		}
		if err := rd.readFile(ctx, uint32(i)); err != nil {
			return err
		}
	}
}

func (rd *fileReaders) readFile(ctx context.Context, index uint32) error {
	f := rd.files[index]
	if f.Size == 0 {
		return nil
	}
	path := filepath.Join(rd.dir, f.Name)
	file, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer file.Close()
	var off uint64
	var crc uint32
	for off < f.Size {
		n := int(min(uint64(rd.chunkSize), f.Size-off))
		buf := rd.pool.Get().(*[]byte)
		if _, err := io.ReadFull(file, (*buf)[:n]); err != nil {
			rd.pool.Put(buf)
			return fmt.Errorf("snapshot: read %s at offset %d: %w (did the file change during the send?)", path, off, err)
		}
		crc = crc32.Update(crc, castagnoli, (*buf)[:n])
		select {
		case rd.pieces <- piece{index: index, off: off, buf: buf, n: n, crc: crc}:
		case <-ctx.Done():
			rd.pool.Put(buf)
			return ctx.Err()
		}
		off += uint64(n)
	}
	var one [1]byte
	if n, _ := file.Read(one[:]); n != 0 {
		return fmt.Errorf("snapshot: %s grew during the send", path)
	}
	return nil
}
