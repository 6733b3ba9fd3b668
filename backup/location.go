package backup

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Location is a directory holding backups.
type Location struct {
	dir string
}

// Open returns the location at dir. It must exist unless create is set, in
// which case it is created.
func Open(dir string, create bool) (*Location, error) {
	if dir == "" {
		return nil, errors.New("backup: no location given")
	}
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
	return &Location{dir: dir}, nil
}

// Dir is the location's directory.
func (l *Location) Dir() string { return l.dir }

func (l *Location) backupDir(id string) string { return filepath.Join(l.dir, "backups", id) }

func (l *Location) manifestPath(id string) string {
	return filepath.Join(l.backupDir(id), "manifest.json")
}

// lockInfo is the lock file's contents.
type lockInfo struct {
	Op    string    `json:"op"`
	PID   int       `json:"pid"`
	Host  string    `json:"host"`
	Since time.Time `json:"since"`
}

// lock takes the location's lock for op: one backup is written or deleted
// at a time. A lock left by a process that died must be removed by hand;
// the error says where it is.
func (l *Location) lock(op string) (unlock func(), err error) {
	path := filepath.Join(l.dir, "lock")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			var held lockInfo
			b, _ := os.ReadFile(path)
			_ = json.Unmarshal(b, &held)
			return nil, fmt.Errorf("backup: location %s is locked by %q (pid %d on %s since %s); if no backup runs there, remove %s",
				l.dir, held.Op, held.PID, held.Host, held.Since.Format(time.RFC3339), path)
		}
		return nil, fmt.Errorf("backup: lock %s: %w", l.dir, err)
	}
	host, _ := os.Hostname()
	b, _ := json.Marshal(lockInfo{Op: op, PID: os.Getpid(), Host: host, Since: time.Now().UTC()})
	_, werr := f.Write(b)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("backup: lock %s: %w", l.dir, errors.Join(werr, cerr))
	}
	return func() { _ = os.Remove(path) }, nil
}

// State says whether a backup is usable.
type State string

// States of a backup in a location.
const (
	// Complete: the manifest is in place and reads back intact.
	Complete State = "complete"
	// Incomplete: no manifest (the backup is being written, or failed).
	Incomplete State = "incomplete"
	// Corrupt: the manifest does not read back (see Entry.Err).
	Corrupt State = "corrupt"
)

// Entry is one backup of a location, as List finds it.
type Entry struct {
	ID    string
	State State
	// Manifest is set when State is Complete.
	Manifest *Manifest
	// Err says why a backup is Corrupt.
	Err error
}

// List returns the location's backups, oldest first (by start time, then
// ID; incomplete and corrupt ones by ID after the complete ones).
func (l *Location) List() ([]Entry, error) {
	ents, err := os.ReadDir(filepath.Join(l.dir, "backups"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("backup: list %s: %w", l.dir, err)
	}
	var out []Entry
	for _, e := range ents {
		if !e.IsDir() || ValidID(e.Name()) != nil {
			continue
		}
		m, err := l.Describe(e.Name())
		switch {
		case err == nil:
			out = append(out, Entry{ID: e.Name(), State: Complete, Manifest: m})
		case errors.Is(err, fs.ErrNotExist):
			out = append(out, Entry{ID: e.Name(), State: Incomplete})
		default:
			out = append(out, Entry{ID: e.Name(), State: Corrupt, Err: err})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Manifest == nil) != (b.Manifest == nil) {
			return a.Manifest != nil
		}
		if a.Manifest != nil && !a.Manifest.Started.Equal(b.Manifest.Started) {
			return a.Manifest.Started.Before(b.Manifest.Started)
		}
		return a.ID < b.ID
	})
	return out, nil
}

// Describe reads backup id's manifest. A backup without one gives an error
// wrapping fs.ErrNotExist; a manifest that does not read back intact, one
// wrapping ErrCorrupt.
func (l *Location) Describe(id string) (*Manifest, error) {
	if err := ValidID(id); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	b, err := os.ReadFile(l.manifestPath(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(l.backupDir(id)); serr == nil {
				return nil, fmt.Errorf("backup: %s is incomplete (no manifest): it is being written, or failed: %w", id, err)
			}
			return nil, fmt.Errorf("backup: no backup %s in %s: %w", id, l.dir, err)
		}
		return nil, fmt.Errorf("backup: read the manifest of %s: %w", id, err)
	}
	m, err := DecodeManifest(b)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", id, err)
	}
	if m.ID != id {
		return nil, fmt.Errorf("backup %s: %w: its manifest names backup %s", id, ErrCorrupt, m.ID)
	}
	return m, nil
}

// DeleteResult says what Delete removed.
type DeleteResult struct {
	// FilesRemoved and BytesRemoved count the stored files no backup left
	// uses any more.
	FilesRemoved int
	BytesRemoved int64
}

// Delete removes backup id (complete or not), then every stored file that
// no complete backup left in the location uses. While any backup's
// manifest is corrupt, no stored file is removed (its files are not
// known).
func (l *Location) Delete(id string) (DeleteResult, error) {
	if err := ValidID(id); err != nil {
		return DeleteResult{}, fmt.Errorf("backup: %w", err)
	}
	if _, err := os.Stat(l.backupDir(id)); err != nil {
		return DeleteResult{}, fmt.Errorf("backup: no backup %s in %s: %w", id, l.dir, err)
	}
	unlock, err := l.lock("delete " + id)
	if err != nil {
		return DeleteResult{}, err
	}
	defer unlock()
	// The manifest goes first: a backup half-deleted is incomplete, never
	// taken for complete.
	if err := os.Remove(l.manifestPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return DeleteResult{}, fmt.Errorf("backup: delete %s: %w", id, err)
	}
	if err := syncDir(l.backupDir(id)); err != nil {
		return DeleteResult{}, fmt.Errorf("backup: delete %s: %w", id, err)
	}
	if err := os.RemoveAll(l.backupDir(id)); err != nil {
		return DeleteResult{}, fmt.Errorf("backup: delete %s: %w", id, err)
	}
	return l.collect()
}

// collect removes the stored files no complete backup uses. The caller
// holds the lock.
func (l *Location) collect() (DeleteResult, error) {
	var res DeleteResult
	entries, err := l.List()
	if err != nil {
		return res, err
	}
	used := map[string]bool{}
	for _, e := range entries {
		if e.State == Corrupt {
			return res, fmt.Errorf("backup: stored files kept: backup %s is corrupt (%v), so the files it uses are not known", e.ID, e.Err)
		}
		if e.Manifest == nil {
			continue
		}
		for _, p := range e.Manifest.Shards {
			for _, f := range p.stored() {
				used[f.Path] = true
			}
		}
	}
	root := filepath.Join(l.dir, "files")
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path == root {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(l.dir, path)
		if err != nil {
			return err
		}
		if used[filepath.ToSlash(rel)] {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.Remove(path); err != nil {
			return err
		}
		res.FilesRemoved++
		res.BytesRemoved += info.Size()
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("backup: remove unused files: %w", err)
	}
	return res, nil
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

// writeFileAtomic writes b to path through a synced temporary file renamed
// into place, then syncs the directory.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

// isTemp reports whether a stored file's name is a temporary one.
func isTemp(name string) bool { return strings.HasPrefix(name, ".tmp-") }
