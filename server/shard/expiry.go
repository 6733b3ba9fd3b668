package shard

import (
	"bytes"
	"fmt"

	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

// An expired key reads as absent at once (reads judge expiry at their own
// time), but it stays stored until an ExpireKeys command deletes it: the
// leader's sweep finds expired records (ExpiredKeys) and proposes their
// deletion, which every replica applies as an ordinary delete with a new
// revision. So an expiry shows in Watch and backups as a DELETE, replicas
// stay identical, and the space comes back.

// ExpiredKey is a stored record whose expiry has passed: its key and the
// mod revision the record had when found.
type ExpiredKey struct {
	Key         []byte
	ModRevision uint64
}

// TTLWrites counts the records with an expiry this Shard applied (puts
// with a TTL, records absorbed by a merge) since it was opened: while it
// stays the same, a shard whose last full ExpiredKeys pass found no record
// with an expiry has none to sweep.
func (s *Shard) TTLWrites() uint64 { return s.ttlWrites.Load() }

// NoTTL reports that no record with an expiry was ever written into the
// shard's user data since it was bootstrapped empty, as the applied state
// says (replicated with it: a split's right shard and a snapshot's copy
// inherit it): ExpiredKeys would find nothing. False when unknown (an
// engine of format 6 or older, a shard restored from such a backup).
func (s *Shard) NoTTL() bool { return s.st.Load().noTTL }

// ExpiredKeys scans up to limit stored records of the shard's user keys
// from key from on (nil: the start of the shard), at one point, and returns
// those expired at time now (Unix nanoseconds), how many scanned records
// have an expiry at all, and the key to resume the next scan at: nil once
// the scan reached the end of the shard.
func (s *Shard) ExpiredKeys(from []byte, limit int, now int64) (expired []ExpiredKey, withTTL int, next []byte, err error) {
	v, err := s.view()
	if err != nil {
		return nil, 0, nil, err
	}
	defer v.release()
	rng, err := v.userRange()
	if err != nil {
		return nil, 0, nil, err
	}
	if !rng.contains(from) { // nil, or outside the shard since a split
		from = rng.start
	}
	it, err := v.snap.NewIter(&storage.IterOptions{LowerBound: dataKey(from), UpperBound: dataBound(rng.end)})
	if err != nil {
		return nil, 0, nil, err
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n == max(limit, 1) {
			return expired, withTTL, bytes.Clone(it.Key()[1:]), it.Error()
		}
		n++
		sv, err := decodeValue(it.Value())
		if err != nil {
			return nil, 0, nil, fmt.Errorf("%w: key %q: %v", ErrCorrupt, it.Key()[1:], err)
		}
		if sv.expire != 0 {
			withTTL++
		}
		if sv.expired(now) {
			expired = append(expired, ExpiredKey{Key: bytes.Clone(it.Key()[1:]), ModRevision: sv.modRev})
		}
	}
	return expired, withTTL, nil, it.Error()
}

// expireCompactKeys is how many keys one ExpireKeys command must delete for
// its replicas to compact the span it deleted once their engine's history
// horizon passes the deletion (storage.DB.CompactAfterHorizon): within the
// history window, not at the next compactions that happen to reach it.
const expireCompactKeys = 256

// applyExpire deletes the keys of an ExpireKeys command that are still as
// found and expired at now. The result's Txn holds the new revision and
// one DeleteResponse whose Deleted counts the keys deleted.
func (a *applier) applyExpire(ex *shalev1.ExpireKeys, now int64) (*shalev1.CommandResult, bool, error) {
	desc := a.st.desc
	switch {
	case desc == nil:
		return errResult(codes.FailedPrecondition, nil, "shard replica is not initialized"), false, nil
	case desc.GetSystem():
		return errResult(codes.InvalidArgument, desc, "the system shard holds no user keys"), false, nil
	case len(ex.GetKeys()) != len(ex.GetModRevisions()):
		return errResult(codes.InvalidArgument, desc, "expire: %d keys but %d revisions", len(ex.GetKeys()), len(ex.GetModRevisions())), false, nil
	}
	rng := shardRange(desc)
	rev := a.st.rev + 1
	var deleted uint64
	var lo, hi []byte
	for i, k := range ex.GetKeys() {
		if !rng.contains(k) {
			continue // moved to another shard by a split: its sweep's
		}
		ek := dataKey(k)
		var oldV storedValue
		old, err := a.getDataInto(ek, &oldV)
		if err != nil {
			return nil, false, err
		}
		if old == nil || old.modRev != ex.GetModRevisions()[i] || !old.expired(now) {
			continue
		}
		a.noteChange(changeDeleteOf, k)
		a.ov.del(a.b, ek)
		deleted++
		if lo == nil || bytes.Compare(ek, lo) < 0 {
			lo = ek
		}
		if hi == nil || bytes.Compare(ek, hi) > 0 {
			hi = ek
		}
	}
	if deleted == 0 {
		rev = a.st.rev
	} else {
		a.st.rev = rev
		if deleted >= expireCompactKeys {
			lo, hi := bytes.Clone(lo), append(bytes.Clone(hi), 0)
			a.after = append(a.after, func() error {
				// After the call's batch, which holds the deletions, is written.
				if err := a.s.db.CompactAfterHorizon(lo, hi, a.b.LastSeqNum()); err != nil {
					a.s.log.Warn("schedule the compaction of expired keys", "shard", a.s.dir, "err", err)
				}
				return nil
			})
		}
	}
	return &shalev1.CommandResult{Txn: &shalev1.TxnResponse{
		Header:    &shalev1.ResponseHeader{ShardId: desc.GetShardId(), Revision: rev, Epoch: desc.GetEpoch()},
		Succeeded: true,
		Results:   []*shalev1.ResponseOp{{Op: &shalev1.ResponseOp_Delete{Delete: &shalev1.DeleteResponse{Deleted: deleted}}}},
	}}, deleted > 0, nil
}
