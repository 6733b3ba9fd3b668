package shard

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// testSplitter hosts split shards in a map, as a node's Store would (from
// the HostShard effects of Apply).
type testSplitter struct {
	hosted map[uint64]*Shard
}

// apply applies entries to s and hosts the shards they create.
func (sp *testSplitter) apply(s *Shard, entries []replication.Entry) ([]any, error) {
	ap, err := s.Apply(entries)
	for _, e := range ap.Effects {
		if h, ok := e.(replication.HostShard); ok {
			right := h.StateMachine.(*Shard)
			sp.hosted[right.Descriptor().GetShardId()] = right
		}
	}
	return ap.Results, err
}

// splitOne applies the split entry e to s alone, checks that it applied,
// and returns the shard it hosted as id (closed at cleanup).
func (sp *testSplitter) splitOne(t *testing.T, s *Shard, e replication.Entry, id uint64) *Shard {
	t.Helper()
	res, err := sp.apply(s, []replication.Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	if cr := res[0].(*shalev1.CommandResult); cr.GetErrorCode() != 0 {
		t.Fatalf("split: %s", cr.GetErrorMessage())
	}
	right := sp.hosted[id]
	if right == nil {
		t.Fatalf("the split did not host shard %d", id)
	}
	t.Cleanup(func() { _ = right.Close() })
	return right
}

// newSplittingShard bootstraps shard 2 over [b, y) among the node's
// shards in "shards".
func newSplittingShard(t *testing.T) (*testEnv, *testSplitter, *Shard) {
	t.Helper()
	e := newTestEnv(t, nil)
	e.keepWAL = true
	sp, s := splittingShardIn(t, e)
	return e, sp, s
}

// splittingShardIn bootstraps shard 2 over [b, y) among the node's shards
// in "shards" of e.
func splittingShardIn(t *testing.T, e *testEnv) (*testSplitter, *Shard) {
	t.Helper()
	sp := &testSplitter{hosted: map[uint64]*Shard{}}
	opts := e.opts(0)
	opts.ShardsDir = "shards"
	s, err := Bootstrap("shards/2", initialState(userDesc(2, "b", "y")), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return sp, s
}

func splitCmd(key string, right uint64) *shalev1.RaftCommand {
	return &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Split{Split: &shalev1.SplitCommand{SplitKey: []byte(key), RightShardId: right}}}
}

// TestSplit splits a shard after writes staged in the same Apply call: the
// right shard's engine holds exactly the keys from the split key on, with
// their revisions, the left keeps the rest, both epochs bump, the right
// starts a fresh Raft group with the left's configuration, and both
// survive a reopen.
func TestSplit(t *testing.T) {
	e, sp, s := newSplittingShard(t)
	f := newFeeder(s)
	for _, k := range []string{"b", "c", "m", "n", "x"} {
		applyOne(t, s, f, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v"+k, 0, false)}}))
	}
	before := dataDump(t, s)
	// One Apply call: a write, the split, a write to the left half.
	res, err := sp.apply(s, []replication.Entry{
		f.entry(marshalCmd(t, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("o", "vo", 0, false)}}))),
		f.entry(marshalCmd(t, splitCmd("m", 7))),
		f.entry(marshalCmd(t, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("d", "vd", 0, false)}}))),
	})
	if err != nil {
		t.Fatal(err)
	}
	cr := res[1].(*shalev1.CommandResult)
	if cr.GetErrorCode() != 0 {
		t.Fatalf("split: %s", cr.GetErrorMessage())
	}
	right := sp.hosted[7]
	if right == nil {
		t.Fatal("the right shard was not hosted")
	}
	t.Cleanup(func() { _ = right.Close() })
	ld, rd := s.Descriptor(), right.Descriptor()
	if string(ld.GetEndKey()) != "m" || ld.GetEpoch() != 2 || string(rd.GetStartKey()) != "m" || string(rd.GetEndKey()) != "y" ||
		rd.GetEpoch() != 2 || rd.GetShardId() != 7 || len(rd.GetReplicas()) != 3 {
		t.Fatalf("descriptors after split: left %v, right %v", ld, rd)
	}
	if st := right.AppliedState(); st.Index != replication.InitialIndex || st.Term != replication.InitialTerm || len(st.ConfState.GetVoters()) != 3 {
		t.Fatalf("right applied state %+v", st)
	}
	// The change log: the write before the split is one event, the split
	// moves keys without events and records the left's new range.
	var events []string
	var ranges int
	for _, le := range walEntries(t, s) {
		for _, ev := range le.Events {
			events = append(events, fmt.Sprintf("%d:%s", ev.Kind, ev.KV.GetKey()))
		}
		if le.Range != nil {
			ranges++
			if string(le.Range.GetEndKey()) != "m" || le.Range.GetEpoch() != 2 || le.Mark.Index != f.index-1 {
				t.Fatalf("range record %v at entry %d; want end m, epoch 2, entry %d", le.Range, le.Mark.Index, f.index-1)
			}
		}
	}
	if want := "[1:b 1:c 1:m 1:n 1:x 1:o 1:d]"; fmt.Sprint(events) != want || ranges != 1 {
		t.Fatalf("change log events %v with %d range records; want %s and 1", events, ranges, want)
	}
	lk, rk := dataDump(t, s), dataDump(t, right)
	for k, r := range before {
		in := lk
		if k >= "m" {
			in = rk
		}
		if in[k] != r {
			t.Errorf("key %s: %+v after the split, %+v before", k, in[k], r)
		}
	}
	if _, ok := rk["o"]; !ok {
		t.Error("the right shard lacks the write applied just before the split")
	}
	if _, ok := lk["d"]; !ok {
		t.Error("the left shard lacks the write applied after the split")
	}
	for k := range lk {
		if k >= "m" {
			t.Errorf("left shard still holds %s", k)
		}
	}
	for k := range rk {
		if k < "m" {
			t.Errorf("right shard holds %s", k)
		}
	}
	if right.Revision() != s.Revision()-1 {
		t.Errorf("right revision %d, left %d (one write since)", right.Revision(), s.Revision())
	}
	// Both reopen with the same state.
	want := engineDump(t, right)
	if err := right.Close(); err != nil {
		t.Fatal(err)
	}
	delete(sp.hosted, 7)
	re := e.open("shards/7", 0)
	if got := engineDump(t, re); !maps.Equal(want, got) {
		t.Fatalf("right shard after reopen: %s", diffMaps(want, got))
	}
}

