package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Copy copies backup id from src into dst: every file it uses that dst
// does not hold already, each checked against its size and CRC-32C as it
// is read (a damaged file fails the copy, wrapping ErrCorrupt, and is not
// stored), then its manifest, last. dst is locked while it runs; a copy
// that fails leaves the backup incomplete in dst.
func Copy(ctx context.Context, src *Location, id string, dst *Location, progress func(VerifyProgress)) (*Manifest, error) {
	m, err := src.Describe(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := copyBackup(ctx, src, id, m, dst, progress); err != nil {
		return nil, err
	}
	return m, nil
}

// copyBackup is Copy of backup id, whose manifest, read from src, is m.
func copyBackup(ctx context.Context, src *Location, id string, m *Manifest, dst *Location, progress func(VerifyProgress)) error {
	unlock, err := dst.lock(ctx, "copy "+id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := dst.begin(ctx, id, map[string]any{"id": id, "cluster": m.ClusterID, "copied_from": src.String(), "started": time.Now().UTC()}); err != nil {
		return err
	}
	stored, err := dst.storedFiles(ctx)
	if err != nil {
		return err
	}
	var total VerifyProgress
	for _, p := range m.Shards {
		total.Files += len(p.stored())
		total.Bytes += int64(p.Bytes())
	}
	for _, p := range m.Shards {
		for _, f := range p.stored() {
			if !stored[f.Path] {
				if err := copyStored(ctx, src, dst, f); err != nil {
					return fmt.Errorf("backup: copy %s: shard %d: %s (%s): %w", id, p.ShardID, f.Name, f.Path, err)
				}
				stored[f.Path] = true
			}
			total.FilesDone++
			total.BytesDone += int64(f.Size)
			if progress != nil {
				progress(total)
			}
		}
	}
	b, err := encodeManifest(m)
	if err != nil {
		return fmt.Errorf("backup: encode the manifest: %w", err)
	}
	if err := dst.st.put(ctx, manifestName(id), bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("backup: write the manifest: %w", err)
	}
	return nil
}

func copyStored(ctx context.Context, src, dst *Location, f File) error {
	in, err := src.openChecked(ctx, f)
	if err != nil {
		return err
	}
	defer in.Close()
	return dst.st.put(ctx, f.Path, in, int64(f.Size))
}

// CheckAsOf says whether the part can be restored as of asOf: not before
// its checkpoint's date, nor after the backup last read the shard.
func (p *Part) CheckAsOf(backupID string, asOf time.Time) error {
	if p.Date.After(asOf) {
		return fmt.Errorf("restore as of %s: backup %s copied shard %d [%q, %q) at %s, later; restore from an earlier backup",
			asOf.Format(time.RFC3339Nano), backupID, p.ShardID, p.Start, p.End, p.Date.Time().Format(time.RFC3339Nano))
	}
	if asOf.After(p.Until) {
		return fmt.Errorf("restore as of %s: backup %s holds shard %d [%q, %q) only until %s; take an incremental backup after that time",
			asOf.Format(time.RFC3339Nano), backupID, p.ShardID, p.Start, p.End, p.Until.Format(time.RFC3339Nano))
	}
	return nil
}

// PreparedDir is the directory of a node's data directory where Prepare
// puts a backup for the node to found its cluster from.
const PreparedDir = "restore"

// preparedFile, in PreparedDir, records what to restore; it is written
// last.
const preparedFile = "restore.json"

// Prepared is a restore that Prepare staged in a data directory.
type Prepared struct {
	// Location is the staged copy (dataDir/restore), a location holding
	// the one backup.
	Location string `json:"location"`
	// Backup is the backup's ID; From, where it was copied from.
	Backup string `json:"backup"`
	From   string `json:"from"`
	// AsOf, when set, restores the data as of that time.
	AsOf time.Time `json:"as_of,omitzero"`
}

// Prepare stages backup id of src in the empty (or missing) data
// directory dataDir, so that shale-server started on it as a founding
// node (--initial-cluster) founds its cluster from the backup, as of asOf
// when it is set. Every file is checked as it is copied, and asOf against
// every part, so a backup that would not restore is refused here. The
// record of what to restore is written last: a Prepare that failed
// half-way leaves nothing a server would act on.
func Prepare(ctx context.Context, src *Location, id string, asOf time.Time, dataDir string, progress func(VerifyProgress)) (*Manifest, error) {
	m, err := src.Describe(ctx, id)
	if err != nil {
		return nil, err
	}
	if !asOf.IsZero() {
		for i := range m.Shards {
			if p := &m.Shards[i]; !p.System {
				if err := p.CheckAsOf(id, asOf); err != nil {
					return nil, fmt.Errorf("backup: %w", err)
				}
			}
		}
	}
	ents, err := os.ReadDir(dataDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("backup: data directory %s: %w", dataDir, err)
	}
	if len(ents) > 0 {
		return nil, fmt.Errorf("backup: data directory %s is not empty: a restore is prepared in a new node's data directory (remove a failed attempt's %s first)", dataDir, PreparedDir)
	}
	stage := filepath.Join(dataDir, PreparedDir)
	dst, err := Open(ctx, stage, true)
	if err != nil {
		return nil, err
	}
	if err := copyBackup(ctx, src, id, m, dst, progress); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(Prepared{Location: stage, Backup: id, From: src.String(), AsOf: asOf}, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := dst.st.put(ctx, preparedFile, bytes.NewReader(b), int64(len(b))); err != nil {
		return nil, fmt.Errorf("backup: record the prepared restore: %w", err)
	}
	return m, nil
}

// ReadPrepared returns the restore Prepare staged in dataDir; ok is false
// when there is none, and a restore Prepare did not finish is an error.
func ReadPrepared(dataDir string) (p Prepared, ok bool, err error) {
	path := filepath.Join(dataDir, PreparedDir, preparedFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(filepath.Dir(path)); serr == nil {
			return p, false, fmt.Errorf("backup: %s holds a restore that was not fully prepared (no %s); remove it and prepare the restore again", filepath.Dir(path), preparedFile)
		}
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("backup: read the prepared restore: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, false, fmt.Errorf("backup: %w: %s: %v", ErrCorrupt, path, err)
	}
	if err := ValidID(p.Backup); err != nil {
		return p, false, fmt.Errorf("backup: %w: %s: %v", ErrCorrupt, path, err)
	}
	// The staged copy is where the record is, wherever the data directory
	// was moved since.
	p.Location = filepath.Join(dataDir, PreparedDir)
	return p, true, nil
}
