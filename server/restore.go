package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/internal/parallel"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/storage"
)

// errReplayDone stops a replay at the first entry after the restore's
// point in time.
var errReplayDone = errors.New("replay reached the restore's point in time")

// usePreparedRestore makes a founding node whose data directory holds a
// restore staged by `shalectl restore` (backup.Prepare) found the cluster
// from it, as --restore-from would. A data directory that already holds a
// node ignores it (a node that founded the cluster removes it).
func (c *Config) usePreparedRestore() error {
	if c.DataDir == "" {
		return nil
	}
	if _, found, err := readMeta(c.DataDir); found || err != nil {
		return nil // Start reports a damaged identity file
	}
	p, ok, err := backup.ReadPrepared(c.DataDir)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if !ok {
		return nil
	}
	if c.RestoreFrom != "" {
		return fmt.Errorf("server: %s holds a prepared restore of backup %s, and --restore-from names another: give one or the other", c.DataDir, p.Backup)
	}
	if !c.RestoreAsOf.IsZero() {
		return fmt.Errorf("server: %s holds a prepared restore of backup %s: its time (--as-of) is given to shalectl restore, not --restore-as-of", c.DataDir, p.Backup)
	}
	c.RestoreFrom, c.RestoreBackup, c.RestoreAsOf = p.Location, p.Backup, p.AsOf
	c.preparedRestore = &p
	return nil
}

// restorePlan is what a founding node restores: the backup's user parts,
// by start key.
type restorePlan struct {
	loc      *backup.Location
	manifest *backup.Manifest
	parts    map[string]*backup.Part
	// prepared is the restore `shalectl restore` staged in the data
	// directory (loc is its staged copy); nil with --restore-from.
	prepared *backup.Prepared
}

// planRestore reads the backup Config.RestoreFrom/RestoreBackup names and
// sets the initial splits to its user shards' boundaries, so that every
// founding node makes the same shards.
func (n *Node) planRestore(ctx context.Context) (*restorePlan, error) {
	loc, err := backup.Open(ctx, n.cfg.RestoreFrom, false)
	if err != nil {
		return nil, fmt.Errorf("server: restore: %w", err)
	}
	m, err := loc.Describe(ctx, n.cfg.RestoreBackup)
	if err != nil {
		return nil, fmt.Errorf("server: restore: %w", err)
	}
	p := &restorePlan{loc: loc, manifest: m, parts: map[string]*backup.Part{}, prepared: n.cfg.preparedRestore}
	var splits [][]byte
	for i := range m.Shards {
		part := &m.Shards[i]
		if part.System {
			continue
		}
		if len(p.parts) > 0 {
			splits = append(splits, part.Start)
		} else if len(part.Start) != 0 {
			return nil, fmt.Errorf("server: restore: backup %s: %w: its first shard starts at %q", m.ID, backup.ErrCorrupt, part.Start)
		}
		p.parts[string(part.Start)] = part
	}
	if len(p.parts) == 0 {
		return nil, fmt.Errorf("server: restore: backup %s: %w: no user shard", m.ID, backup.ErrCorrupt)
	}
	n.cfg.InitialSplits = splits
	n.log.Info("founding the cluster from a backup", "location", n.cfg.RestoreFrom, "backup", m.ID,
		"backup_cluster", m.ClusterID, "shards", len(p.parts), "bytes", m.Bytes())
	return p, nil
}

// restoreParallel is how many parts a founding node copies from a backup
// and opens at once.
const restoreParallel = 4