// TestSplitRejected checks the split commands a shard refuses, and that a
// right shard already hosted (created by its Raft group first) is left
// alone.
func TestSplitRejected(t *testing.T) {
	e, sp, s := newSplittingShard(t)
	f := newFeeder(s)
	for _, tc := range []struct {
		key   string
		right uint64
		code  codes.Code
	}{
		{"b", 7, codes.InvalidArgument}, // the shard's start
		{"a", 7, codes.InvalidArgument}, // below the range
		{"y", 7, codes.InvalidArgument}, // the end
		{"", 7, codes.InvalidArgument},
		{"m", 0, codes.InvalidArgument},
		{"m", 2, codes.InvalidArgument}, // its own ID
	} {
		if cr := applyOne(t, s, f, splitCmd(tc.key, tc.right)); codes.Code(cr.GetErrorCode()) != tc.code {
			t.Errorf("split at %q into %d: %v %q, want %v", tc.key, tc.right, codes.Code(cr.GetErrorCode()), cr.GetErrorMessage(), tc.code)
		}
	}
	if d := s.Descriptor(); d.GetEpoch() != 1 || string(d.GetEndKey()) != "y" {
		t.Fatalf("a refused split changed the descriptor: %v", d)
	}
	// Without a shards directory, splits are refused.
	plain := e.bootstrap("shards/3", userDesc(3, "", ""), 0)
	if cr := applyOne(t, plain, newFeeder(plain), splitCmd("m", 8)); codes.Code(cr.GetErrorCode()) != codes.FailedPrecondition {
		t.Errorf("split without a shards directory: %v %q", codes.Code(cr.GetErrorCode()), cr.GetErrorMessage())
	}
	// A right shard already hosted (its engine's directory exists) is not
	// recreated; the left still shrinks.
	existing := e.bootstrap("shards/9", userDesc(9, "m", "y"), 0)
	res, err := sp.apply(s, []replication.Entry{f.entry(marshalCmd(t, splitCmd("m", 9)))})
	if err != nil {
		t.Fatal(err)
	}
	if cr := res[0].(*shalev1.CommandResult); cr.GetErrorCode() != 0 {
		t.Fatalf("split into a hosted shard: %s", cr.GetErrorMessage())
	}
	if sp.hosted[9] != nil || string(s.Descriptor().GetEndKey()) != "m" || existing.Descriptor().GetEpoch() != 1 {
		t.Fatalf("split into a hosted shard: hosted again %v, left %v, existing %v", sp.hosted[9] != nil, s.Descriptor(), existing.Descriptor())
	}
}

