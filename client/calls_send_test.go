package client

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/shale-db/shale/internal/testcluster"
)

// senderBatches sums, over the client's connections, the KV.Calls
// messages their sender goroutines sent.
func senderBatches(c *Client) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, m := range c.muxes {
		if m != nil {
			n += m.senderBatches.Load()
		}
	}
	return n
}

// TestCallsSentByCaller: a call made while no send is under way on its
// KV.Calls stream is sent by its caller, not handed to the stream's sender
// goroutine (a wake-up and a wait for the scheduler per call, when one
// call is in flight on a connection); calls made while another is being
// sent are handed over and answered too.
func TestCallsSentByCaller(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	ctx := context.Background()
	cl, err := New(ctx, c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	before := senderBatches(cl)
	const gets = 50
	for range gets {
		if kv, err := cl.Get(ctx, []byte("k")); err != nil || string(kv.Value) != "v" {
			t.Fatalf("get: %v, %v", kv, err)
		}
	}
	if n := senderBatches(cl) - before; n != 0 {
		t.Fatalf("%d of %d sequential gets' messages sent by the sender goroutine; want 0", n, gets)
	}

	const workers, each = 32, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				k := fmt.Appendf(nil, "w%d/%d", w, i)
				if _, err := cl.Put(ctx, k, k); err != nil {
					errs <- fmt.Errorf("put %s: %w", k, err)
					return
				}
				if kv, err := cl.Get(ctx, k); err != nil || string(kv.Value) != string(k) {
					errs <- fmt.Errorf("get %s: %v, %v", k, kv, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d messages of %d concurrent calls sent by the sender goroutines", senderBatches(cl)-before, 2*workers*each)
}
