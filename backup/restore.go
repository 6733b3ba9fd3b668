package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
		if err := l.copyFile(f, filepath.Join(dir, f.Name), buf); err != nil {
			return fmt.Errorf("backup: shard %d: %s (%s): %w", part.ShardID, f.Name, f.Path, err)
		}
	}
	return syncDir(dir)
}

func (l *Location) copyFile(f File, dst string, buf []byte) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if err := readChecked(filepath.Join(l.dir, filepath.FromSlash(f.Path)), f, out, buf); err != nil {
		_ = out.Close()
		return err
	}
	serr := out.Sync()
	cerr := out.Close()
	return errors.Join(serr, cerr)
}

// readChecked copies the stored file at path to w, and fails with an error
// wrapping ErrCorrupt when it is missing or its size or CRC-32C is not f's.
func readChecked(path string, f File, w io.Writer, buf []byte) error {
	in, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: missing", ErrCorrupt)
		}
		return err
	}
	defer in.Close()
	sum := &crcCounter{}
	if _, err := io.CopyBuffer(io.MultiWriter(w, sum), in, buf); err != nil {
		return err
	}
	return sum.check(f.Size, f.CRC32C)
}