// TestAllocateShardID checks that the system shard hands out every shard ID
// once, never below the floor the proposer asks for.
func TestAllocateShardID(t *testing.T) {
	e := newTestEnv(t, nil)
	d := userDesc(1, "", "")
	d.System = true
	s := e.bootstrap("shards/1", d, 0)
	f := newFeeder(s)
	alloc := func(floor uint64) uint64 {
		t.Helper()
		cr := applyOne(t, s, f, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_System{System: &shalev1.SystemCommand{
			Op: &shalev1.SystemCommand_AllocateShardId{AllocateShardId: floor}}}})
		if cr.GetErrorCode() != 0 {
			t.Fatalf("allocate at least %d: %s", floor, cr.GetErrorMessage())
		}
		return cr.GetAllocatedId()
	}
	for _, step := range []struct{ floor, want uint64 }{{5, 5}, {3, 6}, {6, 7}, {20, 20}, {1, 21}} {
		if got := alloc(step.floor); got != step.want {
			t.Fatalf("allocate at least %d: got %d, want %d", step.floor, got, step.want)
		}
	}
	// A user shard refuses system commands.
	u := e.bootstrap("shards/2", userDesc(2, "", ""), 0)
	cr := applyOne(t, u, newFeeder(u), &shalev1.RaftCommand{Command: &shalev1.RaftCommand_System{System: &shalev1.SystemCommand{
		Op: &shalev1.SystemCommand_AllocateShardId{AllocateShardId: 5}}}})
	if codes.Code(cr.GetErrorCode()) != codes.InvalidArgument {
		t.Fatalf("allocation on a user shard: %v %q", codes.Code(cr.GetErrorCode()), cr.GetErrorMessage())
	}
}

