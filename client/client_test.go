package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The standard test cluster: 3 nodes, 3 shards [, g) [g, p) [p, ), shard
// i led by node i.
func threeShards(t *testing.T) *fakeCluster {
	return newFakeCluster(t, 3, "g", "p")
}

func TestNewLoadsRouting(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	shards, nodes := c.Routing()
	if len(shards) != 3 {
		t.Fatalf("routing has %d shards, want 3 (system shard skipped): %v", len(shards), shards)
	}
	for i, want := range []string{"", "g", "p"} {
		if got := string(shards[i].GetDescriptor_().GetStartKey()); got != want {
			t.Errorf("shard %d starts at %q, want %q", i, got, want)
		}
		if shards[i].GetLeaderNodeId() != uint64(i+1) {
			t.Errorf("shard %d leader %d, want %d", i, shards[i].GetLeaderNodeId(), i+1)
		}
	}
	if len(nodes) != 3 {
		t.Errorf("nodes = %v", nodes)
	}
}

func TestNewFailsWhenNoEndpointAnswers(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = New(ctx, []string{addr}, WithLogger(discardLogger()), WithBackoff(time.Millisecond, 10*time.Millisecond))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("New = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("New took %v past a 300ms deadline", d)
	}
	if _, err := New(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("New without endpoints = %v, want ErrInvalidArgument", err)
	}
}

// TestNewFailsFastWhenEveryEndpointRefuses: with nothing listening at any
// endpoint, New gives up after refusedGiveUp, well before its deadline,
// and says why.
func TestNewFailsFastWhenEveryEndpointRefuses(t *testing.T) {
	var addrs []string
	for range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, lis.Addr().String())
		lis.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := New(ctx, addrs, WithLogger(discardLogger()))
	took := time.Since(start)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("New = %v, want ErrUnavailable before the deadline", err)
	}
	want := "no node reachable at " + addrs[0] + ", " + addrs[1] + ": connection refused"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("New = %q, want it to say %q", err, want)
	}
	if took < refusedGiveUp || took > refusedGiveUp+2*time.Second {
		t.Errorf("New took %v to give up, want about %v", took, refusedGiveUp)
	}
}

func TestEndpointNeedsAPort(t *testing.T) {
	for e, want := range map[string]string{
		"127.0.0.1":  `endpoint "127.0.0.1" has no port: give host:port (a node's client port, shale-server --listen: 127.0.0.1:7001`,
		"node1:":     `endpoint "node1:" has no port: give host:port (a node's client port, shale-server --listen: node1:7001`,
		"[::1]":      `"[::1]" has no port: give host:port (a node's client port, shale-server --listen: [::1]:7001`,
		"node1:http": `endpoint "node1:http": port "http" is not a number from 1 to 65535`,
		"node1:0":    `port "0" is not a number from 1 to 65535`,
	} {
		_, err := New(context.Background(), []string{"127.0.0.1:7001", e}, WithLogger(discardLogger()))
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("New with endpoint %q = %v, want ErrInvalidArgument saying %q", e, err, want)
		}
	}
}

func TestRoutesToShardLeader(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	for _, k := range []string{"", "apple", "g", "kiwi", "p", "zebra", "\xff\xff"} {
		r, err := c.Put(ctx, []byte(k), []byte("v-"+k))
		if err != nil {
			t.Fatalf("Put %q: %v", k, err)
		}
		if r.Revision == 0 {
			t.Errorf("Put %q: revision 0", k)
		}
	}
	puts := fc.callsOf("Put")
	if len(puts) != 7 {
		t.Fatalf("%d Put calls, want 7 (one per key, no retries): %+v", len(puts), puts)
	}
	fc.mu.Lock()
	for _, call := range puts {
		s := fc.shardFor(call.key)
		if call.shard != s.id || call.epoch != s.epoch || call.node != s.leader {
			t.Errorf("Put %q went to shard %d epoch %d node %d; want shard %d epoch %d node %d",
				call.key, call.shard, call.epoch, call.node, s.id, s.epoch, s.leader)
		}
		if len(call.requestID) != requestIDLen {
			t.Errorf("Put %q: request ID of %d bytes, want %d", call.key, len(call.requestID), requestIDLen)
		}
	}
	fc.mu.Unlock()
	for _, k := range []string{"", "apple", "kiwi", "zebra"} {
		kv, err := c.Get(ctx, []byte(k))
		if err != nil {
			t.Fatalf("Get %q: %v", k, err)
		}
		if string(kv.Value) != "v-"+k || string(kv.Key) != k || kv.Version != 1 || kv.ModRevision == 0 {
			t.Errorf("Get %q = %+v", k, kv)
		}
	}
	if _, err := c.Get(ctx, []byte("missing")); err != ErrNotFound {
		t.Errorf("Get missing = %v, want ErrNotFound", err)
	}
}

