package shard

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// compactForm returns cmd as a proposer whose shard's nodes all read
// compact commands encodes it (server's encodeCommand): its timestamp as
// an offset from its hlc's wall time, and a transaction of one put as a
// put command. cmd must carry an hlc.
func compactForm(cmd *shalev1.RaftCommand) *shalev1.RaftCommand {
	c := proto.Clone(cmd).(*shalev1.RaftCommand)
	c.TimestampUnixNanos, c.WallOffsetNanos = 0, cmd.GetTimestampUnixNanos()-cmd.GetHlc().GetWallNanos()
	if t, ok := c.GetCommand().(*shalev1.RaftCommand_Txn); ok {
		if p := CompactPut(t.Txn); p != nil {
			c.Command = &shalev1.RaftCommand_Put{Put: p}
		}
	}
	return c
}

// longForm is cmd dated at wall time wall as a proposer that predates
// compact commands dates it: the hlc reading, here ahead of the wall clock
// when ahead is set, and the wall time as its timestamp.
func longForm(wall int64, cmd *shalev1.RaftCommand, ahead ...time.Duration) *shalev1.RaftCommand {
	cmd.TimestampUnixNanos = wall
	cmd.Hlc = &shalev1.HlcTimestamp{WallNanos: wall, Logical: 3}
	for _, a := range ahead {
		cmd.Hlc.WallNanos += int64(a)
	}
	return cmd
}

