package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// TestSlowDiskMovesLeadership: a node whose disk turns slow (every write
// and sync 300 to 450 ms, so a Raft-log write and its sync take 600 to
// 900 ms: too slow for a database, too quick for its followers' election
// timeouts, 1 to 2 s at the production tick, to move the leaderships for
// it) hands all its shard leaderships to the other
// nodes and takes none back while the disk stays slow; the cluster serves
// every write throughout, and once the leaderships have moved, writes are
// as quick as without the fault (the slow node is then a follower that a
// quorum does not wait for). The p50/p99 of writes before, during and after
// the hand-off are logged.
//
// What the test times is measured against the machine rather than fixed:
// the hand-off has a minute (it takes 5-10 s on a loaded machine; without
// it the slow node leads for good, its followers hearing its heartbeats),
// and "as quick as without the fault" means that writes of 600 ms or more
// (the least a write waiting on one of the slow node's log writes takes)
// are no more common after the hand-off than before the fault, give or
// take 1% of writes: a loaded -race run has such writes without any fault.
func TestSlowDiskMovesLeadership(t *testing.T) {
	const slowNode = 1
	slow := errorfs.NewToggle(errorfs.InjectorFunc(func(errorfs.Op, string) error {
		time.Sleep(300*time.Millisecond + rand.N(150*time.Millisecond))
		return nil
	}))
	c := testcluster.Start(t, testcluster.Options{
		Splits:       [][]byte{[]byte("c"), []byte("f"), []byte("k")},
		TickInterval: 100 * time.Millisecond,
		Configure: func(cfg *server.Config) {
			if cfg.NodeID == slowNode {
				cfg.FS = errorfs.Wrap(vfs.Default, errorfs.Filter(errorfs.Ops(errorfs.OpWrite, errorfs.OpSync), slow))
			}
		},
	})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, sh := range c.ShardIDs() {
		// A target that did not take the leadership within two election
		// timeouts (a loaded -race run, nodes just started: the fresh-clone
		// CI at b3df55b) is asked again like a request that did not finish;
		// the server does not retry it itself (chaos/README bug 3).
		if err := retryUnavailable(time.Minute, func() error {
			_, err := cl.TransferLeaderPinned(ctx, sh, slowNode, -1)
			if err != nil && strings.Contains(err.Error(), "did not take the leadership") {
				return status.Error(codes.Unavailable, err.Error())
			}
			return err
		}); err != nil {
			t.Fatalf("transfer shard %d to node %d: %v", sh, slowNode, err)
		}
	}
	if n, _ := leaders(c, slowNode); n < len(c.ShardIDs()) {
		t.Fatalf("node %d leads %d of %d shards before the fault", slowNode, n, len(c.ShardIDs()))
	}

	// A steady workload: 8 writers over the shards, every write timed.
	type sample struct {
		at   time.Time
		took time.Duration
	}
	var (
		mu      sync.Mutex
		samples []sample
		failed  []error
	)
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; wctx.Err() == nil; i++ {
				key := fmt.Sprintf("%c/w%d/%d", "abdgmx"[i%6], w, i)
				start := time.Now()
				_, err := cl.Put(wctx, []byte(key), []byte("v"))
				mu.Lock()
				if err != nil && wctx.Err() == nil {
					failed = append(failed, fmt.Errorf("put %s: %w", key, err))
				} else if err == nil {
					samples = append(samples, sample{start, time.Since(start)})
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(2 * time.Second)
	faultAt := time.Now()
	slow.Enable()
	var movedAt time.Time
	for movedAt.IsZero() {
		if n, _ := leaders(c, slowNode); n == 0 {
			movedAt = time.Now()
		} else if time.Since(faultAt) > time.Minute {
			_, sh := leaders(c, slowNode)
			t.Fatalf("node %d still leads shards %v a minute into its slow disk", slowNode, sh)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The disk stays slow: the node takes no leadership back.
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if n, sh := leaders(c, slowNode); n != 0 && time.Since(movedAt) > 2*time.Second {
			t.Fatalf("node %d, its disk slow, leads shards %v again", slowNode, sh)
		}
	}
	endAt := time.Now()
	stopWriters()
	wg.Wait()
	slow.Disable()
	if len(failed) > 0 {
		t.Fatalf("%d writes failed while a node's disk was slow, first: %v", len(failed), failed[0])
	}
	if g := metricSum(t, c, slowNode, "shale_slow_disk"); g != 1 {
		t.Fatalf("node %d's shale_slow_disk is %v while its disk is slow, want 1", slowNode, g)
	}
	// slowWrite is the least a write waiting on the slow node's log takes
	// (a write of 300 ms and a sync of 300 ms at least).
	const slowWrite = 600 * time.Millisecond
	percentiles := func(from, to time.Time) (n int, p50, p99, top time.Duration, slowShare float64) {
		var ds []time.Duration
		slowN := 0
		for _, s := range samples {
			if !s.at.Before(from) && s.at.Before(to) {
				ds = append(ds, s.took)
				if s.took >= slowWrite {
					slowN++
				}
			}
		}
		if len(ds) == 0 {
			return 0, 0, 0, 0, 0
		}
		slices.Sort(ds)
		return len(ds), ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1], float64(slowN) / float64(len(ds))
	}
	n0, p50b, p99b, maxb, slowb := percentiles(time.Time{}, faultAt)
	n1, p50d, p99d, maxd, slowd := percentiles(faultAt, movedAt)
	settled := movedAt.Add(time.Second)
	n2, p50a, p99a, maxa, slowa := percentiles(settled, endAt)
	t.Logf("writes started before the fault: %d, p50 %v, p99 %v, max %v, %.1f%% took %v or more", n0, p50b, p99b, maxb, 100*slowb, slowWrite)
	t.Logf("started while the slow node still led (%v): %d, p50 %v, p99 %v, max %v, %.1f%% took %v or more",
		movedAt.Sub(faultAt).Round(time.Millisecond), n1, p50d, p99d, maxd, 100*slowd, slowWrite)
	t.Logf("started after the leaderships moved (disk still slow): %d, p50 %v, p99 %v, max %v, %.1f%% took %v or more", n2, p50a, p99a, maxa, 100*slowa, slowWrite)
	if n0 < 50 {
		t.Fatalf("only %d writes completed before the fault, too few to compare with", n0)
	}
	if n2 < 50 {
		t.Fatalf("only %d writes completed in the %v after the leaderships moved", n2, endAt.Sub(settled))
	}
	// A write that waited on one of the slow node's log writes takes 600 to
	// 900 ms: were the slow node still in the path of a shard's writes, a
	// sixth of them or more would (the writers' keys fall 2:1:1:2 on the
	// four user shards).
	if slowa > slowb+0.01 {
		t.Fatalf("%.1f%% of writes after the leaderships moved off the slow disk took %v or more, %.1f%% before the fault (p99 %v after, %v before)",
			100*slowa, slowWrite, 100*slowb, p99a, p99b)
	}
}

// metricSum is the sum of the values of metric name (a counter or gauge)
// on node id.
func metricSum(t *testing.T, c *testcluster.Cluster, id uint64, name string) float64 {
	t.Helper()
	mfs, err := c.Node(id).Metrics().Gather()
	if err != nil {
		t.Fatalf("node %d metrics: %v", id, err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