// TestSplitInterruptedIsRedone: a node that stops while a split creates
// its new shard's engine (here: the removal of the marker fails, then the
// power goes) leaves a directory that Open refuses as an unfinished split;
// once it is deleted, the left shard (whose split never became durable)
// applies the split again and the new shard holds the moved keys.
func TestSplitInterruptedIsRedone(t *testing.T) {
	mem := vfs.NewCrashableMem()
	tog := errorfs.NewToggle(errorfs.Filter(errorfs.And(errorfs.Ops(errorfs.OpRemove), errorfs.PathSuffix(splitMarker)), errorfs.FromIndex(0, errorfs.ErrEIO)))
	e := newTestEnv(t, errorfs.Wrap(mem, tog))
	opts := e.opts(0)
	opts.ShardsDir = "shards"
	s, err := Bootstrap("shards/2", initialState(userDesc(2, "b", "y")), opts)
	if err != nil {
		t.Fatal(err)
	}
	f := newFeeder(s)
	for _, k := range []string{"c", "m", "n"} {
		applyOne(t, s, f, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v"+k, 0, false)}}))
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	split := f.entry(marshalCmd(t, splitCmd("m", 7)))
	tog.Enable()
	if _, err := s.Apply([]replication.Entry{split}); err == nil {
		t.Fatal("the split applied although its new engine could not be finished")
	}
	crashed := mem.CrashClone()
	_ = s.Close()

	e2 := newTestEnv(t, crashed)
	opts2 := e2.opts(0)
	opts2.ShardsDir = "shards"
	if _, err := Open("shards/7", opts2); !errors.Is(err, ErrUnfinishedSplit) {
		t.Fatalf("open the unfinished split's copy: %v, want ErrUnfinishedSplit", err)
	}
	if err := crashed.RemoveAll("shards/7"); err != nil {
		t.Fatal(err)
	}
	left, err := Open("shards/2", opts2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = left.Close() })
	if d := left.Descriptor(); d.GetEpoch() != 1 || len(d.GetEndKey()) != 1 || d.GetEndKey()[0] != 'y' {
		t.Fatalf("left descriptor after the crash: %v (the split was not durable)", d)
	}
	sp := &testSplitter{hosted: map[uint64]*Shard{}}
	right := sp.splitOne(t, left, split, 7)
	if rk := dataDump(t, right); len(rk) != 2 || rk["m"].value != "vm" || rk["n"].value != "vn" {
		t.Fatalf("right shard after the redone split: %v", rk)
	}
}

// TestSplitCarriesDedupTable: a write with a request ID applied before a
// split, retried after it, reaches the new shard that now holds its key
// and returns the first result without applying again, also after a
// reopen of the new shard.
func TestSplitCarriesDedupTable(t *testing.T) {
	e, sp, s := newSplittingShard(t)
	f := newFeeder(s)
	retried := func() *shalev1.RaftCommand {
		return withID("write-n", txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("n", "1", 0, false)}}))
	}
	first := applyOne(t, s, f, retried())
	if _, err := sp.apply(s, []replication.Entry{f.entry(marshalCmd(t, splitCmd("m", 7)))}); err != nil {
		t.Fatal(err)
	}
	right := sp.hosted[7]
	if right == nil {
		t.Fatal("the right shard was not hosted")
	}
	check := func(r *Shard) {
		t.Helper()
		before, rev := dataDump(t, r), r.Revision()
		again := applyOne(t, r, newFeeder(r), retried())
		if !proto.Equal(again, first) {
			t.Fatalf("retried write after the split returned %v, want the first result %v", again, first)
		}
		if r.Revision() != rev || !maps.Equal(dataDump(t, r), before) {
			t.Fatalf("retried write after the split applied again (revision %d -> %d)", rev, r.Revision())
		}
	}
	check(right)
	delete(sp.hosted, 7)
	check(reopen(t, e, right, "shards/7"))
}

