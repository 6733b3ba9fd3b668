package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shale-db/shale/backup"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/storage"
)

// errReplayDone stops a replay at the first entry after the restore's
// point in time.
var errReplayDone = errors.New("replay reached the restore's point in time")

// restorePlan is what a founding node restores: the backup's user parts,
// by start key.
type restorePlan struct {
	loc      *backup.Location
	manifest *backup.Manifest
	parts    map[string]*backup.Part
}

// planRestore reads the backup Config.RestoreFrom/RestoreBackup names and
// sets the initial splits to its user shards' boundaries, so that every
// founding node makes the same shards.
func (n *Node) planRestore() (*restorePlan, error) {
	loc, err := backup.Open(n.cfg.RestoreFrom, false)
	if err != nil {
		return nil, fmt.Errorf("server: restore: %w", err)
	}
	m, err := loc.Describe(n.cfg.RestoreBackup)
	if err != nil {
		return nil, fmt.Errorf("server: restore: %w", err)
	}
	p := &restorePlan{loc: loc, manifest: m, parts: map[string]*backup.Part{}}
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

// restoreShards builds this node's replicas of the user shards in descs
// from the plan's parts: every part's files are copied into the node's
// staging directory and checked first, then each replica is created from
// its copy.
func (n *Node) restoreShards(ctx context.Context, p *restorePlan, descs []*shalev1.ShardDescriptor) (map[uint64]*shard.Shard, error) {
	staged := map[uint64]string{}
	defer func() {
		for _, dir := range staged {
			_ = os.RemoveAll(dir)
		}
	}()
	asOf := n.cfg.RestoreAsOf
	for _, d := range descs {
		part := p.parts[string(d.GetStartKey())]
		if part == nil || string(part.End) != string(d.GetEndKey()) {
			return nil, fmt.Errorf("server: restore: no part of backup %s covers shard %d [%q, %q)", p.manifest.ID, d.GetShardId(), d.GetStartKey(), d.GetEndKey())
		}
		if !asOf.IsZero() {
			if part.Date.After(asOf) {
				return nil, fmt.Errorf("server: restore as of %s: backup %s copied shard %d [%q, %q) at %s, later; restore from an earlier backup",
					asOf.Format(time.RFC3339Nano), p.manifest.ID, part.ShardID, part.Start, part.End, part.Date.Time().Format(time.RFC3339Nano))
			}
			if asOf.After(part.Until) {
				return nil, fmt.Errorf("server: restore as of %s: backup %s holds shard %d [%q, %q) only until %s; take an incremental backup after that time",
					asOf.Format(time.RFC3339Nano), p.manifest.ID, part.ShardID, part.Start, part.End, part.Until.Format(time.RFC3339Nano))
			}
		}
		dir := filepath.Join(n.cfg.DataDir, "snapshots", "in", fmt.Sprintf("restore-%d", d.GetShardId()))
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return nil, err
		}
		if err := p.loc.CopyPart(ctx, part, dir); err != nil {
			return nil, fmt.Errorf("server: restore from backup %s: %w", p.manifest.ID, err)
		}
		if err := p.loc.CheckLog(part); err != nil {
			return nil, fmt.Errorf("server: restore from backup %s: %w", p.manifest.ID, err)
		}
		staged[d.GetShardId()] = dir
	}
	out := map[uint64]*shard.Shard{}
	for _, d := range descs {
		part := p.parts[string(d.GetStartKey())]
		replay := func(apply func(*shard.LoggedEntry) error) error {
			err := p.loc.ReadLog(part, func(e *shalev1.BackupLogEntry) error {
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
		s, err := shard.BootstrapFrom(n.shardDir(d.GetShardId()), staged[d.GetShardId()], replication.BootstrapState(d), n.shardOptions(), replay)
		if err != nil {
			// Leave no shard behind: founding again must find none.
			for id, s := range out {
				_ = s.Close()
				_ = os.RemoveAll(n.shardDir(id))
			}
			_ = os.RemoveAll(n.shardDir(d.GetShardId()))
			return nil, fmt.Errorf("server: restore shard %d: %w", d.GetShardId(), err)
		}
		delete(staged, d.GetShardId())
		out[d.GetShardId()] = s
		n.log.Info("shard restored from a backup", "shard", d.GetShardId(), "backup_shard", part.ShardID,
			"backup_index", part.AppliedIndex, "date", part.Date.Time(), "bytes", part.Bytes())
	}
	return out, nil
}