func TestPutOptionsAndDelete(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	if _, err := c.Put(ctx, []byte("k"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	r, err := c.Put(ctx, []byte("k"), []byte("v2"), WithPrevKV(), WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if r.PrevKV == nil || string(r.PrevKV.Value) != "v1" {
		t.Errorf("PrevKV = %+v, want v1", r.PrevKV)
	}
	kv, err := c.Get(ctx, []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	if kv.Version != 2 || kv.ExpireAt.IsZero() || time.Until(kv.ExpireAt) < 59*time.Minute {
		t.Errorf("after TTL put: %+v", kv)
	}
	if _, err := c.Put(ctx, []byte("k"), nil, WithTTL(-time.Second)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative TTL: %v", err)
	}
	d, err := c.Delete(ctx, []byte("k"), WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if !d.Deleted || d.PrevKV == nil || string(d.PrevKV.Value) != "v2" {
		t.Errorf("Delete = %+v", d)
	}
	d, err = c.Delete(ctx, []byte("k"))
	if err != nil || d.Deleted {
		t.Errorf("second Delete = %+v, %v", d, err)
	}
	if _, err := c.Get(ctx, []byte("k")); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after delete: %v", err)
	}
}

func TestFollowsLeaderHint(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	fc.setLeader(2, 3) // shard [g, p) moves from node 2 to node 3
	if _, err := c.Put(ctx, []byte("kiwi"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	puts := fc.callsOf("Put")
	if len(puts) != 2 || puts[0].node != 2 || puts[1].node != 3 || puts[0].requestID != puts[1].requestID {
		t.Fatalf("calls %+v: want node 2 (NotLeader), then node 3 with the same request ID", puts)
	}
	if fc.routingCalls() != 1 {
		t.Errorf("%d GetRouting calls, want only New's", fc.routingCalls())
	}
	// The cache learnt the new leader: the next call goes straight there,
	// and so do linearizable reads.
	fc.resetCalls()
	if _, err := c.Get(ctx, []byte("kiwi")); err != nil {
		t.Fatal(err)
	}
	if gets := fc.callsOf("Get"); len(gets) != 1 || gets[0].node != 3 {
		t.Errorf("Get calls %+v, want one to node 3", gets)
	}
}

func TestNotLeaderWithoutHintTriesOtherReplicas(t *testing.T) {
	fc := threeShards(t)
	fc.hintless = true
	c := fc.client()
	ctx := bg(t)
	fc.setLeader(1, 3)
	if _, err := c.Put(ctx, []byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	puts := fc.callsOf("Put")
	if last := puts[len(puts)-1]; last.node != 3 {
		t.Errorf("last Put went to node %d, want 3", last.node)
	}
	if len(puts) > 3 {
		t.Errorf("%d attempts, want at most 3 (each replica once)", len(puts))
	}
	fc.resetCalls()
	if _, err := c.Put(ctx, []byte("b"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if puts := fc.callsOf("Put"); len(puts) != 1 || puts[0].node != 3 {
		t.Errorf("after learning the leader: %+v", puts)
	}
}

func TestFollowerAndStaleReads(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	fc.load(map[string]string{"a": "1"})
	// The leader (node 1) hangs; stale and follower reads move on to
	// another replica after the attempt timeout.
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		if call.node == 1 {
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		return nil
	}, nil)
	c2 := fc.client(WithAttemptTimeout(100 * time.Millisecond))
	for _, cons := range []Consistency{Follower, Stale} {
		kv, err := c2.Get(ctx, []byte("a"), WithConsistency(cons))
		if err != nil || string(kv.Value) != "1" {
			t.Fatalf("%v read: %v, %v", cons, kv, err)
		}
	}
	gets := fc.callsOf("Get")
	if gets[0].node != 1 || gets[0].consistency != shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER {
		t.Errorf("first follower read went to node %d with %v; want the leader first", gets[0].node, gets[0].consistency)
	}
	_ = c
}

// TestEpochMismatchRefreshesRouting: a server that names only the split
// shard's new range (not the new shard) leaves a gap that a routing
// refresh fills.
func TestEpochMismatchRefreshesRouting(t *testing.T) {
	fc := threeShards(t)
	fc.omitNext = true
	c := fc.client()
	ctx := bg(t)
	newID := fc.split("t") // [p, ) -> [p, t) epoch 2, [t, ) new
	fc.resetCalls()
	// A key in the left half: the EpochMismatch's descriptor is enough.
	if _, err := c.Put(ctx, []byte("q"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	puts := fc.callsOf("Put")
	if len(puts) != 2 || puts[0].epoch != 1 || puts[1].epoch != 2 || puts[1].shard != 3 {
		t.Errorf("left half: calls %+v, want epoch 1 then 2 on shard 3", puts)
	}
	if n := fc.routingCalls(); n != 0 {
		t.Errorf("left half: %d GetRouting calls, want 0 (the descriptor came with the error)", n)
	}
	// A key in the right half: the cache has a gap there now, filled by a
	// refresh.
	fc.resetCalls()
	if _, err := c.Put(ctx, []byte("x"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	puts = fc.callsOf("Put")
	if last := puts[len(puts)-1]; last.shard != newID {
		t.Errorf("right half: last call to shard %d, want %d", last.shard, newID)
	}
	if n := fc.routingCalls(); n != 1 {
		t.Errorf("right half: %d GetRouting calls, want 1", n)
	}
	shards, _ := c.Routing()
	if len(shards) != 4 {
		t.Errorf("routing has %d shards after the split, want 4", len(shards))
	}
}

// TestEpochMismatchNamesNewShard: the EpochMismatch of a split names the
// new shard and its leader; a request for a key that moved there goes
// straight to that leader, with no routing refresh.
func TestEpochMismatchNamesNewShard(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	newID := fc.split("t") // [p, ) -> [p, t) epoch 2, [t, ) new
	fc.resetCalls()
	if _, err := c.Put(ctx, []byte("x"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	puts := fc.callsOf("Put")
	if len(puts) != 2 || puts[0].epoch != 1 || puts[1].shard != newID {
		t.Errorf("calls %+v, want epoch 1 on the old shard, then the new shard %d", puts, newID)
	}
	if n := fc.routingCalls(); n != 0 {
		t.Errorf("%d GetRouting calls, want 0 (the new shard came with the error)", n)
	}
	shards, _ := c.Routing()
	if len(shards) != 4 {
		t.Errorf("routing has %d shards after the split, want 4", len(shards))
	}
}

func TestConcurrentCallersShareOneRefresh(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	fc.split("h")
	fc.split("i")
	fc.split("j")
	fc.resetCalls()
	// Slow GetRouting down a little so that the callers overlap.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte(fmt.Sprintf("j%02d", i))
			if _, err := c.Put(ctx, key, []byte("v")); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := fc.routingCalls(); n > 3 {
		t.Errorf("%d GetRouting calls for 50 concurrent callers, want them shared (<= 3)", n)
	}
}

// TestNoCallsFallbackUnderConcurrency: many callers start at once on new
// clients of nodes without KV.Calls (the fake nodes have none). The first
// stream's failure marks the connection unary while other callers ask the
// connection for its stream; before the fix the two took the connection's
// and the stream's locks in opposite orders and could deadlock, leaving
// every caller waiting until its deadline.
func TestNoCallsFallbackUnderConcurrency(t *testing.T) {
	fc := threeShards(t)
	for round := range 100 {
		c := fc.client()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Put(ctx, []byte(fmt.Sprintf("r%03d/%02d", round, i)), []byte("v")); err != nil {
					failed.Add(1)
				}
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: callers still blocked 15 s past their deadline (a deadlock)", round)
		}
		cancel()
		if n := failed.Load(); n > 0 {
			t.Fatalf("round %d: %d of 50 concurrent puts failed", round, n)
		}
	}
}

func TestRetryKeepsRequestIDAndAppliesOnce(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	var lost atomic.Int32
	// The first two responses are lost after the write applied.
	fc.setHooks(nil, func(ctx context.Context, call fakeCall) error {
		if lost.Add(1) <= 2 {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	})
	r, err := c.Put(ctx, []byte("a"), []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	// Each lost response makes the client try another replica, which
	// points back at the leader (node 1).
	puts := fc.callsOf("Put")
	toLeader := 0
	for _, p := range puts {
		if p.node == 1 {
			toLeader++
		}
	}
	if toLeader != 3 {
		t.Fatalf("%d attempts at the leader, want 3: %+v", toLeader, puts)
	}
	if !puts[0].first {
		t.Errorf("first attempt not marked first_attempt")
	}
	for _, p := range puts[1:] {
		if p.requestID != puts[0].requestID {
			t.Errorf("retry used request ID %x, want %x", p.requestID, puts[0].requestID)
		}
		if p.first {
			t.Errorf("retry at node %d marked first_attempt: the server would skip its dedup lookup", p.node)
		}
	}
	fc.mu.Lock()
	applied := fc.applies[puts[0].requestID]
	fc.mu.Unlock()
	if applied != 1 {
		t.Errorf("write applied %d times, want 1", applied)
	}
	kv, err := c.Get(ctx, []byte("a"))
	if err != nil || kv.Version != 1 || kv.ModRevision != r.Revision {
		t.Errorf("Get = %+v, %v; want version 1 at revision %d", kv, err, r.Revision)
	}
	// Each logical call gets its own ID.
	fc.setHooks(nil, nil)
	if _, err := c.Put(ctx, []byte("a"), []byte("2")); err != nil {
		t.Fatal(err)
	}
	puts = fc.callsOf("Put")
	if puts[len(puts)-1].requestID == puts[0].requestID {
		t.Error("a new Put reused the previous request ID")
	}
}

func TestUnavailableRetriedThenSucceeds(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	var n atomic.Int32
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		if call.method == "Put" && n.Add(1) <= 4 {
			return status.Error(codes.Unavailable, "no quorum")
		}
		return nil
	}, nil)
	if _, err := c.Put(ctx, []byte("kiwi"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	puts := fc.callsOf("Put")
	if len(puts) < 5 {
		t.Fatalf("%d attempts, want >= 5", len(puts))
	}
	ids := map[string]bool{}
	for _, p := range puts {
		ids[p.requestID] = true
	}
	if len(ids) != 1 {
		t.Errorf("%d distinct request IDs across retries, want 1", len(ids))
	}
	if got := fc.callsOf("Put"); got[len(got)-1].node != 2 {
		t.Errorf("succeeded on node %d, want the leader 2", got[len(got)-1].node)
	}
}

func TestResourceExhaustedRetried(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	var n atomic.Int32
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		if n.Add(1) <= 2 {
			return status.Error(codes.ResourceExhausted, "slow down")
		}
		return nil
	}, nil)
	if _, err := c.Put(bg(t), []byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if got := len(fc.callsOf("Put")); got != 3 {
		t.Errorf("%d attempts, want 3", got)
	}
}

// TestTooLargeFailsAtOnce: a request over a node's gRPC receive limit is
// refused by gRPC with ResourceExhausted "message larger than max"; unlike
// overload that is the same on every attempt, so it fails at once with
// ErrInvalidArgument (not ErrOutcomeUnknown: it never reached the handler)
// instead of being retried until the deadline.
func TestTooLargeFailsAtOnce(t *testing.T) {
	fc := newFakeClusterWith(t, 3, fakeServerSetup{
		opts: func(*fakeNode) []grpc.ServerOption { return []grpc.ServerOption{grpc.MaxRecvMsgSize(64 << 10)} },
	}, "m")
	c := fc.client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Put(ctx, []byte("a"), bytes.Repeat([]byte("v"), 100<<10))
	took := time.Since(start)
	if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("100 KiB put to a 64 KiB limit: %v, want ErrInvalidArgument only", err)
	}
	if !strings.Contains(err.Error(), "larger than a node accepts") {
		t.Errorf("error %q does not say the request is too large", err)
	}
	if took > 2*time.Second {
		t.Errorf("the put took %v to fail: retried?", took)
	}
	if n := len(fc.callsOf("Put")); n != 0 {
		t.Errorf("%d puts reached a handler", n)
	}
	// A value under the limit still goes through.
	if _, err := c.Put(ctx, []byte("a"), bytes.Repeat([]byte("v"), 10<<10)); err != nil {
		t.Fatal(err)
	}
}

func TestDeadlineRespected(t *testing.T) {
	fc := threeShards(t)
	c := fc.client(WithAttemptTimeout(0))
	// A slow server: the call must end at the caller's deadline.
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		select {
		case <-time.After(5 * time.Second):
			return nil
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, []byte("a"))
	if d := time.Since(start); d > time.Second {
		t.Errorf("Get took %v with a 200ms deadline", d)
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("status code %v, want DeadlineExceeded", status.Code(err))
	}

	// Unavailable forever: retries stop at the deadline, the last error is
	// wrapped.
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		return status.Error(codes.Unavailable, "no quorum")
	}, nil)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	start = time.Now()
	_, err = c.Put(ctx2, []byte("a"), []byte("1"))
	if d := time.Since(start); d > time.Second || d < 150*time.Millisecond {
		t.Errorf("Put took %v with a 200ms deadline", d)
	}
	if !errors.Is(err, ErrUnavailable) || status.Code(err) != codes.Unavailable {
		t.Errorf("unavailable: %v (code %v), want ErrUnavailable wrapping Unavailable", err, status.Code(err))
	}
	if len(fc.callsOf("Put")) < 3 {
		t.Errorf("only %d attempts in 200ms", len(fc.callsOf("Put")))
	}

	// The default timeout applies when the context has none.
	c3 := fc.client(WithDefaultTimeout(150 * time.Millisecond))
	start = time.Now()
	_, err = c3.Get(context.Background(), []byte("a"))
	if d := time.Since(start); d > time.Second || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("default timeout: %v after %v", err, d)
	}

	// WithMaxAttempts bounds the attempts.
	c4 := fc.client(WithMaxAttempts(3))
	fc.resetCalls()
	_, err = c4.Get(bg(t), []byte("a"))
	if !errors.Is(err, ErrUnavailable) || len(fc.callsOf("Get")) != 3 {
		t.Errorf("max attempts: %v after %d attempts", err, len(fc.callsOf("Get")))
	}
}

func TestCancelIsNotUnavailable(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		return status.Error(codes.Unavailable, "no quorum")
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := c.Get(ctx, []byte("a"))
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) {
		t.Errorf("cancelled: %v, want context.Canceled and not ErrUnavailable", err)
	}
}

func TestErrorTyping(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)

	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		return status.Error(codes.InvalidArgument, "key too large")
	}, nil)
	_, err := c.Put(ctx, []byte("a"), []byte("1"))
	if !errors.Is(err, ErrInvalidArgument) || status.Code(err) != codes.InvalidArgument {
		t.Errorf("invalid argument: %v", err)
	}
	if n := len(fc.callsOf("Put")); n != 1 {
		t.Errorf("InvalidArgument retried: %d attempts", n)
	}

	fc.resetCalls()
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		return status.Error(codes.PermissionDenied, "no")
	}, nil)
	_, err = c.Get(ctx, []byte("a"))
	if status.Code(err) != codes.PermissionDenied || errors.Is(err, ErrUnavailable) || len(fc.callsOf("Get")) != 1 {
		t.Errorf("permission denied: %v", err)
	}

	// NotLeader forever: surfaces as *NotLeaderError inside ErrUnavailable.
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		return statusWith(codes.FailedPrecondition, "not leader", &shalev1.NotLeader{ShardId: 1})
	}, nil)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = c.Put(short, []byte("a"), []byte("1"))
	var nle *NotLeaderError
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &nle) || nle.ShardID != 1 {
		t.Errorf("not leader forever: %v", err)
	}
	if st, ok := status.FromError(err); !ok || st.Code() != codes.FailedPrecondition {
		t.Errorf("status through the wrapping: %v %v", st, ok)
	}
}

func TestMultiGetAcrossShards(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	fc.load(map[string]string{"a": "1", "b": "2", "h": "3", "q": "4", "z": "5"})
	keys := [][]byte{[]byte("z"), []byte("a"), []byte("missing"), []byte("h"), []byte("q"), []byte("b"), []byte("a")}
	got, err := c.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"5", "1", "", "3", "4", "2", "1"}
	for i, w := range want {
		switch {
		case w == "" && got[i] != nil:
			t.Errorf("result %d = %+v, want nil", i, got[i])
		case w != "" && (got[i] == nil || string(got[i].Value) != w || !bytes.Equal(got[i].Key, keys[i])):
			t.Errorf("result %d = %+v, want %s", i, got[i], w)
		}
	}
	calls := fc.callsOf("MultiGet")
	if len(calls) != 3 {
		t.Errorf("%d MultiGet RPCs, want one per shard (3)", len(calls))
	}
	// After a split the client regroups.
	fc.split("c")
	fc.resetCalls()
	got, err = c.MultiGet(ctx, [][]byte{[]byte("a"), []byte("h"), []byte("b"), []byte("d")})
	if err != nil {
		t.Fatal(err)
	}
	if string(got[0].Value) != "1" || string(got[1].Value) != "3" || string(got[2].Value) != "2" || got[3] != nil {
		t.Errorf("after split: %+v", got)
	}
}