// waitUntil polls cond every 20 ms until it holds, failing the test with
// cond's last description after limit.
func waitUntil(t *testing.T, limit time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", limit, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSplitKeepsHistory: the left shard of a split keeps the range it gave
// away for its history window, so previous values of its changes there
// from before the split still read, and its engine's size counts that range
// until the engine reclaims it, once the window passed it, with no call
// from the shard; its own size (what a size split compares) leaves it out
// at once. The right shard keeps no history from before it exists and
// reclaims its parent's other keys at once.
func TestSplitKeepsHistory(t *testing.T) {
	e := newTestEnv(t, nil)
	e.keepWAL = true
	e.historyWindow = 2 * time.Second
	sp, s := splittingShardIn(t, e)
	f := newFeeder(s)
	val := strings.Repeat("v", 1<<10)
	for round := range 2 {
		for i := range 200 {
			k := fmt.Sprintf("%c%03d", 'c'+i%20, i)
			applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, fmt.Sprint(round, val), 0, false)}}))
		}
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	before := s.SizeBytes()
	right := sp.splitOne(t, s, f.entry(marshalCmd(t, splitCmd("m", 7))), 7)
	// Keys c.. to v.., split at m: the left keeps 10 of the 20 prefixes.
	if n, own := s.SizeBytes(), s.OwnSizeBytes(); n < before*9/10 || own < before*3/10 || own > before*7/10 {
		t.Fatalf("left shard right after the split: %d SST bytes, %d of its own range; before %d", n, own, before)
	}
	// The right shard's own range is half the parent's records; its
	// reclaim may already have run (it starts at the split), and then that
	// range holds only the newest version of each key (the right shard
	// keeps no history from before it exists): a quarter of the records
	// (on a loaded machine the CI at d63c418 checked after the reclaim:
	// 8,145 SST bytes, 6,464 of its own range, the parent's 33,922).
	if n, own := right.SizeBytes(), right.OwnSizeBytes(); own > n || own > before*7/10 ||
		(n >= before*7/10 && own < before*3/10) || own < before/8 {
		t.Fatalf("right shard right after the split: %d SST bytes, %d of its own range; parent's %d", n, own, before)
	}
	// Every overwrite's previous value still reads, on both sides of the
	// split key.
	var prevs, gone int
	for _, le := range walEntries(t, s) {
		for _, ev := range le.Events {
			if ev.Prev != nil {
				prevs++
				if k := string(ev.KV.GetKey()); k >= "m" {
					gone++
				}
				if want := "0" + val; string(ev.Prev.GetValue()) != want {
					t.Fatalf("the previous value of %s: %.10q, want %.10q", ev.KV.GetKey(), ev.Prev.GetValue(), want)
				}
			}
		}
	}
	if prevs != 200 || gone == 0 {
		t.Fatalf("%d previous values read (%d in the range given away), want 200", prevs, gone)
	}
	waitUntil(t, 10*time.Second, func() (bool, string) {
		n := right.SizeBytes()
		return n < before*7/10, fmt.Sprintf("right shard: %d SST bytes, parent's %d", n, before)
	})
	waitUntil(t, 20*time.Second, func() (bool, string) {
		n := s.SizeBytes()
		return n < before*7/10, fmt.Sprintf("left shard: %d SST bytes, before the split %d", n, before)
	})
	t.Logf("SST bytes: %d before the split; %d left and %d right once reclaimed (own range: %d and %d)",
		before, s.SizeBytes(), right.SizeBytes(), s.OwnSizeBytes(), right.OwnSizeBytes())
}

// TestFlushMemTablesLeavesTheSplitLittleToFlush checks FlushMemTables, which
// a leader calls before it proposes a split: it writes the applied puts to
// an SST, and the split's apply, which flushes again before its checkpoint,
// then flushes only the metadata written since, while the right shard
// still gets every key of its half.
func TestFlushMemTablesLeavesTheSplitLittleToFlush(t *testing.T) {
	_, sp, s := newSplittingShard(t)
	f := newFeeder(s)
	value := strings.Repeat("v", 1000)
	var keys []string
	for i := range 30 {
		k := fmt.Sprintf("k%02d", i)
		keys = append(keys, k)
		applyOne(t, s, f, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, value, 0, false)}}))
	}
	before := s.EngineMetrics()
	if err := s.FlushMemTables(); err != nil {
		t.Fatal(err)
	}
	flushed := s.EngineMetrics()
	if in := flushed.FlushBytesIn - before.FlushBytesIn; flushed.Flushes != before.Flushes+1 || in < 30*1000 {
		t.Fatalf("FlushMemTables: %d flushes of %d bytes; want 1 of the 30 puts (>= 30000 bytes)", flushed.Flushes-before.Flushes, in)
	}
	right := sp.splitOne(t, s, f.entry(marshalCmd(t, splitCmd("k15", 7))), 7)
	if in := s.EngineMetrics().FlushBytesIn - flushed.FlushBytesIn; in > 4096 {
		t.Errorf("the split's apply flushed %d bytes after FlushMemTables; want only the metadata written since (< 4096)", in)
	}
	rk := dataDump(t, right)
	for _, k := range keys {
		if _, ok := rk[k]; ok != (k >= "k15") {
			t.Errorf("key %s in the right shard: %v", k, ok)
		}
	}
}

