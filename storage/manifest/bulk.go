package manifest

import (
	"fmt"
	"slices"

	"github.com/shale-db/shale/storage/internal/base"
)

// BulkVersionEdit accumulates a sequence of version edits so they can be
// applied to a version at once (a MANIFEST replay, or a single edit during
// normal operation). The zero value is empty and ready to use. It is not
// safe for concurrent use.
//
// Within each edit, deletions apply before additions; edits apply in the
// order accumulated. A file added by one edit and deleted by a later one
// cancels out and never reaches the version.
type BulkVersionEdit struct {
	// Added holds, per level, the files added and not deleted again.
	Added [NumLevels]map[FileNum]*FileMetadata
	// Deleted holds, per level, the files to remove from the version the
	// edits are applied to. A nil value (a file decoded from a MANIFEST)
	// is filled in by Apply with the version's metadata.
	Deleted [NumLevels]map[FileNum]*FileMetadata
}

// Accumulate adds the changes of ve. It returns an error, leaving b in an
// unspecified state, when an entry has an out-of-range level or a nil file,
// when a file is added to a level twice without being deleted in between, or
// when a file is deleted from a level twice without being added in between.
func (b *BulkVersionEdit) Accumulate(ve *VersionEdit) error {
	for de, m := range ve.DeletedFiles {
		if err := validateLevel(de.Level); err != nil {
			return fmt.Errorf("manifest: deleted file %s: %w", de.FileNum, err)
		}
		if _, ok := b.Added[de.Level][de.FileNum]; ok {
			// Added earlier in this bulk edit: the two cancel out.
			delete(b.Added[de.Level], de.FileNum)
			continue
		}
		if _, ok := b.Deleted[de.Level][de.FileNum]; ok {
			return fmt.Errorf("manifest: file %s deleted twice from L%d", de.FileNum, de.Level)
		}
		if b.Deleted[de.Level] == nil {
			b.Deleted[de.Level] = make(map[FileNum]*FileMetadata)
		}
		b.Deleted[de.Level][de.FileNum] = m
	}
	for _, nf := range ve.NewFiles {
		if err := validateLevel(nf.Level); err != nil {
			return fmt.Errorf("manifest: new file: %w", err)
		}
		if nf.Meta == nil {
			return fmt.Errorf("manifest: new file in L%d has nil metadata", nf.Level)
		}
		if _, ok := b.Added[nf.Level][nf.Meta.FileNum]; ok {
			return fmt.Errorf("manifest: file %s added twice to L%d", nf.Meta.FileNum, nf.Level)
		}
		if b.Added[nf.Level] == nil {
			b.Added[nf.Level] = make(map[FileNum]*FileMetadata)
		}
		b.Added[nf.Level][nf.Meta.FileNum] = nf.Meta
	}
	return nil
}

// Apply returns a new version: cur (nil means the empty version) minus the
// deleted files plus the added ones. The new version holds one reference
// owned by the caller (see NewVersion) and inherits cur's ObsoleteFunc; cur
// is not modified and keeps its references. Apply fills in the nil values of
// b.Deleted with cur's metadata.
//
// A file deleted from one level of cur and added to another (a move) keeps
// cur's *FileMetadata even if the edit carries a copy, so that its reference
// count stays whole; the copy must then describe the same file.
//
// It fails, creating no version, when a deleted file is not in that level
// of cur, when a moved file's copy differs from cur's metadata, when a file
// would appear twice (added while already present), or when the result
// violates the invariants of Version (see CheckOrdering).
func (b *BulkVersionEdit) Apply(cur *Version) (*Version, error) {
	// Files removed from cur, by number, to recognize moves.
	removed := make(map[FileNum]*FileMetadata)
	var levels [NumLevels][]*FileMetadata
	for level := range NumLevels {
		var files []*FileMetadata
		if cur != nil {
			files = cur.Levels[level]
		}
		del, add := b.Deleted[level], b.Added[level]
		if len(del) == 0 && len(add) == 0 {
			levels[level] = files
			continue
		}
		out := make([]*FileMetadata, 0, len(files)+len(add))
		if len(del) == 0 {
			out = append(out, files...)
			levels[level] = out
			continue
		}
		found := 0
		for _, f := range files {
			if m, ok := del[f.FileNum]; ok {
				if m == nil {
					del[f.FileNum] = f
				}
				removed[f.FileNum] = f
				found++
				continue
			}
			out = append(out, f)
		}
		if found != len(del) {
			var missing []FileNum
			for fn := range del {
				if !slices.ContainsFunc(files, func(f *FileMetadata) bool { return f.FileNum == fn }) {
					missing = append(missing, fn)
				}
			}
			slices.Sort(missing)
			return nil, fmt.Errorf("manifest: deleting file %s, which is not in L%d", missing[0], level)
		}
		levels[level] = out
	}
	for level, add := range b.Added {
		for _, f := range add {
			if old, ok := removed[f.FileNum]; ok && old != f {
				// A move with a fresh copy of the metadata: keep the
				// original so its reference count stays accurate.
				if !sameFile(old, f) {
					return nil, fmt.Errorf("manifest: file %s moved to L%d with different metadata: %s vs %s",
						f.FileNum, level, old, f)
				}
				f = old
			}
			levels[level] = append(levels[level], f)
		}
	}
	v, err := newVersion(levels)
	if err != nil {
		return nil, fmt.Errorf("manifest: applying version edit: %w", err)
	}
	if cur != nil {
		v.onObsolete = cur.obsoleteFunc()
	}
	return v, nil
}

// sameFile reports whether a and b describe the same file.
func sameFile(a, b *FileMetadata) bool {
	return a.FileNum == b.FileNum && a.Size == b.Size &&
		base.CompareInternal(a.Smallest, b.Smallest) == 0 && base.CompareInternal(a.Largest, b.Largest) == 0 &&
		a.SmallestSeq == b.SmallestSeq && a.LargestSeq == b.LargestSeq && a.CreationTime == b.CreationTime
}
