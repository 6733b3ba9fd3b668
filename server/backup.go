package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/backup"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/replication/snapshot"
	"github.com/shale-db/shale/server/shard"
)

// caughtUpShard returns the local replica of shard id once it has applied
// every entry committed before the call (a read barrier through the
// leader, as a linearizable read on a follower): what a backup copies from
// it then holds every write acknowledged before the backup asked, even from
// a follower that lagged.
func (n *Node) caughtUpShard(ctx context.Context, id uint64) (*shard.Shard, error) {
	sm, err := n.localShard(id)
	if err != nil {
		return nil, err
	}
	r := n.store.Replica(id)
	if r == nil {
		return nil, n.shardNotFoundErr(id)
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
	defer cancel()
	if err := r.ReadIndex(ctx); err != nil {
		return nil, status.Errorf(codes.Unavailable, "node %d: shard %d: could not catch up with the shard's leader: %v", n.cfg.NodeID, id, err)
	}
	return sm, nil
}

// backupCheckpointDir is a checkpoint of a node's own replica for a backup,
// in the node's snapshot directory (hard-linked) until remove.
type backupCheckpointDir struct {
	dir     string
	hdr     *shalev1.SnapshotHeader // without its files
	lengths map[string]int64        // files taken as their first bytes
	applied uint64
	took    time.Duration
}

// checkpointForBackup takes a checkpoint of the node's replica of shard id
// once it has caught up with the shard's leader (caughtUpShard). The
// caller removes it (remove) once done.
func (n *Node) checkpointForBackup(ctx context.Context, id uint64) (*backupCheckpointDir, error) {
	start := time.Now()
	sm, err := n.caughtUpShard(ctx, id)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(n.cfg.DataDir, "snapshots", "out", fmt.Sprintf("backup-%d-%d", id, time.Now().UnixNano()))
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "node %d: backup of shard %d: %v", n.cfg.NodeID, id, err)
	}
	ck := &backupCheckpointDir{dir: dir}
	applied, date, lengths, err := sm.BackupCheckpoint(dir)
	ck.took = time.Since(start)
	if err != nil {
		n.removeCheckpoint(ck)
		return nil, status.Errorf(codes.Unavailable, "node %d: checkpoint of shard %d: %v", n.cfg.NodeID, id, err)
	}
	msg, err := proto.Marshal(&raftpb.Message{
		Type: raftpb.MsgSnap.Enum(),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
			Index:     proto.Uint64(applied.Index),
			Term:      proto.Uint64(applied.Term),
			ConfState: applied.ConfState,
		}},
	})
	if err != nil {
		n.removeCheckpoint(ck)
		return nil, status.Errorf(codes.Internal, "node %d: backup of shard %d: %v", n.cfg.NodeID, id, err)
	}
	ck.lengths, ck.applied = lengths, applied.Index
	ck.hdr = &shalev1.SnapshotHeader{
		ClusterId:   n.clusterID,
		ShardId:     id,
		FromNodeId:  n.cfg.NodeID,
		RaftMessage: msg,
		Descriptor_: applied.Descriptor,
		Hlc:         replication.HLCToProto(date),
	}
	return ck, nil
}

// removeCheckpoint removes a checkpoint taken for a backup.
func (n *Node) removeCheckpoint(ck *backupCheckpointDir) {
	if err := os.RemoveAll(ck.dir); err != nil {
		n.log.Warn("backup: removing the checkpoint", "dir", ck.dir, "err", err)
	}
}

// BackupShard implements the Admin RPC for the receiving node's own replica
// (it is not forwarded: the caller picks the node). The checkpoint lives in
// the node's snapshot directory, hard-linked, only while the stream lasts.
func (s *adminService) BackupShard(req *shalev1.BackupShardRequest, stream shalev1.Admin_BackupShardServer) (err error) {
	n := s.n
	var sent int64
	defer func() { n.backupm.served(backupCheckpoint, sent, err) }()
	start := time.Now()
	ck, err := n.checkpointForBackup(stream.Context(), req.GetShardId())
	if err != nil {
		return err
	}
	defer n.removeCheckpoint(ck)
	skip := make(map[string]*shalev1.SnapshotFile, len(req.GetSkipFiles()))
	for _, f := range req.GetSkipFiles() {
		skip[f.GetName()] = f
	}
	sent, err = snapshot.Send(stream.Context(), stream, ck.hdr, ck.dir, snapshot.Options{
		Limiter: n.snapLimiter,
		Lengths: ck.lengths,
		Skip: func(f *shalev1.SnapshotFile) bool {
			h := skip[f.GetName()]
			return h != nil && h.GetSize() == f.GetSize() && h.GetCrc32C() == f.GetCrc32C()
		},
	})
	if err != nil {
		code := codes.Internal
		if stream.Context().Err() != nil {
			code = codes.Canceled
		}
		return status.Errorf(code, "node %d: backup of shard %d: %v", n.cfg.NodeID, req.GetShardId(), err)
	}
	n.log.Info("backup of a shard sent", "shard", req.GetShardId(), "index", ck.applied, "bytes", sent, "skipped_files", len(skip),
		"took", time.Since(start), "checkpoint_took", ck.took)
	return nil
}

