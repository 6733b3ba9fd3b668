package shard

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

// applySplit applies a SplitCommand: the keys from the split key on move to
// a new engine (a checkpoint of this one with the left half deleted) that
// the node hosts as a new shard with the same replicas and a fresh Raft
// group; this shard deletes them and ends at the split key. Both epochs
// bump. Every replica applies it identically.
func (a *applier) applySplit(sc *shalev1.SplitCommand) (*shalev1.CommandResult, bool, error) {
	desc := a.st.desc
	key, rightID := sc.GetSplitKey(), sc.GetRightShardId()
	switch {
	case a.s.opts.ShardsDir == "":
		return errResult(codes.FailedPrecondition, desc, "this node cannot host split shards"), false, nil
	case desc == nil || desc.GetSystem():
		return errResult(codes.InvalidArgument, desc, "the system shard does not split"), false, nil
	case rightID == 0 || rightID == desc.GetShardId():
		return errResult(codes.InvalidArgument, desc, "split: the new shard needs its own ID (got %d)", rightID), false, nil
	case len(key) == 0 || bytes.Compare(key, desc.GetStartKey()) <= 0 || (len(desc.GetEndKey()) > 0 && bytes.Compare(key, desc.GetEndKey()) >= 0):
		return errResult(codes.InvalidArgument, desc, "split key %q is not strictly inside shard %d [%q, %q)", key, desc.GetShardId(), desc.GetStartKey(), desc.GetEndKey()), false, nil
	case len(a.st.conf.GetVotersOutgoing()) > 0 || len(a.st.conf.GetLearnersNext()) > 0:
		return errResult(codes.FailedPrecondition, desc, "shard %d is changing its membership; split it afterwards", desc.GetShardId()), false, nil
	}
	if _, pending, err := a.ov.get(keyMergePending); err != nil {
		return nil, false, err
	} else if pending {
		return errResult(codes.FailedPrecondition, desc, "shard %d is absorbing its right neighbour; split it afterwards", desc.GetShardId()), false, nil
	}
	date := entryDate(a.st.hlc, a.proposedAt).WallNanos // this entry's date
	left := cloneDesc(desc)
	left.EndKey = append([]byte(nil), key...)
	left.Epoch++
	left.RangeChangedUnixNanos = date
	right := cloneDesc(desc)
	right.ShardId = rightID
	right.StartKey = append([]byte(nil), key...)
	right.Epoch++
	right.AutoSplit = sc.GetAutomatic()
	right.RangeChangedUnixNanos = date

	// The node already hosts the new shard when its engine's directory
	// exists: a message of the new shard's group made this node create an
	// empty replica before this split applied here (the Store creates none
	// while an Apply runs), or a restart opened the engine this split made
	// before its own state became durable. The split then leaves it alone.
	t0 := time.Now()
	var phases splitPhases
	dir := Dir(a.s.opts.ShardsDir, rightID)
	_, err := a.s.fs.Stat(dir)
	hosted := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("split: shard %d: %w", rightID, err)
	}
	if !hosted {
		// The right engine starts from everything applied so far: write
		// what this Apply call staged, then checkpoint.
		if err := a.flushStaged(); err != nil {
			return nil, false, err
		}
		var rs *Shard
		rs, phases, err = a.s.makeRight(dir, right, a.st)
		if err != nil {
			return nil, false, fmt.Errorf("split: create shard %d: %w", rightID, err)
		}
		a.effects = append(a.effects, replication.HostShard{StateMachine: rs, LeaderNodeID: sc.GetRightLeaderNodeId()})
	}
	// The left engine keeps the range it gives away for its history
	// window: a watch of it may still read previous values from before
	// the split. The engine reclaims the range by itself once its horizon
	// passes the deletion (a range deletion's space is scheduled so).
	// Until then SizeBytes counts it; OwnSizeBytes does not.
	a.ov.giveAway(a.b, dataKey(key), dataBound(desc.GetEndKey()))
	if err := a.st.setDesc(left); err != nil {
		return nil, false, err
	}
	a.s.log.Info("shard split", "shard", desc.GetShardId(), "split_key", fmt.Sprintf("%q", key), "right_shard", rightID, "right_already_hosted", hosted,
		"took", time.Since(t0), "flush", phases.flush, "checkpoint", phases.checkpoint, "open", phases.open)
	return &shalev1.CommandResult{Descriptor_: cloneDesc(left), RightDescriptor: right}, true, nil
}

