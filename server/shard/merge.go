package shard

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

// keyMergePending holds the descriptor of the right shard a merge into this
// one is absorbing (between MergeAbsorb begin and commit).
var keyMergePending = []byte("mmerge-pending")

// keyMergeAttempt holds the attempt of the current copy of a pending merge
// (MergeAbsorb.attempt of its begin; absent when the begin carried none).
var keyMergeAttempt = []byte("mmerge-attempt")

// A merge joins a shard (left) and its right neighbour, which must have
// their replicas on the same nodes. The node leading both proposes:
//
//  1. merge_freeze on right: right serves and changes nothing any more;
//  2. merge_absorb begin, records..., commit on left: right's records go
//     through left's Raft log (so every left replica gets them, whatever
//     the state of its right replica), then left's range takes right's in;
//  3. merge_retire on right: its replicas delete themselves.
//
// Each step is idempotent or restartable: begin drops what an interrupted
// attempt copied, and a frozen right shard is only ever finished. Every
// step of one copy names its attempt, and the latest begin's attempt is the
// only one whose records and commit apply: two drivers never mix copies.

// applyMergeFreeze freezes this shard (the right one of a merge).
func (a *applier) applyMergeFreeze(mf *shalev1.MergeFreeze) (*shalev1.CommandResult, bool, error) {
	desc := a.st.desc
	into := mf.GetIntoShardId()
	switch {
	case desc == nil || desc.GetSystem():
		return errResult(codes.InvalidArgument, desc, "the system shard does not merge"), false, nil
	case into == 0 || into == desc.GetShardId():
		return errResult(codes.InvalidArgument, desc, "merge_freeze needs the ID of another shard (got %d)", into), false, nil
	case desc.GetMergingInto() == into:
		return &shalev1.CommandResult{Descriptor_: cloneDesc(desc)}, false, nil // already frozen
	case desc.GetMergingInto() != 0:
		return errResult(codes.FailedPrecondition, desc, "shard %d is already merging into shard %d", desc.GetShardId(), desc.GetMergingInto()), false, nil
	case len(a.st.conf.GetVotersOutgoing()) > 0 || len(a.st.conf.GetLearnersNext()) > 0:
		return errResult(codes.FailedPrecondition, desc, "shard %d is changing its membership; merge it afterwards", desc.GetShardId()), false, nil
	}
	d := cloneDesc(desc)
	d.MergingInto = into
	d.Epoch++
	if err := a.st.setDesc(d); err != nil {
		return nil, false, err
	}
	a.s.log.Info("shard frozen for a merge", "shard", d.GetShardId(), "into", into)
	return &shalev1.CommandResult{Descriptor_: cloneDesc(d)}, true, nil
}

// applyMergeRetire retires this frozen shard, whose left neighbour has
// absorbed it; the replica deletes itself once this has applied.
func (a *applier) applyMergeRetire() (*shalev1.CommandResult, bool, error) {
	desc := a.st.desc
	if desc == nil || desc.GetMergingInto() == 0 {
		return errResult(codes.FailedPrecondition, desc, "merge_retire on a shard that is not merging"), false, nil
	}
	if desc.GetRetired() {
		return &shalev1.CommandResult{Descriptor_: cloneDesc(desc)}, false, nil
	}
	d := cloneDesc(desc)
	d.Retired = true
	d.Epoch++
	if err := a.st.setDesc(d); err != nil {
		return nil, false, err
	}
	a.after = append(a.after, func() error { a.s.compactAway(dataKey(nil), dataUpper); return nil })
	a.s.log.Info("shard retired by a merge", "shard", d.GetShardId(), "into", d.GetMergingInto())
	return &shalev1.CommandResult{Descriptor_: cloneDesc(d)}, true, nil
}

