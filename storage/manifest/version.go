package manifest

import (
	"bytes"
	"cmp"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/shale-db/shale/storage/internal/base"
)

// ObsoleteFunc receives the files whose reference count dropped to zero
// when a version was released: files no live version contains any more,
// which the database may delete (unless file deletions are disabled). It is
// called synchronously by the Unref that released the last reference, in
// that goroutine, possibly while the caller holds locks: it should only
// hand the files off (queue them) and must not call back into the Version.
type ObsoleteFunc func(obsolete []*FileMetadata)

// Version is an immutable set of SST files, per level. A Version built by
// NewVersion or BulkVersionEdit.Apply satisfies:
//
//   - L0 is sorted newest first: by LargestSeq descending, ties broken by
//     FileNum descending. L0 files may overlap one another.
//   - Each level Ln (n >= 1) is sorted by Smallest and its files do not
//     overlap: every file's Largest sorts (as an internal key) strictly
//     before the next file's Smallest. Two adjacent files may share a
//     boundary user key only that way, e.g. k#7 ending one file and k#5
//     starting the next, or a range-deletion sentinel for k ending one file
//     and any real key for k starting the next.
//   - Each file's Smallest <= Largest and SmallestSeq <= LargestSeq, and no
//     file number appears twice.
//
// Neither the Levels slices nor the files may be modified (except for the
// FileMetadata fields documented as mutable). A Version is safe for
// concurrent use.
//
// Reference counting: a new version holds one reference, owned by its
// creator, and one reference on each of its files. Ref and Unref manage the
// version's count; when it drops to zero, the version releases its file
// references, and the files whose count thereby reaches zero are passed to
// the version's ObsoleteFunc.
type Version struct {
	// Levels holds the files of each level in the order described above.
	Levels [NumLevels][]*FileMetadata

	refs atomic.Int32

	mu         sync.Mutex // guards onObsolete
	onObsolete ObsoleteFunc
}

// NewVersion builds a version from the given files per level, owning one
// reference. It sorts each level (copying the slices; the caller's slices
// are not modified), checks the invariants listed on Version (see
// CheckOrdering) and takes a reference on every file. On error no reference
// is taken.
func NewVersion(levels [NumLevels][]*FileMetadata) (*Version, error) {
	v, err := newVersion(levels)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return v, nil
}

func newVersion(levels [NumLevels][]*FileMetadata) (*Version, error) {
	v := &Version{}
	for level, files := range levels {
		for _, f := range files {
			if f == nil {
				return nil, fmt.Errorf("L%d holds a nil file", level)
			}
		}
		if len(files) == 0 {
			continue
		}
		files = slices.Clone(files)
		if level == 0 {
			slices.SortFunc(files, compareL0)
		} else {
			slices.SortFunc(files, func(a, b *FileMetadata) int {
				if c := base.CompareInternal(a.Smallest, b.Smallest); c != 0 {
					return c
				}
				return cmp.Compare(a.FileNum, b.FileNum)
			})
		}
		v.Levels[level] = files
	}
	if err := v.checkOrdering(); err != nil {
		return nil, err
	}
	for f := range v.allFiles() {
		f.Ref()
	}
	v.refs.Store(1)
	return v, nil
}

// compareL0 orders L0 newest first.
func compareL0(a, b *FileMetadata) int {
	if c := cmp.Compare(b.LargestSeq, a.LargestSeq); c != 0 {
		return c
	}
	return cmp.Compare(b.FileNum, a.FileNum)
}

// SetObsoleteFunc sets the function that receives the files this version
// releases for the last time. Versions built from this one by
// BulkVersionEdit.Apply inherit it. Set it before sharing the version (for
// example on the version ReplayManifest returns); a nil fn drops the
// obsolete files silently.
func (v *Version) SetObsoleteFunc(fn ObsoleteFunc) {
	v.mu.Lock()
	v.onObsolete = fn
	v.mu.Unlock()
}

func (v *Version) obsoleteFunc() ObsoleteFunc {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.onObsolete
}

// Ref adds a reference to the version. The caller must already hold one
// (directly or through the owner of the current version).
func (v *Version) Ref() { v.refs.Add(1) }

// Refs returns the version's reference count.
func (v *Version) Refs() int32 { return v.refs.Load() }

// Unref drops a reference. When the count reaches zero the version releases
// its files' references and reports the files that became unreferenced to
// its ObsoleteFunc, in level order. Unref without a reference is a
// programming error and panics.
func (v *Version) Unref() {
	n := v.refs.Add(-1)
	if n > 0 {
		return
	}
	if n < 0 {
		// invariant: every Unref matches an earlier Ref; a mismatch is a programming error.
		panic("manifest: Version.Unref without a matching Ref")
	}
	var obsolete []*FileMetadata
	for f := range v.allFiles() {
		if f.Unref() == 0 {
			obsolete = append(obsolete, f)
		}
	}
	if fn := v.obsoleteFunc(); fn != nil && len(obsolete) > 0 {
		fn(obsolete)
	}
}

