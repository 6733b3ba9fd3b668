package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

func newLDBManifestCmd(f *ldbFlags) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "manifest",
		Short: "Dump the version edits of the current MANIFEST and the version they build",
		Long: `manifest prints every version edit of the MANIFEST named by the database's
CURRENT file (or of the MANIFEST given with --path), in order, with its offset
in the file and the fields it sets (including a clean close's WAL and size,
and the history horizon when the edit was written), then the version they
build: the files of each level with their key bounds, sequence numbers and
sizes.

It reads the MANIFEST file directly, without opening the database: it takes no
lock, writes nothing and does not replay the WAL, so it also works on a
database that cannot be opened. A torn last edit (what a crash during an
append leaves) is reported and ignored, as recovery does; any other damage is
an error naming the file and the offset.`,
		Example: `  shalectl debug ldb --db /data/db manifest
  shalectl debug ldb --db /data/db manifest --path /data/db/MANIFEST-000042`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.textOnly(cmd); err != nil {
				return err
			}
			if path == "" {
				dir, err := f.dir(cmd)
				if err != nil {
					return err
				}
				num, err := manifest.ReadCurrentFile(vfs.Default, dir)
				if err != nil {
					return fmt.Errorf("manifest: find current MANIFEST: %w", err)
				}
				path = manifest.MakeFilepath(vfs.Default, dir, manifest.FileTypeManifest, num)
			}
			return dumpManifest(cmd.OutOrStdout(), vfs.Default, path, f.codec())
		},
	}
	cmd.Flags().StringVar(&path, "path", "", "dump this MANIFEST `FILE` instead of the one CURRENT names (--db is then not needed)")
	return cmd
}

// dumpManifest prints the edits of the MANIFEST at path and the version
// they build.
func dumpManifest(out io.Writer, fs vfs.FS, path string, c output.Codec) error {
	f, err := fs.Open(path)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	defer f.Close()
	fmt.Fprintf(out, "manifest: %s\n", path)

	r := wal.NewReader(f, path)
	var (
		bve        manifest.BulkVersionEdit
		comparator string
		minLog     manifest.FileNum
		nextFile   manifest.FileNum
		lastSeq    storage.SeqNum
		n          int
	)
	for ; ; n++ {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if errors.Is(err, wal.ErrTornTail) {
			fmt.Fprintf(out, "\ntorn tail after edit %d (ignored, as recovery does): %v\n", n-1, err)
			break
		}
		if err != nil {
			return fmt.Errorf("manifest: read edit %d: %w", n, err)
		}
		off := r.LastRecordOffset()
		var ve manifest.VersionEdit
		if err := ve.Decode(rec); err != nil {
			return fmt.Errorf("manifest: %s: edit %d at offset %d: %w", path, n, off, err)
		}
		fmt.Fprintf(out, "\nedit %d at offset %d (%d bytes):\n", n, off, len(rec))
		printEdit(out, &ve, c)
		if err := bve.Accumulate(&ve); err != nil {
			return fmt.Errorf("manifest: %s: edit %d at offset %d: %w", path, n, off, err)
		}
		if ve.ComparatorName != "" {
			comparator = ve.ComparatorName
		}
		if ve.MinUnflushedLogNum != 0 {
			minLog = ve.MinUnflushedLogNum
		}
		if ve.NextFileNum != 0 {
			nextFile = ve.NextFileNum
		}
		if ve.LastSeqNum != 0 {
			lastSeq = ve.LastSeqNum
		}
	}
	if n == 0 {
		return fmt.Errorf("manifest: %s holds no complete version edit", path)
	}
	v, err := bve.Apply(nil)
	if err != nil {
		return fmt.Errorf("manifest: %s: build version from %d edits: %w", path, n, err)
	}
	fmt.Fprintf(out, "\nversion after %d edits: comparator %s, next file %s, last seq %d, min unflushed log %s\n",
		n, comparator, nextFile, lastSeq, minLog)
	var files int
	var bytes uint64
	for level, lf := range v.Levels {
		if len(lf) == 0 {
			continue
		}
		var size uint64
		for _, m := range lf {
			size += m.Size
		}
		files += len(lf)
		bytes += size
		fmt.Fprintf(out, "  L%d: %d files, %d bytes (%s)\n", level, len(lf), size, output.Bytes(size))
		for _, m := range lf {
			fmt.Fprintf(out, "    %s\n", formatFile(m, c))
		}
	}
	fmt.Fprintf(out, "  total: %d files, %d bytes (%s)\n", files, bytes, output.Bytes(bytes))
	return nil
}

// printEdit prints the fields an edit sets, one per line.
func printEdit(out io.Writer, ve *manifest.VersionEdit, c output.Codec) {
	if ve.ComparatorName != "" {
		fmt.Fprintf(out, "  comparator: %s\n", ve.ComparatorName)
	}
	if ve.MinUnflushedLogNum != 0 {
		fmt.Fprintf(out, "  min-unflushed-log: %s\n", ve.MinUnflushedLogNum)
	}
	if ve.NextFileNum != 0 {
		fmt.Fprintf(out, "  next-file: %s\n", ve.NextFileNum)
	}
	if ve.LastSeqNum != 0 {
		fmt.Fprintf(out, "  last-seq: %d\n", ve.LastSeqNum)
	}
	if ve.CleanCloseLogNum != 0 {
		fmt.Fprintf(out, "  clean-close: %s complete at %d bytes\n",
			manifest.MakeFilename(manifest.FileTypeLog, ve.CleanCloseLogNum), ve.CleanCloseLogSize)
	}
	if ve.HistoryHorizon != 0 {
		fmt.Fprintf(out, "  history-horizon: %d\n", ve.HistoryHorizon)
	}
	deleted := make([]manifest.DeletedFileEntry, 0, len(ve.DeletedFiles))
	for de := range ve.DeletedFiles {
		deleted = append(deleted, de)
	}
	slices.SortFunc(deleted, func(a, b manifest.DeletedFileEntry) int {
		return cmp.Or(cmp.Compare(a.Level, b.Level), cmp.Compare(a.FileNum, b.FileNum))
	})
	for _, de := range deleted {
		fmt.Fprintf(out, "  delete L%d %s\n", de.Level, manifest.MakeFilename(manifest.FileTypeTable, de.FileNum))
	}
	for _, nf := range ve.NewFiles {
		fmt.Fprintf(out, "  add L%d %s\n", nf.Level, formatFile(nf.Meta, c))
	}
}

// formatFile formats a file's name, size, key bounds and sequence numbers.
func formatFile(m *manifest.FileMetadata, c output.Codec) string {
	largest := fmt.Sprintf("%s#%d,%s", c.Format(m.Largest.UserKey), m.Largest.SeqNum(), m.Largest.Kind())
	if m.Largest.IsExclusiveSentinel() {
		largest = c.Format(m.Largest.UserKey) + " (exclusive)"
	}
	return fmt.Sprintf("%s size=%d keys=[%s#%d,%s .. %s] seqs=[%d, %d]",
		manifest.MakeFilename(manifest.FileTypeTable, m.FileNum), m.Size,
		c.Format(m.Smallest.UserKey), m.Smallest.SeqNum(), m.Smallest.Kind(), largest,
		m.SmallestSeq, m.LargestSeq)
}
