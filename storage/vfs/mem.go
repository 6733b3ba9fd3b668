package vfs

import (
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// MemFS is an in-memory FS. All its methods, and those of its files, are safe
// for concurrent use; one File may serve concurrent ReadAt calls while
// another goroutine appends to it.
//
// Paths are cleaned with path/filepath and taken relative to the root, so
// "a/b", "a/b/", "./a/b" and "/a/b" all name the same file. Files are inodes:
// hard links share contents, Create of an existing name truncates the shared
// inode, and an open File keeps working after its name is removed or
// replaced. Errors are *os.PathError or *os.LinkError values wrapping
// syscall errnos, so errors.Is(err, os.ErrNotExist) holds for missing files
// exactly as with Default.
//
// A MemFS made by NewCrashableMem also records what is durable under the
// contract of FS (file contents up to the last Sync, directory entries as of
// the last Sync of the directory) and can produce the post-crash state with
// CrashClone.
type MemFS struct {
	// mu guards the tree (every directory's children and durable maps, and
	// lock ownership). Operations that change the tree hold it exclusively;
	// operations on one file's contents hold it shared plus that file's
	// dataMu, so CrashClone, which holds it exclusively, sees a consistent
	// cut of every file at once.
	mu        sync.RWMutex
	root      *memNode
	crashable bool
}

// memNode is an inode: a file or a directory.
//
// Fields of a file are guarded by MemFS.mu held exclusively, or by MemFS.mu
// held shared together with dataMu. Fields of a directory are guarded by
// MemFS.mu.
type memNode struct {
	isDir   bool
	modTime time.Time

	// File state.
	dataMu sync.RWMutex
	// data is the current contents. Bytes below len(data) are never changed
	// in place (files are append-only; truncation allocates afresh), so
	// synced may share data's backing array.
	data []byte
	// synced is the durable contents: data as of the last Sync.
	synced []byte
	// syncedIsPrefix reports that data still begins with synced, i.e. the
	// file has not been truncated since its last Sync, so data[len(synced):]
	// is an unsynced tail that a crash might partly keep.
	syncedIsPrefix bool
	// locked is set while a Lock on this inode is held (guarded by MemFS.mu).
	locked bool

	// Directory state.
	children map[string]*memNode
	// durable is children as of the directory's last Sync (crashable only).
	durable map[string]*memNode
}

func newDirNode() *memNode {
	return &memNode{
		isDir:    true,
		modTime:  time.Now(),
		children: make(map[string]*memNode),
		durable:  make(map[string]*memNode),
	}
}

func newFileNode() *memNode {
	return &memNode{modTime: time.Now(), syncedIsPrefix: true}
}

// NewMem returns an empty in-memory FS that does not simulate crashes:
// CrashClone panics on it. Use NewCrashableMem for crash tests.
func NewMem() *MemFS {
	return &MemFS{root: newDirNode()}
}

// NewCrashableMem returns an empty in-memory FS that tracks durability per
// the FS contract so that CrashClone can produce the state a power loss
// would leave. The root directory itself always exists.
func NewCrashableMem() *MemFS {
	return &MemFS{root: newDirNode(), crashable: true}
}

var _ FS = (*MemFS)(nil)

// cleanPath returns the components of name relative to the root; nil names
// the root itself.
func cleanPath(name string) []string {
	p := filepath.Clean(string(filepath.Separator) + name)
	p = strings.TrimPrefix(p, string(filepath.Separator))
	if p == "" {
		return nil
	}
	return strings.Split(p, string(filepath.Separator))
}

// lookup returns the node at name. fs.mu must be held.
func (fs *MemFS) lookup(op, name string) (*memNode, error) {
	n := fs.root
	for _, c := range cleanPath(name) {
		if !n.isDir {
			return nil, &os.PathError{Op: op, Path: name, Err: syscall.ENOTDIR}
		}
		next, ok := n.children[c]
		if !ok {
			return nil, &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
		}
		n = next
	}
	return n, nil
}

// lookupParent returns the directory holding name's last component and that
// component. For the root it returns (nil, "", nil). fs.mu must be held.
func (fs *MemFS) lookupParent(op, name string) (*memNode, string, error) {
	parts := cleanPath(name)
	if len(parts) == 0 {
		return nil, "", nil
	}
	dir := fs.root
	for _, c := range parts[:len(parts)-1] {
		next, ok := dir.children[c]
		if !ok {
			return nil, "", &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
		}
		if !next.isDir {
			return nil, "", &os.PathError{Op: op, Path: name, Err: syscall.ENOTDIR}
		}
		dir = next
	}
	return dir, parts[len(parts)-1], nil
}

// Create creates the named file, or truncates it (and every hard link to it)
// if it exists, and opens it for reading and writing. The parent directory
// must exist. The new entry is durable only after the parent is synced; the
// truncation is durable only after the file is synced.
func (fs *MemFS) Create(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir, base, err := fs.lookupParent("create", name)
	if err != nil {
		return nil, err
	}
	if dir == nil {
		return nil, &os.PathError{Op: "create", Path: name, Err: syscall.EISDIR}
	}
	n, ok := dir.children[base]
	switch {
	case ok && n.isDir:
		return nil, &os.PathError{Op: "create", Path: name, Err: syscall.EISDIR}
	case ok:
		// Exclusive fs.mu: no data operation is in flight.
		n.data = nil
		n.syncedIsPrefix = len(n.synced) == 0
		n.modTime = time.Now()
	default:
		n = newFileNode()
		dir.children[base] = n
		dir.modTime = n.modTime
	}
	return &memFile{fs: fs, n: n, name: name, writable: true}, nil
}

// Open opens the named file (or directory) for reading.
func (fs *MemFS) Open(name string) (File, error) {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	n, err := fs.lookup("open", name)
	if err != nil {
		return nil, err
	}
	return &memFile{fs: fs, n: n, name: name}, nil
}

// OpenAppend opens the existing named file for writing at its end.
func (fs *MemFS) OpenAppend(name string) (File, error) {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	n, err := fs.lookup("open", name)
	if err != nil {
		return nil, err
	}
	if n.isDir {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EISDIR}
	}
	return &memFile{fs: fs, n: n, name: name, writable: true}, nil
}

