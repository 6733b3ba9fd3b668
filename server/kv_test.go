package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

func rawKV(t *testing.T, addr string) shalev1.KVClient {
	t.Helper()
	return shalev1.NewKVClient(rawConn(t, addr))
}

// rawConn is a plaintext connection to the node at addr, without the SDK.
func rawConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestKVSemantics(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx := context.Background()

	// Revisions: create stays, mod and version move.
	r1, err := cl.Put(ctx, []byte("a"), []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := cl.Put(ctx, []byte("a"), []byte("2"), client.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if r2.Revision <= r1.Revision || r2.PrevKV == nil || string(r2.PrevKV.Value) != "1" {
		t.Fatalf("second put: %+v (first at %d)", r2, r1.Revision)
	}
	kv, err := cl.Get(ctx, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if kv.CreateRevision != r1.Revision || kv.ModRevision != r2.Revision || kv.Version != 2 {
		t.Fatalf("revisions: %+v, puts at %d and %d", kv, r1.Revision, r2.Revision)
	}

	// TTL: the key disappears after it expires.
	if _, err := cl.Put(ctx, []byte("ttl"), []byte("x"), client.WithTTL(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Get(ctx, []byte("ttl")); err != nil {
		t.Fatalf("fresh ttl key: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	if _, err := cl.Get(ctx, []byte("ttl")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("expired ttl key: %v", err)
	}

	// Txn: compare on version, then write; the else branch reads.
	res, err := cl.Txn(ctx).If(client.Version([]byte("a")).Equal(2)).Then(client.OpPut([]byte("b"), []byte("from-txn"))).Else(client.OpGet([]byte("a"))).Commit()
	if err != nil || !res.Succeeded {
		t.Fatalf("txn: %+v %v", res, err)
	}
	res, err = cl.Txn(ctx).If(client.Version([]byte("a")).Equal(7)).Then(client.OpPut([]byte("b"), []byte("nope"))).Else(client.OpGet([]byte("a"))).Commit()
	if err != nil || res.Succeeded {
		t.Fatalf("failing txn: %+v %v", res, err)
	}
	if kv, _ := cl.Get(ctx, []byte("b")); kv == nil || string(kv.Value) != "from-txn" {
		t.Fatalf("b = %v", kv)
	}

	// A batch across the split is refused whole.
	b := client.NewBatch()
	b.Put([]byte("c"), []byte("1"))
	b.Put([]byte("x"), []byte("1"))
	_, err = cl.Commit(ctx, b)
	var cross *client.CrossShardError
	if !errors.As(err, &cross) || string(cross.SplitKey) != "m" {
		t.Fatalf("cross-shard batch: %v", err)
	}
	if _, err := cl.Get(ctx, []byte("c")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("half of a refused batch was written: %v", err)
	}

	// MultiGet across shards, in request order.
	if _, err := cl.Put(ctx, []byte("y"), []byte("why")); err != nil {
		t.Fatal(err)
	}
	kvs, err := cl.MultiGet(ctx, [][]byte{[]byte("y"), []byte("missing"), []byte("a")})
	if err != nil || len(kvs) != 3 || string(kvs[0].Value) != "why" || kvs[1] != nil || string(kvs[2].Value) != "2" {
		t.Fatalf("multiget: %v %v", kvs, err)
	}

	// Delete with the previous value, then DeleteRange across both shards.
	d, err := cl.Delete(ctx, []byte("b"), client.WithPrevKV())
	if err != nil || !d.Deleted || string(d.PrevKV.Value) != "from-txn" {
		t.Fatalf("delete: %+v %v", d, err)
	}
	for i := 0; i < 20; i++ {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("r%02d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("g%02d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.DeleteRange(ctx, []byte("g05"), []byte("r10")); err != nil {
		t.Fatal(err)
	}
	var left []string
	it := cl.Scan(ctx, []byte("g"), []byte("s"))
	for it.Next() {
		left = append(left, string(it.KV().Key))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(left) != 15 || left[0] != "g00" || left[4] != "g04" || left[5] != "r10" {
		t.Fatalf("after delete-range: %v", left)
	}
	// DeleteRange(nil, nil) deletes every key (docs/client.md), the
	// smallest one included.
	if _, err := cl.Put(ctx, []byte{0}, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := cl.DeleteRange(ctx, nil, nil); err != nil {
		t.Fatalf("delete-range of the whole key space: %v", err)
	}
	it = cl.Scan(ctx, nil, nil)
	var rest []string
	for it.Next() {
		rest = append(rest, string(it.KV().Key))
	}
	if err := it.Err(); err != nil || len(rest) != 0 {
		t.Fatalf("after deleting every key: %q, %v", rest, err)
	}
}

// TestWallClockTTL: a write's TTL runs from the leader's wall clock
// (Config.WallClock) and reads check it against the serving node's, so a
// clock offset injected there is what the data sees.
func TestWallClockTTL(t *testing.T) {
	var offset atomic.Int64
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.WallClock = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	}})
	cl := newClient(t, c)
	ctx := context.Background()

	// Written two hours in the past with a one-hour TTL: expired an hour
	// ago in real time, but not by the nodes' clocks.
	offset.Store(int64(-2 * time.Hour))
	if _, err := cl.Put(ctx, []byte("k"), []byte("v"), client.WithTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Get(ctx, []byte("k")); err != nil {
		t.Fatalf("read by the shifted clock, before the TTL ends: %v", err)
	}
	offset.Store(int64(-90 * time.Minute))
	if _, err := cl.Get(ctx, []byte("k")); err != nil {
		t.Fatalf("read by a clock set forward but before the TTL ends: %v", err)
	}
	offset.Store(0)
	if _, err := cl.Get(ctx, []byte("k")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read by the real clock, an hour after the TTL ended: %v", err)
	}
	// By the real clock the leader's expiry sweep deletes it; from then on
	// the expiry is a delete, which a clock set back does not undo.
	shardID := shardOf(t, c, []byte("k"))
	waitFor(t, 20*time.Second, func() (bool, string) {
		for _, id := range c.NodeIDs() {
			left, _, _, err := c.Node(id).Shard(shardID).ExpiredKeys(nil, 1000, math.MaxInt64)
			if err != nil || len(left) > 0 {
				return false, fmt.Sprintf("node %d still stores %d keys with a TTL (%v)", id, len(left), err)
			}
		}
		return true, ""
	})
	offset.Store(int64(-90 * time.Minute))
	if _, err := cl.Get(ctx, []byte("k")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read by a clock set back after the expiry was swept: %v", err)
	}
}

func TestRetriedWriteAppliesOnce(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	lead := c.Leader(2)
	kv := rawKV(t, c.Node(lead).Addr())
	ctx := context.Background()
	id := []byte("0123456789abcdef")
	req := &shalev1.TxnRequest{
		Header:   &shalev1.RequestHeader{ShardId: 2, RequestId: id},
		Compares: []*shalev1.Compare{{Key: []byte("counter"), Target: shalev1.Compare_TARGET_EXISTS, Number: 0}},
		Success:  []*shalev1.RequestOp{{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte("counter"), Value: []byte("1")}}}},
	}
	first, err := kv.Txn(ctx, req)
	if err != nil || !first.GetSucceeded() {
		t.Fatalf("first: %v %v", first, err)
	}
	again, err := kv.Txn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !again.GetSucceeded() || again.GetHeader().GetRevision() != first.GetHeader().GetRevision() {
		t.Fatalf("retry was not answered from the dedup table: first %v, retry %v", first, again)
	}
	// A different ID is a new command: the compare now fails.
	req.Header.RequestId = []byte("fedcba9876543210")
	third, err := kv.Txn(ctx, req)
	if err != nil || third.GetSucceeded() {
		t.Fatalf("new request: %v %v", third, err)
	}
}

func TestFollowerStaleReadsAndScanStream(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx := context.Background()
	for i := 0; i < 30; i++ {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("k%02d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	lead := c.Leader(2)
	var follower uint64
	for _, id := range c.NodeIDs() {
		if id != lead {
			follower = id
		}
	}
	kv := rawKV(t, c.Node(follower).Addr())
	// A linearizable read on a follower is refused with a leader hint.
	_, err := kv.Get(ctx, &shalev1.GetRequest{Header: &shalev1.RequestHeader{ShardId: 2}, Key: []byte("k01")})
	if err == nil {
		t.Fatal("follower served a linearizable read")
	}
	// A follower read sees the latest write.
	if _, err := cl.Put(ctx, []byte("k01"), []byte("new")); err != nil {
		t.Fatal(err)
	}
	resp, err := kv.Get(ctx, &shalev1.GetRequest{Header: &shalev1.RequestHeader{ShardId: 2, Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER}, Key: []byte("k01")})
	if err != nil || string(resp.GetKv().GetValue()) != "new" {
		t.Fatalf("follower read: %v %v", resp, err)
	}
	// A stale read is served locally.
	resp, err = kv.Get(ctx, &shalev1.GetRequest{Header: &shalev1.RequestHeader{ShardId: 2, Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_STALE}, Key: []byte("k02")})
	if err != nil || string(resp.GetKv().GetValue()) != "v" {
		t.Fatalf("stale read: %v %v", resp, err)
	}
	// ScanStream on the leader returns every key in order.
	stream, err := rawKV(t, c.Node(lead).Addr()).ScanStream(ctx, &shalev1.ScanRequest{Header: &shalev1.RequestHeader{ShardId: 2}, Prefix: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for {
		page, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n += len(page.GetKvs())
		if page.GetContinuationToken() != nil {
			t.Fatalf("stream within one shard handed over: %v", page.GetResumeKey())
		}
	}
	if n != 30 {
		t.Fatalf("scan stream saw %d keys, want 30", n)
	}
}

func TestAddAndRemoveNode(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("k%02d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// Remove node 3: its replicas move to a new node 4.
	n4 := c.AddNode()
	if err := cl.RemoveNode(ctx, 3); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := cl.ClusterStatus(ctx)
		if err == nil {
			done := len(st.GetShards()) > 0
			for _, s := range st.GetShards() {
				on := map[uint64]bool{}
				for _, r := range s.GetDescriptor_().GetReplicas() {
					on[r.GetNodeId()] = r.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED
				}
				if on[3] || !on[n4] || len(on) != 3 {
					done = false
				}
			}
			if done {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas did not move from node 3 to node %d: %v", n4, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Stop(3)
	// Everything is still there, served without node 3.
	for i := 0; i < 20; i++ {
		if _, err := cl.Get(ctx, []byte(fmt.Sprintf("k%02d", i))); err != nil {
			t.Fatalf("k%02d after moving off node 3: %v", i, err)
		}
	}
	if _, err := cl.Put(ctx, []byte("after"), []byte("x")); err != nil {
		t.Fatal(err)
	}
}
