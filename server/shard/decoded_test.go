package shard

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// TestDecodedCommandAppliesAlike: random transactions (puts with and
// without TTLs and prev_kv, deletes, range deletions, reads, compares,
// keys outside the shard, retried request IDs), each proposed as the
// server proposes it (compact form, hlc, request ID), applied from the
// payload on one replica and from its decoded form (Entry.Decoded, the
// long form encodeCommand leaves) on another, alone and packed, give the
// same results, engine contents, checksum and applied state, and the
// decoded forms are not modified.
func TestDecodedCommandAppliesAlike(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 70))
	env := newTestEnv(t, nil)
	env.records = NewRecordCache(32 << 10)
	desc := userDesc(7, "k05", "k35")
	payload := env.bootstrap("payload", desc, 0)
	decoded := env.bootstrap("decoded", desc, 0)
	fp, fd := newFeeder(payload), newFeeder(decoded)
	g := &txnGen{rng: rng, m: newModel(desc)}
	now := ts0
	var ids []string
	applied := 0
	for step := range 150 {
		n := 1 + rng.IntN(4)
		packed := n > 1 && rng.IntN(2) == 0
		var pe, de []replication.Entry
		var cmds, before []*shalev1.RaftCommand
		for range n {
			now += rng.Int64N(20e6) - 2e6 // mostly forward, sometimes back
			var txn *shalev1.TxnRequest
			if rng.IntN(3) == 0 { // a transaction of one put: compacted
				txn = &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(g.key(), g.value(), rng.Int64N(3)*20, rng.IntN(2) == 0)}}
			} else {
				txn = g.txn(now)
			}
			cmd := txnCmd(now, txn)
			cmd.Hlc = &shalev1.HlcTimestamp{WallNanos: now - rng.Int64N(3)*1e6, Logical: uint32(rng.IntN(4))}
			switch {
			case len(ids) > 0 && rng.IntN(8) == 0: // a retry
				cmd.RequestId = []byte(ids[rng.IntN(len(ids))])
			case rng.IntN(2) == 0:
				id := fmt.Sprintf("req-%012d", len(ids))
				ids = append(ids, id)
				cmd.RequestId, cmd.FirstAttempt = []byte(id), true
			}
			wire := marshalCmd(t, compactForm(cmd))
			pe = append(pe, fp.entry(wire))
			e := fd.entry(wire)
			e.Decoded = cmd
			de = append(de, e)
			cmds, before = append(cmds, cmd), append(before, proto.Clone(cmd).(*shalev1.RaftCommand))
		}
		if packed {
			for _, ents := range [][]replication.Entry{pe, de} {
				for i := range ents {
					ents[i].Index, ents[i].Part, ents[i].Parts = ents[0].Index, i, n
				}
			}
			fp.index, fd.index = pe[0].Index, de[0].Index
		}
		want, err := results(payload.Apply(pe))
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		got, err := results(decoded.Apply(de))
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i := range want {
			w, _ := want[i].(*shalev1.CommandResult)
			gr, _ := got[i].(*shalev1.CommandResult)
			if !proto.Equal(gr, w) {
				t.Fatalf("step %d, command %d (%v): from the decoded form %v, from the payload %v", step, i, cmds[i], gr, w)
			}
			if w.GetErrorCode() == 0 {
				applied++
			}
			if !proto.Equal(cmds[i], before[i]) {
				t.Fatalf("step %d, command %d: the apply modified the decoded form: %v, was %v", step, i, cmds[i], before[i])
			}
		}
	}
	if applied < 200 {
		t.Fatalf("only %d commands applied without an error", applied)
	}
	if d := diffMaps(engineDump(t, payload), engineDump(t, decoded)); d != "[]" {
		t.Fatalf("engines differ: %s", d)
	}
	if sp, sd := mustChecksum(t, payload), mustChecksum(t, decoded); sp != sd {
		t.Fatalf("checksums differ: %x from payloads, %x from decoded forms", sp, sd)
	}
	if a, b := payload.AppliedState(), decoded.AppliedState(); !proto.Equal(a.Descriptor, b.Descriptor) || a.Index != b.Index || a.Term != b.Term {
		t.Fatalf("applied states differ: %+v and %+v", a, b)
	}
}

// TestDecodedCommandNotDecodedAgain: an entry with a decoded form is
// applied from it: its payload is not read (here it would not decode), and
// the apply of a put allocates less than from the payload.
func TestDecodedCommandNotDecodedAgain(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("shard", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	cmd := txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("a", "1", 0, false)}})
	cmd.Hlc = &shalev1.HlcTimestamp{WallNanos: ts0}
	e := f.entry([]byte{0xff, 0xff, 0xff})
	e.Decoded = cmd
	res, err := results(s.Apply([]replication.Entry{e}))
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := res[0].(*shalev1.CommandResult); r == nil || r.GetErrorCode() != 0 {
		t.Fatalf("a put with a decoded form and an undecodable payload: %v", res[0])
	}
	i := 0
	allocs := func(withDecoded bool) float64 {
		return testing.AllocsPerRun(200, func() {
			i++
			c := txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(fmt.Sprintf("k%06d", i), "v", 0, false)}})
			c.Hlc = cmd.Hlc
			e := f.entry(marshalCmd(t, compactForm(c)))
			if withDecoded {
				e.Decoded = c
			}
			if _, err := s.Apply([]replication.Entry{e}); err != nil {
				t.Fatal(err)
			}
		})
	}
	fromPayload, fromDecoded := allocs(false), allocs(true)
	if fromDecoded >= fromPayload {
		t.Fatalf("a put's apply allocates %.1f times from its decoded form, %.1f from its payload", fromDecoded, fromPayload)
	}
	t.Logf("a put's apply (with making the entry): %.1f allocations from its payload, %.1f from its decoded form", fromPayload, fromDecoded)
}

// mustChecksum is s's checksum (Shard.Checksum), failing t on an error.
func mustChecksum(t testing.TB, s *Shard) uint64 {
	t.Helper()
	sum, err := s.Checksum()
	if err != nil {
		t.Fatal(err)
	}
	return sum
}
