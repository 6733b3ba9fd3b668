package backup

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// A log segment file is a run of frames, one per entry: the length of the
// entry's BackupLogEntry encoding (uvarint), the encoding, and its CRC-32C
// (4 bytes, big-endian).

// maxFrame bounds one frame (an entry's writes are bounded by the server's
// request limits, far below this).
const maxFrame = 64 << 20

// errRangeChanged: the shard's range changed within the log fetched.
var errRangeChanged = errors.New("the shard's range changed")

// appendFrame appends e's frame to b.
func appendFrame(b []byte, e *shalev1.BackupLogEntry) ([]byte, error) {
	body, err := proto.Marshal(e)
	if err != nil {
		return nil, err
	}
	b = binary.AppendUvarint(b, uint64(len(body)))
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(body, castagnoli)), nil
}

// readFrames calls fn with every entry in r's frames. A damaged or
// truncated frame is an error wrapping ErrCorrupt.
func readFrames(r *bufio.Reader, fn func(*shalev1.BackupLogEntry) error) error {
	var buf []byte
	for n := 0; ; n++ {
		size, err := binary.ReadUvarint(r)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: frame %d: %v", ErrCorrupt, n, err)
		}
		if size > maxFrame {
			return fmt.Errorf("%w: frame %d of %d bytes", ErrCorrupt, n, size)
		}
		if uint64(cap(buf)) < size+4 {
			buf = make([]byte, size+4)
		}
		buf = buf[:size+4]
		if _, err := io.ReadFull(r, buf); err != nil {
			return fmt.Errorf("%w: frame %d cut short: %v", ErrCorrupt, n, err)
		}
		body := buf[:size]
		if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(buf[size:]) {
			return fmt.Errorf("%w: frame %d: checksum mismatch", ErrCorrupt, n)
		}
		// The entry copies what it keeps of body (UnmarshalVT copies bytes
		// fields), so buf is the next frame's.
		e := &shalev1.BackupLogEntry{}
		if err := e.UnmarshalVT(body); err != nil {
			return fmt.Errorf("%w: frame %d: %v", ErrCorrupt, n, err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// fetchLog stores the entries node's replica of shard shardID applied
// after index after as one segment, or returns nil when there are none. It
// fails with errRangeChanged when an entry changed the shard's range, and
// with the server's OutOfRange status when the log does not reach back.
func fetchLog(ctx context.Context, cl Cluster, loc *Location, node, shardID, after uint64) (*Segment, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cl.BackupShardLog(ctx, node, shardID, after)
	if err != nil {
		return nil, err
	}
	// The segment's name carries its size and checksum, known only at its
	// end: it is written to a temporary file first.
	tmp, err := loc.st.tempFile()
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	defer tmp.Close()
	seg := &Segment{FromIndex: after + 1}
	sum := &crcCounter{}
	w := bufio.NewWriterSize(io.MultiWriter(tmp, sum), 1<<20)
	var frame []byte
	want := after + 1
	for {
		e, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("node %d: log of shard %d: %w", node, shardID, err)
		}
		if e.GetIndex() != want {
			return nil, fmt.Errorf("%w: node %d: log of shard %d: entry %d where %d was due", ErrCorrupt, node, shardID, e.GetIndex(), want)
		}
		want++
		if e.GetRange() != nil {
			return nil, fmt.Errorf("node %d: shard %d at entry %d: %w", node, shardID, e.GetIndex(), errRangeChanged)
		}
		date := HLC{WallNanos: e.GetHlc().GetWallNanos(), Logical: e.GetHlc().GetLogical()}
		if seg.ToIndex == 0 {
			seg.FirstDate = date
		}
		seg.ToIndex, seg.LastDate = e.GetIndex(), date
		if frame, err = appendFrame(frame[:0], e); err != nil {
			return nil, err
		}
		if _, err := w.Write(frame); err != nil {
			return nil, err
		}
	}
	if seg.ToIndex == 0 {
		return nil, nil
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	seg.Name = fmt.Sprintf("log-%d-%d", seg.FromIndex, seg.ToIndex)
	seg.Size, seg.CRC32C = sum.n, sum.crc
	seg.Path = storedPath(shardID, seg.Name, seg.Size, seg.CRC32C)
	if err := loc.st.putFile(ctx, seg.Path, tmp, int64(seg.Size)); err != nil {
		return nil, err
	}
	return seg, nil
}

// CheckLog checks the size and checksum of every log segment of part. A
// missing or damaged one is an error wrapping ErrCorrupt.
func (l *Location) CheckLog(ctx context.Context, part *Part) error {
	buf := make([]byte, 1<<20)
	for _, seg := range part.Log {
		if err := l.readChecked(ctx, seg.File, io.Discard, buf); err != nil {
			return fmt.Errorf("backup: shard %d: log %s (%s): %w", part.ShardID, seg.Name, seg.Path, err)
		}
	}
	return nil
}

// ReadLog calls fn with every entry of part's log segments, in order, in
// one read of each segment. Each frame's checksum and the entries' order
// are checked as they are read, and each segment's size and checksum at
// its end: a missing or damaged segment is an error wrapping ErrCorrupt,
// possibly after fn saw the entries before the damage (CheckLog first to
// refuse a damaged log before acting on any of it).
func (l *Location) ReadLog(ctx context.Context, part *Part, fn func(*shalev1.BackupLogEntry) error) error {
	for _, seg := range part.Log {
		if err := l.readSegment(ctx, seg, fn); err != nil {
			return fmt.Errorf("backup: shard %d: log %s (%s): %w", part.ShardID, seg.Name, seg.Path, err)
		}
	}
	return nil
}

func (l *Location) readSegment(ctx context.Context, seg Segment, fn func(*shalev1.BackupLogEntry) error) error {
	f, err := l.openChecked(ctx, seg.File)
	if err != nil {
		return err
	}
	defer f.Close()
	next := seg.FromIndex
	err = readFrames(bufio.NewReaderSize(f, 1<<20), func(e *shalev1.BackupLogEntry) error {
		if e.GetIndex() != next || next > seg.ToIndex {
			return fmt.Errorf("%w: entry %d where %d was due", ErrCorrupt, e.GetIndex(), next)
		}
		next++
		return fn(e)
	})
	if err == nil && next != seg.ToIndex+1 {
		return fmt.Errorf("%w: the segment ends at entry %d, not %d", ErrCorrupt, next-1, seg.ToIndex)
	}
	return err
}

// crcCounter is an io.Writer that sums the CRC-32C and size of what it is
// given.
type crcCounter struct {
	crc uint32
	n   uint64
}

func (c *crcCounter) Write(p []byte) (int, error) {
	c.crc = crc32.Update(c.crc, castagnoli, p)
	c.n += uint64(len(p))
	return len(p), nil
}

// check fails, wrapping ErrCorrupt, unless what was summed has size bytes
// and checksum crc.
func (c *crcCounter) check(size uint64, crc uint32) error {
	if c.n != size {
		return fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, c.n, size)
	}
	if c.crc != crc {
		return fmt.Errorf("%w: checksum %08x, want %08x", ErrCorrupt, c.crc, crc)
	}
	return nil
}