// BackupShardTo implements the Admin RPC for the receiving node's own
// replica (not forwarded): the node writes its checkpoint into the backup
// location itself (backup.Location.StoreCheckpoint). The request's
// credentials sign the node's S3 requests and are neither logged nor kept.
func (s *adminService) BackupShardTo(ctx context.Context, req *shalev1.BackupShardToRequest) (_ *shalev1.BackupShardToResponse, err error) {
	n := s.n
	var wrote int64
	defer func() { n.backupm.served(backupCheckpoint, wrote, err) }()
	start := time.Now()
	id := req.GetShardId()
	var creds *backup.S3Credentials
	if c := req.GetS3Credentials(); c != nil {
		creds = &backup.S3Credentials{AccessKeyID: c.GetAccessKeyId(), SecretAccessKey: c.GetSecretAccessKey(), SessionToken: c.GetSessionToken()}
	}
	loc, err := backup.OpenWithCredentials(ctx, req.GetLocation(), creds)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "node %d: backup of shard %d: %v", n.cfg.NodeID, id, err)
	}
	// One location per shard's request: its connections go with it.
	defer loc.Close()
	if err := loc.CheckStarted(ctx, req.GetBackupId(), req.GetToken()); err != nil {
		code := codes.Unavailable
		if errors.Is(err, backup.ErrOtherLocation) {
			code = codes.FailedPrecondition
		}
		return nil, status.Errorf(code, "node %d: backup of shard %d: %v", n.cfg.NodeID, id, err)
	}
	ck, err := n.checkpointForBackup(ctx, id)
	if err != nil {
		return nil, err
	}
	defer n.removeCheckpoint(ck)
	files, err := snapshot.ListFiles(ctx, ck.dir, ck.lengths)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "node %d: backup of shard %d: %v", n.cfg.NodeID, id, err)
	}
	written, wrote, err := loc.StoreCheckpoint(ctx, id, ck.dir, files, req.GetSkipFiles(), n.snapLimiter.WaitN)
	if err != nil {
		code := codes.Internal
		if ctx.Err() != nil {
			code = codes.Canceled
		}
		return nil, status.Errorf(code, "node %d: backup of shard %d: %v", n.cfg.NodeID, id, err)
	}
	ck.hdr.Files = files
	n.log.Info("backup of a shard written", "shard", id, "index", ck.applied, "location", loc.String(), "bytes", wrote,
		"files_written", len(written), "files_skipped", len(files)-len(written), "took", time.Since(start), "checkpoint_took", ck.took)
	return &shalev1.BackupShardToResponse{Header: ck.hdr, Written: written, BytesWritten: uint64(wrote)}, nil
}

// BackupShardLog implements the Admin RPC for the receiving node's own
// replica (not forwarded).
func (s *adminService) BackupShardLog(req *shalev1.BackupShardLogRequest, stream shalev1.Admin_BackupShardLogServer) (err error) {
	n := s.n
	var bytes int64
	defer func() { n.backupm.served(backupLog, bytes, err) }()
	sm, err := n.caughtUpShard(stream.Context(), req.GetShardId())
	if err != nil {
		return err
	}
	sent := 0
	err = sm.ReadLogAfter(req.GetAfterIndex(), func(e *shard.LoggedEntry) error {
		out := &shalev1.BackupLogEntry{
			Index:    e.Mark.Index,
			Term:     e.Mark.Term,
			Hlc:      replication.HLCToProto(e.Mark.HLC),
			Revision: e.Mark.Revision,
			Range:    e.Range,
		}
		for _, op := range e.Ops {
			out.Ops = append(out.Ops, &shalev1.BackupLogOp{Kind: uint32(op.Kind), Key: op.Key, Value: op.Value})
		}
		sent++
		bytes += int64(proto.Size(out))
		return stream.Send(out)
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, shard.ErrLogUnavailable):
		return status.Errorf(codes.OutOfRange, "node %d: shard %d: %v", n.cfg.NodeID, req.GetShardId(), err)
	case stream.Context().Err() != nil:
		return status.Errorf(codes.Canceled, "node %d: log of shard %d: %v", n.cfg.NodeID, req.GetShardId(), err)
	default:
		return status.Errorf(codes.Internal, "node %d: log of shard %d after entry %d (%d sent): %v", n.cfg.NodeID, req.GetShardId(), req.GetAfterIndex(), sent, err)
	}
}