func (v *Version) allFiles() iter.Seq[*FileMetadata] {
	return func(yield func(*FileMetadata) bool) {
		for _, files := range v.Levels {
			for _, f := range files {
				if !yield(f) {
					return
				}
			}
		}
	}
}

// All yields every file of the version with its level, level by level in
// the version's order.
func (v *Version) All() iter.Seq2[int, *FileMetadata] {
	return func(yield func(int, *FileMetadata) bool) {
		for level, files := range v.Levels {
			for _, f := range files {
				if !yield(level, f) {
					return
				}
			}
		}
	}
}

// NumFiles returns the number of files in level, 0 for an out-of-range level.
func (v *Version) NumFiles(level int) int {
	if level < 0 || level >= NumLevels {
		return 0
	}
	return len(v.Levels[level])
}

// LevelSize returns the total Size of the files in level, 0 for an
// out-of-range level.
func (v *Version) LevelSize(level int) uint64 {
	if level < 0 || level >= NumLevels {
		return 0
	}
	var sum uint64
	for _, f := range v.Levels[level] {
		sum += f.Size
	}
	return sum
}

// endsBefore reports whether every key of f has a user key < key, honoring
// an exclusive range-deletion sentinel as f's upper bound.
func endsBefore(f *FileMetadata, key []byte) bool {
	c := bytes.Compare(f.Largest.UserKey, key)
	return c < 0 || (c == 0 && f.Largest.IsExclusiveSentinel())
}

// overlaps reports whether f holds any key whose user key lies in
// [smallest, largest].
func overlaps(f *FileMetadata, smallest, largest []byte) bool {
	return !endsBefore(f, smallest) && bytes.Compare(f.Smallest.UserKey, largest) <= 0
}

// Overlaps returns the files of level that may hold a key whose user key
// lies in [smallest, largest] (both inclusive), in the level's order. A file
// whose Largest is a range-deletion sentinel for user key K does not contain
// K. For L0 every file is tested and only files overlapping the range
// itself are returned (the result is not widened to files overlapping the
// returned files); for L1+ a binary search finds the first candidate. It
// returns nil if smallest > largest or level is out of range. The returned
// slice is freshly allocated for L0 and aliases v.Levels for L1+; do not
// modify it.
func (v *Version) Overlaps(level int, smallest, largest []byte) []*FileMetadata {
	if level < 0 || level >= NumLevels || bytes.Compare(smallest, largest) > 0 {
		return nil
	}
	files := v.Levels[level]
	if level == 0 {
		var out []*FileMetadata
		for _, f := range files {
			if overlaps(f, smallest, largest) {
				out = append(out, f)
			}
		}
		return out
	}
	// Files are sorted and disjoint, so endsBefore is monotone over them.
	i, _ := slices.BinarySearchFunc(files, smallest, func(f *FileMetadata, key []byte) int {
		if endsBefore(f, key) {
			return -1
		}
		return 1
	})
	j := i
	for j < len(files) && bytes.Compare(files[j].Smallest.UserKey, largest) <= 0 {
		j++
	}
	if i == j {
		return nil
	}
	return files[i:j:j]
}

// CheckOrdering verifies the invariants listed on Version and returns an
// error describing the first violation.
func (v *Version) CheckOrdering() error {
	if err := v.checkOrdering(); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	return nil
}

func (v *Version) checkOrdering() error {
	seen := make(map[FileNum]int)
	for level, files := range v.Levels {
		for i, f := range files {
			if f == nil {
				return fmt.Errorf("L%d: file %d is nil", level, i)
			}
			if err := validateFile(f); err != nil {
				return fmt.Errorf("L%d: %w", level, err)
			}
			if prev, ok := seen[f.FileNum]; ok {
				return fmt.Errorf("file %s appears in L%d and L%d", f.FileNum, prev, level)
			}
			seen[f.FileNum] = level
			if i == 0 {
				continue
			}
			prev := files[i-1]
			if level == 0 {
				if compareL0(prev, f) >= 0 {
					return fmt.Errorf("L0 files out of order: %s (largest seqnum %d) before %s (largest seqnum %d)",
						prev.FileNum, prev.LargestSeq, f.FileNum, f.LargestSeq)
				}
				continue
			}
			if base.CompareInternal(prev.Largest, f.Smallest) >= 0 {
				return fmt.Errorf("L%d files overlap or are out of order: %s and %s", level, prev, f)
			}
		}
	}
	return nil
}

// String lists the files of each non-empty level, one per line, as
// "L<n>:" followed by indented FileMetadata.String() lines; "(empty)" for a
// version without files.
func (v *Version) String() string {
	var b strings.Builder
	for level, files := range v.Levels {
		if len(files) == 0 {
			continue
		}
		fmt.Fprintf(&b, "L%d:\n", level)
		for _, f := range files {
			fmt.Fprintf(&b, "  %s\n", f)
		}
	}
	if b.Len() == 0 {
		return "(empty)\n"
	}
	return b.String()
}
