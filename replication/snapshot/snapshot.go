// Package snapshot streams a shard checkpoint — a directory of immutable
// files written by the storage engine's Checkpoint — from one node to another
// as a sequence of shalev1.SnapshotChunk messages, byte for byte (no
// re-encoding of the data), with checksums end to end.
//
// # Stream formats
//
// Both formats open with a chunk that carries only the SnapshotHeader, whose
// Files list every file of the checkpoint, and follow it with chunks that
// each carry no header and a piece of one file: its index in Files, the
// offset of the piece in the file and the bytes. Each file's pieces come in
// order, contiguous from offset 0; an empty file has no chunk. The stream
// ends after the last byte of the last file (the sender closes it).
//
// The ordered format (Send, Receive; Raft.SendSnapshot and
// Admin.BackupShard) lists every file's size and CRC-32C (Castagnoli) in the
// header, sends the files one after the other in the order of Files, and
// gives each chunk the CRC-32C of its bytes (Crc32C).
//
// The interleaved format (SendInterleaved, ReceiveInterleaved;
// Raft.StreamSnapshot) lists names and sizes (a file's Crc32C in the header
// is 0 unless the sender knows it), lets the chunks of up to
// MaxFilesInFlight files come interleaved, and gives each chunk the CRC-32C
// of its file from offset 0 through its last byte (RunningCrc32C): every
// byte is read once and checksummed once on each side, and the last
// chunk's checksum is the whole file's.
//
// Receive and ReceiveInterleaved accept exactly their format and nothing
// else: a chunk out of order, a gap or overlap, a piece past a file's
// declared size, a bad checksum, an unsafe file name or a stream that ends
// early is an error wrapping ErrCorrupt, and the partial directory is
// removed. A directory they return therefore holds exactly the files the
// header lists, with the listed sizes and checksums, synced to disk. Both
// write to disk while the next chunks arrive, several files at once, and
// sync each file as it completes.
package snapshot

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// DefaultChunkSize is the chunk size Send and SendInterleaved use when
// Options.ChunkSize is 0 (1 MiB), and the burst of a Limiter.
const DefaultChunkSize = 1 << 20

// DefaultParallel is the number of files SendInterleaved reads and streams
// at once when Options.Parallel is 0.
const DefaultParallel = 4

// MaxFilesInFlight bounds the files an interleaved stream may have started
// and not finished at any moment; ReceiveInterleaved refuses a stream that
// starts one more.
const MaxFilesInFlight = 16

// MaxFiles bounds the number of files a received header may list, so that a
// malformed header cannot make Receive allocate without bound.
const MaxFiles = 100_000

// receiveBuffer is how many bytes of received chunks Receive and
// ReceiveInterleaved hold for their file writers before they stop reading
// the stream (and so, through flow control, stop the sender).
const receiveBuffer = 32 << 20

// ErrCorrupt is wrapped by every error Receive and ReceiveInterleaved
// return because the stream itself is wrong (bad checksum, bad offset, bad
// file name, missing or extra data, malformed chunk), as opposed to a
// transport, context or local I/O error. Test it with errors.Is.
var ErrCorrupt = errors.New("snapshot: corrupt stream")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the CRC-32C (Castagnoli) checksum of b, the checksum used in
// SnapshotFile.Crc32C and SnapshotChunk.Crc32C.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateCRC32C returns the CRC-32C of the bytes crc covers followed by b: the
// running checksum (SnapshotChunk.RunningCrc32C) of a file after a chunk b.
func UpdateCRC32C(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// ChunkSender is the sending half of a snapshot stream. The gRPC client
// stream of Raft.SendSnapshot and Raft.StreamSnapshot satisfies it.
type ChunkSender interface {
	// Send sends one chunk. The package's Send and SendInterleaved pass
	// a fresh chunk on every call and never touch it again, but they
	// reuse its Data buffer once Send returns: an implementation must be
	// done with the bytes by then (a gRPC stream is: SendMsg encodes the
	// message before it returns).
	Send(*shalev1.SnapshotChunk) error
}

// HeldSender is a ChunkSender that can also send a chunk without being
// done with its bytes when the call returns (a gRPC stream sending
// HeldChunk writes them from the caller's buffer later). SendInterleaved
// sends every data chunk with SendHeld when its ChunkSender is one.
type HeldSender interface {
	ChunkSender
	// SendHeld sends c as Send does, but may read c.Data until it calls
	// release, at most once, after it returned or before; it is not
	// called when the bytes are never sent, and the caller then does not
	// reuse them.
	SendHeld(c *shalev1.SnapshotChunk, release func()) error
}

// ChunkReceiver is the receiving half of a snapshot stream. The gRPC server
// stream of Raft.SendSnapshot and Raft.StreamSnapshot satisfies it.
type ChunkReceiver interface {
	// Recv returns the next chunk, or io.EOF after the last one. The
	// receiver keeps the chunk (it writes Data to disk later, from another
	// goroutine): Recv must return a fresh one every time.
	Recv() (*shalev1.SnapshotChunk, error)
}

// PooledReceiver is a ChunkReceiver whose chunks' Data may be buffers of
// directfile.GetBuffer (ReceivedChunk decodes them so) and are the
// receiver's alone: Receive and ReceiveInterleaved write such a buffer to
// disk without a copy, and give it back with directfile.PutBuffer once it
// is written.
type PooledReceiver interface {
	ChunkReceiver
	// PooledData marks the type; it does nothing.
	PooledData()
}

// Options configure Send and SendInterleaved.
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
	// are sent. Send only: Raft snapshots never skip (the receiver wants
	// every file); a backup (Admin.BackupShard) skips what earlier backups
	// copied.
	Skip func(*shalev1.SnapshotFile) bool
	// Lengths, if set, names files of which only the first Lengths[name]
	// bytes are the checkpoint's (storage.CheckpointInfo.Lengths: a WAL
	// hard-linked into the checkpoint, which may be longer and grow during
	// the send): Send lists, checksums and sends just those bytes. Send
	// only.
	Lengths map[string]int64
	// Parallel is the number of files SendInterleaved reads and streams at
	// once, at most MaxFilesInFlight. Default (0): DefaultParallel.
	Parallel int
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
