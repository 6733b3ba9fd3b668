package shard

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

const ts0 = int64(1_700_000_000_000_000_000)

func withID(id string, cmd *shalev1.RaftCommand) *shalev1.RaftCommand {
	cmd.RequestId = []byte(id)
	return cmd
}

// dedupIDs returns the request IDs in the dedup table, in insertion order:
// the entries at or above the oldest live sequence (those below it were
// evicted, and are left for compactions to drop).
func dedupIDs(t *testing.T, s *Shard) []string {
	t.Helper()
	dump := engineDump(t, s)
	type entry struct {
		seq uint64
		id  string
	}
	var live []entry
	oldest := s.st.Load().dedupOldest
	for k, v := range dump {
		if strings.HasPrefix(k, string(dedupSeqPrefix)) {
			t.Fatalf("a format 1 eviction record %q remains", k)
		}
		prefix, legacy := string(dedupPrefix), false
		if strings.HasPrefix(k, string(legacyDedupPrefix)) {
			prefix, legacy = string(legacyDedupPrefix), true
		} else if !strings.HasPrefix(k, prefix) {
			continue
		}
		seq, _, ok := splitDedupEntry([]byte(v), legacy)
		if !ok {
			t.Fatalf("dedup entry %q of %d bytes", k, len(v))
		}
		if seq >= oldest {
			live = append(live, entry{seq, k[len(prefix):]})
		}
	}
	slices.SortFunc(live, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
	var out []string
	for _, e := range live {
		out = append(out, e.id)
	}
	return out
}

func TestDedupSameRequestOnce(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	put := func() *shalev1.RaftCommand {
		return withID("req-000000000001", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v", 0, true)}}))
	}
	first := applyOne(t, s, f, put())
	// Again in a later Apply call, and twice within one call.
	second := applyOne(t, s, f, put())
	res, err := results(s.Apply([]replication.Entry{f.entry(marshalCmd(t, put())), f.entry(marshalCmd(t, put()))}))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []any{second, res[0], res[1]} {
		if !proto.Equal(r.(*shalev1.CommandResult), first) {
			t.Fatalf("retry %d: result %v, want %v", i, r, first)
		}
	}
	kv, rev, err := s.Get([]byte("k"), ts0)
	if err != nil || kv.Version != 1 || rev != 1 || s.Revision() != 1 {
		t.Fatalf("after retries: %v rev %d (%v); want version 1 at revision 1", kv, rev, err)
	}
	if st := s.AppliedState(); st.Index != f.index {
		t.Fatalf("applied index %d, want %d: deduplicated entries still advance it", st.Index, f.index)
	}
	// A retry after a reopen is still recognised.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("a", 0)
	if r := applyOne(t, s, f, put()); !proto.Equal(r, first) || s.Revision() != 1 {
		t.Fatalf("retry after reopen: %v rev %d", r, s.Revision())
	}
	// Read-only commands and rejected commands are not stored.
	applyOne(t, s, f, withID("read-only-000001", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{getOp("k")}})))
	applyOne(t, s, f, withID("stale-epoch-0001", &shalev1.RaftCommand{Epoch: 99, Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{}}}))
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"req-000000000001"}) {
		t.Fatalf("dedup table %q", ids)
	}
}

// TestDedupFirstAttempt: a command marked first_attempt skips the lookup but
// records its ID, so its retry (not marked) is answered from the table; the
// flag is the proposer's promise, so a marked duplicate is applied again.
func TestDedupFirstAttempt(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	put := func(first bool) *shalev1.CommandResult {
		cmd := withID("req-000000000002", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v", 0, true)}}))
		cmd.FirstAttempt = first
		return applyOne(t, s, f, cmd)
	}
	first := put(true)
	if retry := put(false); !proto.Equal(retry, first) || s.Revision() != 1 {
		t.Fatalf("retry after a first attempt: %v at revision %d, want %v at 1", retry, s.Revision(), first)
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"req-000000000002"}) {
		t.Fatalf("dedup table %q", ids)
	}
	if again := put(true); again.Txn.Header.Revision != 2 || s.Revision() != 2 {
		t.Fatalf("a duplicate marked first_attempt: %v at revision %d; want it applied at revision 2", again, s.Revision())
	}
}

