package server_test

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// TestManualSplit splits a shard of a 3-node cluster under concurrent
// writes: every acknowledged key reads back from the right shard, scans
// cross the new boundary in both directions with exactly the written keys,
// both halves take writes, and all of it survives a restart of every node.
func TestManualSplit(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	want := map[string]string{}
	for i := range 200 {
		k := fmt.Sprintf("k%03d", i)
		if _, err := cl.Put(ctx, []byte(k), []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
		want[k] = "v" + k
	}
	// Writers keep going during the split.
	type ack struct{ k, v string }
	acks := make(chan ack, 1000)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer close(acks)
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			k, v := fmt.Sprintf("k%03d", (i*37)%200), fmt.Sprintf("w%d", i)
			if _, err := cl.Put(ctx, []byte(k), []byte(v)); err != nil {
				done <- fmt.Errorf("put %s during the split: %w", k, err)
				return
			}
			acks <- ack{k, v}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	left, right, err := cl.SplitShard(ctx, []byte("k100"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	for a := range acks {
		want[a.k] = a.v
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if string(left.GetEndKey()) != "k100" || string(right.GetStartKey()) != "k100" || right.GetShardId() == left.GetShardId() ||
		right.GetEpoch() != left.GetEpoch() || len(right.GetReplicas()) != 3 {
		t.Fatalf("split descriptors: left %v, right %v", left, right)
	}
	// Splitting again at the same key is refused.
	if _, _, err := cl.SplitShard(ctx, []byte("k100")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("second split at k100: %v, want InvalidArgument", err)
	}
	check := func(cl *client.Client) {
		t.Helper()
		for k, v := range want {
			kv, err := cl.Get(ctx, []byte(k))
			if err != nil || string(kv.Value) != v {
				t.Fatalf("get %s: %v, %v; want %q", k, kv, err, v)
			}
		}
		for _, reverse := range []bool{false, true} {
			var opts []client.ScanOption
			if reverse {
				opts = append(opts, client.WithReverse())
			}
			it := cl.Scan(ctx, []byte("k050"), []byte("k150"), opts...)
			var got []string
			for it.Next() {
				got = append(got, string(it.KV().Key))
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			if len(got) != 100 {
				t.Fatalf("scan [k050, k150) reverse=%v: %d keys, want 100", reverse, len(got))
			}
			for i, k := range got {
				j := i
				if reverse {
					j = 99 - i
				}
				if k != fmt.Sprintf("k%03d", 50+j) {
					t.Fatalf("scan reverse=%v: key %d is %s", reverse, i, k)
				}
			}
		}
		// Each half holds only its keys, on every node.
		for _, id := range c.NodeIDs() {
			n := c.Node(id)
			ls, rs := n.Shard(left.GetShardId()), n.Shard(right.GetShardId())
			if ls == nil || rs == nil {
				t.Fatalf("node %d hosts left %v, right %v", id, ls != nil, rs != nil)
			}
			if d := rs.Descriptor(); !bytes.Equal(d.GetStartKey(), []byte("k100")) {
				t.Fatalf("node %d: right shard descriptor %v", id, d)
			}
			now := time.Now().UnixNano()
			for _, probe := range []struct {
				sm interface {
					Get([]byte, int64) (*shalev1.KeyValue, uint64, error)
				}
				key  string
				want bool
			}{{ls, "k050", true}, {rs, "k150", true}} {
				kv, _, err := probe.sm.Get([]byte(probe.key), now)
				if err != nil || (kv != nil) != probe.want {
					t.Fatalf("node %d: replica lookup of %s: %v, %v", id, probe.key, kv, err)
				}
			}
		}
	}
	check(cl)
	for _, k := range []string{"k000x", "k199x"} {
		if _, err := cl.Put(ctx, []byte(k), []byte("new")); err != nil {
			t.Fatalf("put %s after the split: %v", k, err)
		}
		want[k] = "new"
	}
	c.StopAll()
	for _, id := range []uint64{1, 2, 3} {
		c.Restart(id)
	}
	c.WaitLeaders(30 * time.Second)
	check(newClient(t, c))
}

// userShardCount returns how many user shards the cluster has.
func userShardCount(ctx context.Context, t *testing.T, cl *client.Client) int {
	t.Helper()
	shards, err := cl.ListShards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u := 0
	for _, s := range shards {
		if !s.GetDescriptor_().GetSystem() {
			u++
		}
	}
	return u
}

// TestAutomaticSplitBySize loads a cluster whose split threshold is tiny:
// the shard splits by itself, more than once, and every key reads back and
// scans in order across the new boundaries. The keys come in random order,
// so a split's left half grows past the threshold again well within its
// engine's history window (5 minutes and 8 MiB of log), while the engine
// still keeps the range it gave away: it splits again all the same.
func TestAutomaticSplitBySize(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.ShardMemTableBytes = 64 << 10
		cfg.SplitSizeBytes = 128 << 10
	}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	val := make([]byte, 1024)
	for i := range val {
		val[i] = byte(i*7 + i/13)
	}
	const n = 1500
	key := func(i int) []byte { return []byte(fmt.Sprintf("key-%05d", i)) }
	for _, i := range mrand.New(mrand.NewPCG(2, 2)).Perm(n) {
		v := append([]byte(fmt.Sprint(i)), val...)
		if _, err := cl.Put(ctx, key(i), v); err != nil {
			t.Fatal(err)
		}
	}
	userShards := func() int { return userShardCount(ctx, t, cl) }
	deadline := time.Now().Add(60 * time.Second)
	for userShards() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d user shards after a minute, want at least 4", userShards())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := range n {
		kv, err := cl.Get(ctx, key(i))
		if err != nil || !bytes.HasPrefix(kv.Value, []byte(fmt.Sprint(i))) {
			t.Fatalf("get %s: %v", key(i), err)
		}
	}
	for _, reverse := range []bool{false, true} {
		var opts []client.ScanOption
		if reverse {
			opts = append(opts, client.WithReverse())
		}
		it := cl.Scan(ctx, nil, nil, append(opts, client.WithKeysOnly())...)
		i := 0
		for it.Next() {
			want := key(i)
			if reverse {
				want = key(n - 1 - i)
			}
			if !bytes.Equal(it.KV().Key, want) {
				t.Fatalf("scan reverse=%v: key %d is %s, want %s", reverse, i, it.KV().Key, want)
			}
			i++
		}
		if err := it.Err(); err != nil || i != n {
			t.Fatalf("scan reverse=%v: %d keys, %v", reverse, i, err)
		}
	}
	t.Logf("%d user shards", userShards())
}

// TestSizeSplitNotRepeated: a shard split by size keeps the range it gave
// away for its engine's history window, and its SST bytes count it until
// then: its leader does not split it again (both halves are under the
// threshold) while they do, nor after.
func TestSizeSplitNotRepeated(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.ShardMemTableBytes = 64 << 10
		cfg.SplitSizeBytes = 1 << 20
		cfg.MergeSizeBytes = -1
		cfg.HistoryWindow = 20 * time.Second
	}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// About 1.5 MiB of random values (the engine's compression keeps them
	// whole), in an order that fills both halves alike: over the
	// threshold, each half under it.
	rng := mrand.New(mrand.NewPCG(1, 1))
	for _, i := range rng.Perm(1500) {
		val := make([]byte, 1024)
		for j := range val {
			val[j] = byte(rng.Uint32())
		}
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("key-%05d", i)), val); err != nil {
			t.Fatal(err)
		}
	}
	userShards := func() int { return userShardCount(ctx, t, cl) }
	deadline := time.Now().Add(60 * time.Second)
	for userShards() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no size split within a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}
	split := time.Now()
	// Past the split cooldown (10 s) and the history window (20 s).
	for time.Since(split) < 35*time.Second {
		if u := userShards(); u != 2 {
			t.Fatalf("%d user shards %v after the first size split, want 2", u, time.Since(split).Round(time.Second))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestLoadBasedSplit hammers a key range with reads: its shard splits at
// the median of the requested keys, and the two halves' leaders end up on
// different nodes.
func TestLoadBasedSplit(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.SplitQPS = 150
		cfg.SplitSizeBytes = -1
	}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := func(i int) []byte { return []byte(fmt.Sprintf("hot/%03d", i)) }
	for i := range 100 {
		if _, err := cl.Put(ctx, key(i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// A cold key far from the hot range stays in the original shard.
	if _, err := cl.Put(ctx, []byte("cold"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	// shardOf returns the shard the cluster lists as holding k. While a
	// split applies, the listing may hold a gap (the left shard already
	// shrunk on a node that does not host the new shard yet), as a client's
	// routing may: it is asked again.
	shardOf := func(k []byte) *shalev1.ShardStatus {
		t.Helper()
		for range 100 {
			shards, err := cl.ListShards(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range shards {
				d := s.GetDescriptor_()
				if !d.GetSystem() && bytes.Compare(k, d.GetStartKey()) >= 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(k, d.GetEndKey()) < 0) {
					return s
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no shard holds %q for 2 s", k)
		return nil
	}
	first := shardOf(key(0)).GetDescriptor_().GetShardId()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += 7 {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := cl.Get(ctx, key(i%100)); err != nil && ctx.Err() == nil {
					t.Errorf("get: %v", err)
					return
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		lo, hi := shardOf(key(0)), shardOf(key(99))
		ld, hd := lo.GetDescriptor_(), hi.GetDescriptor_()
		if ld.GetShardId() != hd.GetShardId() && lo.GetLeaderNodeId() != 0 && hi.GetLeaderNodeId() != 0 && lo.GetLeaderNodeId() != hi.GetLeaderNodeId() {
			// The split key is inside the hot range, near its middle.
			if k := hd.GetStartKey(); bytes.Compare(k, key(20)) < 0 || bytes.Compare(k, key(80)) > 0 {
				t.Fatalf("split at %q, want near the middle of hot/000..hot/099", k)
			}
			if ld.GetShardId() != first && hd.GetShardId() != first {
				t.Fatalf("neither half kept the original shard ID %d: %v, %v", first, ld, hd)
			}
			t.Logf("split at %q; leaders on nodes %d and %d", hd.GetStartKey(), lo.GetLeaderNodeId(), hi.GetLeaderNodeId())
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute of load: hot/000 in shard %d (leader %d), hot/099 in shard %d (leader %d)",
				ld.GetShardId(), lo.GetLeaderNodeId(), hd.GetShardId(), hi.GetLeaderNodeId())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestStaleEpochNamesTheNewShard: a request routed on the epoch a shard had
// before a split is answered EpochMismatch with the shard's new descriptor
// and the new shard after it (with its leader), so that a client routes on
// without fetching the routing table.
func TestStaleEpochNamesTheNewShard(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cl.Put(ctx, []byte("k050"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	var before *shalev1.ShardDescriptor
	for _, id := range c.ShardIDs() {
		if d := c.Node(c.NodeIDs()[0]).Shard(id).Descriptor(); !d.GetSystem() && bytes.Compare(d.GetStartKey(), []byte("k100")) <= 0 &&
			(len(d.GetEndKey()) == 0 || bytes.Compare(d.GetEndKey(), []byte("k100")) > 0) {
			before = d
		}
	}
	if before == nil {
		t.Fatal("no shard holds k100")
	}
	left, right, err := cl.SplitShard(ctx, []byte("k100"))
	if err != nil {
		t.Fatal(err)
	}
	c.WaitLeaders(30 * time.Second)
	lead := c.Leader(left.GetShardId())
	cc, err := grpc.NewClient(c.Node(lead).Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	kv := shalev1.NewKVClient(cc)
	for _, key := range []string{"k050", "k150"} {
		_, err := kv.Put(ctx, &shalev1.PutRequest{
			Header: &shalev1.RequestHeader{ShardId: before.GetShardId(), Epoch: before.GetEpoch()},
			Key:    []byte(key), Value: []byte("x"),
		})
		st := status.Convert(err)
		var em *shalev1.EpochMismatch
		for _, d := range st.Details() {
			if m, ok := d.(*shalev1.EpochMismatch); ok {
				em = m
			}
		}
		if st.Code() != codes.FailedPrecondition || em == nil {
			t.Fatalf("put %s on the old epoch: %v, want FailedPrecondition with EpochMismatch", key, err)
		}
		if em.GetCurrent().GetEpoch() != left.GetEpoch() || !bytes.Equal(em.GetCurrent().GetEndKey(), []byte("k100")) {
			t.Fatalf("put %s: current %v, want the left shard %v", key, em.GetCurrent(), left)
		}
		nx := em.GetNext()
		if nx.GetDescriptor_().GetShardId() != right.GetShardId() || !bytes.Equal(nx.GetDescriptor_().GetStartKey(), []byte("k100")) {
			t.Fatalf("put %s: next %v, want the new shard %v", key, nx, right)
		}
		if l := c.Leader(right.GetShardId()); nx.GetLeaderNodeId() != l {
			t.Fatalf("put %s: next names leader %d, the new shard's leader is %d", key, nx.GetLeaderNodeId(), l)
		}
	}
}

// TestScanRoutedBeforeASplit reads a scan page on the left shard of a
// split as a scan routed just before the split would (the split applied
// between routing and reading): a forward page stops at the new boundary
// and hands the rest on from there, and a reverse page, whose first keys
// the shard no longer holds, fails as a stale epoch; neither skips the keys
// the new shard took.
func TestScanRoutedBeforeASplit(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 200 {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	n := c.Node(c.NodeIDs()[0])
	var before *shalev1.ShardDescriptor
	for _, id := range c.ShardIDs() {
		if d := n.Shard(id).Descriptor(); !d.GetSystem() && bytes.Compare(d.GetStartKey(), []byte("k100")) <= 0 &&
			(len(d.GetEndKey()) == 0 || bytes.Compare(d.GetEndKey(), []byte("k150")) >= 0) {
			before = d
		}
	}
	if before == nil {
		t.Fatal("no shard holds [k100, k150)")
	}
	left, _, err := cl.SplitShard(ctx, []byte("k100"))
	if err != nil {
		t.Fatal(err)
	}
	if left.GetShardId() != before.GetShardId() {
		t.Fatalf("left shard %d, want %d", left.GetShardId(), before.GetShardId())
	}
	for string(n.Shard(left.GetShardId()).Descriptor().GetEndKey()) != "k100" {
		if ctx.Err() != nil {
			t.Fatal("node 1 did not apply the split")
		}
		time.Sleep(10 * time.Millisecond)
	}
	keys, resume, done, err := server.ScanPageRoutedBy(n, ctx, left.GetShardId(), before, []byte("k050"), []byte("k150"), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 50 || keys[0] != "k050" || keys[49] != "k099" || done || string(resume) != "k100" {
		t.Fatalf("forward page: %d keys (%v ... ), resume %q, done %v; want k050-k099, resuming at k100", len(keys), keys[:min(len(keys), 3)], resume, done)
	}
	keys, _, _, err = server.ScanPageRoutedBy(n, ctx, left.GetShardId(), before, []byte("k050"), []byte("k150"), true)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("reverse page from k150: %d keys, %v; want FailedPrecondition (stale epoch)", len(keys), err)
	}
}