// OpenDir opens the named directory; Sync on the result makes the
// directory's current entries durable.
func (fs *MemFS) OpenDir(name string) (File, error) {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	n, err := fs.lookup("opendir", name)
	if err != nil {
		return nil, err
	}
	if !n.isDir {
		return nil, &os.PathError{Op: "opendir", Path: name, Err: syscall.ENOTDIR}
	}
	return &memFile{fs: fs, n: n, name: name}, nil
}

// Remove removes the named file or empty directory. Open files stay usable.
func (fs *MemFS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir, base, err := fs.lookupParent("remove", name)
	if err != nil {
		return err
	}
	if dir == nil {
		return &os.PathError{Op: "remove", Path: name, Err: syscall.EBUSY}
	}
	n, ok := dir.children[base]
	if !ok {
		return &os.PathError{Op: "remove", Path: name, Err: syscall.ENOENT}
	}
	if n.isDir && len(n.children) > 0 {
		return &os.PathError{Op: "remove", Path: name, Err: syscall.ENOTEMPTY}
	}
	delete(dir.children, base)
	dir.modTime = time.Now()
	return nil
}

// RemoveAll removes name and everything under it. A missing name (or a
// missing parent) is not an error. RemoveAll of the root empties it.
func (fs *MemFS) RemoveAll(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir, base, err := fs.lookupParent("removeall", name)
	if err != nil {
		if isErrno(err, syscall.ENOENT) {
			return nil
		}
		return err
	}
	if dir == nil {
		clear(fs.root.children)
		fs.root.modTime = time.Now()
		return nil
	}
	if _, ok := dir.children[base]; ok {
		delete(dir.children, base)
		dir.modTime = time.Now()
	}
	return nil
}

// Rename atomically renames oldname to newname, replacing newname if it is a
// file (or an empty directory, when oldname is a directory). Each directory's
// side of the change is durable only once that directory is synced, so a
// crash after syncing only the destination of a cross-directory rename may
// leave the file under both names.
func (fs *MemFS) Rename(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	linkErr := func(errno syscall.Errno) error {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: errno}
	}
	odir, obase, err := fs.lookupParent("rename", oldname)
	if err != nil {
		return linkErr(errnoOf(err))
	}
	if odir == nil {
		return linkErr(syscall.EBUSY)
	}
	n, ok := odir.children[obase]
	if !ok {
		return linkErr(syscall.ENOENT)
	}
	ndir, nbase, err := fs.lookupParent("rename", newname)
	if err != nil {
		return linkErr(errnoOf(err))
	}
	if ndir == nil {
		return linkErr(syscall.EBUSY)
	}
	if n.isDir {
		// Refuse to move a directory into its own subtree.
		for _, c := range fs.ancestors(newname) {
			if c == n {
				return linkErr(syscall.EINVAL)
			}
		}
	}
	if existing, ok := ndir.children[nbase]; ok {
		if existing == n {
			return nil // same inode: POSIX says do nothing
		}
		switch {
		case !n.isDir && existing.isDir:
			return linkErr(syscall.EISDIR)
		case n.isDir && !existing.isDir:
			return linkErr(syscall.ENOTDIR)
		case n.isDir && len(existing.children) > 0:
			return linkErr(syscall.ENOTEMPTY)
		}
	}
	delete(odir.children, obase)
	ndir.children[nbase] = n
	now := time.Now()
	odir.modTime, ndir.modTime = now, now
	return nil
}