func TestCrossShardBatch(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	b := NewBatch().Put([]byte("a"), []byte("1")).Put([]byte("h"), []byte("2"))
	_, err := c.Commit(ctx, b)
	var cse *CrossShardError
	if !errors.As(err, &cse) || string(cse.SplitKey) != "g" || cse.ShardID != 1 {
		t.Fatalf("cross-shard batch: %v, want *CrossShardError at g", err)
	}
	if !errors.Is(err, ErrInvalidArgument) || status.Code(err) != codes.InvalidArgument {
		t.Errorf("not typed as invalid argument: %v (code %v)", err, status.Code(err))
	}
	if st, _ := status.FromError(err); len(st.Details()) != 1 {
		t.Errorf("status details %v, want the CrossShardRequest", st.Details())
	}
	if n := len(fc.callsOf("Batch")); n != 0 {
		t.Errorf("%d Batch RPCs, want none (the client knows)", n)
	}
	// A delete-range crossing the boundary too.
	_, err = c.Commit(ctx, NewBatch().DeleteRange([]byte("a"), []byte("h")))
	if !errors.As(err, &cse) || string(cse.SplitKey) != "g" {
		t.Errorf("cross-shard delete-range: %v", err)
	}
	// Within a shard it applies atomically.
	r, err := c.Commit(ctx, NewBatch().Put([]byte("h"), []byte("1"), WithPrevKV()).Put([]byte("i"), []byte("2")).Delete([]byte("j")))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 3 || r.Results[0].Type != OpTypePut || r.Results[2].Type != OpTypeDelete || r.Results[2].Deleted {
		t.Errorf("batch results %+v", r.Results)
	}
	// A split the client has not seen: the server's EpochMismatch makes the
	// client refresh and recheck, and the batch fails without applying.
	fc.split("i")
	fc.resetCalls()
	_, err = c.Commit(ctx, NewBatch().Put([]byte("h"), []byte("x")).Put([]byte("k"), []byte("y")))
	if !errors.As(err, &cse) || string(cse.SplitKey) != "i" {
		t.Errorf("after unseen split: %v", err)
	}
	kv, _ := c.Get(ctx, []byte("h"))
	if kv == nil || string(kv.Value) != "1" {
		t.Errorf("the failed batch applied: h = %+v", kv)
	}
	// The server's own answer is typed the same way.
	fc.setHooks(func(ctx context.Context, call fakeCall) error {
		return statusWith(codes.InvalidArgument, "cross", &shalev1.CrossShardRequest{SplitKey: []byte("hh"), ShardId: 2})
	}, nil)
	_, err = c.Commit(ctx, NewBatch().Put([]byte("h"), []byte("1")))
	if !errors.As(err, &cse) || string(cse.SplitKey) != "hh" || !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("server cross-shard: %v", err)
	}
	if _, err := c.Commit(ctx, NewBatch()); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty batch: %v", err)
	}
}