// flushStaged writes the batch staged so far in this Apply call, with the
// metadata of the last entry applied, and publishes that state.
func (a *applier) flushStaged() error {
	a.st.writeMeta(a.b, a.written)
	if err := a.s.db.Apply(a.b, storage.NoSync); err != nil {
		return err
	}
	a.ov.remember()
	published := *a.st
	a.s.publish(&published)
	a.written = &published
	a.b.Reset()
	clear(a.ov.writes)
	a.ov.rangeDels, a.ov.forget = a.ov.rangeDels[:0], false
	return nil
}

// splitMarker is a file in a split's new engine directory while the split
// creates it. A directory holding it is an unfinished copy, made by a split
// that had not applied durably when the node stopped: Open refuses it
// (ErrUnfinishedSplit), and the split makes it again when it applies.
const splitMarker = "SPLITTING"

// ErrUnfinishedSplit is returned by Open for the directory of a split's new
// shard that the split did not finish creating; the directory may be
// deleted (the split creates it again when it applies).
var ErrUnfinishedSplit = errors.New("shard: an unfinished split's copy")

// splitPhases are how long the parts of makeRight took: the flush of this
// engine's memtable, the checkpoint (with the directory syncs and the
// rename), and the new engine's open with its first synced batch.
type splitPhases struct{ flush, checkpoint, open time.Duration }