func TestDedupEvictionOrder(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 3)
	f := newFeeder(s)
	put := func(id string) *shalev1.CommandResult {
		return applyOne(t, s, f, withID(id, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", id, 0, false)}})))
	}
	for _, id := range []string{"id1", "id2", "id3", "id4", "id5"} {
		put(id)
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"id3", "id4", "id5"}) {
		t.Fatalf("after 5 inserts with capacity 3: %q", ids)
	}
	// id5 is remembered: no effect. id1 was evicted: applied again, and
	// it evicts id3, the oldest.
	if r := put("id5"); r.Txn.Header.Revision != 5 || s.Revision() != 5 {
		t.Fatalf("retry of id5 applied again: %v", r)
	}
	if r := put("id1"); r.Txn.Header.Revision != 6 || s.Revision() != 6 {
		t.Fatalf("retry of evicted id1: %v", r)
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"id4", "id5", "id1"}) {
		t.Fatalf("after re-inserting id1: %q", ids)
	}
	// Eviction within one Apply call, several at once.
	var entries []replication.Entry
	for i := range 5 {
		id := fmt.Sprintf("batch%d", i)
		entries = append(entries, f.entry(marshalCmd(t, withID(id, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", id, 0, false)}})))))
	}
	entries = append(entries, f.entry(marshalCmd(t, withID("batch4", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "x", 0, false)}})))))
	res, err := results(s.Apply(entries))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(res[5].(*shalev1.CommandResult), res[4].(*shalev1.CommandResult)) || s.Revision() != 11 {
		t.Fatalf("in-call duplicate: %v vs %v, revision %d", res[5], res[4], s.Revision())
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"batch2", "batch3", "batch4"}) {
		t.Fatalf("after a batch: %q", ids)
	}
}

