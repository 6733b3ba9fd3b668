// Package manifest describes which SST files make up a database and at which
// level: file metadata, immutable versions (the set of live files), version
// edits (the deltas logged to the MANIFEST file) and the CURRENT pointer.
package manifest

import (
	"fmt"
	"sync/atomic"

	"github.com/shale-db/shale/storage/internal/base"
)

// NumLevels is the number of LSM levels, L0 through L6.
const NumLevels = 7

// FileNum identifies a file (SST, WAL, MANIFEST) within a database directory.
// File numbers are allocated from one counter and never reused.
type FileNum uint64

// String formats the number as it appears in file names (zero-padded to 6).
func (n FileNum) String() string { return fmt.Sprintf("%06d", uint64(n)) }

// FileMetadata describes one SST file. Everything but the Compacting flag and
// the reference count is immutable once the file is part of a version.
//
// Smallest and Largest bound every key in the file, point keys and range
// tombstones alike. When a range tombstone's exclusive end is the file's
// upper bound, Largest is base.MakeRangeDeleteSentinel(end), which covers no
// key equal to end.
type FileMetadata struct {
	FileNum     FileNum
	Size        uint64 // bytes on disk
	Smallest    base.InternalKey
	Largest     base.InternalKey
	SmallestSeq base.SeqNum // smallest sequence number of any entry
	LargestSeq  base.SeqNum // largest sequence number of any entry
	// CreationTime is the Unix time (seconds) at which the file was written.
	CreationTime int64

	// Compacting is set while the file is an input of a running compaction.
	// It is guarded by the owner's mutex, not by the version.
	Compacting bool

	// refs counts versions that contain the file; when it reaches zero the
	// file is obsolete (unless file deletions are disabled).
	refs atomic.Int32
}

// Ref adds a reference and returns the new count.
func (m *FileMetadata) Ref() int32 { return m.refs.Add(1) }

// Unref drops a reference and returns the new count.
func (m *FileMetadata) Unref() int32 { return m.refs.Add(-1) }

// Refs returns the current reference count.
func (m *FileMetadata) Refs() int32 { return m.refs.Load() }

// String formats the file as "000012:[a#5,SET-c#3,SET]".
func (m *FileMetadata) String() string {
	return fmt.Sprintf("%s:[%s-%s]", m.FileNum, m.Smallest, m.Largest)
}
