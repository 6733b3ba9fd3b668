package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Location is where backups are kept: a directory (local or mounted) or a
// prefix of an S3 bucket.
type Location struct {
	st store
}

// Open returns the location where names: a directory path, or an S3 URL,
// s3://BUCKET[/PREFIX][?endpoint=URL][&region=REGION] (credentials from
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the AWS credentials file or
// the instance's role; the endpoint and region also from AWS_ENDPOINT_URL
// and AWS_REGION). A directory must exist unless create is set, in which
// case it is created; a bucket must exist.
func Open(ctx context.Context, where string, create bool) (*Location, error) {
	return open(ctx, where, create, nil)
}

// open is Open, with S3 requests signed with creds when it is set.
func open(ctx context.Context, where string, create bool, creds *S3Credentials) (*Location, error) {
	if where == "" {
		return nil, errors.New("backup: no location given")
	}
	if strings.HasPrefix(where, "s3://") {
		u, err := url.Parse(where)
		if err != nil {
			return nil, fmt.Errorf("backup: location %q: %w", where, err)
		}
		st, err := openS3(ctx, where, u, creds)
		if err != nil {
			return nil, err
		}
		return &Location{st: st}, nil
	}
	if i := strings.Index(where, "://"); i > 0 && !strings.ContainsAny(where[:i], "/.") {
		return nil, fmt.Errorf("backup: location %s: unknown scheme %q (a directory path or s3://BUCKET/PREFIX)", where, where[:i])
	}
	st, err := openDir(where, create)
	if err != nil {
		return nil, err
	}
	return &Location{st: st}, nil
}

// String names the location as Open accepts it: the directory, or the
// s3:// URL with the endpoint and region it was given.
func (l *Location) String() string { return l.st.String() }

// Close releases what the location holds between requests: an S3
// location's idle connections, which a long-lived process (a node writing
// a backup's parts, one location per shard) would otherwise keep until
// they time out. The location still works after Close; using it again
// opens new connections.
func (l *Location) Close() { l.st.close() }

func backupPrefix(id string) string { return "backups/" + id + "/" }

func manifestName(id string) string { return backupPrefix(id) + "manifest.json" }

// startedName marks a backup begun: it is written, exclusively, before
// any of the backup's files, and makes a backup without a manifest
// incomplete rather than absent.
func startedName(id string) string { return backupPrefix(id) + "started.json" }

// begin marks backup id begun in the location (startedName, with info),
// unless it holds a backup id already. info's "token" is what CheckStarted
// compares.
func (l *Location) begin(ctx context.Context, id string, info map[string]any) error {
	b, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := l.st.create(ctx, startedName(id), b); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("backup: %s already holds a backup %s", l, id)
		}
		return fmt.Errorf("backup: %w", err)
	}
	return nil
}

const lockName = "lock"

// lockInfo is the lock file's contents.
type lockInfo struct {
	Op    string    `json:"op"`
	PID   int       `json:"pid"`
	Host  string    `json:"host"`
	Since time.Time `json:"since"`
}

// lock takes the location's lock for op: one backup is written or deleted
// at a time. A lock left by a process that died on this host (its host
// name is this one's and no process has its PID) is taken over; one left
// from another host must be removed by hand, and the error says where it
// is. Once it holds the lock, lock removes what killed writers left in the
// location (the store's clean: temporary files, incomplete multipart
// uploads): with the lock held, no writer is at work there.
func (l *Location) lock(ctx context.Context, op string) (unlock func(), err error) {
	host, _ := os.Hostname()
	b, _ := json.Marshal(lockInfo{Op: op, PID: os.Getpid(), Host: host, Since: time.Now().UTC()})
	err = l.st.create(ctx, lockName, b)
	if errors.Is(err, fs.ErrExist) {
		var held lockInfo
		held, err = l.breakDeadLock(ctx, host)
		if err == nil {
			err = l.st.create(ctx, lockName, b)
		}
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("backup: location %s is locked by %q (pid %d on %s since %s); if no backup runs there, remove %s",
				l, held.Op, held.PID, held.Host, held.Since.Format(time.RFC3339), l.st.where(lockName))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("backup: lock %s: %w", l, err)
	}
	unlock = func() {
		// The lock goes even when the caller's context is done.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = l.st.remove(ctx, lockName)
	}
	if err := l.st.clean(ctx); err != nil {
		unlock()
		return nil, fmt.Errorf("backup: %s: remove what an earlier writer left: %w", l, err)
	}
	return unlock, nil
}