func TestTxn(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	fc.load(map[string]string{"h": "1"})
	r, err := c.Txn(ctx).
		If(Value([]byte("h")).Equal([]byte("1")), KeyMissing([]byte("i")), Version([]byte("h")).Equal(1)).
		Then(OpPut([]byte("i"), []byte("new")), OpGet([]byte("h"))).
		Else(OpGet([]byte("i"))).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !r.Succeeded || len(r.Results) != 2 || r.Results[1].KV == nil || string(r.Results[1].KV.Value) != "1" {
		t.Errorf("txn 1: %+v", r)
	}
	r, err = c.Txn(ctx).
		If(KeyMissing([]byte("i")), ModRevision([]byte("h")).Greater(0), CreateRevision([]byte("h")).Less(100)).
		Then(OpDelete([]byte("i"))).
		Else(OpGet([]byte("i")), OpDeleteRange([]byte("h"), []byte("i"))).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	if r.Succeeded || len(r.Results) != 2 || string(r.Results[0].KV.Value) != "new" || r.Results[1].Type != OpTypeDeleteRange {
		t.Errorf("txn 2: %+v", r)
	}
	if _, err := c.Get(ctx, []byte("h")); !errors.Is(err, ErrNotFound) {
		t.Errorf("h after delete-range in else: %v", err)
	}
	_, err = c.Txn(ctx).If(KeyExists([]byte("a"))).Then(OpPut([]byte("z"), nil)).Commit()
	var cse *CrossShardError
	if !errors.As(err, &cse) {
		t.Errorf("cross-shard txn: %v", err)
	}
	if n := len(fc.callsOf("Txn")); n != 2 {
		t.Errorf("%d Txn RPCs, want 2", n)
	}
}

