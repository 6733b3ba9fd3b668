package shard

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage/vfs"
)

// packedEntry makes cmds the parts of one packed Raft entry (as the
// Replica hands it over) at f's next index.
func packedEntry(t *testing.T, f *feeder, cmds ...*shalev1.RaftCommand) []replication.Entry {
	t.Helper()
	f.index++
	ents := make([]replication.Entry, len(cmds))
	for i, c := range cmds {
		ents[i] = replication.Entry{Index: f.index, Term: f.term, Payload: marshalCmd(t, c), Part: i, Parts: len(cmds)}
	}
	return ents
}

func putCmd(k, v string) *shalev1.RaftCommand {
	return txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, v, 0, false)}})
}

// TestPackedEntryCommandsFailAlone: the commands of one packed Raft entry
// apply in order, each with its own result; one that fails its validation
// (a key outside the shard, a stale epoch, a command that must have an
// entry of its own) fails alone, a retried request gets its stored result
// and applies nothing, and the others apply. The entry leaves one entry
// record, whose events carry their own commands' revisions.
func TestPackedEntryCommandsFailAlone(t *testing.T) {
	env := newTestEnv(t, nil)
	env.keepWAL = true
	s := env.bootstrap("a", userDesc(1, "b", "m"), 0)
	f := newFeeder(s)
	first := applyOne(t, s, f, withID("req-1", putCmd("c", "1")))
	stale := putCmd("d", "x")
	stale.Epoch = 7
	del := txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delOp("c", true)}})
	split := &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Split{Split: &shalev1.SplitCommand{SplitKey: []byte("g"), RightShardId: 2}}}
	ents := packedEntry(t, f,
		putCmd("e", "2"),                  // revision 2
		putCmd("z", "outside"),            // OutOfRange
		stale,                             // FailedPrecondition
		withID("req-1", putCmd("c", "1")), // a retry: the stored result
		split,                             // InvalidArgument: not in a packed entry
		del,                               // revision 3
		putCmd("f", "4"),                  // revision 4
	)
	res, err := results(s.Apply(ents))
	if err != nil {
		t.Fatal(err)
	}
	codesWant := []codes.Code{codes.OK, codes.OutOfRange, codes.FailedPrecondition, codes.OK, codes.InvalidArgument, codes.OK, codes.OK}
	revsWant := []uint64{2, 0, 0, 1, 0, 3, 4}
	for i, r := range res {
		cr, _ := r.(*shalev1.CommandResult)
		if cr == nil {
			t.Fatalf("part %d: result %v", i, r)
		}
		if codes.Code(cr.GetErrorCode()) != codesWant[i] {
			t.Errorf("part %d: %v %q, want %v", i, codes.Code(cr.GetErrorCode()), cr.GetErrorMessage(), codesWant[i])
		}
		if rev := cr.GetTxn().GetHeader().GetRevision(); rev != revsWant[i] {
			t.Errorf("part %d: revision %d, want %d", i, rev, revsWant[i])
		}
	}
	if !proto.Equal(res[3].(*shalev1.CommandResult), first) {
		t.Errorf("the retried request got %v, want its first result %v", res[3], first)
	}
	got := dataDump(t, s)
	if _, ok := got["c"]; ok || len(got) != 2 || s.Revision() != 4 {
		t.Fatalf("after the packed entry: %d keys %v at revision %d; want e and f at 4", len(got), got, s.Revision())
	}
	if st := s.AppliedState(); st.Index != f.index {
		t.Fatalf("applied index %d, want the packed entry's %d", st.Index, f.index)
	}
	entries := walEntries(t, s)
	last := entries[len(entries)-1]
	if last.Mark.Index != f.index || last.Mark.Revision != 4 || entries[len(entries)-2].Mark.Index != f.index-1 {
		t.Fatalf("the WAL ends with entries %v, %v", entries[len(entries)-2].Mark, last.Mark)
	}
	var evs []string
	for _, ev := range last.Events {
		evs = append(evs, fmt.Sprintf("%s@%d", ev.KV.GetKey(), ev.Revision))
	}
	if want := []string{"e@2", "c@3", "f@4"}; !slices.Equal(evs, want) {
		t.Fatalf("the packed entry's events %v, want %v", evs, want)
	}
	if ev := last.Events[1]; ev.Kind != EventDelete || ev.KV.GetModRevision() != 3 || string(ev.Prev.GetValue()) != "1" {
		t.Fatalf("the delete's event: %v", ev)
	}
}

// TestPackedEntryReplay: a packed entry applied but lost in a crash (the
// shard's WAL is not synced: the Raft log is the durable record) is applied
// again whole after the restart, with the same results and state as on a
// shard that never crashed; one made durable before the crash is skipped
// whole when the log replays it.
func TestPackedEntryReplay(t *testing.T) {
	env := newTestEnv(t, vfs.NewCrashableMem())
	a := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(a)
	fill(t, a, f, rand.New(rand.NewPCG(1, 2)), 20)
	durable := packedEntry(t, f, putCmd("p1", "a"), putCmd("p2", "b"))
	if _, err := a.Apply(durable); err != nil {
		t.Fatal(err)
	}
	if idx, err := a.Flush(); err != nil || idx != f.index {
		t.Fatalf("Flush = %d, %v; want %d", idx, err, f.index)
	}
	lost := packedEntry(t, f, putCmd("p1", "c"),
		txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delOp("p2", false)}}), putCmd("p3", "d"))
	want, err := results(a.Apply(lost))
	if err != nil {
		t.Fatal(err)
	}
	wantData, wantRev := dataDump(t, a), a.Revision()

	b := newTestEnv(t, env.fs.(*vfs.MemFS).CrashClone()).open("a", 0)
	if st := b.AppliedState(); st.Index != lost[0].Index-1 {
		t.Fatalf("after the crash: applied %d, want %d", st.Index, lost[0].Index-1)
	}
	// The Raft log replays from the durable entry on.
	got, err := results(b.Apply(append(durable, lost...)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range durable {
		if got[i] != nil {
			t.Fatalf("the durable entry's part %d applied again: %v", i, got[i])
		}
	}
	for i, w := range want {
		if !proto.Equal(got[len(durable)+i].(*shalev1.CommandResult), w.(*shalev1.CommandResult)) {
			t.Fatalf("part %d after replay: %v, want %v", i, got[len(durable)+i], w)
		}
	}
	if d := dataDump(t, b); !maps.Equal(d, wantData) || b.Revision() != wantRev || b.AppliedState().Index != f.index {
		t.Fatalf("after replay: %s, revision %d (want %d), applied %d (want %d)", diffMaps(d, wantData), b.Revision(), wantRev, b.AppliedState().Index, f.index)
	}
}
