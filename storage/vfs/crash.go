package vfs

import (
	"bytes"
	"math/rand/v2"
	"sort"
)

// CrashOption adjusts what CrashClone keeps.
type CrashOption func(*crashOptions)

type crashOptions struct {
	rng *rand.Rand
}

// WithRandomTail makes CrashClone also keep, for each file, a prefix chosen
// uniformly at random (from nothing to everything) of the data written since
// the file's last Sync, simulating writes that partly reached the disk
// before the power went out. A file truncated by Create since its last Sync
// keeps only its synced contents. Files are visited in sorted path order, so
// a given rng state gives a reproducible result. rng is used only during the
// CrashClone call and must not be used concurrently with it.
func WithRandomTail(rng *rand.Rand) CrashOption {
	return func(o *crashOptions) { o.rng = rng }
}

// CrashClone returns a new, independent MemFS holding exactly the state that
// would survive if the machine lost power now: every directory holds the
// entries it had at its last Sync (through OpenDir), and every file reachable
// through those entries holds its contents as of its last Sync (plus part of
// its unsynced tail with WithRandomTail). Hard links still share one inode in
// the clone. The snapshot is atomic with respect to all concurrent
// operations on fs. Nothing is locked in the clone, and the clone is itself
// crashable, with everything in it durable.
//
// Directory entries are tracked per directory, so stale durable entries can
// in rare cases describe a directory inside its own subtree (after renames
// whose source directories were never synced); such entries are dropped, and
// a directory durably listed under two names is copied for each.
//
// CrashClone panics if fs was not made by NewCrashableMem.
func (fs *MemFS) CrashClone(opts ...CrashOption) *MemFS {
	if !fs.crashable {
		// invariant: only tests call CrashClone, on filesystems they made crashable.
		panic("vfs: CrashClone on a MemFS not created by NewCrashableMem")
	}
	var o crashOptions
	for _, opt := range opts {
		opt(&o)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	c := cloner{
		rng:      o.rng,
		files:    make(map[*memNode]*memNode),
		visiting: make(map[*memNode]bool),
	}
	return &MemFS{root: c.dir(fs.root), crashable: true}
}

type cloner struct {
	rng *rand.Rand
	// files maps original file inodes to their clones, so hard links stay
	// shared.
	files map[*memNode]*memNode
	// visiting holds the directories on the current path, to break cycles.
	visiting map[*memNode]bool
}

func (c *cloner) dir(n *memNode) *memNode {
	c.visiting[n] = true
	defer delete(c.visiting, n)
	out := newDirNode()
	out.modTime = n.modTime
	names := make([]string, 0, len(n.durable))
	for name := range n.durable {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		child := n.durable[name]
		if child.isDir {
			if c.visiting[child] {
				continue
			}
			out.children[name] = c.dir(child)
		} else {
			out.children[name] = c.file(child)
		}
	}
	for k, v := range out.children {
		out.durable[k] = v
	}
	return out
}

func (c *cloner) file(n *memNode) *memNode {
	if m, ok := c.files[n]; ok {
		return m
	}
	// The caller holds MemFS.mu exclusively, so no data op is in flight.
	data := n.synced
	if c.rng != nil && n.syncedIsPrefix && len(n.data) > len(n.synced) {
		keep := c.rng.IntN(len(n.data) - len(n.synced) + 1)
		data = n.data[:len(n.synced)+keep]
	}
	m := newFileNode()
	m.modTime = n.modTime
	m.data = bytes.Clone(data)
	m.synced = m.data
	c.files[n] = m
	return m
}