func TestCompareAndSwap(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	ok, cur, err := c.CompareAndSwap(ctx, []byte("k"), nil, []byte("v1"), ExpectAbsent())
	if err != nil || !ok || cur != nil {
		t.Fatalf("create: %v %+v %v", ok, cur, err)
	}
	ok, cur, err = c.CompareAndSwap(ctx, []byte("k"), nil, []byte("v1"), ExpectAbsent())
	if err != nil || ok || cur == nil || string(cur.Value) != "v1" {
		t.Errorf("create again: %v %+v %v", ok, cur, err)
	}
	ok, _, err = c.CompareAndSwap(ctx, []byte("k"), []byte("nope"), []byte("v2"))
	if err != nil || ok {
		t.Errorf("wrong expected: %v %v", ok, err)
	}
	ok, cur, err = c.CompareAndSwap(ctx, []byte("k"), []byte("v1"), []byte("v2"), WithCASTTL(time.Minute))
	if err != nil || !ok || string(cur.Value) != "v1" {
		t.Errorf("swap: %v %+v %v", ok, cur, err)
	}
	kv, _ := c.Get(ctx, []byte("k"))
	if string(kv.Value) != "v2" || kv.ExpireAt.IsZero() {
		t.Errorf("after swap: %+v", kv)
	}
}

func TestDeleteRangeAcrossShards(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	all := map[string]string{}
	for _, k := range []string{"a", "f", "g", "h", "o", "p", "q", "z"} {
		all[k] = k
	}
	fc.load(all)
	if err := c.DeleteRange(ctx, []byte("f"), []byte("q")); err != nil {
		t.Fatal(err)
	}
	calls := fc.callsOf("DeleteRange")
	if len(calls) != 3 {
		t.Fatalf("%d DeleteRange RPCs, want 3", len(calls))
	}
	ids := map[string]bool{}
	for i, call := range calls {
		if call.shard != uint64(i+1) {
			t.Errorf("part %d went to shard %d", i, call.shard)
		}
		ids[call.requestID] = true
	}
	if len(ids) != 3 {
		t.Errorf("parts share request IDs: %d distinct", len(ids))
	}
	var left []string
	it := c.Scan(ctx, nil, nil, WithKeysOnly())
	for it.Next() {
		left = append(left, string(it.KV().Key))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, []string{"a", "q", "z"}) {
		t.Errorf("left after delete-range: %v", left)
	}
	if err := c.DeleteRange(ctx, []byte("b"), nil); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteRange(ctx, []byte("b"), []byte("a")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("inverted range: %v", err)
	}
}

// scanKeys collects a scan's keys.
func scanKeys(t *testing.T, c *Client, start, end []byte, opts ...ScanOption) []string {
	t.Helper()
	it := c.Scan(bg(t), start, end, opts...)
	defer it.Close()
	var out []string
	for it.Next() {
		out = append(out, string(it.KV().Key))
	}
	if err := it.Err(); err != nil {
		t.Fatalf("scan [%q, %q): %v", start, end, err)
	}
	return out
}