// TestReplicasConverge feeds two shards the same random entries (with
// duplicated request IDs, TTLs and deletes) in different Apply groupings:
// they must end with identical checksums and identical engines.
func TestReplicasConverge(t *testing.T) {
	env := newTestEnv(t, nil)
	desc := userDesc(3, "k05", "k35")
	a := env.bootstrap("a", desc, 20)
	b := env.bootstrap("b", desc, 20)
	rng := rand.New(rand.NewPCG(1, 2))
	g := &txnGen{rng: rng, m: newModel(desc)}
	f := newFeeder(a)
	var entries []replication.Entry
	now := ts0
	for i := range 600 {
		now += rng.Int64N(10e6)
		cmd := txnCmd(now, g.txn(now))
		if rng.IntN(2) == 0 {
			cmd.RequestId = fmt.Appendf(nil, "req-%d", rng.IntN(i+1))
		}
		entries = append(entries, f.entry(marshalCmd(t, cmd)))
	}
	apply := func(s *Shard, maxGroup int) []any {
		var all []any
		for rest := entries; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(maxGroup))
			res, err := results(s.Apply(rest[:n]))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, res...)
			rest = rest[n:]
		}
		return all
	}
	ra, rb := apply(a, 1), apply(b, 20)
	for i := range ra {
		if !proto.Equal(ra[i].(*shalev1.CommandResult), rb[i].(*shalev1.CommandResult)) {
			t.Fatalf("entry %d: results differ: %v vs %v", i, ra[i], rb[i])
		}
	}
	ca, err := a.Checksum()
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Checksum()
	if err != nil {
		t.Fatal(err)
	}
	if ca != cb {
		t.Fatalf("checksums differ: %x vs %x", ca, cb)
	}
	if da, db := engineDump(t, a), engineDump(t, b); !maps.Equal(da, db) {
		t.Fatalf("engines differ: %s", diffMaps(da, db))
	}
	sameAppliedState(t, a.AppliedState(), b.AppliedState())
	if a.Revision() == 0 || len(dedupIDs(t, a)) != 20 {
		t.Fatalf("test did too little: revision %d, dedup %d", a.Revision(), len(dedupIDs(t, a)))
	}
	// A different history gives a different checksum.
	applyOne(t, b, newFeeder(b), txnCmd(now, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k10", "other", 0, false)}}))
	if cb2, _ := b.Checksum(); cb2 == ca {
		t.Fatal("checksum did not change with the data")
	}
}

func TestEpochMismatch(t *testing.T) {
	env := newTestEnv(t, nil)
	desc := userDesc(1, "", "")
	desc.Epoch = 4
	s := env.bootstrap("a", desc, 0)
	f := newFeeder(s)
	applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v1", 0, false)}}))
	before := dataDump(t, s)
	for _, epoch := range []uint64{3, 5} {
		cmd := withID(fmt.Sprint("req-epoch-", epoch), txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v2", 0, false), delOp("k", false)}}))
		cmd.Epoch = epoch
		r := applyOne(t, s, f, cmd)
		if r.ErrorCode != uint32(codes.FailedPrecondition) || r.Txn != nil || !proto.Equal(r.Descriptor_, desc) || r.ErrorMessage == "" {
			t.Fatalf("epoch %d: result %v", epoch, r)
		}
	}
	if got := dataDump(t, s); !maps.Equal(got, before) || s.Revision() != 1 {
		t.Fatalf("rejected commands changed the state: %s", diffMaps(got, before))
	}
	if st := s.AppliedState(); st.Index != f.index {
		t.Fatalf("applied index %d, want %d", st.Index, f.index)
	}
	// The matching epoch applies, also after a rejection with the same
	// request ID (rejections are not remembered).
	cmd := withID("req-epoch-5", txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v3", 0, false)}}))
	cmd.Epoch = 4
	if r := applyOne(t, s, f, cmd); r.ErrorCode != 0 || r.Txn.Header.Revision != 2 || r.Txn.Header.Epoch != 4 || r.Txn.Header.ShardId != 1 {
		t.Fatalf("matching epoch: %v", r)
	}
}

func TestTxnValidation(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "b", "m"), 0)
	f := newFeeder(s)
	for _, tc := range []struct {
		name string
		txn  *shalev1.TxnRequest
		code codes.Code
	}{
		{"put below", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("c", "v", 0, false), putOp("a", "v", 0, false)}}, codes.OutOfRange},
		{"put at end", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("m", "v", 0, false)}}, codes.OutOfRange},
		{"failure branch checked too", &shalev1.TxnRequest{Failure: []*shalev1.RequestOp{delOp("z", false)}, Success: []*shalev1.RequestOp{putOp("c", "v", 0, false)}}, codes.OutOfRange},
		{"compare outside", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("n")}}, Success: []*shalev1.RequestOp{putOp("c", "v", 0, false)}}, codes.OutOfRange},
		{"get outside", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{getOp("a")}}, codes.OutOfRange},
		{"range outside", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("m", "")}}, codes.OutOfRange},
		{"range below", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("a", "b")}}, codes.OutOfRange},
		{"range partly below", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("a", "c")}}, codes.OutOfRange},
		{"range partly above", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("c", "n")}}, codes.OutOfRange},
		{"range empty start", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("", "c")}}, codes.InvalidArgument},
		{"range empty", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("c", "c")}}, codes.InvalidArgument},
		{"put empty key", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("", "v", 0, false)}}, codes.InvalidArgument},
		{"negative ttl", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("c", "v", -1, false)}}, codes.InvalidArgument},
		{"empty txn", &shalev1.TxnRequest{}, codes.InvalidArgument},
		{"range inverted", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("d", "c")}}, codes.InvalidArgument},
		{"empty op", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{{}}}, codes.InvalidArgument},
		{"bad target", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("c"), Target: 9}}}, codes.InvalidArgument},
		{"bad result", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("c"), Result: 9}}}, codes.InvalidArgument},
	} {
		r := applyOne(t, s, f, txnCmd(ts0, tc.txn))
		if r.ErrorCode != uint32(tc.code) || r.Txn != nil {
			t.Errorf("%s: result %v, want code %v", tc.name, r, tc.code)
		}
	}
	if s.Revision() != 0 || len(dataDump(t, s)) != 0 {
		t.Fatal("a rejected txn changed the state")
	}
	// A delete range with an open end runs to the shard's end.
	applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("b", "1", 0, false), putOp("l", "2", 0, false)}}))
	if r := applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("c", "")}})); r.ErrorCode != 0 {
		t.Fatal(r)
	}
	if r := applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{getOp("b"), getOp("l")}})); r.Txn.Results[0].GetGet().Kv == nil || r.Txn.Results[1].GetGet().Kv != nil {
		t.Fatal(r)
	}
	// A system command on a user shard is rejected.
	r := applyOne(t, s, f, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_System{System: &shalev1.SystemCommand{Op: &shalev1.SystemCommand_RemoveNodeId{RemoveNodeId: 1}}}})
	if r.ErrorCode != uint32(codes.InvalidArgument) {
		t.Fatal(r)
	}
}