// makeRight creates, durably, the engine of a split's right-hand shard in
// dir and returns it open: a checkpoint of this engine without the keys
// outside right's range, whose applied state is the start of a new Raft
// group (as a bootstrapped shard's) with the left shard's configuration,
// revision and dedup table. The engine is opened once, in place (its WAL
// replayed once, nothing flushed): the directory carries splitMarker until
// its state is durable. Its history horizon starts after the batch that
// deleted the keys outside right's range, so it reclaims them at once.
func (s *Shard) makeRight(dir string, right *shalev1.ShardDescriptor, left *state) (rs *Shard, phases splitPhases, err error) {
	tmp := dir + ".split"
	if err := s.fs.RemoveAll(tmp); err != nil {
		return nil, phases, err
	}
	if err := s.fs.RemoveAll(dir); err != nil {
		return nil, phases, err
	}
	// Flush first: the checkpoint then holds SSTs only, and the new engine
	// opens without replaying (and flushing again) a copy of the memtable.
	t := time.Now()
	if err := s.db.Flush(); err != nil {
		return nil, phases, fmt.Errorf("flush: %w", err)
	}
	phases.flush, t = time.Since(t), time.Now()
	if _, err := s.db.Checkpoint(tmp); err != nil {
		return nil, phases, fmt.Errorf("checkpoint: %w", err)
	}
	marker, err := s.fs.Create(s.fs.Join(tmp, splitMarker))
	if err == nil {
		err = marker.Close()
	}
	if err != nil {
		return nil, phases, err
	}
	if err := vfs.SyncDir(s.fs, tmp); err != nil {
		return nil, phases, err
	}
	if err := s.fs.Rename(tmp, dir); err != nil {
		return nil, phases, err
	}
	if err := vfs.SyncDir(s.fs, filepath.Dir(dir)); err != nil {
		return nil, phases, err
	}
	phases.checkpoint, t = time.Since(t), time.Now()
	rs = newShard(dir, s.opts)
	o := rs.engineOptions()
	o.ErrorIfNotExists = true
	db, err := storage.Open(dir, o)
	if err != nil {
		return nil, phases, err
	}
	st := *left
	st.index, st.term = replication.InitialIndex, replication.InitialTerm
	err = st.setConf(cloneConfState(left.conf))
	if err == nil {
		err = st.setDesc(right)
	}
	var b *storage.Batch
	if err == nil {
		b = storage.NewBatch()
		b.DeleteRange(dataKey(nil), dataKey(right.GetStartKey()))
		if len(right.GetEndKey()) > 0 {
			b.DeleteRange(dataKey(right.GetEndKey()), dataUpper)
		}
		st.writeMeta(b, nil)
		err = db.Apply(b, storage.Sync)
	}
	if err == nil {
		// The new shard's change log starts after this batch, so nothing
		// reads its history before it: the engine may drop the keys it
		// deleted at once (it schedules that by itself once its horizon
		// passes the deletion).
		db.AdvanceHistoryHorizon(db.LastSeq() + 1)
	}
	if err == nil {
		err = s.fs.Remove(s.fs.Join(dir, splitMarker))
	}
	if err == nil {
		err = vfs.SyncDir(s.fs, dir)
	}
	var loaded *state
	if err == nil {
		var found bool
		loaded, found, err = loadState(db)
		if err == nil && !found {
			err = ErrNoMetadata
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, phases, err
	}
	rs.db = db
	rs.publish(loaded)
	// The new shard's user keys are this shard's in [split key, end), and
	// so are their cached records: it shares this shard's space in the
	// record cache (the two ranges are disjoint), and with it the knowledge
	// that a key the cache does not hold is absent, where this shard had it.
	// Either shard takes a space of its own when it forgets (delRange, a
	// snapshot), and any eviction ends that knowledge for both.
	rs.recordSpace = s.recordSpace
	phases.open = time.Since(t)
	return rs, phases, nil
}

// SplitKey returns a user key strictly inside the shard's range that
// divides the data its engine's SSTs hold into two parts of about equal
// size, or nil when there is too little to divide (see storage.DB.SplitKey:
// only index metadata is read).
func (s *Shard) SplitKey() ([]byte, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return nil, ErrClosed
	}
	desc := s.st.Load().desc
	if desc == nil || desc.GetSystem() {
		return nil, nil
	}
	k, err := s.db.SplitKey(dataKey(desc.GetStartKey()), dataBound(desc.GetEndKey()))
	if err != nil || k == nil || !isDataKey(k) {
		return nil, err
	}
	uk := bytes.Clone(k[1:])
	if len(uk) == 0 || bytes.Compare(uk, desc.GetStartKey()) <= 0 || (len(desc.GetEndKey()) > 0 && bytes.Compare(uk, desc.GetEndKey()) >= 0) {
		return nil, nil
	}
	return uk, nil
}

// OwnSizeBytes returns an estimate of the SST bytes that hold the
// shard's own range (storage.DB.SSTBytesIn): unlike SizeBytes it leaves
// out a range a split gave away, which the engine keeps for its history
// window (a right-hand shard's engine reclaims the rest of its parent at
// once), and the shard's metadata. It is what a size split compares with
// its threshold. It reads the SSTs' in-memory indexes, so it costs more
// than SizeBytes; 0 when the shard is closed.
func (s *Shard) OwnSizeBytes() uint64 {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	st := s.st.Load()
	if s.db == nil || st == nil || st.desc == nil {
		return 0
	}
	n, _ := s.db.SSTBytesIn(dataKey(st.desc.GetStartKey()), dataBound(st.desc.GetEndKey()))
	return n
}

// compactAway compacts the engine keys in [lo, hi), which a merge deleted,
// in the background, so that the space (and the shard's size) is
// reclaimed. Close and Restore wait for it.
func (s *Shard) compactAway(lo, hi []byte) {
	go func() {
		s.dbMu.RLock()
		defer s.dbMu.RUnlock()
		if s.db == nil {
			return
		}
		if err := s.db.CompactRange(lo, hi); err != nil {
			s.log.Warn("compact a deleted range", "shard", s.dir, "err", err)
		}
	}()
}