func TestScanAcrossShards(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	// Keys on both sides of, and exactly at, the shard boundaries, and
	// some with a common prefix crossing a boundary.
	keys := []string{"", "a", "b", "f", "fz", "g", "g0", "h", "o", "oa", "ob", "p", "p0", "q", "r", "z", "\xff"}
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("k%02d", i))
	}
	kvs := map[string]string{}
	for _, k := range keys {
		kvs[k] = "v" + k
	}
	fc.load(kvs)
	sort.Strings(keys)
	rev := func(s []string) []string { s = slices.Clone(s); slices.Reverse(s); return s }
	between := func(lo, hi string) []string {
		var out []string
		for _, k := range keys {
			if k >= lo && (hi == "" || k < hi) {
				out = append(out, k)
			}
		}
		return out
	}
	withPrefix := func(p string) []string {
		var out []string
		for _, k := range keys {
			if len(k) >= len(p) && k[:len(p)] == p {
				out = append(out, k)
			}
		}
		return out
	}
	for _, fcPage := range []int{1, 3, 100} {
		fc.mu.Lock()
		fc.pageSize = fcPage
		fc.mu.Unlock()
		for _, page := range []int{0, 1, 2, 5} {
			name := fmt.Sprintf("server page %d, client page %d", fcPage, page)
			po := WithPageSize(page)
			check := func(what string, got, want []string) {
				t.Helper()
				if !slices.Equal(got, want) {
					t.Errorf("%s: %s:\n got %q\nwant %q", name, what, got, want)
				}
			}
			check("all", scanKeys(t, c, nil, nil, po), keys)
			check("all reverse", scanKeys(t, c, nil, nil, po, WithReverse()), rev(keys))
			check("[b, q)", scanKeys(t, c, []byte("b"), []byte("q"), po), between("b", "q"))
			check("[b, q) reverse", scanKeys(t, c, []byte("b"), []byte("q"), po, WithReverse()), rev(between("b", "q")))
			check("[g, p)", scanKeys(t, c, []byte("g"), []byte("p"), po), between("g", "p"))
			check("[g, p) reverse", scanKeys(t, c, []byte("g"), []byte("p"), po, WithReverse()), rev(between("g", "p")))
			check("[fz, g0] reverse", scanKeys(t, c, []byte("fz"), []byte("g1"), po, WithReverse()), rev(between("fz", "g1")))
			check("prefix o", scanKeys(t, c, nil, nil, po, WithPrefix([]byte("o"))), withPrefix("o"))
			check("prefix k reverse", scanKeys(t, c, nil, nil, po, WithPrefix([]byte("k")), WithReverse()), rev(withPrefix("k")))
			check("prefix \\xff", scanKeys(t, c, nil, nil, po, WithPrefix([]byte("\xff"))), withPrefix("\xff"))
			check("limit 7", scanKeys(t, c, nil, nil, po, WithLimit(7)), keys[:7])
			check("limit 7 reverse", scanKeys(t, c, nil, nil, po, WithLimit(7), WithReverse()), rev(keys)[:7])
			check("[f, z) limit 9", scanKeys(t, c, []byte("f"), []byte("z"), po, WithLimit(9)), between("f", "z")[:9])
			check("empty range", scanKeys(t, c, []byte("c"), []byte("d"), po), nil)
		}
	}
	// An inverted or empty range is refused before any request.
	calls := len(fc.callsOf("Scan"))
	for _, r := range [][2]string{{"d", "c"}, {"d", "d"}} {
		it := c.Scan(bg(t), []byte(r[0]), []byte(r[1]), WithReverse())
		if it.Next() || !errors.Is(it.Err(), ErrInvalidArgument) {
			t.Errorf("scan [%q, %q): %v, want ErrInvalidArgument", r[0], r[1], it.Err())
		}
		it.Close()
	}
	if n := len(fc.callsOf("Scan")) - calls; n != 0 {
		t.Errorf("inverted scans sent %d requests", n)
	}
	// Values and keys-only.
	it := c.Scan(bg(t), []byte("g"), []byte("h"))
	for it.Next() {
		if kv := it.KV(); string(kv.Value) != "v"+string(kv.Key) {
			t.Errorf("value of %q = %q", kv.Key, kv.Value)
		}
	}
	it.Close()
	it = c.Scan(bg(t), []byte("g"), []byte("h"), WithKeysOnly())
	for it.Next() {
		if kv := it.KV(); kv.Value != nil || kv.ModRevision == 0 {
			t.Errorf("keys-only %+v", kv)
		}
	}
	it.Close()
	if it.Next() {
		t.Error("Next after Close")
	}
	it = c.Scan(bg(t), []byte("a"), nil, WithPrefix([]byte("x")))
	if it.Next() || !errors.Is(it.Err(), ErrInvalidArgument) {
		t.Errorf("prefix with bounds: %v", it.Err())
	}
}

func TestScanPagesBoundMemoryAndFollowTokens(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	kvs := map[string]string{}
	for i := range 40 {
		kvs[fmt.Sprintf("k%02d", i)] = "v"
	}
	fc.load(kvs)
	fc.mu.Lock()
	fc.pageSize = 100
	fc.mu.Unlock()
	it := c.Scan(bg(t), []byte("k"), []byte("l"), WithPageSize(4))
	n := 0
	for it.Next() {
		n++
		if len(it.buf) > 4 {
			t.Fatalf("buffer of %d entries with page size 4", len(it.buf))
		}
	}
	if n != 40 || it.Err() != nil {
		t.Fatalf("%d keys, %v", n, it.Err())
	}
	scans := fc.callsOf("Scan")
	// 10 full pages, then one more to learn that the range is exhausted.
	if len(scans) != 11 {
		t.Errorf("%d Scan RPCs for 40 keys in pages of 4, want 11", len(scans))
	}
}

