// Package snapshot streams a shard checkpoint — a directory of immutable
// files written by the storage engine's Checkpoint — from one node to another
// as a sequence of shalev1.SnapshotChunk messages, byte for byte (no
// re-encoding of the data), with checksums end to end.
//
// # Stream format
//
// The first chunk carries only the SnapshotHeader, whose Files list every
// file of the checkpoint: name, size and CRC-32C (Castagnoli) of the whole
// file. Every later chunk carries no header and a piece of one file: its index
// in Files, the offset of the piece in the file, the bytes, and the CRC-32C of
// those bytes. Files are sent in the order of Files, each from offset 0 in
// contiguous pieces; an empty file has no chunk. The stream ends after the
// last byte of the last file (the sender closes it).
//
// Receive accepts exactly this format and nothing else: a chunk out of order,
// a gap or overlap, a piece past a file's declared size, a bad checksum, an
// unsafe file name or a stream that ends early is an error wrapping
// ErrCorrupt, and the partial directory is removed. A directory returned by
// Receive therefore holds exactly the files the header lists, with the listed
// sizes and checksums, synced to disk.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// DefaultChunkSize is the chunk size Send uses when Options.ChunkSize is 0
// (1 MiB), and the burst of a Limiter.
const DefaultChunkSize = 1 << 20

// MaxFiles bounds the number of files a received header may list, so that a
// malformed header cannot make Receive allocate without bound.
const MaxFiles = 100_000

// ErrCorrupt is wrapped by every error Receive returns because the stream
// itself is wrong (bad checksum, bad offset, bad file name, missing or extra
// data, malformed chunk), as opposed to a transport, context or local I/O
// error. Test it with errors.Is.
var ErrCorrupt = errors.New("snapshot: corrupt stream")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the CRC-32C (Castagnoli) checksum of b, the checksum used in
// SnapshotFile.Crc32C and SnapshotChunk.Crc32C.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// ChunkSender is the sending half of a snapshot stream. The gRPC client
// stream of Raft.SendSnapshot satisfies it.
type ChunkSender interface {
	// Send sends one chunk. Send passes a fresh chunk (and Data buffer) on
	// every call and never touches it again, so the implementation may keep it.
	Send(*shalev1.SnapshotChunk) error
}

// ChunkReceiver is the receiving half of a snapshot stream. The gRPC server
// stream of Raft.SendSnapshot satisfies it.
type ChunkReceiver interface {
	// Recv returns the next chunk, or io.EOF after the last one.
	Recv() (*shalev1.SnapshotChunk, error)
}

// Options configure Send.
type Options struct {
	// ChunkSize is the number of file bytes per chunk. Default (0):
	// DefaultChunkSize. Keep it well under the receiver's gRPC maximum
	// message size (4 MiB by default).
	ChunkSize int
	// Limiter paces the bytes sent; it is usually shared by every snapshot
	// send of a node. Default (nil): unlimited.
	Limiter *Limiter
	// Skip, if set, names files the receiver already holds: a file for
	// which it returns true is listed in the header but none of its bytes
	// are sent. Raft snapshots never skip (Receive wants every file); a
	// backup (Admin.BackupShard) skips what earlier backups copied.
	Skip func(*shalev1.SnapshotFile) bool
}

// Send streams the checkpoint in dir to s: it lists the regular files of dir
// (anything else in dir, such as a subdirectory or a symlink, is an error
// rather than silently left out), reads each to compute its size and CRC-32C,
// sends a copy of header with Files set to that list as the first chunk (the
// caller's header is not modified), then sends every file's bytes in order
// in chunks of opts.ChunkSize, each with its own CRC-32C, waiting on
// opts.Limiter before each chunk. The files must not change while Send runs:
// a file whose size or checksum differs on the second read fails the send.
//
// Send returns the number of file bytes sent. It stops with ctx's error once
// ctx is done. It does not close the stream: the caller does (for gRPC,
// CloseAndRecv), which is how the receiver learns the stream is complete.
func Send(ctx context.Context, s ChunkSender, header *shalev1.SnapshotHeader, dir string, opts Options) (sentBytes int64, err error) {
	chunkSize := opts.ChunkSize
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	files, err := listFiles(ctx, dir)
	if err != nil {
		return 0, err
	}
	hdr := &shalev1.SnapshotHeader{}
	if header != nil {
		hdr = proto.Clone(header).(*shalev1.SnapshotHeader)
	}
	hdr.Files = files
	if err := s.Send(&shalev1.SnapshotChunk{Header: hdr}); err != nil {
		return 0, fmt.Errorf("snapshot: send header: %w", err)
	}
	for i, f := range files {
		if opts.Skip != nil && opts.Skip(f) {
			continue
		}
		n, err := sendFile(ctx, s, uint32(i), filepath.Join(dir, f.Name), f, chunkSize, opts.Limiter)
		sentBytes += n
		if err != nil {
			return sentBytes, err
		}
	}
	return sentBytes, nil
}

