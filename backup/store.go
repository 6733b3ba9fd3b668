package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/shale-db/shale/internal/directfile"
)

// store holds a location's objects: files named by slash-separated paths
// relative to the location ("backups/<id>/manifest.json"). It is a
// directory (dirStore) or a prefix of an S3 bucket (s3Store).
type store interface {
	// String names the location for people ("/mnt/backups",
	// "s3://bucket/prefix").
	String() string
	// where names object name for people, as a path or URL.
	where(name string) string
	// create writes name with b unless name exists, when it fails with an
	// error wrapping fs.ErrExist. At most one of several concurrent
	// callers succeeds.
	create(ctx context.Context, name string, b []byte) error
	// put writes name from the size bytes r yields: the object appears
	// whole, durably, or not at all (an error from r leaves no object).
	put(ctx context.Context, name string, r io.Reader, size int64) error
	// tempFile returns a local temporary file to write an object whose
	// name is known only once it is written (putFile stores it); the
	// caller closes and removes it in any case.
	tempFile() (*os.File, error)
	// putFile stores the size bytes of f, a file from tempFile, as name:
	// whole, durably, or not at all.
	putFile(ctx context.Context, name string, f *os.File, size int64) error
	// open reads name; a missing object is an error wrapping
	// fs.ErrNotExist.
	open(ctx context.Context, name string) (io.ReadCloser, error)
	// list gives every object whose name starts with prefix, by name.
	list(ctx context.Context, prefix string) ([]object, error)
	// remove deletes name; a missing object is not an error.
	remove(ctx context.Context, name string) error
	// close releases what the store keeps between requests (an S3
	// client's idle connections); a request made after it still works.
	close()
	// clean removes what writers that died left in the location and that
	// no listing shows: temporary files, incomplete multipart uploads. The
	// caller holds the location's lock, so no writer is at work.
	clean(ctx context.Context) error
}

// object is a stored object as list finds it.
type object struct {
	name string
	size int64
}

// validObjectName refuses names that could leave the location.
func validObjectName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") {
		return fmt.Errorf("backup: bad object name %q", name)
	}
	return nil
}

// dirStore is a location on a local or mounted file system. put writes
// through a synced temporary file renamed into place, then syncs the
// directory, so an object is durable once put returns.
type dirStore struct {
	dir string
	// readSoon: the files put are read again soon (a restored part the
	// node opens next, a restore staged for the node's start), so they are
	// written through the page cache. Otherwise a file goes around it
	// (internal/directfile): a backup is written once and read only by a
	// restore or a verify, and must not push a serving node's data out of
	// the cache.
	readSoon bool
}

func openDir(dir string, create bool) (*dirStore, error) {
	// A clean path: remove compares it with the joined (clean) paths of
	// objects.
	dir = filepath.Clean(dir)
	if create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("backup: create location %s: %w", dir, err)
		}
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("backup: location %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("backup: location %s is not a directory", dir)
	}
	return &dirStore{dir: dir}, nil
}

func (d *dirStore) String() string { return d.dir }

func (d *dirStore) where(name string) string { return filepath.Join(d.dir, filepath.FromSlash(name)) }

func (d *dirStore) path(name string) (string, error) {
	if err := validObjectName(name); err != nil {
		return "", err
	}
	return filepath.Join(d.dir, filepath.FromSlash(name)), nil
}

func (d *dirStore) create(_ context.Context, name string, b []byte) error {
	p, err := d.path(name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(p)
		return err
	}
	return syncDir(filepath.Dir(p))
}

func (d *dirStore) put(ctx context.Context, name string, r io.Reader, size int64) error {
	p, err := d.path(name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), tempPrefix+"*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	var w interface {
		io.Writer
		Sync() error
		Close() error
	} = tmp
	if !d.readSoon {
		w = directfile.New(tmp)
	}
	defer w.Close()
	// An *os.File's ReadFrom would copy in 32 KiB writes: hide it.
	if _, err := io.Copy(struct{ io.Writer }{w}, ctxReader{ctx, r}); err != nil {
		return err
	}
	if err := w.Sync(); err != nil {
		return err
	}
	return d.putFile(ctx, name, tmp, size)
}

// tempFile is in the location's directory, so putFile renames it into
// place instead of copying it.
func (d *dirStore) tempFile() (*os.File, error) { return os.CreateTemp(d.dir, tempPrefix+"*") }

func (d *dirStore) putFile(_ context.Context, name string, f *os.File, size int64) error {
	p, err := d.path(name)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != size {
		return fmt.Errorf("backup: %s: %d bytes where %d were due", name, st.Size(), size)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return err
	}
	return syncDir(filepath.Dir(p))
}

func (d *dirStore) open(_ context.Context, name string) (io.ReadCloser, error) {
	p, err := d.path(name)
	if err != nil {
		return nil, err
	}
	return os.Open(p)
}

func (d *dirStore) list(_ context.Context, prefix string) ([]object, error) {
	// Walk the deepest directory the prefix names, and keep the names that
	// start with it.
	root := d.dir
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		root = filepath.Join(d.dir, filepath.FromSlash(prefix[:i]))
	}
	var out []object
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == root {
				return filepath.SkipDir
			}
			return err
		}
		if e.IsDir() || isTemp(e.Name()) {
			return nil
		}
		rel, err := filepath.Rel(d.dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if !strings.HasPrefix(rel, prefix) {
			return nil
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		out = append(out, object{name: rel, size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

func (d *dirStore) remove(_ context.Context, name string) error {
	p, err := d.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// Remove the directories the object leaves empty, up to the location.
	for dir := filepath.Dir(p); dir != d.dir && strings.HasPrefix(dir, d.dir); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

func (d *dirStore) close() {}

func (d *dirStore) clean(ctx context.Context) error {
	return filepath.WalkDir(d.dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.IsDir() || !isTemp(e.Name()) {
			return nil
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
}

// tempPrefix starts the names of files being written.
const tempPrefix = ".tmp-"

// isTemp reports whether a stored file's name is a temporary one.
func isTemp(name string) bool {
	return strings.HasPrefix(name, tempPrefix) || strings.HasSuffix(name, ".tmp")
}

// syncDir makes dir's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	cerr := d.Close()
	return errors.Join(serr, cerr)
}

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// WriteTo hands the reader's bytes to w as the reader has them (a backup
// stream's chunks, with no copy and in writes of a chunk each: io.Copy
// would cut them into 32 KiB writes), when the reader can, and checks ctx
// before each write.
func (c ctxReader) WriteTo(w io.Writer) (int64, error) {
	if wt, ok := c.r.(io.WriterTo); ok {
		return wt.WriteTo(ctxWriter{c.ctx, w})
	}
	return io.CopyBuffer(w, struct{ io.Reader }{c}, make([]byte, 1<<20))
}

// ctxWriter stops writing once ctx is done.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}