// TestCompactCommandsApplyAsTheLongForm: the same commands, proposed by a
// proposer that predates compact commands (a Txn of one put, a timestamp)
// on one replica and in their compact forms (a put command, the hlc's wall
// time as the clock) on another, give the same results and leave the same
// engine: TTL expiries, overwrites with prev_kv, retried requests, a
// transaction with a compare (never compacted), an expiry command, and
// puts packed in one Raft entry.
func TestCompactCommandsApplyAsTheLongForm(t *testing.T) {
	env := newTestEnv(t, nil)
	long := env.bootstrap("long", userDesc(1, "", ""), 16)
	compact := env.bootstrap("compact", userDesc(1, "", ""), 16)
	fl, fc := newFeeder(long), newFeeder(compact)
	sec := int64(time.Second)
	put := func(k, v string, ttlMs int64, prev bool) *shalev1.RaftCommand {
		return txnCmd(0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, v, ttlMs, prev)}})
	}
	cmds := []*shalev1.RaftCommand{
		longForm(ts0, put("a", "1", 0, false)),
		longForm(ts0+sec, withID("req-000000000001", put("b", "2", 1500, false))),
		longForm(ts0+2*sec, put("a", "1b", 0, true), 300*time.Millisecond),          // the hlc ahead of the wall clock
		longForm(ts0+2*sec, withID("req-000000000001", put("b", "2", 1500, false))), // a retry
		longForm(ts0+3*sec, txnCmd(0, &shalev1.TxnRequest{
			Compares: []*shalev1.Compare{{Key: []byte("b"), Target: shalev1.Compare_TARGET_EXISTS, Number: 0}},
			Success:  []*shalev1.RequestOp{putOp("c", "b expired", 0, false)},
			Failure:  []*shalev1.RequestOp{putOp("c", "b live", 0, false)},
		})),
		longForm(ts0+4*sec, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Expire{Expire: &shalev1.ExpireKeys{
			Keys: [][]byte{[]byte("b")}, ModRevisions: []uint64{2},
		}}}),
		longForm(ts0+5*sec, put("b", "3", 500, true), time.Hour), // a wall clock stepped back
		longForm(ts0+5*sec, txnCmd(0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("d", "4", 0, false), putOp("e", "5", 0, false)}})),
	}
	for i, cmd := range cmds {
		want := applyOne(t, long, fl, cmd)
		c := compactForm(cmd)
		if c.GetTimestampUnixNanos() != 0 {
			t.Fatalf("command %d: compact form has a timestamp", i)
		}
		got := applyOne(t, compact, fc, c)
		if !proto.Equal(got, want) {
			t.Fatalf("command %d (%T): compact form's result %v, long form's %v", i, c.GetCommand(), got, want)
		}
	}
	if _, ok := compactForm(cmds[0]).GetCommand().(*shalev1.RaftCommand_Put); !ok {
		t.Fatal("a put's compact form is not a put command")
	}
	if _, ok := compactForm(cmds[4]).GetCommand().(*shalev1.RaftCommand_Txn); !ok {
		t.Fatal("a transaction with a compare was compacted")
	}

	// Puts packed in one entry.
	var longCmds, compactCmds []*shalev1.RaftCommand
	for i, k := range []string{"f", "a", "g"} {
		cmd := longForm(ts0+6*sec+int64(i), put(k, "packed", 2000, true))
		longCmds, compactCmds = append(longCmds, cmd), append(compactCmds, compactForm(cmd))
	}
	want, err := results(long.Apply(packedEntry(t, fl, longCmds...)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := results(compact.Apply(packedEntry(t, fc, compactCmds...)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if !proto.Equal(got[i].(*shalev1.CommandResult), want[i].(*shalev1.CommandResult)) {
			t.Fatalf("packed put %d: compact form's result %v, long form's %v", i, got[i], want[i])
		}
	}

	if d := diffMaps(engineDump(t, long), engineDump(t, compact)); d != "[]" {
		t.Fatalf("engines differ: %s", d)
	}
	if r := dataDump(t, compact)["b"]; r.expire != ts0+5*sec+500*int64(time.Millisecond) {
		t.Fatalf("b expires at %d, want its put's wall clock + 500 ms", r.expire)
	}
	// 10 bytes of timestamp, and the Txn's and RequestOp's tags and
	// lengths: 4 bytes for this small put (6 for one over 127 bytes).
	if c := compactForm(cmds[0]); c.GetWallOffsetNanos() != 0 || len(marshalCmd(t, c)) != len(marshalCmd(t, cmds[0]))-10-4 {
		t.Fatalf("a put whose hlc follows the wall clock: %d bytes compact, %d long", len(marshalCmd(t, c)), len(marshalCmd(t, cmds[0])))
	}
}

// TestOldCommandsKeepTheirTimestamp: a command of a proposer that predates
// compact commands (in a Raft log written before an upgrade) carries a
// timestamp and an hlc reading whose wall times differ; its clock stays
// the timestamp, as that proposer's replicas applied it, whatever its
// wall_offset_nanos (which such a proposer never set). A compact command's
// clock is its hlc's wall time plus its offset, and one with neither a
// timestamp nor an hlc (no clock at all) keeps 0.
func TestOldCommandsKeepTheirTimestamp(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	hlcWall := ts0 + int64(time.Hour)
	put := func(k string) *shalev1.RaftCommand {
		return txnCmd(0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v", 1000, false)}})
	}
	old := put("old")
	old.TimestampUnixNanos, old.WallOffsetNanos, old.Hlc = ts0, 77, &shalev1.HlcTimestamp{WallNanos: hlcWall}
	applyOne(t, s, f, old)
	compact := put("compact")
	compact.WallOffsetNanos, compact.Hlc = -int64(time.Minute), &shalev1.HlcTimestamp{WallNanos: hlcWall}
	applyOne(t, s, f, compact)
	applyOne(t, s, f, put("none"))
	recs := dataDump(t, s)
	if got, want := recs["old"].expire, ts0+int64(time.Second); got != want {
		t.Fatalf("an old command's put expires at %d, want its timestamp + 1 s (%d)", got, want)
	}
	if got, want := recs["compact"].expire, hlcWall-int64(time.Minute)+int64(time.Second); got != want {
		t.Fatalf("a compact command's put: %+v, want it expiring at %d (its hlc's wall time - 1 min + 1 s)", recs["compact"], want)
	}
	if got, want := recs["none"].expire, int64(time.Second); got != want {
		t.Fatalf("a command with no clock: its put expires at %d, want %d (as before compact commands)", got, want)
	}
}

// TestExpandCommand: expandCommand leaves every command but a put command
// and an undated one with an hlc as it is, makes a put command the
// transaction of that put, and an undated command's timestamp its hlc's
// wall time plus its offset.
func TestExpandCommand(t *testing.T) {
	p := &shalev1.PutOp{Key: []byte("k"), Value: []byte("v"), TtlMs: 5, PrevKv: true}
	cmd := &shalev1.RaftCommand{RequestId: []byte("id"), Epoch: 3, FirstAttempt: true, WallOffsetNanos: -2,
		Hlc: &shalev1.HlcTimestamp{WallNanos: 42, Logical: 1}, Command: &shalev1.RaftCommand_Put{Put: p}}
	expandCommand(cmd)
	want := &shalev1.RaftCommand{RequestId: []byte("id"), Epoch: 3, FirstAttempt: true, TimestampUnixNanos: 40,
		Hlc: &shalev1.HlcTimestamp{WallNanos: 42, Logical: 1}, Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{
			Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: p}}}}}}
	if !proto.Equal(cmd, want) {
		t.Fatalf("expanded %v, want %v", cmd, want)
	}
	for _, c := range []*shalev1.RaftCommand{
		txnCmd(7, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v", 0, false)}}),
		{TimestampUnixNanos: 9, Hlc: &shalev1.HlcTimestamp{WallNanos: 10}, Command: &shalev1.RaftCommand_Noop{Noop: true}},
		{Command: &shalev1.RaftCommand_MergeRetire{MergeRetire: true}},
		{},
	} {
		before := proto.Clone(c)
		expandCommand(c)
		if !proto.Equal(c, before) {
			t.Fatalf("expandCommand changed %v to %v", before, c)
		}
	}
}

