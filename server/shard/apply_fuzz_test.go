package shard

import (
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// FuzzApplyPayload applies arbitrary command payloads (a corrupted or
// hostile Raft entry) to a shard: Apply must never panic or fail — a
// payload it cannot use gets an error result — and the shard keeps
// applying afterwards.
func FuzzApplyPayload(f *testing.F) {
	f.Add(marshalCmd(f, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v", 0, false)}})))
	f.Add(marshalCmd(f, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{delRangeOp("a", "z")}})))
	f.Add(marshalCmd(f, &shalev1.RaftCommand{Hlc: &shalev1.HlcTimestamp{WallNanos: ts0}, Command: &shalev1.RaftCommand_Put{Put: &shalev1.PutOp{Key: []byte("k"), Value: []byte("v"), TtlMs: 5}}})) // compact
	f.Add([]byte{0x52, 0x03, 0x0a, 0x01, 0x00})
	f.Add([]byte{})
	env := newTestEnv(f, nil)
	s := env.bootstrap("fuzz", userDesc(2, "", ""), 16)
	fd := newFeeder(s)
	f.Fuzz(func(t *testing.T, payload []byte) {
		if len(payload) == 0 {
			payload = []byte{0}
		}
		res, err := results(s.Apply([]replication.Entry{fd.entry(payload)}))
		if err != nil {
			t.Fatalf("apply failed on a bad payload: %v", err)
		}
		if len(res) != 1 {
			t.Fatalf("%d results for one entry", len(res))
		}
		// The shard still works.
		good := marshalCmd(t, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("ok", "1", 0, false)}}))
		if _, err := results(s.Apply([]replication.Entry{fd.entry(good)})); err != nil {
			t.Fatalf("apply after a bad payload: %v", err)
		}
	})
}
