package server

import (
	"context"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server/shard"
)

// Expiry sweep parameters: every expirySweepInterval, the shards this node
// leads scan expirySweepKeys stored records between them (at least
// expirySweepMinKeys each), each resuming where its last scan stopped, and
// the expired records found are deleted by ExpireKeys commands of up to
// expireBatchKeys keys. A key therefore goes within one sweep pass of its
// expiry: about a second for a node whose led shards hold fewer than
// expirySweepKeys records. A shard whose last full pass found no record
// with a TTL, and which applied none since, is not scanned; nor is one whose
// applied state says no record with a TTL was ever written to it
// (shard.Shard.NoTTL), so a node that begins to lead such a shard (a moved
// replica) does not read all of it.
const (
	expirySweepInterval = time.Second
	expirySweepKeys     = 50_000
	expirySweepMinKeys  = 1_000
	expireBatchKeys     = 1_000
)

// sweepState is the expiry sweep's progress through one shard.
type sweepState struct {
	cursor []byte // where the next scan starts; nil: a new pass
	// passWrites is the shard's TTLWrites when the pass began, passTTL
	// whether the pass saw a record with a TTL.
	passWrites uint64
	passTTL    bool
	// idle: the last full pass saw no record with a TTL and the shard had
	// applied idleWrites of them when it began.
	idle       bool
	idleWrites uint64
}

// expiryLoop runs the expiry sweep until Stop.
func (n *Node) expiryLoop() {
	defer n.wg.Done()
	t := time.NewTicker(expirySweepInterval)
	defer t.Stop()
	states := map[uint64]*sweepState{}
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		n.sweepExpired(states)
	}
}

// sweepExpired runs one round of the expiry sweep on the user shards this
// node leads, deleting the expired records it finds through the shards'
// logs. states keeps each shard's progress between rounds.
func (n *Node) sweepExpired(states map[uint64]*sweepState) {
	// Forget the shards this node no longer leads first, so that every
	// shard collected below keeps its state for the whole round (a
	// leadership lost between the two loops must not leave a shard with
	// no state).
	for id := range states {
		if r := n.store.Replica(id); r == nil || !r.IsLeader() {
			delete(states, id)
		}
	}
	var shards []uint64
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if !r.IsLeader() || sm == nil {
			continue
		}
		d := sm.Descriptor()
		if d == nil || d.GetSystem() || d.GetMergingInto() != 0 || d.GetRetired() {
			continue
		}
		st := states[r.ShardID()]
		if st == nil {
			st = &sweepState{}
			states[r.ShardID()] = st
		}
		if sm.NoTTL() || (st.idle && sm.TTLWrites() == st.idleWrites) {
			continue
		}
		shards = append(shards, r.ShardID())
	}
	if len(shards) == 0 {
		return
	}
	budget := max(expirySweepKeys/len(shards), expirySweepMinKeys)
	for _, id := range shards {
		select {
		case <-n.stop:
			return
		default:
		}
		sm, r, st := n.Shard(id), n.store.Replica(id), states[id]
		if sm == nil || r == nil {
			continue
		}
		if st.cursor == nil {
			st.passWrites, st.passTTL = sm.TTLWrites(), false
		}
		expired, withTTL, next, err := sm.ExpiredKeys(st.cursor, budget, n.wallNanos())
		if err != nil {
			n.log.Debug("expiry sweep: scan", "shard", id, "err", err)
			continue
		}
		st.cursor, st.passTTL = next, st.passTTL || withTTL > 0
		if next == nil {
			st.idle, st.idleWrites = !st.passTTL, st.passWrites
		}
		n.expire(id, expired)
	}
}

// expire proposes the deletion of expired records of a shard this node
// leads, in batches; it stops at the first failure (the next pass finds
// what is left).
func (n *Node) expire(id uint64, expired []shard.ExpiredKey) {
	r := n.store.Replica(id)
	for len(expired) > 0 && r != nil {
		batch := expired[:min(len(expired), expireBatchKeys)]
		expired = expired[len(batch):]
		ex := &shalev1.ExpireKeys{}
		for _, e := range batch {
			ex.Keys = append(ex.Keys, e.Key)
			ex.ModRevisions = append(ex.ModRevisions, e.ModRevision)
		}
		ctx, inner, cancel := n.requestCtx(context.Background())
		res, err := n.proposeHere(ctx, inner, r, 0, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Expire{Expire: ex}})
		cancel()
		if err != nil {
			n.log.Debug("expiry sweep: propose", "shard", id, "keys", len(batch), "err", err)
			return
		}
		if rs := res.GetTxn().GetResults(); len(rs) == 1 {
			n.expiredKeys.Add(float64(rs[0].GetDelete().GetDeleted()))
		}
	}
}
