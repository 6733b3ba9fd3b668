package client

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// TestReconnectBackoffCapped: while a node refuses connections, the client
// tries to reconnect at least every WithReconnectBackoff (plus jitter),
// not on gRPC's default schedule, which spaces tries 1 s, 1.6 s, 2.6 s...
// apart and up to 120 s.
func TestReconnectBackoffCapped(t *testing.T) {
	fc := threeShards(t)
	down := fc.nodes[1].addr // node 2 leads [g, p)
	var (
		mu    sync.Mutex
		dials []time.Time
	)
	var d net.Dialer
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		if addr == down {
			mu.Lock()
			dials = append(dials, time.Now())
			mu.Unlock()
		}
		return d.DialContext(ctx, "tcp", addr)
	}
	c := fc.client(WithReconnectBackoff(300*time.Millisecond),
		WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial)))
	if _, err := c.Put(bg(t), []byte("kiwi"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	fc.stopNode(2)
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_, _ = c.Put(ctx, []byte("kiwi"), []byte("2")) // node 2 stays the leader: calls keep going to it
		cancel()
	}
	mu.Lock()
	defer mu.Unlock()
	var after []time.Time
	for _, at := range dials {
		if at.After(start) {
			after = append(after, at)
		}
	}
	if len(after) < 2 {
		t.Fatalf("%d reconnect attempts in 5 s", len(after))
	}
	prev, widest := start, time.Duration(0)
	for _, at := range append(after, time.Now()) {
		widest = max(widest, at.Sub(prev))
		prev = at
	}
	if widest > 700*time.Millisecond {
		t.Fatalf("%d reconnect attempts in 5 s, %v apart at the widest; want at most about 360 ms (300 ms + jitter)", len(after), widest)
	}
	t.Logf("%d reconnect attempts in 5 s, at most %v apart", len(after), widest)
}

// TestClientConnectsToEveryNodeAhead: once it has the routing table, a
// client opens a KV.Calls stream to every node in the background, before
// any request needs one, so that the first request a node serves (the
// leader of a split's new shard) does not wait for a dial.
func TestClientConnectsToEveryNodeAhead(t *testing.T) {
	var mu sync.Mutex
	opened := map[uint64]int{}
	fc := newFakeClusterWith(t, 3, fakeServerSetup{opts: func(n *fakeNode) []grpc.ServerOption {
		return []grpc.ServerOption{grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if info.FullMethod == shalev1.KV_Calls_FullMethodName {
				mu.Lock()
				opened[n.id]++
				mu.Unlock()
			}
			return handler(srv, ss)
		})}
	}}, "g", "p")
	fc.client()
	waitFor(t, "a KV.Calls stream opened to each of the three nodes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(opened) == len(fc.nodes)
	})
}