// TestTxnSeesOwnWrites checks etcd semantics within a txn and across the
// entries of one Apply call, including range deletes over pending writes.
func TestTxnSeesOwnWrites(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("a", "0", 0, false), putOp("c", "0", 0, false)}}))
	r := applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{
		putOp("a", "1", 0, true),
		getOp("a"),
		putOp("b", "1", 0, false),
		delRangeOp("a", "c"),
		getOp("a"),
		putOp("b", "2", 0, true),
		getOp("b"),
		getOp("c"),
	}}))
	res := r.Txn.Results
	if r.Txn.Header.Revision != 2 {
		t.Fatal(r)
	}
	if pk := res[0].GetPut().PrevKv; pk == nil || string(pk.Value) != "0" || pk.Version != 1 {
		t.Fatalf("prev kv %v", pk)
	}
	if kv := res[1].GetGet().Kv; string(kv.Value) != "1" || kv.Version != 2 || kv.ModRevision != 2 || kv.CreateRevision != 1 {
		t.Fatalf("get after put: %v", kv)
	}
	if res[4].GetGet().Kv != nil || res[5].GetPut().PrevKv != nil {
		t.Fatalf("range delete not seen: %v %v", res[4], res[5])
	}
	if kv := res[6].GetGet().Kv; string(kv.Value) != "2" || kv.Version != 1 || kv.CreateRevision != 2 {
		t.Fatalf("get after re-put: %v", kv)
	}
	if kv := res[7].GetGet().Kv; string(kv.Value) != "0" {
		t.Fatalf("key at the range end: %v", kv)
	}
	// Across entries of one Apply call.
	res2, err := results(s.Apply([]replication.Entry{
		f.entry(marshalCmd(t, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("x", "1", 0, false)}}))),
		f.entry(marshalCmd(t, txnCmd(ts0, &shalev1.TxnRequest{
			Compares: []*shalev1.Compare{{Key: []byte("x"), Target: shalev1.Compare_TARGET_VERSION, Number: 1}},
			Success:  []*shalev1.RequestOp{delRangeOp("\x00", "")},
		}))),
		f.entry(marshalCmd(t, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{getOp("x"), getOp("c")}}))),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !res2[1].(*shalev1.CommandResult).Txn.Succeeded {
		t.Fatal("compare did not see the previous entry's write")
	}
	last := res2[2].(*shalev1.CommandResult).Txn
	if last.Results[0].GetGet().Kv != nil || last.Results[1].GetGet().Kv != nil || last.Header.Revision != 4 {
		t.Fatalf("read after delete range in the same call: %v", last)
	}
	if n := len(dataDump(t, s)); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}

func TestTTLExpiry(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v", 100, false)}}))
	exp := ts0 + 100e6
	if kv, _, _ := s.Get([]byte("k"), exp-1); kv == nil || kv.ExpireUnixNanos != exp {
		t.Fatalf("before expiry: %v", kv)
	}
	if kv, _, _ := s.Get([]byte("k"), exp); kv != nil {
		t.Fatalf("at expiry: %v", kv)
	}
	// A put at the expiry time recreates the key.
	r := applyOne(t, s, f, txnCmd(exp, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "w", 0, true)}}))
	kv, _, _ := s.Get([]byte("k"), exp+1e12)
	if r.Txn.Results[0].GetPut().PrevKv != nil || kv.Version != 1 || kv.CreateRevision != 2 || kv.ExpireUnixNanos != 0 {
		t.Fatalf("recreate after expiry: %v %v", r, kv)
	}
}

