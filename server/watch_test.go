package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// shardOf returns the user shard whose range holds key, waiting up to 10 s
// while none does (frozen for a merge, say).
func shardOf(t *testing.T, c *testcluster.Cluster, key []byte) uint64 {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		for _, id := range c.ShardIDs() {
			for _, nid := range c.NodeIDs() {
				n := c.Node(nid)
				if n == nil {
					continue
				}
				sm := n.Shard(id)
				if sm == nil {
					continue
				}
				d := sm.Descriptor()
				if d != nil && !d.GetSystem() && d.GetMergingInto() == 0 && bytes.Compare(key, d.GetStartKey()) >= 0 &&
					(len(d.GetEndKey()) == 0 || bytes.Compare(key, d.GetEndKey()) < 0) {
					return id
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no shard holds %q", key)
		}
	}
}

// watchLeader waits for the leader of the shard holding key and returns
// its KV client.
func watchLeader(t *testing.T, c *testcluster.Cluster, key []byte) (shalev1.KVClient, uint64, uint64) {
	t.Helper()
	id := shardOf(t, c, key)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if l := c.Leader(id); l != 0 {
			return rawKV(t, c.Node(l).Addr()), id, l
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard %d has no leader", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// recvEvents receives until n events have come, checking that the stream's
// revisions never go back, and returns them with the last header revision.
func recvEvents(t *testing.T, st shalev1.KV_WatchClient, n int) ([]*shalev1.WatchEvent, uint64) {
	t.Helper()
	var evs []*shalev1.WatchEvent
	var rev uint64
	for len(evs) < n {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("after %d of %d events: %v", len(evs), n, err)
		}
		if m.GetHeader().GetRevision() < rev {
			t.Fatalf("header revision went back from %d to %d", rev, m.GetHeader().GetRevision())
		}
		rev = m.GetHeader().GetRevision()
		for _, e := range m.GetEvents() {
			if e.GetKv().GetModRevision() > rev {
				t.Fatalf("event at revision %d in a message current through %d", e.GetKv().GetModRevision(), rev)
			}
		}
		evs = append(evs, m.GetEvents()...)
	}
	return evs, rev
}

func describe(evs []*shalev1.WatchEvent) string {
	var b bytes.Buffer
	for _, e := range evs {
		op := "put"
		if e.GetType() == shalev1.WatchEvent_TYPE_DELETE {
			op = "del"
		}
		fmt.Fprintf(&b, "%s %s=%s@%d", op, e.GetKv().GetKey(), e.GetKv().GetValue(), e.GetKv().GetModRevision())
		if e.GetPrevKv() != nil {
			fmt.Fprintf(&b, "(was %s)", e.GetPrevKv().GetValue())
		}
		b.WriteString("; ")
	}
	return b.String()
}

// TestWatch: a Watch stream delivers puts, deletes and the keys a range
// deletion removed, with their revisions and previous values, and nothing
// outside its prefix; a watch from an older revision replays the same
// events from the shard's log; progress notifications report the
// revision while idle; bad requests get InvalidArgument, OutOfRange and
// NotLeader; a split ends the stream with the new range; a stopping node
// ends it with Unavailable and the revision to resume from.
func TestWatch(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{
		Splits:    [][]byte{[]byte("m")},
		Configure: func(cfg *server.Config) { cfg.WatchProgressInterval = 100 * time.Millisecond },
	})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kv, shardID, leader := watchLeader(t, c, []byte("w/"))

	st, err := kv.Watch(ctx, &shalev1.WatchRequest{Prefix: []byte("w/"), PrevKv: true})
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.GetHeader().GetShardId() != shardID || len(first.GetEvents()) != 0 {
		t.Fatalf("first message %v", first)
	}
	put := func(k, v string) uint64 {
		r, err := cl.Put(ctx, []byte(k), []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		return r.Revision
	}
	r1 := put("w/1", "a")
	r2 := put("w/1", "b")
	put("x", "outside")
	if _, err := cl.Delete(ctx, []byte("w/1")); err != nil {
		t.Fatal(err)
	}
	put("w/2", "c")
	put("w/3", "d")
	if err := cl.DeleteRange(ctx, []byte("w/"), []byte("w0")); err != nil {
		t.Fatal(err)
	}
	evs, _ := recvEvents(t, st, 7)
	got := describe(evs)
	want := fmt.Sprintf("put w/1=a@%d; put w/1=b@%d(was a); del w/1=@%d(was b); put w/2=c@%d; put w/3=d@%d; del w/2=@%d(was c); del w/3=@%d(was d); ",
		r1, r2, r2+2, r2+3, r2+4, r2+5, r2+5)
	if got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}

	// From an older revision: the same events, from the log.
	old, err := kv.Watch(ctx, &shalev1.WatchRequest{Prefix: []byte("w/"), StartRevision: r1, PrevKv: true})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := old.Recv(); err != nil || m.GetHeader().GetRevision() != r1-1 {
		t.Fatalf("first message of a watch from %d: %v, %v", r1, m, err)
	}
	if evs, _ := recvEvents(t, old, 7); describe(evs) != want {
		t.Fatalf("events from revision %d:\n got %s\nwant %s", r1, describe(evs), want)
	}

	// Progress while idle.
	prog, err := kv.Watch(ctx, &shalev1.WatchRequest{Prefix: []byte("w/"), ProgressNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	put("x", "moves the revision")
	last := put("x", "again")
	for {
		m, err := prog.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.GetEvents()) > 0 {
			t.Fatalf("events outside the prefix: %v", m.GetEvents())
		}
		if m.GetHeader().GetRevision() >= last {
			break
		}
	}

	// Bad requests.
	for name, tc := range map[string]struct {
		req  *shalev1.WatchRequest
		code codes.Code
	}{
		"prefix and start":   {&shalev1.WatchRequest{Prefix: []byte("w/"), StartKey: []byte("w/")}, codes.InvalidArgument},
		"inverted":           {&shalev1.WatchRequest{StartKey: []byte("w/9"), EndKey: []byte("w/1")}, codes.InvalidArgument},
		"across shards":      {&shalev1.WatchRequest{StartKey: []byte("a"), EndKey: []byte("z")}, codes.OutOfRange},
		"unknown shard":      {&shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: 999}, Prefix: []byte("w/")}, codes.NotFound},
		"oversized boundary": {&shalev1.WatchRequest{StartKey: bytes.Repeat([]byte("w"), 5000)}, codes.InvalidArgument},
	} {
		s, err := kv.Watch(ctx, tc.req)
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", name, err, tc.code)
		}
	}
	for _, nid := range c.NodeIDs() {
		if nid == leader {
			continue
		}
		s, err := rawKV(t, c.Node(nid).Addr()).Watch(ctx, &shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: shardID}, Prefix: []byte("w/")})
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("watch on follower node %d: %v, want FailedPrecondition (not the leader)", nid, err)
		}
		break
	}

	// A split inside the prefix ends the stream with the new range.
	put("w/7", "e")
	if _, _, err := cl.SplitShard(ctx, []byte("w/5")); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("watch across a split: %v, want a range change", err)
		}
		if rc := m.GetRangeChange(); rc != nil {
			if string(rc.GetEndKey()) != "w/5" || rc.GetShardId() != shardID {
				t.Fatalf("range change %v", rc)
			}
			break
		}
	}
	if _, err := st.Recv(); err == nil {
		t.Fatal("the stream goes on after its range change")
	}
	// A client that missed the split resumes with the range and epoch it
	// knew: the changes up to the split, then the range change.
	if s, err := kv.Watch(ctx, &shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: shardID}, Prefix: []byte("w/"), StartRevision: r1}); err != nil {
		t.Fatal(err)
	} else if _, err := s.Recv(); status.Code(err) != codes.OutOfRange {
		t.Fatalf("watch of a range the shard no longer holds, without range_epoch: %v, want OutOfRange", err)
	}
	missed, err := kv.Watch(ctx, &shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: shardID}, Prefix: []byte("w/"),
		StartRevision: r1, PrevKv: true, RangeEpoch: first.GetHeader().GetEpoch()})
	if err != nil {
		t.Fatal(err)
	}
	evs, _ = recvEvents(t, missed, 8) // the 7 events, then the put of w/7
	if describe(evs[:7]) != want || string(evs[7].GetKv().GetKey()) != "w/7" {
		t.Fatalf("resumed across the split: %s", describe(evs))
	}
	for {
		m, err := missed.Recv()
		if err != nil {
			t.Fatalf("resumed across the split: %v, want a range change", err)
		}
		if m.GetRangeChange() != nil {
			if len(m.GetEvents()) != 0 || string(m.GetRangeChange().GetEndKey()) != "w/5" {
				t.Fatalf("range change message %v", m)
			}
			break
		}
		if len(m.GetEvents()) > 0 {
			t.Fatalf("events after w/7 before the range change: %v", m.GetEvents())
		}
	}

	// A stopping node ends its streams with the revision to resume from.
	kv, shardID, leader = watchLeader(t, c, []byte("w/1"))
	stop, err := kv.Watch(ctx, &shalev1.WatchRequest{StartKey: []byte("w/"), EndKey: []byte("w/5")})
	if err != nil {
		t.Fatal(err)
	}
	m, err := stop.Recv()
	if err != nil {
		t.Fatal(err)
	}
	current := m.GetHeader().GetRevision()
	c.Stop(leader)
	_, err = stop.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("watch on a stopping node: %v, want Unavailable", err)
	}
	var resume uint64
	for _, d := range status.Convert(err).Details() {
		if wi, ok := d.(*shalev1.WatchInterrupted); ok && wi.GetShardId() == shardID {
			resume = wi.GetResumeRevision()
		}
	}
	if resume != current+1 {
		t.Fatalf("resume revision %d (%v), want %d", resume, err, current+1)
	}
}

