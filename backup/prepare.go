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
	"slices"
	"time"

	"github.com/shale-db/shale/placement"
)

// Copy copies backup id from src into dst: every file it uses that dst
// does not hold already, DefaultCopyParallel at once, each checked against
// its size and CRC-32C as it is read (a damaged file fails the copy,
// wrapping ErrCorrupt, and is not stored), then its manifest, last. dst is
// locked while it runs; a copy that fails leaves the backup incomplete in
// dst.
func Copy(ctx context.Context, src *Location, id string, dst *Location, progress func(VerifyProgress)) (*Manifest, error) {
	m, err := src.Describe(ctx, id)
	if err != nil {
		return nil, err
	}
	parts := make([]*Part, len(m.Shards))
	for i := range m.Shards {
		parts[i] = &m.Shards[i]
	}
	info := map[string]any{"id": id, "cluster": m.ClusterID, "copied_from": src.String(), "started": time.Now().UTC()}
	if _, err := copyBackup(ctx, src, id, m, parts, dst, info, false, DefaultCopyParallel, progress); err != nil {
		return nil, err
	}
	return m, nil
}

// copyBackup copies the files of parts, parts of backup id whose manifest,
// read from src, is m, into dst, atOnce at once, then the manifest, whole;
// the files dst holds already are not copied again, and reused counts
// them. A copy marks the backup begun in dst first (with info), unless
// again is set and dst holds the backup's begun copy already (a copy cut
// short that this one finishes).
func copyBackup(ctx context.Context, src *Location, id string, m *Manifest, parts []*Part, dst *Location, info map[string]any, again bool, atOnce int, progress func(VerifyProgress)) (reused VerifyProgress, err error) {
	unlock, err := dst.lock(ctx, "copy "+id)
	if err != nil {
		return reused, err
	}
	defer unlock()
	begun := false
	if again {
		if begun, err = dst.Exists(ctx, id); err != nil {
			return reused, fmt.Errorf("backup: %w", err)
		}
	}
	if !begun {
		if err := dst.begin(ctx, id, info); err != nil {
			return reused, err
		}
	}
	stored, err := dst.storedFiles(ctx)
	if err != nil {
		return reused, err
	}
	var total VerifyProgress
	var todo []fileCopy
	for _, p := range parts {
		for _, f := range p.stored() {
			total.Files++
			total.Bytes += int64(f.Size)
			if stored[f.Path] {
				reused.Files++
				reused.Bytes += int64(f.Size)
				continue
			}
			// A file two parts share (none do) is copied once.
			stored[f.Path] = true
			todo = append(todo, fileCopy{f: f, shard: p.ShardID, to: dst.st, name: f.Path})
		}
	}
	total.FilesDone, total.BytesDone = reused.Files, reused.Bytes
	if progress != nil {
		progress(total)
	}
	err = src.copyFiles(ctx, todo, atOnce, func(f File) {
		total.FilesDone++
		total.BytesDone += int64(f.Size)
		if progress != nil {
			progress(total)
		}
	})
	if err != nil {
		return reused, fmt.Errorf("backup: copy %s: %w", id, err)
	}
	b, err := encodeManifest(m)
	if err != nil {
		return reused, fmt.Errorf("backup: encode the manifest: %w", err)
	}
	if err := dst.st.put(ctx, manifestName(id), bytes.NewReader(b), int64(len(b))); err != nil {
		return reused, fmt.Errorf("backup: write the manifest: %w", err)
	}
	return reused, nil
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
// puts the parts of a backup the node hosts, for it to found its cluster
// from.
const PreparedDir = "restore"

// preparedFile, in PreparedDir, records what to restore; it is written
// last.
const preparedFile = "restore.json"

// Prepared is a restore that Prepare staged in a data directory.
type Prepared struct {
	// Location is the staged copy (dataDir/restore): a location holding
	// the backup's manifest and the files of the parts the node hosts.
	Location string `json:"location"`
	// Backup is the backup's ID; From, where it was copied from.
	Backup string `json:"backup"`
	From   string `json:"from"`
	// AsOf, when set, restores the data as of that time.
	AsOf time.Time `json:"as_of,omitzero"`
	// NodeID, Nodes and ReplicationFactor are the founding cluster the
	// restore was prepared for: this node's ID, every founding node's ID
	// and the replicas per shard. Parts are the backup's shards (their
	// IDs in the backup) whose parts were staged: those the node hosts
	// there (Manifest.PartsHostedBy). NodeID is 0 in a restore staged
	// whole by an earlier version, which holds every part.
	NodeID            uint64   `json:"node_id,omitempty"`
	Nodes             []uint64 `json:"nodes,omitempty"`
	ReplicationFactor int      `json:"replication_factor,omitempty"`
	Parts             []uint64 `json:"parts"`
}

// Holds reports whether the restore staged part.
func (p *Prepared) Holds(part *Part) bool {
	return p.NodeID == 0 || slices.Contains(p.Parts, part.ShardID)
}

// PartsHostedBy returns the user parts (in key order) whose shards node
// hosts when the founding nodes nodes found a cluster from the backup with
// replicationFactor replicas per shard: the restored cluster's initial
// shards are the backup's user shards, placed as every new cluster's are
// (placement.FoundingReplicas). The backed-up cluster's placement (each
// part's Descriptor and NodeID) plays no part; the system shard is not
// restored (a restore makes a new one).
func (m *Manifest) PartsHostedBy(node uint64, nodes []uint64, replicationFactor int) []*Part {
	var out []*Part
	k := 0
	for i := range m.Shards {
		p := &m.Shards[i]
		if p.System {
			continue
		}
		if slices.Contains(placement.FoundingReplicas(nodes, replicationFactor, k), node) {
			out = append(out, p)
		}
		k++
	}
	return out
}

// PrepareOptions say what Prepare stages, and how.
type PrepareOptions struct {
	// AsOf, when set, restores the data as of that time; it is checked
	// against every part.
	AsOf time.Time
	// NodeID is the founding node whose data directory is prepared;
	// Nodes, every founding node's ID (shale-server --initial-cluster);
	// ReplicationFactor, the replicas per shard (default 3). Only the
	// parts of the shards NodeID hosts are staged.
	NodeID            uint64
	Nodes             []uint64
	ReplicationFactor int
	// Parallel is how many files are copied at once (default
	// DefaultCopyParallel).
	Parallel int
	// Progress, when set, is called as files are copied, one call at a
	// time; the files an unfinished Prepare had staged already count as
	// done from the first call.
	Progress func(VerifyProgress)
}

// PrepareResult says what Prepare staged.
type PrepareResult struct {
	Manifest *Manifest
	Prepared Prepared
	// Staged counts the files and bytes of the parts staged (Files,
	// Bytes), of which Reused were staged already by a Prepare that did
	// not finish.
	Staged VerifyProgress
	Reused VerifyProgress
}

// Prepare stages backup id of src in the data directory dataDir of the
// founding node o.NodeID, so that shale-server started on it as that
// founding node (--node-id, --initial-cluster) founds its cluster from the
// backup, as of o.AsOf when it is set. It copies the backup's manifest and
// the files of the parts of the shards the node hosts (PartsHostedBy),
// o.Parallel files at once, each checked against the manifest's size and
// CRC-32C as it is copied, written through the page cache to a temporary
// name, synced and renamed into place. Before anything is written it
// checks the time against every part and the node against the founding
// nodes, so a restore that would not found is refused with nothing
// touched.
//
// dataDir must be missing, empty, or hold only a Prepare that did not
// finish (a PreparedDir without its record): that one is continued, the
// files it staged under their final names (whole and checked) kept and the
// rest copied. A data directory that holds anything else is refused. The
// record of what to restore is written last: a Prepare that failed or was
// interrupted leaves nothing a server would act on, and what it staged for
// the next Prepare to continue.
func Prepare(ctx context.Context, src *Location, id string, dataDir string, o PrepareOptions) (*PrepareResult, error) {
	if o.ReplicationFactor == 0 {
		o.ReplicationFactor = 3
	}
	if o.Parallel <= 0 {
		o.Parallel = DefaultCopyParallel
	}
	m, err := src.Describe(ctx, id)
	if err != nil {
		return nil, err
	}
	if !o.AsOf.IsZero() {
		for i := range m.Shards {
			if p := &m.Shards[i]; !p.System {
				if err := p.CheckAsOf(id, o.AsOf); err != nil {
					return nil, fmt.Errorf("backup: %w", err)
				}
			}
		}
	}
	nodes := slices.Sorted(slices.Values(o.Nodes))
	if !slices.Contains(nodes, o.NodeID) {
		return nil, fmt.Errorf("backup: node %d is not one of the founding nodes %v: a restore is prepared for a founding node, by its ID in --initial-cluster", o.NodeID, nodes)
	}
	if o.ReplicationFactor < 1 {
		return nil, fmt.Errorf("backup: replication factor %d: want 1 or more", o.ReplicationFactor)
	}
	again, err := unfinishedPrepare(dataDir)
	if err != nil {
		return nil, err
	}
	parts := m.PartsHostedBy(o.NodeID, nodes, o.ReplicationFactor)
	rec := Prepared{Location: filepath.Join(dataDir, PreparedDir), Backup: id, From: src.String(), AsOf: o.AsOf,
		NodeID: o.NodeID, Nodes: nodes, ReplicationFactor: o.ReplicationFactor, Parts: []uint64{}}
	for _, p := range parts {
		rec.Parts = append(rec.Parts, p.ShardID)
	}
	dst, err := Open(ctx, rec.Location, true)
	if err != nil {
		return nil, err
	}
	if d, ok := dst.st.(*dirStore); ok {
		// The node links the staged files into its shards and opens them
		// at its start.
		d.readSoon = true
	}
	info := map[string]any{"id": id, "cluster": m.ClusterID, "copied_from": src.String(), "started": time.Now().UTC(),
		"node_id": o.NodeID, "nodes": nodes, "replication_factor": o.ReplicationFactor}
	reused, err := copyBackup(ctx, src, id, m, parts, dst, info, again, o.Parallel, o.Progress)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := dst.st.put(ctx, preparedFile, bytes.NewReader(b), int64(len(b))); err != nil {
		return nil, fmt.Errorf("backup: record the prepared restore: %w", err)
	}
	res := &PrepareResult{Manifest: m, Prepared: rec, Reused: reused}
	for _, p := range parts {
		res.Staged.Files += len(p.stored())
		res.Staged.Bytes += int64(p.Bytes())
	}
	res.Staged.FilesDone, res.Staged.BytesDone = res.Staged.Files, res.Staged.Bytes
	return res, nil
}

// unfinishedPrepare checks that dataDir can be prepared: it is missing or
// empty (false), or holds nothing but a Prepare that did not finish
// (true). Anything else is an error that says what dataDir holds.
func unfinishedPrepare(dataDir string) (bool, error) {
	ents, err := os.ReadDir(dataDir)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(ents) == 0) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("backup: data directory %s: %w", dataDir, err)
	}
	if len(ents) == 1 && ents[0].Name() == PreparedDir && ents[0].IsDir() {
		p, ok, err := ReadPrepared(dataDir)
		if ok {
			return false, fmt.Errorf("backup: %s already holds a prepared restore of backup %s (from %s): start shale-server on it, or remove %s to prepare it again",
				dataDir, p.Backup, p.From, p.Location)
		}
		if err != nil && !errors.Is(err, errUnfinished) {
			return false, err
		}
		return true, nil
	}
	return false, fmt.Errorf("backup: data directory %s is not empty: a restore is prepared in a new node's data directory", dataDir)
}

// errUnfinished is wrapped by ReadPrepared's error about a PreparedDir
// without its record.
var errUnfinished = errors.New("a restore that was not fully prepared")

// ReadPrepared returns the restore Prepare staged in dataDir; ok is false
// when there is none, and a restore Prepare did not finish is an error.
func ReadPrepared(dataDir string) (p Prepared, ok bool, err error) {
	path := filepath.Join(dataDir, PreparedDir, preparedFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(filepath.Dir(path)); serr == nil {
			return p, false, fmt.Errorf("backup: %s holds %w (no %s): run shalectl restore again to finish it, or remove it", filepath.Dir(path), errUnfinished, preparedFile)
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