func TestConfChangeRoles(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	single := func(typ raftpb.ConfChangeType, id uint64) *raftpb.ConfChangeSingle {
		return &raftpb.ConfChangeSingle{Type: &typ, NodeId: &id}
	}
	type role = shalev1.ReplicaRole
	const (
		V   = shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED
		L   = shalev1.ReplicaRole_REPLICA_ROLE_LEARNER
		IN  = shalev1.ReplicaRole_REPLICA_ROLE_VOTER_INCOMING
		OUT = shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING
	)
	step := func(name string, changes []*raftpb.ConfChangeSingle, cs *raftpb.ConfState, ctx []*shalev1.ReplicaDescriptor, want map[uint64]role, wantNodes map[uint64]uint64, wantNext uint64) {
		t.Helper()
		before := s.Descriptor()
		res, err := results(s.Apply([]replication.Entry{f.confEntry(&replication.AppliedConfChange{
			Change:    &raftpb.ConfChangeV2{Changes: changes},
			ConfState: cs,
			Context:   &shalev1.ConfChangeContext{Replicas: ctx},
		})}))
		if err != nil || res[0] != nil {
			t.Fatalf("%s: %v %v", name, res, err)
		}
		d := s.Descriptor()
		got := map[uint64]role{}
		for _, r := range d.Replicas {
			got[r.ReplicaId] = r.Role
			if n, ok := wantNodes[r.ReplicaId]; ok && r.NodeId != n {
				t.Fatalf("%s: replica %d on node %d, want %d", name, r.ReplicaId, r.NodeId, n)
			}
		}
		if !maps.Equal(got, want) {
			t.Fatalf("%s: roles %v, want %v", name, got, want)
		}
		if d.Epoch != before.Epoch+1 || d.NextReplicaId != wantNext {
			t.Fatalf("%s: epoch %d (was %d), next replica id %d want %d", name, d.Epoch, before.Epoch, d.NextReplicaId, wantNext)
		}
		if st := s.AppliedState(); !proto.Equal(st.ConfState, cs) || !proto.Equal(st.Descriptor, d) {
			t.Fatalf("%s: applied state %v", name, st)
		}
	}
	step("add learner 4",
		[]*raftpb.ConfChangeSingle{single(raftpb.ConfChangeAddLearnerNode, 4)},
		&raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}},
		[]*shalev1.ReplicaDescriptor{{NodeId: 40, ReplicaId: 4}},
		map[uint64]role{1: V, 2: V, 3: V, 4: L}, map[uint64]uint64{1: 10, 4: 40}, 5)
	step("joint: promote 4, remove 3",
		[]*raftpb.ConfChangeSingle{single(raftpb.ConfChangeAddNode, 4), single(raftpb.ConfChangeRemoveNode, 3)},
		&raftpb.ConfState{Voters: []uint64{1, 2, 4}, VotersOutgoing: []uint64{1, 2, 3}},
		nil,
		map[uint64]role{1: V, 2: V, 3: OUT, 4: IN}, map[uint64]uint64{3: 30, 4: 40}, 5)
	step("leave joint",
		nil,
		&raftpb.ConfState{Voters: []uint64{1, 2, 4}},
		nil,
		map[uint64]role{1: V, 2: V, 4: V}, nil, 5)
	step("joint: demote 2, add voter 6",
		[]*raftpb.ConfChangeSingle{single(raftpb.ConfChangeAddLearnerNode, 2), single(raftpb.ConfChangeAddNode, 6)},
		&raftpb.ConfState{Voters: []uint64{1, 4, 6}, VotersOutgoing: []uint64{1, 2, 4}, LearnersNext: []uint64{2}},
		[]*shalev1.ReplicaDescriptor{{NodeId: 60, ReplicaId: 6}},
		map[uint64]role{1: V, 2: OUT, 4: V, 6: IN}, map[uint64]uint64{2: 20, 6: 60}, 7)
	step("leave joint again",
		nil,
		&raftpb.ConfState{Voters: []uint64{1, 4, 6}, Learners: []uint64{2}},
		nil,
		map[uint64]role{1: V, 2: L, 4: V, 6: V}, map[uint64]uint64{2: 20}, 7)
	step("remove learner 2",
		[]*raftpb.ConfChangeSingle{single(raftpb.ConfChangeRemoveNode, 2)},
		&raftpb.ConfState{Voters: []uint64{1, 4, 6}},
		nil,
		map[uint64]role{1: V, 4: V, 6: V}, nil, 7)

	// The configuration survives a reopen.
	want := s.AppliedState()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("a", 0)
	sameAppliedState(t, s.AppliedState(), want)

	// Epoch-checked commands now need the new epoch.
	cmd := txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v", 0, false)}})
	cmd.Epoch = 1
	if r := applyOne(t, s, f, cmd); r.ErrorCode != uint32(codes.FailedPrecondition) || r.Descriptor_.Epoch != 7 {
		t.Fatalf("old epoch after conf changes: %v", r)
	}
}