// TestScanStreamsEachShard: without WithPageSize, a scan is one ScanStream
// per shard it overlaps, however many pages each shard's part has.
func TestScanStreamsEachShard(t *testing.T) {
	fc := threeShards(t) // split at g and p
	kvs := map[string]string{}
	for i := range 60 {
		kvs[fmt.Sprintf("%c%02d", 'a'+i%26, i)] = "v"
	}
	fc.load(kvs)
	c := fc.client()
	for _, reverse := range []bool{false, true} {
		fc.mu.Lock()
		fc.streams = 0
		fc.mu.Unlock()
		var opts []ScanOption
		if reverse {
			opts = append(opts, WithReverse())
		}
		got := scanKeys(t, c, nil, nil, opts...)
		if len(got) != 60 {
			t.Errorf("reverse=%v: %d keys, want 60", reverse, len(got))
		}
		fc.mu.Lock()
		streams := fc.streams
		fc.mu.Unlock()
		if streams != 3 {
			t.Errorf("reverse=%v: %d ScanStream calls for 3 shards (pages of 3 keys), want 3", reverse, streams)
		}
		if n := len(fc.callsOf("Scan")); n != 0 {
			t.Errorf("reverse=%v: %d unary Scan calls", reverse, n)
		}
	}
}

// TestScanStreamResumes: a stream that fails mid-shard, or goes silent for
// the attempt timeout, is resumed after the last key received: every key
// once, in order.
func TestScanStreamResumes(t *testing.T) {
	fc := threeShards(t)
	kvs := map[string]string{}
	var want []string
	for i := range 40 {
		k := fmt.Sprintf("h%02d", i) // all in the middle shard [g, p)
		kvs[k] = "v"
		want = append(want, k)
	}
	fc.load(kvs)
	for _, fault := range []string{"fail", "stall"} {
		for _, reverse := range []bool{false, true} {
			c := fc.client(WithAttemptTimeout(300 * time.Millisecond))
			var pages atomic.Int32
			fc.setHooks(func(ctx context.Context, call fakeCall) error {
				if call.method != "ScanStream" || pages.Add(1) != 4 {
					return nil
				}
				if fault == "fail" {
					return status.Error(codes.Unavailable, "node stopping")
				}
				select { // silent until the client gives up on the stream
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
				}
				return status.FromContextError(ctx.Err()).Err()
			}, nil)
			var opts []ScanOption
			exp := slices.Clone(want)
			if reverse {
				opts = append(opts, WithReverse())
				slices.Reverse(exp)
			}
			fc.mu.Lock()
			fc.streams = 0
			fc.mu.Unlock()
			start := time.Now()
			got := scanKeys(t, c, []byte("h"), []byte("i"), opts...)
			if !slices.Equal(got, exp) {
				t.Errorf("%s, reverse=%v: got %q", fault, reverse, got)
			}
			fc.mu.Lock()
			streams := fc.streams
			fc.mu.Unlock()
			if streams != 2 {
				t.Errorf("%s, reverse=%v: %d streams, want 2 (the one that broke, and its resumption)", fault, reverse, streams)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("%s, reverse=%v: took %v", fault, reverse, took)
			}
		}
	}
	fc.setHooks(nil, nil)
}

func TestScanSurvivesSplitAndLeaderChange(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	kvs := map[string]string{}
	var want []string
	for i := range 30 {
		k := fmt.Sprintf("k%02d", i)
		kvs[k] = "v"
		want = append(want, k)
	}
	fc.load(kvs)
	for _, reverse := range []bool{false, true} {
		var opts []ScanOption
		exp := slices.Clone(want)
		if reverse {
			opts = append(opts, WithReverse())
			slices.Reverse(exp)
		}
		c := fc.client()
		it := c.Scan(bg(t), []byte("k"), []byte("l"), opts...)
		var got []string
		for it.Next() {
			got = append(got, string(it.KV().Key))
			switch len(got) {
			case 4:
				fc.split("k10")
				fc.split("k20")
			case 12:
				fc.setLeader(2, 1)
			}
		}
		if it.Err() != nil || !slices.Equal(got, exp) {
			t.Errorf("reverse=%v: %q, %v", reverse, got, it.Err())
		}
	}
	_ = c
}

