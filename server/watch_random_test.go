package server_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
)

// watchRounds is how many seeded rounds TestWatchRandomized runs.
const watchRounds = 20

// TestWatchRandomized runs watchRounds seeded rounds on one 3-node
// cluster. In each, an SDK watch follows a prefix of its own while writers
// put increasing values to keys under it and a seeded schedule splits and
// merges the shards holding them, moves their leaderships, and stops and
// restarts the node leading one of them (so streams break and the client
// resumes, possibly across the split or merge). The watch must deliver
// every acknowledged write exactly once, at its acknowledged revision, each
// key's values in order, nothing never written — or end with ErrCompacted
// (history gone, never a silent gap), in which case what it delivered
// before must hold the same properties.
//
// It runs under `make soak` (SHALE_SOAK=1), not yet in `make test`: it
// found undelivered writes and a directory that kept a merged-away shard
// (both fixed) and once a watch that stopped delivering (not seen since;
// chaos/README, bug 21).
func TestWatchRandomized(t *testing.T) {
	if os.Getenv("SHALE_SOAK") == "" {
		t.Skip("SHALE_SOAK=1 (make soak) runs it: 20 rounds of splits, merges and restarts under a watch")
	}
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	compacted := 0
	for seed := uint64(1); seed <= watchRounds; seed++ {
		t.Run(fmt.Sprintf("seed%02d", seed), func(t *testing.T) {
			if watchRound(t, c, cl, seed) {
				compacted++
			}
		})
	}
	t.Logf("%d rounds, %d ended with ErrCompacted", watchRounds, compacted)
}