// TestSplitKeepsTheRecordCache checks that a split keeps what the record
// cache knows of both halves: after it, a put of a new key on either side
// and an overwrite on the right (of a key written before the split) read
// no engine, and the overwrite keeps the key's create revision and counts
// its version on. Without it, every put of a new key after a load split
// read the engine's SSTs.
func TestSplitKeepsTheRecordCache(t *testing.T) {
	e := newTestEnv(t, nil)
	e.keepWAL = true
	e.records = NewRecordCache(16 << 20)
	sp, s := splittingShardIn(t, e)
	f := newFeeder(s)
	put := func(s *Shard, f *feeder, k string) {
		t.Helper()
		if r := applyOne(t, s, f, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v"+k, 0, false)}})); r.GetErrorCode() != 0 {
			t.Fatalf("put %s: %s", k, r.GetErrorMessage())
		}
	}
	for i := range 30 {
		put(s, f, fmt.Sprintf("k%02d", i))
	}
	created := dataDump(t, s)["k20"]
	right := sp.splitOne(t, s, f.entry(marshalCmd(t, splitCmd("k15", 7))), 7)
	rf := newFeeder(right)
	misses := e.records.Metrics().Misses
	put(s, f, "k05x")      // a new key on the left
	put(right, rf, "k25x") // a new key on the right
	put(right, rf, "k20")  // an overwrite on the right
	put(s, f, "k03")       // an overwrite on the left
	if m := e.records.Metrics().Misses; m != misses {
		t.Errorf("%d record cache misses after the split; want 0 (each a read of the engine)", m-misses)
	}
	got := dataDump(t, right)["k20"]
	if got.create != created.create || got.version != created.version+1 || got.value != "vk20" {
		t.Fatalf("k20 after an overwrite on the right: %+v; created as %+v", got, created)
	}
	if _, ok := dataDump(t, right)["k25x"]; !ok {
		t.Fatal("k25x missing on the right")
	}
	if _, ok := dataDump(t, s)["k05x"]; !ok {
		t.Fatal("k05x missing on the left")
	}
	// A range deletion on the right makes it forget (a namespace of its
	// own), so the namespace it shared with the left still holds k26 as
	// present. Merged back, the left must not take that record for
	// current (the merge copies no record of k26): its merge's begin
	// forgets too, so k26 is written anew and overwrites count on from the
	// right's records.
	if r := applyOne(t, right, rf, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("k26", "k27")}})); r.GetErrorCode() != 0 {
		t.Fatalf("delete range on the right: %s", r.GetErrorMessage())
	}
	put(right, rf, "k20")
	attempt := []byte("a")
	if r := applyOne(t, right, rf, freezeCmd(2)); r.GetErrorCode() != 0 {
		t.Fatalf("freeze: %s", r.GetErrorMessage())
	}
	if r := applyOne(t, s, f, absorbCmd(&shalev1.MergeAbsorb{Begin: true, Right: right.Descriptor(), Attempt: attempt})); r.GetErrorCode() != 0 {
		t.Fatalf("begin: %s", r.GetErrorMessage())
	}
	keys, vals := scanRecords(t, right)
	for _, m := range []*shalev1.MergeAbsorb{
		{Keys: keys, Values: vals, Attempt: attempt},
		{Commit: true, RightRevision: right.Revision(), Attempt: attempt},
	} {
		if r := applyOne(t, s, f, absorbCmd(m)); r.GetErrorCode() != 0 {
			t.Fatalf("merge step %v: %s", m, r.GetErrorMessage())
		}
	}
	put(s, f, "k20")
	put(s, f, "k25x")
	put(s, f, "k26")
	merged := dataDump(t, s)
	if k := merged["k26"]; k.version != 1 || k.create != k.mod {
		t.Fatalf("k26, deleted on the right, put again after the merge: %+v; want a new key (version 1)", k)
	}
	if k := merged["k20"]; k.create != created.create || k.version != created.version+3 {
		t.Fatalf("k20 after the merge and an overwrite: %+v; created as %+v", k, created)
	}
	if k := merged["k25x"]; k.version != 2 {
		t.Fatalf("k25x after the merge and an overwrite: %+v; want version 2", k)
	}
}