func TestSystemShard(t *testing.T) {
	env := newTestEnv(t, nil)
	sys := &shalev1.ShardDescriptor{ShardId: 1, Epoch: 1, System: true, NextReplicaId: 2,
		Replicas: []*shalev1.ReplicaDescriptor{{NodeId: 1, ReplicaId: 1}}}
	s := env.bootstrap("sys", sys, 0)
	f := newFeeder(s)
	sysCmd := func(sc *shalev1.SystemCommand) *shalev1.CommandResult {
		return applyOne(t, s, f, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_System{System: sc}})
	}
	for i := uint64(1); i <= 3; i++ {
		if r := sysCmd(&shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutNode{PutNode: &shalev1.NodeDescriptor{NodeId: i, Address: fmt.Sprintf("n%d:7000", i)}}}); r.ErrorCode != 0 || r.Txn.Header.Revision != i {
			t.Fatal(r)
		}
	}
	sysCmd(&shalev1.SystemCommand{Op: &shalev1.SystemCommand_RemoveNodeId{RemoveNodeId: 2}})
	nodes, err := s.Nodes()
	if err != nil || len(nodes) != 2 || nodes[0].NodeId != 1 || nodes[1].NodeId != 3 || nodes[1].Address != "n3:7000" {
		t.Fatalf("nodes %v %v", nodes, err)
	}
	putShard := func(id, epoch uint64, end string) *shalev1.CommandResult {
		return sysCmd(&shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutShard{PutShard: &shalev1.ShardDescriptor{ShardId: id, Epoch: epoch, EndKey: []byte(end)}}})
	}
	putShard(2, 5, "m")
	putShard(3, 1, "")
	if r := putShard(2, 4, "x"); r.ErrorCode != uint32(codes.FailedPrecondition) || r.Descriptor_.Epoch != 5 {
		t.Fatalf("stale put_shard: %v", r)
	}
	if r := putShard(2, 5, "n"); r.ErrorCode != 0 {
		t.Fatalf("same-epoch put_shard: %v", r)
	}
	shards, err := s.Shards()
	if err != nil || len(shards) != 2 || shards[0].ShardId != 2 || string(shards[0].EndKey) != "n" || shards[1].ShardId != 3 {
		t.Fatalf("shards %v %v", shards, err)
	}
	// Pins: put, replace, delete (until 0).
	putPin := func(id uint64, until int64) *shalev1.CommandResult {
		return sysCmd(&shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutPin{PutPin: &shalev1.ShardPin{ShardId: id, UntilUnixNanos: until, MoveFromNodeId: 1, MoveToNodeId: 4}}})
	}
	putPin(7, 100)
	putPin(9, 200)
	putPin(7, 300)
	putPin(9, 0)
	pins, err := s.Pins()
	if err != nil || len(pins) != 1 || pins[0].GetShardId() != 7 || pins[0].GetUntilUnixNanos() != 300 || pins[0].GetMoveToNodeId() != 4 {
		t.Fatalf("pins %v %v", pins, err)
	}
	// Auth state: replaced whole when the stored revision is the expected
	// one; refused (Aborted) otherwise.
	if st, err := s.AuthState(); err != nil || st != nil {
		t.Fatalf("auth state before any: %v %v", st, err)
	}
	putAuth := func(expected, rev uint64, user string) *shalev1.CommandResult {
		return sysCmd(&shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutAuth{PutAuth: &shalev1.PutAuth{
			ExpectedRevision: expected, State: &shalev1.AuthState{Revision: rev, Users: []*shalev1.User{{Name: user}}}}}})
	}
	if r := putAuth(0, 1, "a"); r.ErrorCode != 0 {
		t.Fatal(r)
	}
	if r := putAuth(0, 1, "b"); r.ErrorCode != uint32(codes.Aborted) {
		t.Fatalf("stale put_auth: %v", r)
	}
	if r := putAuth(1, 3, "b"); r.ErrorCode != uint32(codes.InvalidArgument) {
		t.Fatalf("put_auth skipping a revision: %v", r)
	}
	if r := putAuth(1, 2, "c"); r.ErrorCode != 0 {
		t.Fatal(r)
	}
	if st, err := s.AuthState(); err != nil || st.GetRevision() != 2 || st.GetUsers()[0].GetName() != "c" {
		t.Fatalf("auth state %v %v", st, err)
	}
	for _, bad := range []*shalev1.SystemCommand{
		{},
		{Op: &shalev1.SystemCommand_PutAuth{PutAuth: &shalev1.PutAuth{}}},
		{Op: &shalev1.SystemCommand_PutPin{PutPin: &shalev1.ShardPin{UntilUnixNanos: 5}}},
		{Op: &shalev1.SystemCommand_PutNode{PutNode: &shalev1.NodeDescriptor{}}},
		{Op: &shalev1.SystemCommand_PutShard{PutShard: &shalev1.ShardDescriptor{}}},
		{Op: &shalev1.SystemCommand_RemoveNodeId{}},
	} {
		if r := sysCmd(bad); r.ErrorCode != uint32(codes.InvalidArgument) {
			t.Fatalf("%v: %v", bad, r)
		}
	}
	// No user keys on the system shard.
	if r := applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v", 0, false)}})); r.ErrorCode != uint32(codes.InvalidArgument) {
		t.Fatal(r)
	}
	if _, _, err := s.Get([]byte("k"), ts0); err == nil {
		t.Fatal("Get on the system shard succeeded")
	}
	// A user shard has no system records.
	u := env.bootstrap("user", userDesc(2, "", ""), 0)
	if _, err := u.Nodes(); err == nil {
		t.Fatal("Nodes on a user shard succeeded")
	}
	if c, err := s.Checksum(); err != nil || c == 0 {
		t.Fatal(c, err)
	}
}