// restoreShards builds this node's replicas of the user shards in descs
// from the plan's parts, restoreParallel parts at once, each as soon as its
// own files are in place: every file of the part is copied into the node's
// staging directory and checked (or, from a restore `shalectl restore`
// prepared, hard-linked there from the staged copy, checked when it was
// staged), the directory synced, and only then is the replica created from
// the copy with its log replayed. So one part's engine opens and replays
// while the next parts are still copying, and no engine ever opens a part
// whose copy did not finish. On an error no shard is left behind, and a
// prepared restore's staged copy is kept.
func (n *Node) restoreShards(ctx context.Context, p *restorePlan, descs []*shalev1.ShardDescriptor) (map[uint64]*shard.Shard, error) {
	start := time.Now()
	staged := map[uint64]string{}
	defer func() {
		for _, dir := range staged {
			_ = os.RemoveAll(dir)
		}
	}()
	asOf := n.cfg.RestoreAsOf
	parts := make([]*backup.Part, len(descs))
	dirs := make([]string, len(descs))
	for i, d := range descs {
		part := p.parts[string(d.GetStartKey())]
		if part == nil || string(part.End) != string(d.GetEndKey()) {
			return nil, fmt.Errorf("server: restore: no part of backup %s covers shard %d [%q, %q)", p.manifest.ID, d.GetShardId(), d.GetStartKey(), d.GetEndKey())
		}
		if !asOf.IsZero() {
			if err := part.CheckAsOf(p.manifest.ID, asOf); err != nil {
				return nil, fmt.Errorf("server: %w", err)
			}
		}
		if p.prepared != nil && !p.prepared.Holds(part) {
			return nil, n.notPreparedHere(p.prepared, d, part)
		}
		dir := filepath.Join(n.cfg.DataDir, "snapshots", "in", fmt.Sprintf("restore-%d", d.GetShardId()))
		if err := os.RemoveAll(dir); err != nil {
			return nil, fmt.Errorf("server: restore shard %d: clear %s: %w", d.GetShardId(), dir, err)
		}
		parts[i], dirs[i] = part, dir
		staged[d.GetShardId()] = dir
	}
	if len(dirs) > 0 {
		if err := os.MkdirAll(filepath.Dir(dirs[0]), 0o755); err != nil {
			return nil, fmt.Errorf("server: restore: %w", err)
		}
	}
	place, how := p.loc.CopyParts, "restore: parts copied"
	if p.prepared != nil {
		place, how = p.loc.LinkParts, "restore: parts linked from the prepared restore"
	}
	var placed, copying, opening atomic.Int64 // bytes; nanoseconds summed over the parts
	// About restoreParallel files in flight in all: a node with fewer
	// parts copies each part's files several at once.
	filesAtOnce := max(1, restoreParallel/max(1, len(descs)))
	opened := make([]*shard.Shard, len(descs))
	err := parallel.ForEach(ctx, restoreParallel, len(descs), func(ctx context.Context, i int) error {
		d, part := descs[i], parts[i]
		copyStart := time.Now()
		if err := place(ctx, parts[i:i+1], dirs[i:i+1], filesAtOnce); err != nil {
			return fmt.Errorf("server: restore from backup %s: %w", p.manifest.ID, err)
		}
		var bytes uint64
		for _, f := range part.Files {
			bytes += f.Size
		}
		took := time.Since(copyStart)
		placed.Add(int64(bytes))
		copying.Add(int64(took))
		n.log.Info(how, "shard", d.GetShardId(), "parts", 1, "bytes", bytes, "took", took)
		openStart := time.Now()
		s, err := shard.BootstrapFrom(n.shardDir(d.GetShardId()), dirs[i], replication.BootstrapState(d), n.shardOptions(), p.replay(ctx, d, asOf))
		if err != nil {
			return fmt.Errorf("server: restore shard %d: %w", d.GetShardId(), err)
		}
		opened[i] = s
		opening.Add(int64(time.Since(openStart)))
		n.log.Info("shard restored from a backup", "shard", d.GetShardId(), "backup_shard", part.ShardID,
			"backup_index", part.AppliedIndex, "date", part.Date.Time(), "bytes", part.Bytes(), "took", time.Since(openStart))
		return nil
	})
	if err != nil {
		// Leave no shard behind: founding again must find none.
		for i, d := range descs {
			if opened[i] != nil {
				_ = opened[i].Close()
			}
			_ = os.RemoveAll(n.shardDir(d.GetShardId()))
		}
		return nil, err
	}
	out := map[uint64]*shard.Shard{}
	for i, d := range descs {
		delete(staged, d.GetShardId())
		out[d.GetShardId()] = opened[i]
	}
	took := time.Since(start)
	n.log.Info("restore: done", "shards", len(descs), "took", took,
		"bytes", placed.Load(), "linked", p.prepared != nil, "mb_per_s", float64(placed.Load())/1e6/took.Seconds(),
		"copying_summed", time.Duration(copying.Load()), "opening_summed", time.Duration(opening.Load()))
	return out, nil
}

// notPreparedHere is the error of a node whose founding placement hosts
// shard d (the backup's part) while the restore prepared in its data
// directory does not hold that part: it was prepared for another node, or
// another cluster shape.
func (n *Node) notPreparedHere(p *backup.Prepared, d *shalev1.ShardDescriptor, part *backup.Part) error {
	ids := make([]uint64, 0, len(n.cfg.InitialCluster))
	for id := range n.cfg.InitialCluster {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return fmt.Errorf("server: %s was prepared for node %d of the founding nodes %v with %d replicas per shard, and holds no copy of backup %s's shard %d [%q, %q), which node %d of %v with %d replicas hosts (shard %d): prepare it again with shalectl restore %s --node-id %d --initial-cluster (the same as this node's) --replication-factor %d",
		p.Location, p.NodeID, p.Nodes, p.ReplicationFactor, p.Backup, part.ShardID, part.Start, part.End,
		n.cfg.NodeID, ids, n.cfg.ReplicationFactor, d.GetShardId(), p.Backup, n.cfg.NodeID, n.cfg.ReplicationFactor)
}

// replay is the log replay of shard d's part for shard.BootstrapFrom: the
// part's logged entries in order, up to asOf when it is set.
func (p *restorePlan) replay(ctx context.Context, d *shalev1.ShardDescriptor, asOf time.Time) func(apply func(*shard.LoggedEntry) error) error {
	part := p.parts[string(d.GetStartKey())]
	return func(apply func(*shard.LoggedEntry) error) error {
		err := p.loc.ReadLog(ctx, part, func(e *shalev1.BackupLogEntry) error {
			if !asOf.IsZero() && e.GetHlc().GetWallNanos() > asOf.UnixNano() {
				return errReplayDone
			}
			le := &shard.LoggedEntry{
				Mark:  shard.EntryMark{ShardID: d.GetShardId(), Index: e.GetIndex(), Term: e.GetTerm(), Revision: e.GetRevision(), HLC: replication.HLCFromProto(e.GetHlc())},
				Range: e.GetRange(),
			}
			for _, op := range e.GetOps() {
				le.Ops = append(le.Ops, shard.LoggedOp{Kind: storage.Kind(op.GetKind()), Key: op.GetKey(), Value: op.GetValue()})
			}
			return apply(le)
		})
		if errors.Is(err, errReplayDone) {
			return nil
		}
		return err
	}
}
