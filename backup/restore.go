package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/shale-db/shale/internal/parallel"
)

// CopyPart writes part's checkpoint into dir (created; it must not exist),
// every file under its name in the checkpoint, checking each file's size
// and CRC-32C as it is copied, and syncs it all. A file missing, cut short
// or with a wrong checksum is an error wrapping ErrCorrupt, and dir is
// removed.
func (l *Location) CopyPart(ctx context.Context, part *Part, dir string) (err error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("backup: shard %d: %w", part.ShardID, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	buf := make([]byte, 1<<20)
	for _, f := range part.Files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := validFileName(f.Name); err != nil {
			return fmt.Errorf("%w: shard %d: %v", ErrCorrupt, part.ShardID, err)
		}
		if err := l.copyFile(ctx, f, filepath.Join(dir, f.Name), buf); err != nil {
			return fmt.Errorf("backup: shard %d: %s (%s): %w", part.ShardID, f.Name, f.Path, err)
		}
	}
	return syncDir(dir)
}

// CopyParts copies each part into its directory of dirs (as CopyPart) and
// checks its log (as CheckLog), atOnce parts at once. The first failure
// cancels the other copies and is returned; the directories that were
// created, copies finished or not, are the caller's to remove.
func (l *Location) CopyParts(ctx context.Context, parts []*Part, dirs []string, atOnce int) error {
	if len(dirs) != len(parts) {
		return fmt.Errorf("backup: %d directories for %d parts", len(dirs), len(parts))
	}
	return parallel.ForEach(ctx, atOnce, len(parts), func(ctx context.Context, i int) error {
		if err := l.CopyPart(ctx, parts[i], dirs[i]); err != nil {
			return err
		}
		return l.CheckLog(ctx, parts[i])
	})
}

func (l *Location) copyFile(ctx context.Context, f File, dst string, buf []byte) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if err := l.readChecked(ctx, f, out, buf); err != nil {
		_ = out.Close()
		return err
	}
	serr := out.Sync()
	cerr := out.Close()
	return errors.Join(serr, cerr)
}

// readChecked copies the stored file f to w, and fails with an error
// wrapping ErrCorrupt when it is missing or its size or CRC-32C is not f's.
func (l *Location) readChecked(ctx context.Context, f File, w io.Writer, buf []byte) error {
	in, err := l.openChecked(ctx, f)
	if err != nil {
		return err
	}
	defer in.Close()
	// Hide w's ReadFrom (an *os.File's), which would copy in 32 KiB writes
	// and ignore buf.
	_, err = io.CopyBuffer(struct{ io.Writer }{w}, in, buf)
	return err
}

// openChecked opens the stored file f for a read that fails, wrapping
// ErrCorrupt, when f is missing or its size or CRC-32C is not f's; the
// last bytes are given only once the whole file checked out, so a reader
// that stops at f.Size bytes never takes a damaged file for a sound one.
func (l *Location) openChecked(ctx context.Context, f File) (io.ReadCloser, error) {
	in, err := l.st.open(ctx, f.Path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: missing", ErrCorrupt)
		}
		return nil, err
	}
	return &checkedReader{in: in, r: ctxReader{ctx, in}, size: f.Size, crc: f.CRC32C}, nil
}

// checkedReader reads a stored file, checking its size and checksum.
type checkedReader struct {
	in   io.Closer
	r    io.Reader
	size uint64
	crc  uint32
	sum  crcCounter
}

func (c *checkedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		_, _ = c.sum.Write(p[:n])
		if c.sum.n > c.size {
			return 0, fmt.Errorf("%w: over %d bytes", ErrCorrupt, c.size)
		}
		if c.sum.n == c.size {
			if cerr := c.sum.check(c.size, c.crc); cerr != nil {
				return 0, cerr
			}
		}
	}
	if err == io.EOF {
		if cerr := c.sum.check(c.size, c.crc); cerr != nil {
			return 0, cerr
		}
	}
	return n, err
}

func (c *checkedReader) Close() error { return c.in.Close() }