// listFiles returns name, size and CRC-32C of every file in dir, sorted by
// name.
func listFiles(ctx context.Context, dir string) ([]*shalev1.SnapshotFile, error) {
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
		size, crc, err := checksumFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		files = append(files, &shalev1.SnapshotFile{Name: e.Name(), Size: uint64(size), Crc32C: crc})
	}
	return files, nil
}

func checksumFile(path string) (size int64, crc uint32, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot: %w", err)
	}
	defer f.Close()
	h := crc32.New(castagnoli)
	size, err = io.Copy(h, f)
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot: read %s: %w", path, err)
	}
	return size, h.Sum32(), nil
}

func sendFile(ctx context.Context, s ChunkSender, index uint32, path string, f *shalev1.SnapshotFile, chunkSize int, lim *Limiter) (int64, error) {
	if f.Size == 0 {
		return 0, nil
	}
	file, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	defer file.Close()
	var off uint64
	var crc uint32
	for off < f.Size {
		if err := ctx.Err(); err != nil {
			return int64(off), err
		}
		n := uint64(chunkSize)
		if rest := f.Size - off; rest < n {
			n = rest
		}
		// A fresh buffer per chunk: the ChunkSender may keep the message.
		data := make([]byte, n)
		if _, err := io.ReadFull(file, data); err != nil {
			return int64(off), fmt.Errorf("snapshot: read %s at offset %d: %w (did the file change during the send?)", path, off, err)
		}
		if err := lim.WaitN(ctx, len(data)); err != nil {
			return int64(off), err
		}
		c := CRC32C(data)
		crc = crc32.Update(crc, castagnoli, data)
		if err := s.Send(&shalev1.SnapshotChunk{FileIndex: index, Offset: off, Data: data, Crc32C: c}); err != nil {
			return int64(off), fmt.Errorf("snapshot: send %s at offset %d: %w", f.Name, off, err)
		}
		off += n
	}
	// The file must not have grown or changed since it was checksummed.
	var one [1]byte
	if n, _ := file.Read(one[:]); n != 0 {
		return int64(off), fmt.Errorf("snapshot: %s grew during the send", path)
	}
	if crc != f.Crc32C {
		return int64(off), fmt.Errorf("snapshot: %s changed during the send (crc %08x, listed %08x)", path, crc, f.Crc32C)
	}
	return int64(off), nil
}

// checkName accepts a plain file name: not empty, not "." or containing "..",
// without path separators, NUL bytes or a volume name.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty file name")
	case len(name) > 255:
		return fmt.Errorf("file name %.40q... longer than 255 bytes", name)
	case name == ".", strings.Contains(name, ".."):
		return fmt.Errorf("file name %q contains \"..\" or is \".\"", name)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("file name %q contains a path separator or NUL", name)
	case filepath.Base(name) != name, filepath.VolumeName(name) != "", !filepath.IsLocal(name):
		return fmt.Errorf("file name %q is not a plain local file name", name)
	}
	return nil
}

// Receive reads a snapshot stream from r (see the package comment for the
// format) and writes its files into a new directory under stagingDir
// (created if missing). It verifies every chunk's CRC-32C, that each file's
// pieces are contiguous from offset 0 and in file order, and each file's final
// size and whole-file CRC-32C against the header; it fsyncs every file, the
// new directory and stagingDir. On success it returns the header and the
// directory, which the caller then owns.
//
// On any error it removes the partial directory and returns an error naming
// what was wrong (file name, index and offset where it applies); errors caused
// by the stream's content wrap ErrCorrupt. It never returns a directory whose
// contents do not match the header. ctx is checked between chunks; to
// interrupt a Recv that blocks, cancel the stream itself (for gRPC, its
// context).
func Receive(ctx context.Context, r ChunkReceiver, stagingDir string) (*shalev1.SnapshotHeader, string, error) {
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
	if first.FileIndex != 0 || first.Offset != 0 || len(first.Data) != 0 || first.Crc32C != 0 {
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
	rc := &receiver{dir: dir, files: hdr.Files}
	if err := rc.run(ctx, r); err != nil {
		rc.abort()
		return nil, "", err
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

// receiver is the state of one Receive: files before cur are complete and
// synced, file cur is open in out (or not yet created), later ones are not
// started.
type receiver struct {
	dir     string
	files   []*shalev1.SnapshotFile
	cur     int
	out     *os.File
	written uint64
	crc     uint32
}

func (rc *receiver) run(ctx context.Context, r ChunkReceiver) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		c, err := r.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("snapshot: receive %s: %w", rc.position(), err)
		}
		if err := rc.chunk(c); err != nil {
			return err
		}
	}
	// End of stream: every remaining file must be complete (only empty
	// files may still be missing).
	for rc.cur < len(rc.files) {
		if err := rc.finishCurrent(); err != nil {
			return err
		}
	}
	if err := syncDir(rc.dir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(rc.dir))
}