// applyMergeAbsorb applies one step of absorbing a frozen right neighbour.
func (a *applier) applyMergeAbsorb(m *shalev1.MergeAbsorb) (*shalev1.CommandResult, bool, error) {
	desc := a.st.desc
	if desc == nil || desc.GetSystem() {
		return errResult(codes.InvalidArgument, desc, "the system shard does not merge"), false, nil
	}
	if desc.GetMergingInto() != 0 {
		return errResult(codes.FailedPrecondition, desc, "shard %d is itself merging into shard %d", desc.GetShardId(), desc.GetMergingInto()), false, nil
	}
	if m.GetBegin() {
		right := m.GetRight()
		switch {
		case right == nil || right.GetMergingInto() != desc.GetShardId():
			return errResult(codes.FailedPrecondition, desc, "merge: the right shard is not frozen into shard %d", desc.GetShardId()), false, nil
		case len(desc.GetEndKey()) == 0 || !bytes.Equal(right.GetStartKey(), desc.GetEndKey()):
			return errResult(codes.FailedPrecondition, desc, "merge: shard %d [%q, %q) does not start where shard %d ends (%q)",
				right.GetShardId(), right.GetStartKey(), right.GetEndKey(), desc.GetShardId(), desc.GetEndKey()), false, nil
		case len(a.st.conf.GetVotersOutgoing()) > 0 || len(a.st.conf.GetLearnersNext()) > 0:
			return errResult(codes.FailedPrecondition, desc, "shard %d is changing its membership; merge it afterwards", desc.GetShardId()), false, nil
		}
		enc, err := marshalOpts.Marshal(right)
		if err != nil {
			return nil, false, err
		}
		a.ov.set(a.b, keyMergePending, enc)
		if len(m.GetAttempt()) > 0 {
			a.ov.set(a.b, keyMergeAttempt, m.GetAttempt())
		} else {
			a.ov.del(a.b, keyMergeAttempt)
		}
		a.ov.delRange(a.b, dataKey(right.GetStartKey()), dataBound(right.GetEndKey()))
		return &shalev1.CommandResult{Descriptor_: cloneDesc(desc)}, true, nil
	}
	raw, ok, err := a.ov.get(keyMergePending)
	if err != nil {
		return nil, false, err
	}
	if !ok {
		return errResult(codes.FailedPrecondition, desc, "merge: shard %d is absorbing no shard", desc.GetShardId()), false, nil
	}
	right := &shalev1.ShardDescriptor{}
	if err := proto.Unmarshal(raw, right); err != nil {
		return nil, false, fmt.Errorf("%w: pending merge: %v", ErrCorrupt, err)
	}
	current, _, err := a.ov.get(keyMergeAttempt)
	if err != nil {
		return nil, false, err
	}
	if !bytes.Equal(current, m.GetAttempt()) {
		// A later begin cleared what this attempt copied: its chunks
		// and its commit must not land on the other attempt's copy.
		return errResult(codes.Aborted, desc, "merge: shard %d's copy of shard %d was restarted by another driver (attempt %x, this step's %x)",
			desc.GetShardId(), right.GetShardId(), current, m.GetAttempt()), false, nil
	}
	rng := shardRange(right)
	if len(m.GetKeys()) != len(m.GetValues()) {
		return errResult(codes.InvalidArgument, desc, "merge: %d keys but %d values", len(m.GetKeys()), len(m.GetValues())), false, nil
	}
	if len(m.GetDedupIds()) != len(m.GetDedupResults()) {
		return errResult(codes.InvalidArgument, desc, "merge: %d request IDs but %d results", len(m.GetDedupIds()), len(m.GetDedupResults())), false, nil
	}
	for i, id := range m.GetDedupIds() {
		res := &shalev1.CommandResult{}
		if len(id) == 0 {
			return errResult(codes.InvalidArgument, desc, "merge: an empty request ID"), false, nil
		}
		if err := proto.Unmarshal(m.GetDedupResults()[i], res); err != nil {
			return errResult(codes.InvalidArgument, desc, "merge: the result of request %x: %v", id, err), false, nil
		}
		// An interrupted merge may send an entry again.
		if _, ok, err := a.dedupLookup(id); err != nil || ok {
			if err != nil {
				return nil, false, err
			}
			continue
		}
		if err := a.dedupStore(id, res); err != nil {
			return nil, false, err
		}
	}
	for i, k := range m.GetKeys() {
		if !rng.contains(k) {
			return errResult(codes.InvalidArgument, desc, "merge: key %q is outside shard %d", k, right.GetShardId()), false, nil
		}
		v, err := decodeValue(m.GetValues()[i])
		if err != nil {
			return errResult(codes.InvalidArgument, desc, "merge: key %q: %v", k, err), false, nil
		}
		if v.expire != 0 {
			a.s.ttlWrites.Add(1)
			a.st.noTTL = false
		}
		a.ov.set(a.b, dataKey(k), m.GetValues()[i])
	}
	if !m.GetCommit() {
		return &shalev1.CommandResult{Descriptor_: cloneDesc(desc)}, true, nil
	}
	d := cloneDesc(desc)
	d.EndKey = append([]byte(nil), right.GetEndKey()...)
	d.Epoch = max(desc.GetEpoch(), right.GetEpoch()) + 1
	d.RangeChangedUnixNanos = entryDate(a.st.hlc, a.proposedAt).WallNanos // this entry's date
	if err := a.st.setDesc(d); err != nil {
		return nil, false, err
	}
	a.st.rev = max(a.st.rev, m.GetRightRevision())
	a.st.absorbed = appendAbsorbed(a.st.absorbed, absorbedRange{
		start: bytes.Clone(right.GetStartKey()), end: bytes.Clone(right.GetEndKey()), rev: a.st.rev,
		from: right.GetShardId(), fromRev: m.GetRightRevision()})
	a.ov.del(a.b, keyMergePending)
	a.ov.del(a.b, keyMergeAttempt)
	a.s.log.Info("shard merged", "shard", d.GetShardId(), "absorbed", right.GetShardId(), "end", fmt.Sprintf("%q", d.GetEndKey()))
	return &shalev1.CommandResult{Descriptor_: cloneDesc(d), RightDescriptor: cloneDesc(right)}, true, nil
}

