// Package errorfs wraps a vfs.FS so that tests can make chosen operations
// fail or slow down. An Injector is consulted before every operation; if it
// returns an error, the operation is not performed (see Write for the one
// exception) and the error is returned wrapped in an *os.PathError (or
// *os.LinkError for Rename and Link) naming the path, with an
// *InjectedError inside, so errors.Is sees both the injected cause (for
// example syscall.ENOSPC) and IsInjected reports true.
package errorfs

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"

	"github.com/shale-db/shale/storage/vfs"
)

// Op is a kind of filesystem operation, as seen by an Injector.
type Op int

// The operations an Injector is consulted for.
const (
	OpCreate     Op = iota // FS.Create
	OpOpen                 // FS.Open
	OpOpenDir              // FS.OpenDir
	OpRead                 // File.Read and File.ReadAt
	OpWrite                // File.Write
	OpSync                 // File.Sync, on files and directories
	OpClose                // File.Close
	OpRemove               // FS.Remove and FS.RemoveAll
	OpRename               // FS.Rename (path is the new name)
	OpLink                 // FS.Link (path is the new name)
	OpMkdirAll             // FS.MkdirAll
	OpList                 // FS.List
	OpStat                 // FS.Stat and File.Stat
	OpLock                 // FS.Lock (releasing a lock is never failed)
	OpOpenAppend           // FS.OpenAppend
	numOps
)

var opNames = [numOps]string{
	OpCreate:     "create",
	OpOpen:       "open",
	OpOpenDir:    "opendir",
	OpRead:       "read",
	OpWrite:      "write",
	OpSync:       "sync",
	OpClose:      "close",
	OpRemove:     "remove",
	OpRename:     "rename",
	OpLink:       "link",
	OpMkdirAll:   "mkdirall",
	OpList:       "list",
	OpStat:       "stat",
	OpLock:       "lock",
	OpOpenAppend: "openappend",
}