// watchRound runs one seeded round; it reports whether the watch ended
// with ErrCompacted.
func watchRound(t *testing.T, c *testcluster.Cluster, cl *client.Client, seed uint64) (compacted bool) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5a1e))
	prefix := fmt.Sprintf("w%02d/", seed)
	key := func(letter byte, w int) string { return fmt.Sprintf("%s%c/%d", prefix, letter, w) }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events := cl.Watch(wctx, nil, nil, client.WithWatchPrefix([]byte(prefix)))

	type seen struct {
		value int
		rev   uint64
	}
	var (
		mu    sync.Mutex
		got   = map[string][]seen{}
		werr  error
		wdone = make(chan struct{})
	)
	go func() {
		defer close(wdone)
		for resp := range events {
			mu.Lock()
			if resp.Err != nil {
				werr = resp.Err
				mu.Unlock()
				return
			}
			for _, e := range resp.Events {
				v, err := strconv.Atoi(string(e.KV.Value))
				if e.Type != client.EventPut || err != nil {
					werr = fmt.Errorf("unexpected event %v %q=%q", e.Type, e.KV.Key, e.KV.Value)
				}
				got[string(e.KV.Key)] = append(got[string(e.KV.Key)], seen{v, e.KV.ModRevision})
			}
			mu.Unlock()
		}
	}()
	// The watch is open once it delivers a marker written after it.
	marker := prefix + "a-marker"
	if _, err := cl.Put(ctx, []byte(marker), []byte("0")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(got[marker]) > 0 || werr != nil, "the watch has not delivered its marker"
	})

	type ack struct {
		key   string
		value int
		rev   uint64
	}
	var (
		wg     sync.WaitGroup
		acksMu sync.Mutex
		acked  []ack
		tried  = map[string]int{}
		stop   = make(chan struct{})
	)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := key("bdfhkmoqsuwy"[i%12], w)
				acksMu.Lock()
				tried[k] = i
				acksMu.Unlock()
				pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
				r, err := cl.Put(pctx, []byte(k), []byte(strconv.Itoa(i)))
				pcancel()
				if err == nil {
					acksMu.Lock()
					acked = append(acked, ack{k, i, r.Revision})
					acksMu.Unlock()
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}

	var schedule []string
	t0 := time.Now()
	for step := 0; step < 6; step++ {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		at := []byte(prefix + string("cgjnrv"[rng.IntN(6)]))
		var err error
		schedule = append(schedule, fmt.Sprintf("+%dms", time.Since(t0).Milliseconds()))
		switch op := rng.IntN(10); {
		case op < 4:
			_, _, err = cl.SplitShard(ctx, at)
			schedule = append(schedule, fmt.Sprintf("split %s: %v", at, err))
		case op < 7:
			_, _, err = cl.MergeShards(ctx, []byte(prefix))
			schedule = append(schedule, fmt.Sprintf("merge at %s: %v", prefix, err))
		case op < 9:
			sh := shardOf(t, c, at)
			to := uint64(rng.IntN(3) + 1)
			_, err = cl.TransferLeader(ctx, sh, to)
			schedule = append(schedule, fmt.Sprintf("leader of shard %d to node %d: %v", sh, to, err))
		default:
			// Stop the leader of the watched prefix's first shard (its
			// watch streams break) and, meanwhile, merge it away.
			sh := shardOf(t, c, []byte(prefix))
			victim := c.Leader(sh)
			if victim == 0 {
				continue
			}
			c.Stop(victim)
			_, _, err = cl.MergeShards(ctx, []byte(prefix))
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
			c.Restart(victim)
			waitDirectoryLeaders(t, c)
			schedule = append(schedule, fmt.Sprintf("node %d stopped, merge at %s (%v), restarted", victim, prefix, err))
		}
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()

	acksMu.Lock()
	defer acksMu.Unlock()
	want := map[string]int{}
	for _, a := range acked {
		want[a.key] = max(want[a.key], a.value)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		done := true
		for k, v := range want {
			if s := got[k]; len(s) == 0 || s[len(s)-1].value < v {
				done = false
			}
		}
		err := werr
		mu.Unlock()
		if err != nil || done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("seed %d: the watch did not deliver every acknowledged write within 60s; schedule: %v", seed, schedule)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wcancel()
	<-wdone
	mu.Lock()
	defer mu.Unlock()
	if werr != nil {
		if !errors.Is(werr, client.ErrCompacted) {
			t.Fatalf("seed %d: the watch ended with %v; schedule: %v", seed, werr, schedule)
		}
		compacted = true
		t.Logf("seed %d: the watch ended with ErrCompacted (%v); schedule: %v", seed, werr, schedule)
	}
	seenAt := map[string]map[int]uint64{}
	for k, s := range got {
		seenAt[k] = map[int]uint64{}
		for i, e := range s {
			if _, dup := seenAt[k][e.value]; dup {
				t.Fatalf("seed %d: %s=%d delivered twice; schedule: %v", seed, k, e.value, schedule)
			}
			if i > 0 && (e.rev <= s[i-1].rev || e.value <= s[i-1].value) {
				t.Fatalf("seed %d: %s=%d@%d after %d@%d: out of order; schedule: %v", seed, k, e.value, e.rev, s[i-1].value, s[i-1].rev, schedule)
			}
			if e.value > tried[k] {
				t.Fatalf("seed %d: %s=%d delivered, never written", seed, k, e.value)
			}
			seenAt[k][e.value] = e.rev
		}
	}
	if compacted {
		return true
	}
	for _, a := range acked {
		rev, ok := seenAt[a.key][a.value]
		if !ok {
			var around []string
			for _, e := range got[a.key] {
				if e.value > a.value-5 && e.value < a.value+5 {
					around = append(around, fmt.Sprintf("%d@%d", e.value, e.rev))
				}
			}
			t.Fatalf("seed %d: acknowledged write %s=%d (revision %d) never delivered, and no error (delivered near it: %v); schedule: %v",
				seed, a.key, a.value, a.rev, around, schedule)
		}
		if rev != a.rev {
			t.Fatalf("seed %d: %s=%d delivered at revision %d, acknowledged at %d; schedule: %v", seed, a.key, a.value, rev, a.rev, schedule)
		}
	}
	t.Logf("seed %d: %d acknowledged writes delivered once, in order; schedule: %v", seed, len(acked), schedule)
	return false
}

// waitDirectoryLeaders waits until every shard of the shard directory has a
// leader (a stray replica a node brought back, which replica GC removes
// later, does not count).
func waitDirectoryLeaders(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	waitFor(t, 60*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, d := range dir {
			if c.Leader(d.GetShardId()) == 0 {
				return false, fmt.Sprintf("shard %d has no leader", d.GetShardId())
			}
		}
		return true, ""
	})
}
