package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// TestTTLExpiryIsAReplicatedDelete writes 100,000 keys with a TTL under a
// watch, then moves the nodes' clocks past it. Once they expire, they read as absent, the watch delivers
// one DELETE per key (with the value it deleted), every replica holds the
// same data, and the shard's SST bytes drop back near zero.
func TestTTLExpiryIsAReplicatedDelete(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 keys")
	}
	const n = 100_000
	// The nodes' wall clock, which TTLs follow, runs offset from the real
	// one: the keys are written with an hour's TTL (so a slow machine
	// cannot let them expire before their size is measured) and expire
	// when the clock is moved two hours on.
	var offset atomic.Int64
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.WallClock = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
		// The expired keys' space comes back once the shard engines'
		// history window passes their deletion.
		cfg.HistoryWindow = 5 * time.Second
	}})
	cl := newClient(t, c)
	// The whole test may take 5 minutes; the expiries get at least 2 of
	// them, however long a loaded machine took to write the keys.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prefix := []byte("ttl/")
	// The watch starts at a marker's revision (the cluster has one shard,
	// so the revision names one point of the prefix's history) and is open
	// once the marker arrives: a watch with no start revision starts where
	// the shard is when its stream arrives, which may be after a write made
	// just after Watch (chaos/README bug 33).
	marker, err := cl.Put(ctx, []byte("ttl/marker"), []byte("m"))
	if err != nil {
		t.Fatal(err)
	}
	events := cl.Watch(ctx, nil, nil, client.WithWatchPrefix(prefix), client.WithPrevKV(), client.WithStartRevision(marker.Revision))
	for open := false; !open; {
		select {
		case resp := <-events:
			if resp.Err != nil {
				t.Fatal(resp.Err)
			}
			open = len(resp.Events) > 0
		case <-ctx.Done():
			t.Fatal("the watch saw no marker")
		}
	}
	ttl := time.Hour
	start := time.Now()
	for i := 0; i < n; i += 1000 {
		b := client.NewBatch()
		for j := i; j < i+1000; j++ {
			b.Put([]byte(fmt.Sprintf("ttl/%06d", j)), []byte(fmt.Sprintf("value-%06d", j)), client.WithTTL(ttl))
		}
		if _, err := cl.Commit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d keys with a %v TTL in %v", n, ttl, time.Since(start).Round(time.Millisecond))
	shardID := shardOf(t, c, prefix)
	var sstBefore uint64
	for _, id := range c.NodeIDs() {
		sm := c.Node(id).Shard(shardID)
		if _, err := sm.Flush(); err != nil {
			t.Fatal(err)
		}
		sstBefore = max(sstBefore, sm.SizeBytes())
	}
	offset.Store(int64(2 * time.Hour))
	expired := time.Now()
	deliveryBound := time.After(2 * time.Minute)

	// Every key's PUT, then its DELETE, each once.
	puts, deletes := map[string]int{}, map[string]int{}
	for len(deletes) < n {
		select {
		case resp := <-events:
			if resp.Err != nil {
				t.Fatal(resp.Err)
			}
			for _, ev := range resp.Events {
				k := string(ev.KV.Key)
				if k == "ttl/marker" {
					continue
				}
				switch ev.Type {
				case client.EventPut:
					puts[k]++
				case client.EventDelete:
					if puts[k] != 1 {
						t.Fatalf("DELETE of %s before its PUT", k)
					}
					if ev.PrevKV == nil || string(ev.PrevKV.Value) != "value-"+k[len("ttl/"):] {
						t.Fatalf("DELETE of %s carries previous value %v", k, ev.PrevKV)
					}
					deletes[k]++
					if deletes[k] > 1 {
						t.Fatalf("%s deleted twice", k)
					}
				}
			}
		case <-deliveryBound:
			t.Fatalf("%d of %d expiries delivered by the watch %v after the keys expired", len(deletes), n, time.Since(expired))
		case <-ctx.Done():
			t.Fatalf("%d of %d expiries delivered by the watch %v after the keys expired", len(deletes), n, time.Since(expired))
		}
	}
	t.Logf("every key's expiry delivered as a DELETE %v after the keys expired", time.Since(expired).Round(time.Millisecond))
	if len(puts) != n {
		t.Fatalf("%d PUT events, want %d", len(puts), n)
	}
	// Unreadable, and gone from every replica alike.
	it := cl.Scan(ctx, nil, nil, client.WithPrefix(prefix))
	left := 0
	for it.Next() {
		if string(it.KV().Key) != "ttl/marker" {
			left++
		}
	}
	if it.Err() != nil || left != 0 {
		t.Fatalf("scan after the expiry: %d keys, %v", left, it.Err())
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		var sums []uint64
		var sizes []uint64
		for _, id := range c.NodeIDs() {
			sm := c.Node(id).Shard(shardID)
			sum, err := sm.Checksum()
			if err != nil {
				return false, err.Error()
			}
			sums = append(sums, sum)
			sizes = append(sizes, sm.SizeBytes())
		}
		for i := range sums {
			if sums[i] != sums[0] || sizes[i] > sstBefore/20 {
				return false, fmt.Sprintf("checksums %x, SST bytes %v (before the expiry: %d)", sums, sizes, sstBefore)
			}
		}
		t.Logf("SST bytes of the shard's replicas: %v, from %d before the expiry", sizes, sstBefore)
		return true, ""
	})
}

// TestSweepSkipsShardsWithoutTTL: a leader's first sweep round reads no
// record of a shard to which no record with a TTL was ever written (a
// node given a moved replica's leadership used to read all of it), and
// scans it once one is.
func TestSweepSkipsShardsWithoutTTL(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 100 {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("plain/%03d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	id := shardOf(t, c, []byte("plain/000"))
	leader := func() *server.Node {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if l := c.Leader(id); l != 0 {
				return c.Node(l)
			}
		}
		t.Fatal("no leader")
		return nil
	}
	if server.SweepScans(leader(), id) {
		t.Fatal("the sweep scanned a shard that never held a record with a TTL")
	}
	if _, err := cl.Put(ctx, []byte("plain/ttl"), []byte("v"), client.WithTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// The leader applied the put before it answered.
	if !server.SweepScans(leader(), id) {
		t.Fatal("the sweep skipped a shard holding a record with a TTL")
	}
}
