package shard

import (
	"bytes"
	"maps"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func freezeCmd(into uint64) *shalev1.RaftCommand {
	return &shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeFreeze{MergeFreeze: &shalev1.MergeFreeze{IntoShardId: into}}}
}

var retireCmd = &shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeRetire{MergeRetire: true}}

func absorbCmd(m *shalev1.MergeAbsorb) *shalev1.RaftCommand {
	return &shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeAbsorb{MergeAbsorb: m}}
}

// scanRecords returns copies of the records s.ScanRecords gives, in order:
// what a merge copies from s.
func scanRecords(t *testing.T, s *Shard) (keys, vals [][]byte) {
	t.Helper()
	if err := s.ScanRecords(func(k, v []byte) error {
		keys, vals = append(keys, bytes.Clone(k)), append(vals, bytes.Clone(v))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys, vals
}

// TestMergeCommands drives a merge through its three commands on two shard
// engines: the frozen right refuses writes, the left copies its records
// with their revisions and takes its range, and each step refuses what is
// out of order.
func TestMergeCommands(t *testing.T) {
	e := newTestEnv(t, nil)
	left := e.bootstrap("left", userDesc(2, "", "m"), 0)
	right := e.bootstrap("right", userDesc(3, "m", ""), 0)
	lf, rf := newFeeder(left), newFeeder(right)
	for _, k := range []string{"a", "b"} {
		applyOne(t, left, lf, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v"+k, 0, false)}}))
	}
	for i, k := range []string{"m", "n", "x", "n"} {
		var ttlMs int64
		if k == "x" { // the right's one record with a TTL (an hour)
			ttlMs = 3_600_000
		}
		applyOne(t, right, rf, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v"+k+string(rune('0'+i)), ttlMs, false)}}))
	}
	rightRecs := dataDump(t, right)
	code := func(r *shalev1.CommandResult) codes.Code { return codes.Code(r.GetErrorCode()) }

	// Absorbing an unfrozen shard is refused.
	if r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Begin: true, Right: right.Descriptor()})); code(r) != codes.FailedPrecondition {
		t.Fatalf("begin with an unfrozen right: %v", r)
	}
	// Freeze: the epoch bumps, writes are refused, a second freeze into
	// the same shard is a no-op, into another one refused.
	before := right.Descriptor().GetEpoch()
	if r := applyOne(t, right, rf, freezeCmd(2)); code(r) != codes.OK || r.GetDescriptor_().GetMergingInto() != 2 || r.GetDescriptor_().GetEpoch() != before+1 {
		t.Fatalf("freeze: %v", r)
	}
	if r := applyOne(t, right, rf, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("q", "v", 0, false)}})); code(r) != codes.Unavailable {
		t.Fatalf("write to a frozen shard: %v", r)
	}
	if r := applyOne(t, right, rf, freezeCmd(2)); code(r) != codes.OK {
		t.Fatalf("second freeze: %v", r)
	}
	if r := applyOne(t, right, rf, freezeCmd(7)); code(r) != codes.FailedPrecondition {
		t.Fatalf("freeze into another shard: %v", r)
	}
	if r := applyOne(t, left, lf, retireCmd); code(r) != codes.FailedPrecondition {
		t.Fatalf("retire a shard that is not merging: %v", r)
	}
	// Records before begin are refused.
	if r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Keys: [][]byte{[]byte("m")}, Values: [][]byte{{1}}})); code(r) != codes.FailedPrecondition {
		t.Fatalf("records before begin: %v", r)
	}
	frozen := right.Descriptor()
	one, two := []byte("attempt-one"), []byte("attempt-two")
	if r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Begin: true, Right: frozen, Attempt: one})); code(r) != codes.OK {
		t.Fatalf("begin: %v", r)
	}
	// While absorbing, the left does not split.
	if r := applyOne(t, left, lf, splitCmd("c", 9)); code(r) == codes.OK {
		t.Fatalf("split while absorbing: %v", r)
	}
	// A record outside the right's range, or one that does not decode, is
	// refused.
	if r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Keys: [][]byte{[]byte("c")}, Values: [][]byte{{}}, Attempt: one})); code(r) != codes.InvalidArgument {
		t.Fatalf("record outside the range: %v", r)
	}
	if r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Keys: [][]byte{[]byte("m")}, Values: [][]byte{{0xff}}, Attempt: one})); code(r) != codes.InvalidArgument {
		t.Fatalf("undecodable record: %v", r)
	}
	// A partial copy, then a restart of the copy from begin by another
	// attempt (another driver).
	first := true
	var keys, vals [][]byte
	if err := right.ScanRecords(func(k, v []byte) error {
		keys, vals = append(keys, bytes.Clone(k)), append(vals, bytes.Clone(v))
		if first {
			first = false
			applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Keys: [][]byte{bytes.Clone(k)}, Values: [][]byte{bytes.Clone(v)}, Attempt: one}))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Fatalf("ScanRecords saw %d records", len(keys))
	}
	applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Begin: true, Right: frozen, Attempt: two}))
	// The superseded attempt's records and commit, or a step naming no
	// attempt, are refused and change nothing.
	before = left.Descriptor().GetEpoch()
	for _, m := range []*shalev1.MergeAbsorb{
		{Keys: keys[:1], Values: vals[:1], Attempt: one},
		{Commit: true, RightRevision: right.Revision(), Attempt: one},
		{Keys: keys[1:2], Values: vals[1:2]},
	} {
		if r := applyOne(t, left, lf, absorbCmd(m)); code(r) != codes.Aborted {
			t.Fatalf("a step of a superseded attempt (%v): %v", m, r)
		}
	}
	if d := left.Descriptor(); d.GetEpoch() != before || string(d.GetEndKey()) != "m" {
		t.Fatalf("a superseded attempt's commit changed the descriptor: %v", d)
	}
	if got := dataDump(t, left); len(got) != 2 {
		t.Fatalf("the superseded attempt's records landed: %v", got)
	}
	applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Keys: keys[:2], Values: vals[:2], Attempt: two}))
	if !left.NoTTL() {
		t.Fatal("records without a TTL absorbed: the left lost its no-TTL mark")
	}
	r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Keys: keys[2:], Values: vals[2:], Commit: true, RightRevision: right.Revision(), Attempt: two}))
	m := r.GetDescriptor_()
	if code(r) != codes.OK || len(m.GetEndKey()) != 0 || m.GetEpoch() <= frozen.GetEpoch() || m.GetShardId() != 2 {
		t.Fatalf("commit: %v", r)
	}
	if left.Revision() < right.Revision() {
		t.Fatalf("merged revision %d below the right's %d", left.Revision(), right.Revision())
	}
	got := dataDump(t, left)
	want := map[string]rec{}
	maps.Copy(want, rightRecs)
	for _, k := range []string{"a", "b"} {
		want[k] = got[k]
	}
	if !maps.Equal(got, want) {
		t.Fatalf("merged records %v, want %v", got, want)
	}
	if kv, _, err := left.Get([]byte("x"), ts0); err != nil || string(kv.GetValue()) != "vx2" {
		t.Fatalf("get x from the merged shard: %v %v", kv, err)
	}
	// The merge is remembered, also after a reopen: watches of the
	// absorbed range need the log only from after it.
	mergedAt := left.Revision()
	for _, s := range []*Shard{left, reopen(t, e, left, "left")} {
		if got := s.AbsorbedAt([]byte("n"), []byte("p")).Rev; got != mergedAt {
			t.Fatalf("AbsorbedAt([n, p)) = %d, want %d", got, mergedAt)
		}
		if got := s.AbsorbedAt([]byte("a"), []byte("n")).Rev; got != 0 {
			t.Fatalf("AbsorbedAt([a, n)) = %d, want 0: the range was not all absorbed", got)
		}
		if s.NoTTL() {
			t.Fatal("the merged shard absorbed a record with a TTL but is marked as holding none")
		}
	}
	// Retire the right.
	if r := applyOne(t, right, rf, retireCmd); code(r) != codes.OK || !right.Descriptor().GetRetired() {
		t.Fatalf("retire: %v", r)
	}
	if !right.AppliedState().Descriptor.GetRetired() {
		t.Fatal("the applied state does not show the retirement")
	}
}

