package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/shale-db/shale/internal/parallel"
)

// DefaultCopyParallel is how many files a restore or a copy of a backup
// reads and writes at once unless told otherwise.
const DefaultCopyParallel = 4

// fileCopy is one stored file to copy, checked, into a store.
type fileCopy struct {
	f     File
	shard uint64 // the backup's shard whose part uses f
	to    store
	name  string // f's name in to
}

// copyFiles copies each file of todo from l into its store, atOnce at
// once: each is read checked against its size and CRC-32C as it streams
// (openChecked) and put whole (store.put: a directory's file is written
// through internal/directfile to a temporary name, synced and renamed, and
// the directory synced), so nothing half-written or damaged is ever found
// under its name. done, when set, is called after each file, one call at a
// time. The first failure cancels the copies under way and is returned,
// naming the shard and the file.
func (l *Location) copyFiles(ctx context.Context, todo []fileCopy, atOnce int, done func(File)) error {
	var mu sync.Mutex
	return parallel.ForEach(ctx, atOnce, len(todo), func(ctx context.Context, i int) error {
		c := todo[i]
		in, err := l.openChecked(ctx, c.f)
		if err == nil {
			err = c.to.put(ctx, c.name, in, int64(c.f.Size))
			_ = in.Close()
		}
		if err != nil {
			return fmt.Errorf("shard %d: %s (%s): %w", c.shard, c.f.Name, c.f.Path, err)
		}
		if done != nil {
			mu.Lock()
			done(c.f)
			mu.Unlock()
		}
		return nil
	})
}

// CopyParts copies each part's checkpoint into its directory of dirs
// (created; none may exist), every file under its name in the checkpoint,
// atOnce files at once over all the parts, each checked against its size
// and CRC-32C as it is copied and written as copyFiles writes it; then it
// checks each part's log (as CheckLog). A file missing, cut short or with
// a wrong checksum is an error wrapping ErrCorrupt. The first failure
// cancels the other copies and is returned; the directories, copies
// finished or not, are the caller's to remove.
func (l *Location) CopyParts(ctx context.Context, parts []*Part, dirs []string, atOnce int) error {
	return l.placeParts(ctx, parts, dirs, atOnce, false)
}

// LinkParts is CopyParts for a location that is the caller's own, on the
// same file system as dirs: the copy `shalectl restore` staged in a node's
// data directory (Prepare). Each file is hard-linked into its directory
// rather than copied (it was checked as it was staged, and its size is
// checked again), and copied, checked, only where the link fails (another
// file system, a location that is not a directory). The logs are not read
// again: they were checked as they were staged, and ReadLog checks them as
// a replay reads them. The storage engine never writes into a file it
// finds in its directory (it writes new tables, a new MANIFEST and a new
// WAL, and replaces CURRENT by a rename), so the staged files stay intact
// while a shard built from them runs.
func (l *Location) LinkParts(ctx context.Context, parts []*Part, dirs []string, atOnce int) error {
	return l.placeParts(ctx, parts, dirs, atOnce, true)
}

func (l *Location) placeParts(ctx context.Context, parts []*Part, dirs []string, atOnce int, link bool) error {
	if len(dirs) != len(parts) {
		return fmt.Errorf("backup: %d directories for %d parts", len(dirs), len(parts))
	}
	local, _ := l.st.(*dirStore)
	var todo []fileCopy
	for i, part := range parts {
		if err := os.Mkdir(dirs[i], 0o755); err != nil {
			return fmt.Errorf("backup: shard %d: %w", part.ShardID, err)
		}
		// The node opens the part next: its files are read back at once.
		to := &dirStore{dir: filepath.Clean(dirs[i]), readSoon: true}
		for _, f := range part.Files {
			if err := validFileName(f.Name); err != nil {
				return fmt.Errorf("%w: shard %d: %v", ErrCorrupt, part.ShardID, err)
			}
			if link && local != nil {
				linked, err := linkStored(local, f, filepath.Join(dirs[i], f.Name))
				if err != nil {
					return fmt.Errorf("backup: shard %d: %s (%s): %w", part.ShardID, f.Name, f.Path, err)
				}
				if linked {
					continue
				}
			}
			todo = append(todo, fileCopy{f: f, shard: part.ShardID, to: to, name: f.Name})
		}
	}
	if err := l.copyFiles(ctx, todo, atOnce, nil); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	for i, part := range parts {
		if err := syncDir(dirs[i]); err != nil {
			return err
		}
		if !link {
			if err := l.CheckLog(ctx, part); err != nil {
				return err
			}
		}
	}
	return nil
}

// linkStored hard-links the stored file f of the directory location d to
// dst, after checking its size; linked is false when the file system
// refuses the link (the caller copies it instead).
func linkStored(d *dirStore, f File, dst string) (linked bool, err error) {
	src, err := d.path(f.Path)
	if err != nil {
		return false, err
	}
	st, err := os.Stat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%w: missing", ErrCorrupt)
	}
	if err != nil {
		return false, err
	}
	if uint64(st.Size()) != f.Size {
		return false, fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, st.Size(), f.Size)
	}
	return os.Link(src, dst) == nil, nil
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