// ScanDedup calls fn with every entry of the shard's deduplication table
// (a request ID and its encoded CommandResult), oldest first, read at one
// point; id and result are valid only during the call. It is how a merge
// carries the right shard's table into the left one, so that a write the
// right shard applied, retried after the merge, applies once.
func (s *Shard) ScanDedup(fn func(id, result []byte) error) error {
	v, err := s.view()
	if err != nil {
		return err
	}
	defer v.release()
	type entry struct {
		seq    uint64
		id     []byte
		result []byte
	}
	var entries []entry
	ai, err := readApplied(v.snap)
	if err != nil {
		return err
	}
	// The entries an older format wrote, if any are left, then the rest.
	for _, legacy := range [...]bool{true, false} {
		prefix := dedupPrefix
		if legacy {
			prefix = legacyDedupPrefix
		}
		it, err := v.snap.NewIter(&storage.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
		if err != nil {
			return err
		}
		for ok := it.First(); ok; ok = it.Next() {
			id := it.Key()[len(prefix):]
			seq, result, ok := splitDedupEntry(it.Value(), legacy)
			if !ok {
				_ = it.Close()
				return fmt.Errorf("%w: dedup entry of %x: no sequence in %d bytes", ErrCorrupt, id, len(it.Value()))
			}
			if seq < ai.dedupOldest {
				continue // evicted
			}
			entries = append(entries, entry{seq: seq, id: bytes.Clone(id), result: bytes.Clone(result)})
		}
		err = it.Error()
		if cerr := it.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("shard: scan the dedup table: %w", err)
		}
	}
	slices.SortFunc(entries, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
	for _, e := range entries {
		if err := fn(e.id, e.result); err != nil {
			return err
		}
	}
	return nil
}

// ScanRecords calls fn with every stored record of the shard's user keys
// (key and encoded value, expired ones included), in key order, read at one
// point; key and value are valid only during the call. It is how a merge
// copies a frozen shard's records.
func (s *Shard) ScanRecords(fn func(key, value []byte) error) error {
	v, err := s.view()
	if err != nil {
		return err
	}
	defer v.release()
	rng, err := v.userRange()
	if err != nil {
		return err
	}
	it, err := v.snap.NewIter(&storage.IterOptions{LowerBound: dataKey(rng.start), UpperBound: dataBound(rng.end)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(it.Key()[1:], it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}