// breakDeadLock removes the location's lock when a process on this host
// (host) that no longer runs left it, and returns the lock it found (the
// zero lockInfo when it could not read it). Only processes on the lock's
// host can tell that its process died, so a host-local file lock
// (lockBreakFile) makes them break it one at a time, and each removes the
// lock only if it still reads what it judged dead: a second breaker never
// removes the lock the first took in its place.
func (l *Location) breakDeadLock(ctx context.Context, host string) (lockInfo, error) {
	var held lockInfo
	read := func() []byte {
		r, err := l.st.open(ctx, lockName)
		if err != nil {
			return nil
		}
		defer r.Close()
		b, _ := io.ReadAll(io.LimitReader(r, 1<<16))
		return b
	}
	first := read()
	if json.Unmarshal(first, &held) != nil || host == "" || held.Host != host || held.PID <= 0 || held.PID == os.Getpid() || !processGone(held.PID) {
		return held, fs.ErrExist
	}
	release, ok := hostLock(filepath.Join(os.TempDir(), lockBreakFile))
	if !ok {
		return held, fs.ErrExist // another process is breaking a lock on this host
	}
	defer release()
	if !bytes.Equal(read(), first) {
		return held, fs.ErrExist
	}
	if err := l.st.remove(ctx, lockName); err != nil {
		return held, err
	}
	return held, nil
}

// lockBreakFile names the file in the host's temporary directory that
// breakDeadLock holds while it breaks a location's lock.
const lockBreakFile = "shale-backup-lock-break"

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
func (l *Location) List(ctx context.Context) ([]Entry, error) {
	objs, err := l.st.list(ctx, "backups/")
	if err != nil {
		return nil, fmt.Errorf("backup: list %s: %w", l, err)
	}
	var out []Entry
	seen := map[string]bool{}
	for _, o := range objs {
		id, _, ok := strings.Cut(strings.TrimPrefix(o.name, "backups/"), "/")
		if !ok || seen[id] || ValidID(id) != nil {
			continue
		}
		seen[id] = true
		m, err := l.Describe(ctx, id)
		switch {
		case err == nil:
			out = append(out, Entry{ID: id, State: Complete, Manifest: m})
		case errors.Is(err, fs.ErrNotExist):
			out = append(out, Entry{ID: id, State: Incomplete})
		default:
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			out = append(out, Entry{ID: id, State: Corrupt, Err: err})
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

// Exists reports whether backup id is in the location, complete or not.
func (l *Location) Exists(ctx context.Context, id string) (bool, error) {
	objs, err := l.st.list(ctx, backupPrefix(id))
	return len(objs) > 0, err
}

// Describe reads backup id's manifest. A backup without one gives an error
// wrapping fs.ErrNotExist; a manifest that does not read back intact, one
// wrapping ErrCorrupt.
func (l *Location) Describe(ctx context.Context, id string) (*Manifest, error) {
	if err := ValidID(id); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	b, err := l.readAll(ctx, manifestName(id), maxManifestBytes)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if ok, lerr := l.Exists(ctx, id); lerr == nil && ok {
				return nil, fmt.Errorf("backup: %s is incomplete (no manifest): it is being written, or failed: %w", id, err)
			}
			return nil, fmt.Errorf("backup: no backup %s in %s: %w", id, l, err)
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

// maxManifestBytes bounds the manifest read back.
const maxManifestBytes = 1 << 30

// readAll reads object name whole, refusing one over limit bytes.
func (l *Location) readAll(ctx context.Context, name string, limit int64) ([]byte, error) {
	r, err := l.st.open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrCorrupt, name, limit)
	}
	return b, nil
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
func (l *Location) Delete(ctx context.Context, id string) (DeleteResult, error) {
	if err := ValidID(id); err != nil {
		return DeleteResult{}, fmt.Errorf("backup: %w", err)
	}
	objs, err := l.st.list(ctx, backupPrefix(id))
	if err != nil {
		return DeleteResult{}, fmt.Errorf("backup: delete %s: %w", id, err)
	}
	if len(objs) == 0 {
		return DeleteResult{}, fmt.Errorf("backup: no backup %s in %s: %w", id, l, fs.ErrNotExist)
	}
	unlock, err := l.lock(ctx, "delete "+id)
	if err != nil {
		return DeleteResult{}, err
	}
	defer unlock()
	// The manifest goes first: a backup half-deleted is incomplete, never
	// taken for complete.
	if err := l.st.remove(ctx, manifestName(id)); err != nil {
		return DeleteResult{}, fmt.Errorf("backup: delete %s: %w", id, err)
	}
	for _, o := range objs {
		if err := l.st.remove(ctx, o.name); err != nil {
			return DeleteResult{}, fmt.Errorf("backup: delete %s: %w", id, err)
		}
	}
	return l.collect(ctx)
}

// collect removes the stored files no complete backup uses. The caller
// holds the lock.
func (l *Location) collect(ctx context.Context) (DeleteResult, error) {
	var res DeleteResult
	entries, err := l.List(ctx)
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
	objs, err := l.st.list(ctx, "files/")
	if err != nil {
		return res, fmt.Errorf("backup: remove unused files: %w", err)
	}
	for _, o := range objs {
		if used[o.name] {
			continue
		}
		if err := l.st.remove(ctx, o.name); err != nil {
			return res, fmt.Errorf("backup: remove unused file %s: %w", o.name, err)
		}
		res.FilesRemoved++
		res.BytesRemoved += o.size
	}
	return res, nil
}
