package proctest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
)

// TestSplitsUnderLoad loads a cluster of real server processes whose split
// threshold is 4 MiB: the data ends up in many shards, no write fails
// while they split, every key reads back, and full scans (forward and
// reverse) return exactly the written keys in order. It loads 16 MiB; with
// SHALE_SOAK=1 (`make soak`), 200 MiB, the placement issue's proof.
func TestSplitsUnderLoad(t *testing.T) {
	bins := requireBinaries(t)
	loadMiB := 16
	if os.Getenv("SHALE_SOAK") != "" {
		loadMiB = 200
	}
	const threshold = 4 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// Small memtables, so that shard sizes (counted in SSTs) follow the
	// load closely.
	c := startProcCluster(t, bins, 3, "", "--split-size-bytes", fmt.Sprint(threshold), "--shard-memtable-bytes", fmt.Sprint(2<<20))
	cli, err := client.New(ctx, c.endpoints(), client.WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	waitReady(ctx, t, cli, 3)

	const valueSize = 1024
	n := loadMiB << 20 / valueSize
	key := func(i int) []byte { return []byte(fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15)) }
	value := func(i int) []byte {
		r := rand.New(rand.NewPCG(uint64(i), 9))
		b := make([]byte, valueSize)
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		return b
	}
	run := func(what string, op func(i int) error) {
		t.Helper()
		var next atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		start := time.Now()
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= n {
						return
					}
					if err := op(i); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("%s: %d keys in %v", what, n, time.Since(start).Round(time.Millisecond))
		if len(errs) > 0 {
			t.Fatalf("%s: %d failures, first: %v", what, len(errs), errs[0])
		}
	}
	run("load", func(i int) error {
		_, err := cli.Put(ctx, key(i), value(i))
		return err
	})
	// Splits trail the load by a few seconds (one per node per second, and
	// a split shard waits ten seconds before splitting again).
	want := loadMiB / 4
	deadline := time.Now().Add(time.Minute)
	for {
		shards, err := cli.ListShards(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(shards)-1 >= want {
			t.Logf("%d user shards for %d MiB", len(shards)-1, loadMiB)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d user shards for %d MiB at a %d MiB threshold, want at least %d", len(shards)-1, loadMiB, threshold>>20, want)
		}
		time.Sleep(500 * time.Millisecond)
	}
	run("verify", func(i int) error {
		kv, err := cli.Get(ctx, key(i))
		if err != nil {
			return fmt.Errorf("get %s: %w", key(i), err)
		}
		if !bytes.Equal(kv.Value, value(i)) {
			return fmt.Errorf("get %s: wrong value", key(i))
		}
		return nil
	})
	for _, reverse := range []bool{false, true} {
		opts := []client.ScanOption{client.WithKeysOnly()}
		if reverse {
			opts = append(opts, client.WithReverse())
		}
		it := cli.Scan(ctx, nil, nil, opts...)
		count := 0
		var prev []byte
		for it.Next() {
			k := it.KV().Key
			if prev != nil && (bytes.Compare(prev, k) < 0) == reverse {
				t.Fatalf("scan reverse=%v: %s after %s", reverse, k, prev)
			}
			prev = append(prev[:0], k...)
			count++
		}
		if err := it.Err(); err != nil || count != n {
			t.Fatalf("scan reverse=%v: %d keys (want %d), %v", reverse, count, n, err)
		}
	}
}