func (rc *receiver) position() string {
	if rc.cur >= len(rc.files) {
		return "after the last file"
	}
	return fmt.Sprintf("file %q (index %d) at offset %d", rc.files[rc.cur].Name, rc.cur, rc.written)
}

func (rc *receiver) chunk(c *shalev1.SnapshotChunk) error {
	if c == nil {
		return corruptf("null chunk at %s", rc.position())
	}
	if c.Header != nil {
		return corruptf("second header at %s", rc.position())
	}
	idx := int(c.FileIndex)
	if uint64(c.FileIndex) >= uint64(len(rc.files)) {
		return corruptf("chunk for file index %d at offset %d: the header lists %d files", c.FileIndex, c.Offset, len(rc.files))
	}
	if idx < rc.cur {
		return corruptf("chunk for file %q (index %d) at offset %d after the file was complete", rc.files[idx].Name, idx, c.Offset)
	}
	// Moving on to a later file: the files in between must be complete.
	for rc.cur < idx {
		if err := rc.finishCurrent(); err != nil {
			return err
		}
	}
	f := rc.files[idx]
	if c.Offset != rc.written {
		return corruptf("file %q (index %d): chunk at offset %d, expected offset %d", f.Name, idx, c.Offset, rc.written)
	}
	if uint64(len(c.Data)) > f.Size-rc.written {
		return corruptf("file %q (index %d): chunk at offset %d of %d bytes runs past the file size %d", f.Name, idx, c.Offset, len(c.Data), f.Size)
	}
	if got := CRC32C(c.Data); got != c.Crc32C {
		return corruptf("file %q (index %d): chunk at offset %d: checksum %08x, chunk says %08x", f.Name, idx, c.Offset, got, c.Crc32C)
	}
	if len(c.Data) == 0 {
		return nil
	}
	if rc.out == nil {
		if err := rc.create(); err != nil {
			return err
		}
	}
	if _, err := rc.out.Write(c.Data); err != nil {
		return fmt.Errorf("snapshot: write %s: %w", rc.position(), err)
	}
	rc.written += uint64(len(c.Data))
	rc.crc = crc32.Update(rc.crc, castagnoli, c.Data)
	return nil
}

func (rc *receiver) create() error {
	f := rc.files[rc.cur]
	out, err := os.OpenFile(filepath.Join(rc.dir, f.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("snapshot: create %q: %w", f.Name, err)
	}
	rc.out = out
	return nil
}

// finishCurrent checks that file cur is complete, syncs and closes it, and
// moves on to the next file.
func (rc *receiver) finishCurrent() error {
	f := rc.files[rc.cur]
	if rc.written != f.Size {
		return corruptf("file %q (index %d): stream has %d of its %d bytes (missing from offset %d)", f.Name, rc.cur, rc.written, f.Size, rc.written)
	}
	if rc.crc != f.Crc32C {
		return corruptf("file %q (index %d): whole-file checksum %08x, header says %08x", f.Name, rc.cur, rc.crc, f.Crc32C)
	}
	if rc.out == nil { // an empty file
		if err := rc.create(); err != nil {
			return err
		}
	}
	if err := rc.out.Sync(); err != nil {
		return fmt.Errorf("snapshot: sync %q: %w", f.Name, err)
	}
	err := rc.out.Close()
	rc.out = nil
	if err != nil {
		return fmt.Errorf("snapshot: close %q: %w", f.Name, err)
	}
	rc.cur++
	rc.written, rc.crc = 0, 0
	return nil
}

func (rc *receiver) abort() {
	if rc.out != nil {
		_ = rc.out.Close()
		rc.out = nil
	}
	_ = os.RemoveAll(rc.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("snapshot: sync dir: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("snapshot: sync dir %s: %w", dir, err)
	}
	return nil
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}