// String returns the operation's lower-case name, e.g. "write".
func (o Op) String() string {
	if o >= 0 && o < numOps {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// IsWrite reports whether the operation changes the filesystem: Create,
// OpenAppend, Write, Sync, Remove, Rename, Link and MkdirAll.
func (o Op) IsWrite() bool {
	switch o {
	case OpCreate, OpOpenAppend, OpWrite, OpSync, OpRemove, OpRename, OpLink, OpMkdirAll:
		return true
	}
	return false
}

// Injector decides, before each operation, whether it fails. MaybeError
// returns nil to let the operation proceed. It may also sleep (see Latency).
// Implementations must be safe for concurrent use.
type Injector interface {
	MaybeError(op Op, path string) error
}

// InjectedError marks an error as injected by this package. Errors returned
// by a wrapped FS for injected faults always contain one.
type InjectedError struct {
	// Err is the simulated cause, e.g. syscall.EIO.
	Err error
}

// Error reports the cause, prefixed to say it was injected.
func (e *InjectedError) Error() string { return "injected error: " + e.Err.Error() }

// Unwrap returns the cause, so errors.Is(err, syscall.EIO) works.
func (e *InjectedError) Unwrap() error { return e.Err }

// IsInjected reports whether err (or anything it wraps) is an injected error.
func IsInjected(err error) bool {
	var ie *InjectedError
	return errors.As(err, &ie)
}

// Errors to inject. Each matches (errors.Is) the errno it is named after and
// says in its message that it was injected.
var (
	// ErrENOSPC simulates a full disk; errors.Is(err, syscall.ENOSPC) holds.
	ErrENOSPC error = &InjectedError{Err: syscall.ENOSPC}
	// ErrEIO simulates a device I/O error; errors.Is(err, syscall.EIO) holds.
	ErrEIO error = &InjectedError{Err: syscall.EIO}
)

// Option configures Wrap.
type Option func(*wrapFS)

// WithShortWrites makes an injected Write failure first write a prefix of
// the buffer, of a length drawn with the given seed from [0, len(p)), and
// return that length with the error, as a real short write does. Without
// this option a failed Write writes nothing and returns 0.
func WithShortWrites(seed int64) Option {
	return func(fs *wrapFS) {
		fs.shortRand = rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	}
}

// Wrap returns an FS that consults inj before each operation on fs or on
// files opened through it, and fails the operation with the injector's error
// (see the package comment) instead of performing it. Join is never
// consulted. A failed Close still closes the underlying file, so no
// descriptor leaks. The lock closer returned by Lock is the underlying one.
func Wrap(fs vfs.FS, inj Injector, opts ...Option) vfs.FS {
	w := &wrapFS{fs: fs, inj: inj}
	for _, o := range opts {
		o(w)
	}
	return w
}

type wrapFS struct {
	fs  vfs.FS
	inj Injector

	shortMu   sync.Mutex
	shortRand *rand.Rand // nil: failed writes write nothing
}

// maybe consults the injector and returns the error to hand back, with
// the path, or nil.
func (w *wrapFS) maybe(op Op, path string) error {
	err := w.inj.MaybeError(op, path)
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op.String(), Path: path, Err: asInjected(err)}
}

func (w *wrapFS) maybeLink(op Op, oldname, newname string) error {
	err := w.inj.MaybeError(op, newname)
	if err == nil {
		return nil
	}
	return &os.LinkError{Op: op.String(), Old: oldname, New: newname, Err: asInjected(err)}
}

func asInjected(err error) error {
	if IsInjected(err) {
		return err
	}
	return &InjectedError{Err: err}
}

func (w *wrapFS) Create(name string) (vfs.File, error) {
	if err := w.maybe(OpCreate, name); err != nil {
		return nil, err
	}
	f, err := w.fs.Create(name)
	if err != nil {
		return nil, err
	}
	return &wrapFile{w: w, f: f, path: name}, nil
}

func (w *wrapFS) Open(name string) (vfs.File, error) {
	if err := w.maybe(OpOpen, name); err != nil {
		return nil, err
	}
	f, err := w.fs.Open(name)
	if err != nil {
		return nil, err
	}
	return &wrapFile{w: w, f: f, path: name}, nil
}

func (w *wrapFS) OpenAppend(name string) (vfs.File, error) {
	if err := w.maybe(OpOpenAppend, name); err != nil {
		return nil, err
	}
	f, err := w.fs.OpenAppend(name)
	if err != nil {
		return nil, err
	}
	return &wrapFile{w: w, f: f, path: name}, nil
}

func (w *wrapFS) OpenDir(name string) (vfs.File, error) {
	if err := w.maybe(OpOpenDir, name); err != nil {
		return nil, err
	}
	f, err := w.fs.OpenDir(name)
	if err != nil {
		return nil, err
	}
	return &wrapFile{w: w, f: f, path: name}, nil
}

func (w *wrapFS) Remove(name string) error {
	if err := w.maybe(OpRemove, name); err != nil {
		return err
	}
	return w.fs.Remove(name)
}

func (w *wrapFS) RemoveAll(name string) error {
	if err := w.maybe(OpRemove, name); err != nil {
		return err
	}
	return w.fs.RemoveAll(name)
}

func (w *wrapFS) Rename(oldname, newname string) error {
	if err := w.maybeLink(OpRename, oldname, newname); err != nil {
		return err
	}
	return w.fs.Rename(oldname, newname)
}

func (w *wrapFS) Link(oldname, newname string) error {
	if err := w.maybeLink(OpLink, oldname, newname); err != nil {
		return err
	}
	return w.fs.Link(oldname, newname)
}

func (w *wrapFS) MkdirAll(dir string, perm os.FileMode) error {
	if err := w.maybe(OpMkdirAll, dir); err != nil {
		return err
	}
	return w.fs.MkdirAll(dir, perm)
}

func (w *wrapFS) List(dir string) ([]string, error) {
	if err := w.maybe(OpList, dir); err != nil {
		return nil, err
	}
	return w.fs.List(dir)
}

func (w *wrapFS) Stat(name string) (os.FileInfo, error) {
	if err := w.maybe(OpStat, name); err != nil {
		return nil, err
	}
	return w.fs.Stat(name)
}

func (w *wrapFS) Lock(name string) (io.Closer, error) {
	if err := w.maybe(OpLock, name); err != nil {
		return nil, err
	}
	return w.fs.Lock(name)
}

func (w *wrapFS) Join(elem ...string) string { return w.fs.Join(elem...) }

type wrapFile struct {
	w    *wrapFS
	f    vfs.File
	path string
}

func (f *wrapFile) Read(p []byte) (int, error) {
	if err := f.w.maybe(OpRead, f.path); err != nil {
		return 0, err
	}
	return f.f.Read(p)
}

func (f *wrapFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.w.maybe(OpRead, f.path); err != nil {
		return 0, err
	}
	return f.f.ReadAt(p, off)
}

// Write fails without writing, or with WithShortWrites writes a strict
// prefix first.
func (f *wrapFile) Write(p []byte) (int, error) {
	err := f.w.maybe(OpWrite, f.path)
	if err == nil {
		return f.f.Write(p)
	}
	if f.w.shortRand == nil || len(p) == 0 {
		return 0, err
	}
	f.w.shortMu.Lock()
	k := f.w.shortRand.IntN(len(p))
	f.w.shortMu.Unlock()
	n, werr := f.f.Write(p[:k])
	if werr != nil {
		return n, werr
	}
	return n, err
}

func (f *wrapFile) Sync() error {
	if err := f.w.maybe(OpSync, f.path); err != nil {
		return err
	}
	return f.f.Sync()
}

func (f *wrapFile) Stat() (os.FileInfo, error) {
	if err := f.w.maybe(OpStat, f.path); err != nil {
		return nil, err
	}
	return f.f.Stat()
}

// Close always closes the underlying file; an injected error replaces the
// result.
func (f *wrapFile) Close() error {
	ierr := f.w.maybe(OpClose, f.path)
	err := f.f.Close()
	if ierr != nil {
		return ierr
	}
	return err
}
