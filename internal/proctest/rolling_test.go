//go:build unix

package proctest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// TestRollingRestartNoFailedRequest restarts every node of a 3-process
// cluster in turn, with SIGTERM (so each drains its leaderships first), under
// a steady workload of writes and linearizable reads through the SDK. The
// promise tested: not one request fails and no write's outcome is left
// unknown, and every acknowledged write reads back afterwards.
func TestRollingRestartNoFailedRequest(t *testing.T) {
	bins := requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 3, "g,p")
	cli, err := client.New(ctx, c.endpoints(), client.WithLogger(testLogger()), client.WithAttemptTimeout(2*time.Second))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	waitReady(ctx, t, cli, 3)

	var (
		wg                    sync.WaitGroup
		stop                  atomic.Bool
		writes, reads, failed atomic.Int64
		unknown               atomic.Int64
		mu                    sync.Mutex
		acked                 []string
		firstErr              error
	)
	fail := func(op string, err error) {
		failed.Add(1)
		if errors.Is(err, client.ErrOutcomeUnknown) {
			unknown.Add(1)
		}
		mu.Lock()
		if firstErr == nil {
			firstErr = fmt.Errorf("%s at %s: %w", op, time.Now().Format("15:04:05.000"), err)
		}
		mu.Unlock()
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("%c/w%d/%06d", "bhq"[i%3], w, i)
				octx, ocancel := context.WithTimeout(ctx, 15*time.Second)
				_, err := cli.Put(octx, []byte(key), valueOf(key))
				ocancel()
				if err != nil {
					fail("put "+key, err)
					continue
				}
				writes.Add(1)
				mu.Lock()
				acked = append(acked, key)
				mu.Unlock()
			}
		}()
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				mu.Lock()
				var key string
				if len(acked) > 0 {
					key = acked[rand.IntN(len(acked))]
				}
				mu.Unlock()
				if key == "" {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				octx, ocancel := context.WithTimeout(ctx, 15*time.Second)
				kv, err := cli.Get(octx, []byte(key))
				ocancel()
				switch {
				case err != nil:
					fail("get "+key, err)
				case string(kv.Value) != string(valueOf(key)):
					fail("get "+key, fmt.Errorf("read %q", kv.Value))
				default:
					reads.Add(1)
				}
			}
		}()
	}

	time.Sleep(2 * time.Second)
	for id := uint64(1); id <= 3; id++ {
		p := c.node(id)
		before := writes.Load()
		start := time.Now()
		if err := p.stop(30 * time.Second); err != nil {
			t.Fatalf("SIGTERM of node %d: %v", id, err)
		}
		stopped := time.Since(start)
		p.start(t, bins.server)
		waitServing(ctx, t, c, id)
		waitReady(ctx, t, cli, 3)
		// Let the node serve again (leadership balancing gives it shards
		// back) before the next one goes.
		time.Sleep(3 * time.Second)
		t.Logf("node %d: stopped cleanly in %v, back and serving after %v; %d writes meanwhile",
			id, stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), writes.Load()-before)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d writes and %d linearizable reads acknowledged; %d failed (%d with an unknown outcome)",
		writes.Load(), reads.Load(), failed.Load(), unknown.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d requests failed during the rolling restart (%d with an unknown outcome); first: %v", failed.Load(), unknown.Load(), firstErr)
	}
	if writes.Load() < 100 || reads.Load() < 100 {
		t.Fatalf("only %d writes and %d reads in the run: the workload did not run", writes.Load(), reads.Load())
	}
	for _, key := range acked {
		kv, err := cli.Get(ctx, []byte(key))
		if err != nil || string(kv.Value) != string(valueOf(key)) {
			t.Fatalf("acknowledged write %s reads back %v, %v", key, kv, err)
		}
	}
}

// waitServing waits until node id answers NodeInfo itself and knows a
// leader for every shard it hosts.
func waitServing(ctx context.Context, t *testing.T, c *procCluster, id uint64) {
	t.Helper()
	var last string
	for {
		ictx, icancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := shalev1.NewAdminClient(c.conn(c.node(id).addr)).NodeInfo(ictx, &shalev1.NodeInfoRequest{})
		icancel()
		if err == nil {
			led := 0
			for _, s := range resp.GetShards() {
				if s.GetLeaderNodeId() != 0 {
					led++
				}
			}
			if len(resp.GetShards()) > 0 && led == len(resp.GetShards()) {
				return
			}
			last = fmt.Sprintf("%d of its %d shards with a known leader", led, len(resp.GetShards()))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %d not serving: %s", id, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