// ancestors returns the directories on the path to name's parent, root
// first. fs.mu must be held; missing components end the walk.
func (fs *MemFS) ancestors(name string) []*memNode {
	parts := cleanPath(name)
	out := []*memNode{fs.root}
	n := fs.root
	for _, c := range parts[:max(len(parts)-1, 0)] {
		next, ok := n.children[c]
		if !ok {
			break
		}
		out = append(out, next)
		n = next
	}
	return out
}

// Link makes newname a hard link to the file oldname; newname must not
// exist. Both names then share one inode.
func (fs *MemFS) Link(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	linkErr := func(errno syscall.Errno) error {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: errno}
	}
	n, err := fs.lookup("link", oldname)
	if err != nil {
		return linkErr(errnoOf(err))
	}
	if n.isDir {
		return linkErr(syscall.EPERM)
	}
	ndir, nbase, err := fs.lookupParent("link", newname)
	if err != nil {
		return linkErr(errnoOf(err))
	}
	if ndir == nil {
		return linkErr(syscall.EEXIST)
	}
	if _, ok := ndir.children[nbase]; ok {
		return linkErr(syscall.EEXIST)
	}
	ndir.children[nbase] = n
	ndir.modTime = time.Now()
	return nil
}

// MkdirAll creates dir and any missing parents; existing directories are
// fine, an existing file on the path is an error. perm is ignored. Each new
// directory's entry is durable only after its parent is synced.
func (fs *MemFS) MkdirAll(dir string, perm os.FileMode) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.root
	for _, c := range cleanPath(dir) {
		next, ok := n.children[c]
		if !ok {
			next = newDirNode()
			n.children[c] = next
			n.modTime = next.modTime
		} else if !next.isDir {
			return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		n = next
	}
	return nil
}