func TestAdmin(t *testing.T) {
	fc := threeShards(t)
	fc.adminLeader = 3
	c := fc.client()
	ctx := bg(t)
	cs, err := c.ClusterStatus(ctx)
	if err != nil || cs.GetClusterId() != "fake-cluster" || len(cs.GetNodes()) != 3 || len(cs.GetShards()) != 3 {
		t.Fatalf("ClusterStatus = %v, %v", cs, err)
	}
	nodes, err := c.ListNodes(ctx)
	if err != nil || len(nodes) != 3 {
		t.Fatalf("ListNodes = %v, %v", nodes, err)
	}
	shards, err := c.ListShards(ctx)
	if err != nil || len(shards) != 3 {
		t.Fatalf("ListShards = %v, %v", shards, err)
	}
	si, err := c.ShardInfo(ctx, 2)
	if err != nil || si.GetDescriptor_().GetShardId() != 2 || string(si.GetDescriptor_().GetStartKey()) != "g" {
		t.Fatalf("ShardInfo = %v, %v", si, err)
	}
	if _, err := c.ShardInfo(ctx, 77); status.Code(err) != codes.NotFound {
		t.Errorf("ShardInfo of unknown shard: %v", err)
	}
	// Mutations follow the admin leader's hint.
	an, err := c.AddNode(ctx, "10.0.0.4:7001", "zd")
	if err != nil || an.GetNode().GetNodeId() != 4 || an.GetNode().GetZone() != "zd" {
		t.Fatalf("AddNode = %v, %v", an, err)
	}
	if err := c.RemoveNode(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveNode(ctx, 42); status.Code(err) != codes.NotFound {
		t.Errorf("RemoveNode 42: %v", err)
	}
	l, err := c.TransferLeader(ctx, 1, 2)
	if err != nil || l != 2 {
		t.Fatalf("TransferLeader = %d, %v", l, err)
	}
	rs, _ := c.Routing()
	if rs[0].GetLeaderNodeId() != 2 {
		t.Errorf("routing leader of shard 1 = %d after the transfer, want 2", rs[0].GetLeaderNodeId())
	}
	fc.resetCalls()
	if _, err := c.Put(ctx, []byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if puts := fc.callsOf("Put"); len(puts) != 1 || puts[0].node != 2 {
		t.Errorf("Put after transfer: %+v", puts)
	}
}

func TestNodeDownFailsOver(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	fc.load(map[string]string{"kiwi": "1"})
	fc.stopNode(2)     // the leader of [g, p)
	fc.setLeader(2, 1) // and an election moved it to node 1
	if _, err := c.Put(ctx, []byte("kiwi"), []byte("2")); err != nil {
		t.Fatal(err)
	}
	kv, err := c.Get(ctx, []byte("kiwi"))
	if err != nil || string(kv.Value) != "2" {
		t.Fatalf("Get = %+v, %v", kv, err)
	}
	// Admin requests skip the dead node too.
	if _, err := c.ListNodes(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(bg(t), []byte("a")); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := c.ListNodes(bg(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("ListNodes after Close: %v", err)
	}
}

// TestConcurrentUse runs writers, readers and scanners while leaders move
// and shards split (run with -race).
func TestConcurrentUse(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := []byte(fmt.Sprintf("%c%03d", 'a'+(w*3+i)%26, i%50))
				if _, err := c.Put(ctx, k, []byte("v")); err != nil {
					t.Error(err)
					return
				}
				if _, err := c.Get(ctx, k); err != nil {
					t.Error(err)
					return
				}
				if i%10 == 0 {
					it := c.Scan(ctx, nil, nil, WithPageSize(7), WithKeysOnly())
					prev := ""
					first := true
					for it.Next() {
						if k := string(it.KV().Key); !first && k <= prev {
							t.Errorf("scan out of order: %q after %q", k, prev)
						} else {
							prev, first = k, false
						}
					}
					if err := it.Err(); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	for i, at := range []string{"c", "e", "j", "m", "s", "v"} {
		time.Sleep(20 * time.Millisecond)
		fc.split(at)
		fc.setLeader(uint64(i%3+1), uint64((i+1)%3+1))
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
}

func TestPrefixEnd(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""}, {"a", "b"}, {"a\xff", "b"}, {"\xff\xff", ""}, {"ab", "ac"},
	} {
		if got := string(prefixEnd([]byte(tc.in))); got != tc.want {
			t.Errorf("prefixEnd(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestAddressMap: the client dials every address through the map — here
// endpoints that exist only as names the map knows, and the node addresses
// the cluster reports — and routes requests as usual.
func TestAddressMap(t *testing.T) {
	fc := threeShards(t)
	addrs := fc.addrs()
	var mu sync.Mutex
	seen := map[string]bool{}
	m := func(addr string) string {
		mu.Lock()
		defer mu.Unlock()
		seen[addr] = true
		var i int
		if _, err := fmt.Sscanf(addr, "alias-%d:7001", &i); err == nil && i >= 1 && i <= len(addrs) {
			return addrs[i-1]
		}
		return addr
	}
	ctx := bg(t)
	c, err := New(ctx, []string{"alias-1:7001", "alias-2:7001", "alias-3:7001"},
		WithAddressMap(m), WithBackoff(time.Millisecond, 20*time.Millisecond), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, k := range []string{"a", "h", "q"} { // one key per shard, one per leader
		if _, err := c.Put(ctx, []byte(k), []byte("v")); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !seen["alias-1:7001"] {
		t.Errorf("the endpoint was not mapped: %v", seen)
	}
	for _, a := range addrs {
		if !seen[a] {
			t.Errorf("the reported node address %s was not mapped: %v", a, seen)
		}
	}
	// Without the map the alias endpoints reach nothing.
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if c2, err := New(short, []string{"alias-1:7001"}, WithLogger(discardLogger())); err == nil {
		c2.Close()
		t.Fatal("a client reached the cluster through an unmapped alias")
	}
}

// TestChecksumConflicts: replicas at one index with different checksums
// conflict; replicas at different indexes are not compared.
func TestChecksumConflicts(t *testing.T) {
	r := func(node, idx, sum uint64) *shalev1.ReplicaChecksumResponse {
		return &shalev1.ReplicaChecksumResponse{NodeId: node, AppliedIndex: idx, Checksum: sum}
	}
	if c := ChecksumConflicts([]*shalev1.ReplicaChecksumResponse{r(1, 10, 5), r(2, 11, 6), r(3, 10, 5)}); len(c) != 0 {
		t.Fatalf("conflicts reported for equal replicas: %v", c)
	}
	c := ChecksumConflicts([]*shalev1.ReplicaChecksumResponse{r(1, 10, 5), r(2, 11, 6), r(3, 10, 7)})
	if len(c) != 1 || c[0] != "nodes 1 and 3 at index 10: 0000000000000005 != 0000000000000007" {
		t.Fatalf("conflicts %v, want nodes 1 and 3 at index 10", c)
	}
}

// TestAdminCallsFollowNodeChanges: a client that makes only Admin calls
// learns of a node added to the cluster, and reaches it once the nodes it
// knew are gone (the chaos suite's admin client lost the cluster after
// every founding node had been replaced).
func TestAdminCallsFollowNodeChanges(t *testing.T) {
	fc := newFakeCluster(t, 3)
	fc.mu.Lock()
	fc.removed[3] = true // not in the cluster yet
	fc.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, []string{fc.nodes[0].addr}, WithBackoff(time.Millisecond, 20*time.Millisecond), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.routingMaxAge = 10 * time.Millisecond
	if _, nodes := c.Routing(); len(nodes) != 2 {
		t.Fatalf("routing nodes %v, want nodes 1 and 2", nodes)
	}
	fc.mu.Lock()
	delete(fc.removed, 3) // node 3 joins
	fc.mu.Unlock()
	for {
		time.Sleep(20 * time.Millisecond)
		if _, err := c.ClusterStatus(ctx); err != nil {
			t.Fatal(err)
		}
		if _, nodes := c.Routing(); nodes[3] != "" {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the client never learned of node 3 from its Admin calls")
		}
	}
	fc.stopNode(1) // nodes 1 and 2 leave
	fc.stopNode(2)
	if _, err := c.ClusterStatus(ctx); err != nil {
		t.Fatalf("ClusterStatus with only node 3 left: %v", err)
	}
}