// TestWatchResumeAcrossMergeReportsLostHistory: a watcher of a shard that
// was merged away while it was disconnected resumes on the merged shard
// with a revision of the absorbed shard. The changes after it came with the
// merge without their history: the stream ends with OutOfRange and the
// oldest revision available instead of skipping them. A resume after the
// absorbed shard's last revision (a watcher that followed the merge) is
// served.
func TestWatchResumeAcrossMergeReportsLostHistory(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var revs []uint64
	for _, k := range []string{"n1", "n2", "n3"} {
		res, err := cl.Put(ctx, []byte(k), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, res.Revision)
	}
	left, right := twoUserShards(t, c)
	mergeRetrying(t, adminOf(t, c), &shalev1.MergeShardsRequest{Key: []byte("a"), ShardId: left.GetShardId()})
	kv := rawKV(t, c.Node(c.Leader(left.GetShardId())).Addr())

	// Delivered through n1 on the right shard; n2 and n3 were missed.
	st, err := kv.Watch(ctx, &shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: left.GetShardId()},
		StartKey: []byte("m"), StartRevision: revs[0] + 1, RevisionShardId: right.GetShardId()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	var wi *shalev1.WatchInterrupted
	for _, d := range status.Convert(err).Details() {
		if v, ok := d.(*shalev1.WatchInterrupted); ok {
			wi = v
		}
	}
	if status.Code(err) != codes.OutOfRange || wi == nil || wi.GetCompactRevision() <= revs[2] {
		t.Fatalf("resume across the merge that skipped revisions %d..%d: %v (detail %v); want OutOfRange naming a revision after %d",
			revs[1], revs[2], err, wi, revs[2])
	}

	// Counted by the absorbing shard itself, from before the merge (a part
	// split off to the right shard that never started a stream there):
	// the right shard's changes are not in the left's history either.
	st, err = kv.Watch(ctx, &shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: left.GetShardId()},
		StartKey: []byte("m"), StartRevision: revs[0] + 1, RevisionShardId: left.GetShardId()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err = st.Recv(); status.Code(err) != codes.OutOfRange {
		t.Fatalf("resume counted by the absorbing shard from before the merge: %v, want OutOfRange", err)
	}

	// Delivered through n3, the absorbed shard's last change: served.
	st, err = kv.Watch(ctx, &shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: left.GetShardId()},
		StartKey: []byte("m"), StartRevision: revs[2] + 1, RevisionShardId: right.GetShardId()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("resume after the absorbed shard's last revision: %v", err)
	}
	if _, err := cl.Put(ctx, []byte("n4"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || len(m.GetEvents()) != 1 || string(m.GetEvents()[0].GetKv().GetKey()) != "n4" {
		t.Fatalf("after the resume: %v, %v; want the put of n4", m, err)
	}
}

// TestWatchResumeAcrossTwoMergesReportsLostHistory: a watch part that last
// streamed on a shard that was merged into its neighbour, which was then
// merged into the next (the part never streamed on the middle one), resumes
// on the last with the first shard's revision: the changes it missed there
// reached the last shard without their history, so the resume ends with
// OutOfRange (ErrCompacted), not a silent gap. TestWatchRandomized found
// it (seed 13: a merge of the right shard into the middle one, cut short,
// then completed by a merge of the middle one into the left).
func TestWatchResumeAcrossTwoMergesReportsLostHistory(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m"), []byte("t")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	right := shardOf(t, c, []byte("u"))
	var revs []uint64
	for _, k := range []string{"u1", "u2", "u3"} {
		res, err := cl.Put(ctx, []byte(k), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, res.Revision)
	}
	middle := shardOf(t, c, []byte("n"))
	mergeRetrying(t, adminOf(t, c), &shalev1.MergeShardsRequest{Key: []byte("n"), ShardId: middle})
	left := shardOf(t, c, []byte("a"))
	mergeRetrying(t, adminOf(t, c), &shalev1.MergeShardsRequest{Key: []byte("a"), ShardId: left})
	if got := shardOf(t, c, []byte("u")); got != left {
		t.Fatalf("after both merges u is in shard %d, want %d", got, left)
	}
	kv := rawKV(t, c.Node(c.Leader(left)).Addr())
	// Delivered through u1 on the right shard; u2 and u3 were missed.
	st, err := kv.Watch(ctx, &shalev1.WatchRequest{Header: &shalev1.RequestHeader{ShardId: left},
		StartKey: []byte("t"), StartRevision: revs[0] + 1, RevisionShardId: right})
	if err != nil {
		t.Fatal(err)
	}
	if _, err = st.Recv(); status.Code(err) != codes.OutOfRange {
		t.Fatalf("resume of shard %d's revisions on shard %d, two merges later, skipping revisions %d..%d: %v; want OutOfRange",
			right, left, revs[1], revs[2], err)
	}
}

// TestWatchCreatedNotify: a watch across three shards with
// client.WithCreatedNotify delivers a Created response first, with no
// events, though writers were busy on every shard as it opened; every
// write made after it arrives is delivered, and nothing is delivered
// twice.
func TestWatchCreatedNotify(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("h"), []byte("p")}})
	cl := newClient(t, c)
	// The watcher's streams on the third shard start 500 ms late, so the
	// other two have changes to deliver meanwhile.
	late := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != shalev1.KV_Watch_FullMethodName {
			return cs, err
		}
		return &lateStart{ClientStream: cs}, nil
	}
	wcl := newClient(t, c, client.WithDialOptions(grpc.WithStreamInterceptor(late)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Writers on all three shards before and while the watch opens.
	wctx, stopWriters := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; wctx.Err() == nil; i++ {
			_, _ = cl.Put(wctx, []byte(fmt.Sprintf("%c-busy", "dkt"[i%3])), []byte(fmt.Sprint(i)))
		}
	}()
	time.Sleep(50 * time.Millisecond)
	events := wcl.Watch(ctx, nil, nil, client.WithCreatedNotify())
	first := <-events
	if !first.Created || len(first.Events) != 0 || first.Err != nil {
		t.Fatalf("first response %+v; want Created with no events", first)
	}
	stopWriters()
	<-done

	// A write on each shard after Created: each delivered, once.
	want := map[string]uint64{}
	for _, k := range []string{"a-after", "k-after", "z-after"} {
		r, err := cl.Put(ctx, []byte(k), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		want[k] = r.Revision
	}
	got := map[string]int{}
	for len(got) < len(want) {
		select {
		case r := <-events:
			if r.Err != nil || r.Created {
				t.Fatalf("response %+v", r)
			}
			for _, e := range r.Events {
				k := string(e.KV.Key)
				if rev, ok := want[k]; ok {
					if e.KV.ModRevision != rev {
						t.Fatalf("%s delivered at revision %d, written at %d", k, e.KV.ModRevision, rev)
					}
					if got[k]++; got[k] > 1 {
						t.Fatalf("%s delivered twice", k)
					}
				}
			}
		case <-ctx.Done():
			t.Fatalf("delivered %v of %v", got, want)
		}
	}
}

// lateStart is a Watch stream whose request, on a shard whose range
// starts at or after "p", leaves 500 ms late: the server starts it then.
type lateStart struct {
	grpc.ClientStream
}

func (s *lateStart) SendMsg(m any) error {
	if r, ok := m.(*shalev1.WatchRequest); ok && bytes.Compare(r.GetStartKey(), []byte("p")) >= 0 {
		time.Sleep(500 * time.Millisecond)
	}
	return s.ClientStream.SendMsg(m)
}