// TestBatchedEntriesFailAlone: an apply worker hands a busy shard's
// entries to one Apply call; a command among them that fails validation
// (a key outside the shard, a stale epoch) fails alone, and every other
// command of the call applies.
func TestBatchedEntriesFailAlone(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "b", "m"), 0)
	f := newFeeder(s)
	var ents []replication.Entry
	bad := map[int]codes.Code{5: codes.OutOfRange, 11: codes.FailedPrecondition}
	for i := range 16 {
		cmd := txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(fmt.Sprintf("c%02d", i), "v", 0, false)}})
		switch bad[i] {
		case codes.OutOfRange:
			cmd = txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("z", "v", 0, false)}})
		case codes.FailedPrecondition:
			cmd.Epoch = 7
		}
		ents = append(ents, f.entry(marshalCmd(t, cmd)))
	}
	res, err := results(s.Apply(ents))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		cr := r.(*shalev1.CommandResult)
		if want := bad[i]; codes.Code(cr.GetErrorCode()) != want {
			t.Errorf("entry %d: %v %q, want %v", i, codes.Code(cr.GetErrorCode()), cr.GetErrorMessage(), want)
		}
	}
	if n := len(dataDump(t, s)); n != 14 || s.Revision() != 14 {
		t.Fatalf("%d keys at revision %d after 16 entries with 2 refused; want 14 and 14", n, s.Revision())
	}
}