// reopen closes s and opens its directory again (closed at cleanup).
func reopen(t *testing.T, e *testEnv, s *Shard, dir string) *Shard {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return e.open(dir, 0)
}

// TestMergeCarriesDedupTable merges a right shard that applied a write
// with a request ID: the same command retried on the merged shard returns
// the first result and applies nothing, also after the copy restarted
// from begin (entries sent twice are kept once) and after a reopen.
func TestMergeCarriesDedupTable(t *testing.T) {
	e := newTestEnv(t, nil)
	left := e.bootstrap("left", userDesc(2, "", "m"), 0)
	right := e.bootstrap("right", userDesc(3, "m", ""), 0)
	lf, rf := newFeeder(left), newFeeder(right)
	code := func(r *shalev1.CommandResult) codes.Code { return codes.Code(r.GetErrorCode()) }
	applyOne(t, left, lf, withID("left-write-1", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("a", "1", 0, false)}})))
	retried := func() *shalev1.RaftCommand {
		return withID("right-write-1", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("n", "1", 0, false)}}))
	}
	first := applyOne(t, right, rf, retried())
	applyOne(t, right, rf, withID("right-write-2", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("x", "1", 0, false)}})))
	applyOne(t, right, rf, freezeCmd(2))

	var ids, results [][]byte
	if err := right.ScanDedup(func(id, res []byte) error {
		ids, results = append(ids, bytes.Clone(id)), append(results, bytes.Clone(res))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || string(ids[0]) != "right-write-1" || string(ids[1]) != "right-write-2" {
		t.Fatalf("ScanDedup gave %q, want the right's two IDs oldest first", ids)
	}
	// Malformed entries are refused.
	frozen := right.Descriptor()
	applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Begin: true, Right: frozen}))
	if r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{DedupIds: ids})); code(r) != codes.InvalidArgument {
		t.Fatalf("IDs without results: %v", r)
	}
	if r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{DedupIds: ids[:1], DedupResults: [][]byte{{0xff, 0xff}}})); code(r) != codes.InvalidArgument {
		t.Fatalf("an undecodable result: %v", r)
	}
	// A first copy of one entry, then the copy restarts from begin.
	applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{DedupIds: ids[:1], DedupResults: results[:1]}))
	applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Begin: true, Right: frozen}))
	keys, vals := scanRecords(t, right)
	r := applyOne(t, left, lf, absorbCmd(&shalev1.MergeAbsorb{Keys: keys, Values: vals, DedupIds: ids, DedupResults: results, Commit: true, RightRevision: right.Revision()}))
	if code(r) != codes.OK {
		t.Fatalf("commit: %v", r)
	}
	if got := dedupIDs(t, left); len(got) != 3 || got[0] != "left-write-1" || got[1] != "right-write-1" || got[2] != "right-write-2" {
		t.Fatalf("merged dedup table %q, want the left's entry then the right's, each once", got)
	}
	check := func(s *Shard) {
		t.Helper()
		before := dataDump(t, s)
		rev := s.Revision()
		again := applyOne(t, s, newFeeder(s), retried())
		if !proto.Equal(again, first) {
			t.Fatalf("retried write after the merge returned %v, want the first result %v", again, first)
		}
		if s.Revision() != rev || !maps.Equal(dataDump(t, s), before) {
			t.Fatalf("retried write after the merge applied again (revision %d -> %d)", rev, s.Revision())
		}
	}
	check(left)
	check(reopen(t, e, left, "left"))
}
