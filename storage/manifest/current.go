package manifest

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

// maxCurrentSize bounds how much of CURRENT is read; a valid one is ~20 bytes.
const maxCurrentSize = 4096

// SetCurrentFile atomically points dir's CURRENT file at MANIFEST-<num>: it
// writes "MANIFEST-<num>\n" to the temp file <num>.dbtmp, syncs it, renames
// it over CURRENT and syncs dir. When it returns nil the switch is durable.
// When it fails, CURRENT names either the old or the new manifest (the
// rename is atomic), and the new one may not be durable; the caller should
// treat the database as failed. The temp file is removed on failure (best
// effort).
func SetCurrentFile(fs vfs.FS, dir string, manifestNum FileNum) (err error) {
	tmp := MakeFilepath(fs, dir, FileTypeTemp, manifestNum)
	renamed := false
	defer func() {
		if err != nil && !renamed {
			_ = fs.Remove(tmp)
		}
	}()
	f, err := fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("manifest: creating %s: %w", tmp, err)
	}
	contents := MakeFilename(FileTypeManifest, manifestNum) + "\n"
	if _, err := io.WriteString(f, contents); err != nil {
		f.Close()
		return fmt.Errorf("manifest: writing %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("manifest: syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("manifest: closing %s: %w", tmp, err)
	}
	current := MakeFilepath(fs, dir, FileTypeCurrent, 0)
	if err := fs.Rename(tmp, current); err != nil {
		return fmt.Errorf("manifest: renaming %s to %s: %w", tmp, current, err)
	}
	renamed = true
	d, err := fs.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("manifest: opening directory %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("manifest: syncing directory %s: %w", dir, err)
	}
	if err := d.Close(); err != nil {
		return fmt.Errorf("manifest: closing directory %s: %w", dir, err)
	}
	return nil
}

