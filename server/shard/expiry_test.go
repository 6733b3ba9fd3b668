package shard

import (
	"testing"

	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func expireCmd(ts int64, keys []ExpiredKey) *shalev1.RaftCommand {
	ex := &shalev1.ExpireKeys{}
	for _, k := range keys {
		ex.Keys = append(ex.Keys, k.Key)
		ex.ModRevisions = append(ex.ModRevisions, k.ModRevision)
	}
	return &shalev1.RaftCommand{TimestampUnixNanos: ts, Command: &shalev1.RaftCommand_Expire{Expire: ex}}
}

// TestExpireKeys finds expired records with ExpiredKeys (in pages) and
// deletes them with ExpireKeys commands: only records still as found and
// expired at the command's time go, all at one new revision; the rest,
// malformed commands and a frozen shard are refused or skipped.
func TestExpireKeys(t *testing.T) {
	e := newTestEnv(t, nil)
	s := e.bootstrap("s", userDesc(2, "", "m"), 0)
	f := newFeeder(s)
	const sec = int64(1_000_000_000)
	put := func(ts int64, k string, ttlMs int64) {
		t.Helper()
		applyOne(t, s, f, txnCmd(ts, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v", ttlMs, false)}}))
	}
	put(ts0, "a", 1000)
	put(ts0, "b", 1000)
	put(ts0, "c", 0)
	put(ts0, "d", 5000)
	if s.TTLWrites() != 3 {
		t.Fatalf("TTLWrites = %d, want 3", s.TTLWrites())
	}
	now := ts0 + 2*sec
	// In pages of two records.
	got, withTTL, next, err := s.ExpiredKeys(nil, 2, now)
	if err != nil || len(got) != 2 || string(got[0].Key) != "a" || string(got[1].Key) != "b" || withTTL != 2 || string(next) != "c" {
		t.Fatalf("first page: %v, %d with a TTL, next %q, %v", got, withTTL, next, err)
	}
	rest, withTTL, next, err := s.ExpiredKeys(next, 2, now)
	if err != nil || len(rest) != 0 || withTTL != 1 || next != nil {
		t.Fatalf("second page: %v, %d with a TTL, next %q, %v", rest, withTTL, next, err)
	}
	// b is rewritten (no TTL) before the expiry applies: it stays.
	put(ts0+1500*1_000_000, "b", 0)
	rev := s.Revision()
	r := applyOne(t, s, f, expireCmd(now, append(got, ExpiredKey{Key: []byte("d"), ModRevision: 4}, ExpiredKey{Key: []byte("x"), ModRevision: 1})))
	if codes.Code(r.GetErrorCode()) != codes.OK || r.GetTxn().GetResults()[0].GetDelete().GetDeleted() != 1 || r.GetTxn().GetHeader().GetRevision() != rev+1 {
		t.Fatalf("expire: %v; want a deleted at revision %d", r, rev+1)
	}
	if s.Revision() != rev+1 {
		t.Fatalf("revision %d after the expiry, want %d", s.Revision(), rev+1)
	}
	recs := dataDump(t, s)
	if _, ok := recs["a"]; ok {
		t.Fatal("expired a is still stored")
	}
	for _, k := range []string{"b", "c", "d"} {
		if _, ok := recs[k]; !ok {
			t.Fatalf("%s was deleted: it was rewritten, had no TTL or had not expired", k)
		}
	}
	// Nothing left to expire: no new revision.
	if r := applyOne(t, s, f, expireCmd(now, got)); r.GetTxn().GetResults()[0].GetDelete().GetDeleted() != 0 || s.Revision() != rev+1 {
		t.Fatalf("a second expiry of the same keys: %v, revision %d", r, s.Revision())
	}
	// Malformed.
	bad := expireCmd(now, got)
	bad.GetExpire().ModRevisions = nil
	if r := applyOne(t, s, f, bad); codes.Code(r.GetErrorCode()) != codes.InvalidArgument {
		t.Fatalf("keys without revisions: %v", r)
	}
	// A frozen shard expires nothing.
	applyOne(t, s, f, freezeCmd(9))
	dGone, _, _, _ := s.ExpiredKeys(nil, 10, ts0+10*sec)
	if r := applyOne(t, s, f, expireCmd(ts0+10*sec, dGone)); codes.Code(r.GetErrorCode()) != codes.Unavailable {
		t.Fatalf("expiry on a frozen shard: %v", r)
	}
}
