package watch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func putReq(k, v string) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte(k), Value: []byte(v)}}}
}

func delReq(k string) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Delete{Delete: &shalev1.DeleteOp{Key: []byte(k)}}}
}

// txn applies one transaction of ops and records its events.
func (s *testShard) txn(ops ...*shalev1.RequestOp) {
	s.t.Helper()
	res := s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{Success: ops}}})
	s.record(ops, res.GetTxn().GetHeader().GetRevision())
}

// fill puts n values of 16 KiB (keys "big..."), so that the engine's 64 KiB
// memtables flush and its level 0 compacts.
func (s *testShard) fill(n int) {
	s.t.Helper()
	for i := range n {
		s.put(fmt.Sprintf("big%03d", i), strings.Repeat("x", 16<<10))
	}
}

// TestHubPrevValuesFromTheEngine: the change log holds no previous values
// (shard engine format 8); a watcher with PrevKV gets each change's from
// the engine, as of just before the change's own write: for overwrites,
// deletes, several writes to one key in one transaction and in one packed
// Raft entry, a range deletion, a TTL expiry (the expired value), and for
// changes whose previous values went through flushes and compactions
// first. A live watcher and one reading the log from revision 1 after all
// of it see the same.
func TestHubPrevValuesFromTheEngine(t *testing.T) {
	s := newTestShard(t, 1<<30, nil)
	h, err := NewHub(s.sh, 1, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	all := Request{Start: []byte{}, PrevKV: true}
	live, _, err := h.Watch(context.Background(), all)
	if err != nil {
		t.Fatal(err)
	}
	s.put("a", "a1")
	s.put("a", "a2")
	s.txn(putReq("b", "b1"), putReq("b", "b2"), delReq("b"), putReq("b", "b3"), putReq("b", "b4"))
	s.applyPacked([][]*shalev1.RequestOp{
		{putReq("c", "c1")}, {putReq("c", "c2"), putReq("c", "c3")}, {delReq("c")}, {putReq("c", "c4")}, {putReq("c", "c5")},
	})
	// A TTL expiry: the put's command is dated 0, so its key expires at 1
	// ms; the expiry's command is dated 2 ms.
	res := s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{Success: []*shalev1.RequestOp{
		{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte("t"), Value: []byte("t1"), TtlMs: 1}}}}}}})
	s.record([]*shalev1.RequestOp{putReq("t", "t1")}, res.GetTxn().GetHeader().GetRevision())
	res = s.apply(&shalev1.RaftCommand{TimestampUnixNanos: 2e6, Command: &shalev1.RaftCommand_Expire{Expire: &shalev1.ExpireKeys{
		Keys: [][]byte{[]byte("t")}, ModRevisions: []uint64{s.rev}}}})
	if d := res.GetTxn().GetResults()[0].GetDelete().GetDeleted(); d != 1 {
		t.Fatalf("the expiry deleted %d keys, want 1", d)
	}
	s.rev = res.GetTxn().GetHeader().GetRevision()
	s.events = append(s.events, ev{rev: s.rev, del: true, key: "t", prev: "t1", hasPrev: true})
	delete(s.model, "t")
	s.put("d1", "d1")
	s.put("d2", "d2")
	s.txn(&shalev1.RequestOp{Op: &shalev1.RequestOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeOp{StartKey: []byte("d"), EndKey: []byte("e")}}},
		putReq("d1", "d1 again"))
	// The previous values of the next changes are in SSTs by then, after
	// compactions that would have dropped the shadowed versions read below.
	compactions := s.sh.EngineMetrics().Compactions
	s.fill(40)
	if _, err := s.sh.Flush(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); s.sh.EngineMetrics().Compactions == compactions; {
		if time.Now().After(deadline) {
			t.Fatalf("no compaction ran after %d flushes", s.sh.EngineMetrics().Flushes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.put("a", "a3")
	s.txn(delReq("b"), putReq("c", "c6"), delReq("d1"))
	s.put("big000", "small")

	got, err := collect(t, live, s.rev)
	if err != nil {
		t.Fatal(err)
	}
	want := expected(s.events, all, 0)
	if !slices.Equal(got, want) {
		t.Fatalf("live watcher:\ngot  %v\nwant %v", got, want)
	}
	from, _, err := h.Watch(context.Background(), Request{Start: []byte{}, PrevKV: true, StartRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got, err = collect(t, from, s.rev); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("watcher from revision 1:\ngot  %v\nwant %v", got, want)
	}
	for _, e := range want {
		if e.key == "a" && e.value == "a3" && e.prev != "a2" {
			t.Fatalf("the model is off: %v", e)
		}
	}
}

// historyShard is a test shard whose engine keeps 64 KiB of WAL's history
// (and an archive of 1 GiB): 40 puts of 16 KiB move its horizon past every
// earlier write.
func historyShard(t *testing.T) *testShard {
	t.Helper()
	o := testShardOptions(1 << 30)
	o.HistoryWindowBytes = 64 << 10
	return newTestShardWith(t, o, nil, nil)
}

// TestHubPrevKVBeforeTheWindow: a watch with PrevKV from a revision whose
// changes are older than the shard engine's history window ends with
// ErrCompacted and the oldest revision it can start from, which serves
// every change after it with its previous value; a watch without PrevKV
// from the same revision still reads the whole log.
func TestHubPrevKVBeforeTheWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	s := historyShard(t)
	for range 30 {
		s.write(rng)
	}
	s.fill(40)
	for range 10 {
		s.write(rng)
	}
	h, err := NewHub(s.sh, 1, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	_, _, err = h.Watch(context.Background(), Request{Start: []byte{}, PrevKV: true, StartRevision: 2})
	var ie *InterruptedError
	if !errors.As(err, &ie) || !errors.Is(err, ErrCompacted) || ie.Compact <= 2 {
		t.Fatalf("watch with PrevKV from revision 2: %v, want ErrCompacted with a later revision", err)
	}
	t.Logf("a watch with PrevKV from revision 2: %v", err)
	bare, after, err := h.Watch(context.Background(), Request{Start: []byte{}, StartRevision: 2})
	if err != nil || after != 1 {
		t.Fatalf("watch without PrevKV from revision 2: %v, current through %d", err, after)
	}
	got, err := collect(t, bare, s.rev)
	if err != nil {
		t.Fatal(err)
	}
	if want := expected(s.events, Request{Start: []byte{}}, 1); !slices.Equal(got, want) {
		t.Fatalf("watch without PrevKV from revision 2:\ngot  %v\nwant %v", got, want)
	}
	for attempt := 1; ; attempt++ {
		req := Request{Start: []byte{}, PrevKV: true, StartRevision: ie.Compact}
		w, _, err := h.Watch(context.Background(), req)
		if err == nil {
			got, err = collect(t, w, s.rev)
		}
		if err == nil {
			if want := expected(s.events, req, ie.Compact-1); !slices.Equal(got, want) {
				t.Fatalf("watch with PrevKV from %d:\ngot  %v\nwant %v", ie.Compact, got, want)
			}
			break
		}
		// The engine's horizon may have moved on meanwhile.
		if !errors.As(err, &ie) || !errors.Is(err, ErrCompacted) || attempt == 5 {
			t.Fatalf("watch with PrevKV from the revision the refusal named: %v", err)
		}
	}
}

// TestHubPrevKVFallsBehindTheWindow: a watcher with PrevKV that falls
// behind the shard engine's history window ends with ErrCompacted, and
// every change it delivered before carries its right previous value: one
// reading the log on its own whose consumer stops while the writes go on,
// and a live one whose hub publishes a change after the horizon passed it.
func TestHubPrevKVFallsBehindTheWindow(t *testing.T) {
	t.Run("catching up", func(t *testing.T) {
		s := historyShard(t)
		for i := range 30 {
			s.put(fmt.Sprintf("k%02d", i%5), fmt.Sprint("v", i))
		}
		h, err := NewHub(s.sh, 1, Options{Logger: quiet, MaxQueueBytes: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Stop()
		req := Request{Start: []byte("k"), End: []byte("l"), PrevKV: true, StartRevision: 1}
		w, _, err := h.Watch(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		// The watcher queued its first batch and waits for its consumer.
		s.fill(40)
		got, err := collect(t, w, s.rev)
		if !errors.Is(err, ErrCompacted) {
			t.Fatalf("after the horizon passed its position: %v, want ErrCompacted", err)
		}
		want := expected(s.events, req, 0)
		if len(got) == 0 || len(got) >= len(want) || !slices.Equal(got, want[:len(got)]) {
			t.Fatalf("before the end:\ngot  %v\nwant a prefix of %v", got, want)
		}
		t.Logf("%d of %d changes delivered, then: %v", len(got), len(want), err)
	})
	t.Run("live", func(t *testing.T) {
		s := historyShard(t)
		s.put("a", "a1")
		h, err := NewHub(s.sh, 1, Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Stop()
		req := Request{Start: []byte("a"), End: []byte("b"), PrevKV: true}
		w, _, err := h.Watch(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		bare, _, err := h.Watch(context.Background(), Request{Start: []byte("a"), End: []byte("b")})
		if err != nil {
			t.Fatal(err)
		}
		// The hub cannot publish while its lock is held: the overwrite
		// waits until the horizon passed it.
		h.mu.Lock()
		s.put("a", "a2")
		s.fill(40)
		h.mu.Unlock()
		got, err := collect(t, w, s.rev)
		if !errors.Is(err, ErrCompacted) || len(got) != 0 {
			t.Fatalf("live watcher: %v then %v, want no change and ErrCompacted", got, err)
		}
		if got, err = collect(t, bare, s.rev); err != nil || !slices.Equal(got, expected(s.events, Request{Start: []byte("a"), End: []byte("b")}, 1)) {
			t.Fatalf("live watcher without PrevKV: %v, %v", got, err)
		}
	})
}