// ReadCurrentFile returns the number of the manifest named by dir's CURRENT
// file. If CURRENT cannot be opened or read it returns the file system's
// error wrapped with the path (so errors.Is(err, os.ErrNotExist) works for a
// missing CURRENT, if the FS reports it that way). If its contents are not
// exactly "MANIFEST-<num>\n" it returns a *base.CorruptionError naming
// CURRENT.
func ReadCurrentFile(fs vfs.FS, dir string) (FileNum, error) {
	path := MakeFilepath(fs, dir, FileTypeCurrent, 0)
	f, err := fs.Open(path)
	if err != nil {
		return 0, fmt.Errorf("manifest: opening %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCurrentSize+1))
	if err != nil {
		return 0, fmt.Errorf("manifest: reading %s: %w", path, err)
	}
	switch {
	case len(data) == 0:
		return 0, base.Corruptf(path, -1, "CURRENT is empty")
	case len(data) > maxCurrentSize:
		return 0, base.Corruptf(path, -1, "CURRENT is larger than %d bytes", maxCurrentSize)
	case data[len(data)-1] != '\n':
		return 0, base.Corruptf(path, -1, "CURRENT does not end with a newline: %q", data)
	}
	name := strings.TrimSuffix(string(data), "\n")
	ft, num, ok := ParseFilename(name)
	if !ok || ft != FileTypeManifest {
		return 0, base.Corruptf(path, -1, "CURRENT does not name a manifest: %q", data)
	}
	return num, nil
}

// VersionEditSummary gathers the scalar fields of the edits of a MANIFEST:
// for each, the value from the last edit that set it (0 or "" if none did).
type VersionEditSummary struct {
	ComparatorName     string
	MinUnflushedLogNum FileNum
	NextFileNum        FileNum
	LastSeqNum         base.SeqNum
	// NumEdits is the number of complete edits replayed.
	NumEdits int
	// TornTail is set when the MANIFEST ended inside an edit (a crash
	// during an append); that edit was ignored. The file must not be
	// appended to: the next append would follow the torn bytes.
	TornTail bool
	// ValidSize is the offset just past the last complete edit.
	ValidSize int64
	// CleanCloseLogNum and CleanCloseLogSize are set when the last edit
	// recorded a clean close (see VersionEdit); 0 otherwise.
	CleanCloseLogNum  FileNum
	CleanCloseLogSize uint64
	// HistoryHorizon is the highest history horizon any edit recorded (see
	// VersionEdit.HistoryHorizon); 0 if none did.
	HistoryHorizon base.SeqNum
	// Reclaims are the reclaims of the last edit that set them (see
	// VersionEdit.Reclaims); nil if none did.
	Reclaims []Reclaim
}

// ReplayManifest reads the MANIFEST at path and applies its edits in order
// to the empty version. It returns the resulting version (holding one
// reference, with no ObsoleteFunc set) and the summary of the edits.
//
// A torn tail — the file ending inside an edit, as a crash during an append
// leaves it — is tolerated: the incomplete edit is ignored and
// summary.TornTail is set. A zeroed tail is a clean end. Everything else is
// an error: damage anywhere (a checksum mismatch, including in the last
// record), an edit that does not decode, an edit that cannot be applied
// (e.g. deleting a file not present), a comparator name that changes between
// edits, or a manifest without any complete edit all return a
// *base.CorruptionError naming path (and the record's offset where known).
// I/O errors are returned wrapped.
func ReplayManifest(fs vfs.FS, path string) (*Version, VersionEditSummary, error) {
	var sum VersionEditSummary
	f, err := fs.Open(path)
	if err != nil {
		return nil, sum, fmt.Errorf("manifest: opening %s: %w", path, err)
	}
	defer f.Close()

	r := wal.NewReader(f, path)
	var bve BulkVersionEdit
	var ve VersionEdit
	for {
		rec, err := r.Next()
		if err == io.EOF {
			if r.ValidRecordFollows() {
				// A zeroed chunk header with intact edits after it: damage,
				// not the end of the file.
				return nil, sum, base.Corruptf(path, r.ValidOffset(), "zeroed record header before intact records")
			}
			break
		}
		if errors.Is(err, wal.ErrTornTail) {
			if r.ValidRecordFollows() {
				// Intact data after the "torn" record: a damaged chunk
				// header, not an interrupted append.
				return nil, sum, base.Corruptf(path, r.ValidOffset(), "damaged record: %v", err)
			}
			sum.TornTail = true
			break
		}
		if err != nil {
			return nil, sum, fmt.Errorf("manifest: replaying %s: %w", path, err)
		}
		off := r.LastRecordOffset()
		if err := ve.Decode(rec); err != nil {
			return nil, sum, base.Corruptf(path, off, "version edit %d: %v", sum.NumEdits, err)
		}
		if ve.ComparatorName != "" {
			if sum.ComparatorName != "" && sum.ComparatorName != ve.ComparatorName {
				return nil, sum, base.Corruptf(path, off, "version edit %d: comparator changes from %q to %q",
					sum.NumEdits, sum.ComparatorName, ve.ComparatorName)
			}
			sum.ComparatorName = ve.ComparatorName
		}
		if err := bve.Accumulate(&ve); err != nil {
			return nil, sum, base.Corruptf(path, off, "version edit %d: %v", sum.NumEdits, err)
		}
		if ve.MinUnflushedLogNum != 0 {
			sum.MinUnflushedLogNum = ve.MinUnflushedLogNum
		}
		if ve.NextFileNum != 0 {
			sum.NextFileNum = ve.NextFileNum
		}
		if ve.LastSeqNum != 0 {
			sum.LastSeqNum = ve.LastSeqNum
		}
		sum.HistoryHorizon = max(sum.HistoryHorizon, ve.HistoryHorizon)
		if ve.ReclaimsSet {
			sum.Reclaims = ve.Reclaims
		}
		// Only a clean close recorded by the very last edit counts.
		sum.CleanCloseLogNum, sum.CleanCloseLogSize = ve.CleanCloseLogNum, ve.CleanCloseLogSize
		sum.NumEdits++
		sum.ValidSize = r.ValidOffset()
	}
	if sum.NumEdits == 0 {
		return nil, sum, base.Corruptf(path, 0, "manifest holds no complete version edit")
	}
	v, err := bve.Apply(nil)
	if err != nil {
		return nil, sum, base.Corruptf(path, -1, "%v", err)
	}
	return v, sum, nil
}