// FuzzCompactPut: a put of any key, value, TTL and prev_kv, applied in
// its compact form and in the long form of an older proposer, gives the
// same result and the same engine; and a compact command's payload
// corrupted anywhere applies as an error result or a command, never a
// panic (FuzzApplyPayload's property, seeded with compact commands).
func FuzzCompactPut(f *testing.F) {
	f.Add([]byte("k"), []byte("v"), int64(0), false, uint64(0), byte(0))
	f.Add([]byte("key"), []byte(""), int64(1500), true, uint64(3), byte(0x32))
	f.Add([]byte{}, []byte("v"), int64(-1), false, uint64(1), byte(0xff))
	f.Fuzz(func(t *testing.T, key, value []byte, ttlMs int64, prev bool, flip uint64, mask byte) {
		env := newTestEnv(t, nil)
		long := env.bootstrap("long", userDesc(1, "", ""), 0)
		compact := env.bootstrap("compact", userDesc(1, "", ""), 0)
		fl, fc := newFeeder(long), newFeeder(compact)
		for i := range 2 { // a new key, then an overwrite
			cmd := longForm(ts0+int64(i), &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{
				Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: key, Value: value, TtlMs: ttlMs, PrevKv: prev}}}},
			}}})
			want := applyOne(t, long, fl, cmd)
			got := applyOne(t, compact, fc, compactForm(cmd))
			if !proto.Equal(got, want) {
				t.Fatalf("put %d: compact form's result %v, long form's %v", i, got, want)
			}
		}
		if d := diffMaps(engineDump(t, long), engineDump(t, compact)); d != "[]" {
			t.Fatalf("engines differ: %s", d)
		}
		payload := marshalCmd(t, compactForm(longForm(ts0, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{
			Success: []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: key, Value: value, TtlMs: ttlMs, PrevKv: prev}}}},
		}}})))
		payload[flip%uint64(len(payload))] ^= mask
		if _, err := results(compact.Apply([]replication.Entry{fc.entry(payload)})); err != nil {
			t.Fatalf("apply failed on a corrupted compact command: %v", err)
		}
	})
}