// List returns the sorted names of the entries in dir.
func (fs *MemFS) List(dir string) ([]string, error) {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	n, err := fs.lookup("open", dir)
	if err != nil {
		return nil, err
	}
	if !n.isDir {
		return nil, &os.PathError{Op: "readdirent", Path: dir, Err: syscall.ENOTDIR}
	}
	names := make([]string, 0, len(n.children))
	for name := range n.children {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

// Stat returns the metadata of the named file or directory.
func (fs *MemFS) Stat(name string) (os.FileInfo, error) {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	n, err := fs.lookup("stat", name)
	if err != nil {
		return nil, err
	}
	return n.stat(baseName(name)), nil
}

// Lock takes an exclusive lock on the named file, creating it if needed.
// While it is held, further Lock calls on the same file (under any of its
// names) fail with an error matching ErrLocked. Closing the returned closer
// releases the lock; closing it again does nothing.
func (fs *MemFS) Lock(name string) (io.Closer, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir, base, err := fs.lookupParent("lock", name)
	if err != nil {
		return nil, err
	}
	if dir == nil {
		return nil, &os.PathError{Op: "lock", Path: name, Err: syscall.EISDIR}
	}
	n, ok := dir.children[base]
	if !ok {
		n = newFileNode()
		dir.children[base] = n
		dir.modTime = n.modTime
	}
	if n.isDir {
		return nil, &os.PathError{Op: "lock", Path: name, Err: syscall.EISDIR}
	}
	if n.locked {
		return nil, &os.PathError{Op: "lock", Path: name, Err: ErrLocked}
	}
	n.locked = true
	return &memLock{fs: fs, n: n}, nil
}

// Join joins path elements with filepath.Join.
func (fs *MemFS) Join(elem ...string) string { return filepath.Join(elem...) }

type memLock struct {
	once sync.Once
	fs   *MemFS
	n    *memNode
}

func (l *memLock) Close() error {
	l.once.Do(func() {
		l.fs.mu.Lock()
		l.n.locked = false
		l.fs.mu.Unlock()
	})
	return nil
}

func baseName(name string) string {
	parts := cleanPath(name)
	if len(parts) == 0 {
		return string(filepath.Separator)
	}
	return parts[len(parts)-1]
}

// stat returns n's metadata. MemFS.mu must be held (shared suffices).
func (n *memNode) stat(name string) os.FileInfo {
	if n.isDir {
		return &memFileInfo{name: name, dir: true, modTime: n.modTime}
	}
	n.dataMu.RLock()
	defer n.dataMu.RUnlock()
	return &memFileInfo{name: name, size: int64(len(n.data)), modTime: n.modTime}
}

func errnoOf(err error) syscall.Errno {
	if pe, ok := err.(*os.PathError); ok {
		if e, ok := pe.Err.(syscall.Errno); ok {
			return e
		}
	}
	return syscall.EINVAL
}

func isErrno(err error, errno syscall.Errno) bool { return errnoOf(err) == errno }

// memFile is an open MemFS file or directory.
type memFile struct {
	fs       *MemFS
	n        *memNode
	name     string // as passed to Create/Open/OpenDir
	writable bool
	closed   atomic.Bool

	mu  sync.Mutex // guards pos; ordered before MemFS.mu
	pos int64      // offset of the next Read
}

func (f *memFile) pathErr(op string, err error) error {
	return &os.PathError{Op: op, Path: f.name, Err: err}
}

// Read reads from the handle's offset. After a Write on the same handle the
// offset is at the end of the file, as with an *os.File from os.Create.
func (f *memFile) Read(p []byte) (int, error) {
	if f.closed.Load() {
		return 0, f.pathErr("read", os.ErrClosed)
	}
	if f.n.isDir {
		return 0, f.pathErr("read", syscall.EISDIR)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.readAt(p, f.pos)
	f.pos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// ReadAt reads len(p) bytes at off; fewer bytes come with io.EOF. Data
// appended through any handle is visible as soon as Write returns.
func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	if f.closed.Load() {
		return 0, f.pathErr("read", os.ErrClosed)
	}
	if f.n.isDir {
		return 0, f.pathErr("read", syscall.EISDIR)
	}
	if off < 0 {
		return 0, f.pathErr("readat", syscall.EINVAL)
	}
	return f.readAt(p, off)
}

func (f *memFile) readAt(p []byte, off int64) (int, error) {
	f.fs.mu.RLock()
	defer f.fs.mu.RUnlock()
	f.n.dataMu.RLock()
	defer f.n.dataMu.RUnlock()
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.n.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Write appends p to the file.
func (f *memFile) Write(p []byte) (int, error) {
	if f.closed.Load() {
		return 0, f.pathErr("write", os.ErrClosed)
	}
	if !f.writable {
		return 0, f.pathErr("write", syscall.EBADF)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fs.mu.RLock()
	f.n.dataMu.Lock()
	f.n.data = append(f.n.data, p...)
	f.n.modTime = time.Now()
	f.pos = int64(len(f.n.data))
	f.n.dataMu.Unlock()
	f.fs.mu.RUnlock()
	return len(p), nil
}

// Sync makes the file's current contents durable or, for a directory opened
// with OpenDir, the directory's current entries.
func (f *memFile) Sync() error {
	if f.closed.Load() {
		return f.pathErr("sync", os.ErrClosed)
	}
	if f.n.isDir {
		f.fs.mu.Lock()
		defer f.fs.mu.Unlock()
		if f.fs.crashable {
			f.n.durable = make(map[string]*memNode, len(f.n.children))
			for k, v := range f.n.children {
				f.n.durable[k] = v
			}
		}
		return nil
	}
	f.fs.mu.RLock()
	defer f.fs.mu.RUnlock()
	f.n.dataMu.Lock()
	defer f.n.dataMu.Unlock()
	f.n.synced = f.n.data
	f.n.syncedIsPrefix = true
	return nil
}

// Stat returns the file's metadata; Name is the base of the name it was
// opened under.
func (f *memFile) Stat() (os.FileInfo, error) {
	if f.closed.Load() {
		return nil, f.pathErr("stat", os.ErrClosed)
	}
	f.fs.mu.RLock()
	defer f.fs.mu.RUnlock()
	return f.n.stat(baseName(f.name)), nil
}

// Close closes the handle; a second Close returns an error wrapping
// os.ErrClosed, as *os.File does.
func (f *memFile) Close() error {
	if f.closed.Swap(true) {
		return f.pathErr("close", os.ErrClosed)
	}
	return nil
}

// memFileInfo implements os.FileInfo.
type memFileInfo struct {
	name    string
	size    int64
	dir     bool
	modTime time.Time
}

func (i *memFileInfo) Name() string       { return i.name }
func (i *memFileInfo) Size() int64        { return i.size }
func (i *memFileInfo) ModTime() time.Time { return i.modTime }
func (i *memFileInfo) IsDir() bool        { return i.dir }
func (i *memFileInfo) Sys() any           { return nil }
func (i *memFileInfo) Mode() os.FileMode {
	if i.dir {
		return os.ModeDir | 0o755
	}
	return 0o644
}
