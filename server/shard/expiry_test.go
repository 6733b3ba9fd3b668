package shard

import (
	"fmt"
	"strings"
	"testing"
	"time"

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

// TestNoTTL follows the applied state's mark that no record with an
// expiry was ever written: set at bootstrap, kept by writes without a TTL,
// a reopen, a split (both halves) and a checkpoint restored elsewhere,
// cleared for good by the first write with a TTL, which a reopen and a
// restored checkpoint then show too.
func TestNoTTL(t *testing.T) {
	e, sp, s := newSplittingShard(t)
	f := newFeeder(s)
	put := func(s *Shard, f *feeder, k string, ttlMs int64) {
		t.Helper()
		applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v", ttlMs, false)}}))
	}
	if !s.NoTTL() {
		t.Fatal("a bootstrapped shard is not marked as holding no TTL")
	}
	put(s, f, "c", 0)
	put(s, f, "p", 0)
	right := sp.splitOne(t, s, f.entry(marshalCmd(t, splitCmd("m", 7))), 7)
	if !s.NoTTL() || !right.NoTTL() {
		t.Fatalf("after writes without a TTL and a split: left %v, right %v; want both marked", s.NoTTL(), right.NoTTL())
	}
	// A checkpoint restored on a new replica carries the mark.
	restored := func(s *Shard, name string) *Shard {
		t.Helper()
		if _, err := s.Checkpoint(name + "-cp"); err != nil {
			t.Fatal(err)
		}
		r, err := OpenEmpty(name, e.opts(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		if r.NoTTL() {
			t.Fatal("an uninitialized replica is marked as holding no TTL")
		}
		if err := r.Restore(name + "-cp"); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := restored(right, "r1"); !r.NoTTL() {
		t.Fatal("a restored checkpoint of a shard without TTLs lost the mark")
	}
	// The first write with a TTL clears it, durably.
	rf := newFeeder(right)
	rf.index = right.AppliedState().Index
	put(right, rf, "q", 60_000)
	if right.NoTTL() {
		t.Fatal("still marked after a write with a TTL")
	}
	put(right, rf, "q", 0) // the record with the TTL is gone; the mark stays off
	if right.NoTTL() || s.NoTTL() != true {
		t.Fatalf("right %v, left %v; want the right unmarked, the left marked", right.NoTTL(), s.NoTTL())
	}
	if r := restored(right, "r2"); r.NoTTL() {
		t.Fatal("a restored checkpoint of a shard that had a TTL is marked")
	}
	if err := right.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if r := e.open("shards/7", 0); r.NoTTL() {
		t.Fatal("the mark is back after a reopen")
	}
	if l := e.open("shards/2", 0); !l.NoTTL() {
		t.Fatal("the left shard lost its mark in a reopen")
	}
}

// TestExpiryReclaimedAfterTheWindow: an expiry of 256 keys or more keeps
// their values for the engine's history window (a watch reads the expired
// values as the deletions' previous values), then the engine compacts
// their span by itself (storage.DB.CompactAfterHorizon), with no write or
// call after the expiry.
func TestExpiryReclaimedAfterTheWindow(t *testing.T) {
	e := newTestEnv(t, nil)
	e.keepWAL = true // as a node's shards keep theirs: the history reaches back past flushes
	e.historyWindow = 2 * time.Second
	s := e.bootstrap("s", userDesc(2, "", ""), 0)
	f := newFeeder(s)
	val := strings.Repeat("x", 512)
	for i := range 2 * expireCompactKeys {
		applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(fmt.Sprintf("k%04d", i), val, 1000, false)}}))
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	before := s.SizeBytes()
	now := ts0 + 2_000_000_000
	expired, _, _, err := s.ExpiredKeys(nil, 10_000, now)
	if err != nil || len(expired) != 2*expireCompactKeys {
		t.Fatalf("ExpiredKeys: %d keys, %v", len(expired), err)
	}
	if r := applyOne(t, s, f, expireCmd(now, expired)); r.GetTxn().GetResults()[0].GetDelete().GetDeleted() != uint64(len(expired)) {
		t.Fatalf("expire: %v", r)
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	deletes := 0
	for _, le := range walEntries(t, s) {
		for _, ev := range le.Events {
			if ev.Kind == EventDelete {
				deletes++
				if string(ev.Prev.GetValue()) != val || ev.Prev.GetExpireUnixNanos() != ts0+1_000_000_000 {
					t.Fatalf("the expiry of %s: previous value %.10q expiring at %d", ev.KV.GetKey(), ev.Prev.GetValue(), ev.Prev.GetExpireUnixNanos())
				}
			}
		}
	}
	if deletes != len(expired) {
		t.Fatalf("%d deletes in the change log, want %d", deletes, len(expired))
	}
	if n := s.SizeBytes(); n < before/2 {
		t.Fatalf("%d SST bytes right after the expiry, from %d: the history window keeps the expired values", n, before)
	}
	waitUntil(t, 20*time.Second, func() (bool, string) {
		n := s.SizeBytes()
		return n < before/10, fmt.Sprintf("%d SST bytes, %d before the expiry", n, before)
	})
	t.Logf("SST bytes: %d before the expiry, %d once the window passed it", before, s.SizeBytes())
}
