package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/logring"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// watchRounds is how many seeded rounds TestWatchRandomized runs, on a
// cluster of watchNodes nodes (one more than a shard's replicas, so that
// replicas can move).
const (
	watchRounds = 20
	watchNodes  = 4
)

// TestWatchRandomized runs watchRounds seeded rounds on one cluster of
// watchNodes nodes. In each, an SDK watch follows a prefix of its own while
// writers put increasing values to keys under it and a seeded schedule
// splits and merges the shards holding them, moves their leaderships and
// replicas, and stops and restarts the node leading one of them (so streams
// break and the client resumes, possibly across the split, merge or move).
// The watch must deliver every acknowledged write exactly once, at its
// acknowledged revision, each key's values in order, nothing never written
// — or end with ErrCompacted (history gone, never a silent gap), in which
// case what it delivered before must hold the same properties. It found
// two silent gaps and a directory that kept a merged-away shard (chaos/README,
// bugs 20 and 21, fixed).
func TestWatchRandomized(t *testing.T) {
	// The nodes' and the client's last log records are printed when a
	// round fails.
	nodeLog, clientLog := logring.New(400, slog.LevelInfo), logring.New(200, slog.LevelDebug)
	c := testcluster.Start(t, testcluster.Options{Nodes: watchNodes, Configure: func(cfg *server.Config) {
		cfg.Logger = slog.New(nodeLog).With("node", cfg.NodeID)
	}})
	cl := newClient(t, c, client.WithLogger(slog.New(clientLog)))

	compacted := 0
	for seed := uint64(1); seed <= watchRounds; seed++ {
		t.Run(fmt.Sprintf("seed%02d", seed), func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("the client's last log records:\n%s", strings.Join(clientLog.Lines(), "\n"))
					t.Logf("the nodes' last log records (info and above):\n%s", strings.Join(nodeLog.Lines(), "\n"))
				}
			}()
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
		shard uint64 // the shard whose stream delivered it
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
				got[string(e.KV.Key)] = append(got[string(e.KV.Key)], seen{v, e.KV.ModRevision, resp.ShardID})
			}
			mu.Unlock()
		}
	}()
	// The watch is open once it delivers a marker written after its stream
	// started. Cluster.Watch returns before that (the stream starts when
	// the shard's leader is found), so markers are written until one is
	// delivered: one written before is not, rightly.
	marker := prefix + "a-marker"
	markers := 0
	var markerRevs []uint64
	for deadline := time.Now().Add(30 * time.Second); ; {
		mu.Lock()
		open := len(got[marker]) > 0 || werr != nil
		mu.Unlock()
		if open {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("seed %d: the watch delivered none of %d markers in 30 s (put at revisions %v)", seed, markers, markerRevs)
		}
		markers++
		mr, err := cl.Put(ctx, []byte(marker), []byte(strconv.Itoa(markers)))
		if err != nil {
			t.Fatal(err)
		}
		markerRevs = append(markerRevs, mr.Revision)
		time.Sleep(300 * time.Millisecond)
	}

	type ack struct {
		key   string
		value int
		rev   uint64
	}
	var (
		wg     sync.WaitGroup
		acksMu sync.Mutex
		acked  []ack
		tried  = map[string]int{marker: markers}
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
		case op < 3:
			_, _, err = cl.SplitShard(ctx, at)
			schedule = append(schedule, fmt.Sprintf("split %s: %v", at, err))
		case op < 6:
			// A watched shard that has a right neighbour, with it.
			mk := []byte(prefix)
			if ws := watchedShards(t, c, prefix); len(ws) > 0 {
				if d := ws[rng.IntN(len(ws))]; len(d.GetEndKey()) > 0 {
					mk = d.GetStartKey()
					if bytes.Compare(mk, []byte(prefix)) < 0 {
						mk = []byte(prefix)
					}
				}
			}
			_, _, err = cl.MergeShards(ctx, mk)
			schedule = append(schedule, fmt.Sprintf("merge at %s: %v", mk, err))
		case op < 8:
			sh := shardOf(t, c, at)
			to := uint64(rng.IntN(watchNodes) + 1)
			_, err = cl.TransferLeader(ctx, sh, to)
			schedule = append(schedule, fmt.Sprintf("leader of shard %d to node %d: %v", sh, to, err))
		case op == 8:
			// Move every replica of the watched shards on one node to
			// another (the shards stay co-located, so merges still can):
			// the nodes serving watch streams change under them.
			// From a random node holding the shard at the step's key to the
			// one that does not.
			on := map[uint64]bool{}
			for _, d := range watchedShards(t, c, prefix) {
				if (len(d.GetEndKey()) == 0 || bytes.Compare(at, d.GetEndKey()) < 0) && bytes.Compare(at, d.GetStartKey()) >= 0 {
					for _, rd := range d.GetReplicas() {
						on[rd.GetNodeId()] = true
					}
				}
			}
			var from, to uint64
			for _, id := range rng.Perm(watchNodes) {
				if n := uint64(id + 1); on[n] && from == 0 {
					from = n
				} else if !on[n] && to == 0 {
					to = n
				}
			}
			schedule = append(schedule, moveReplicas(t, c, cl, prefix, from, to))
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
			mu.Lock()
			var behind []string
			for k, v := range want {
				s := got[k]
				if len(s) == 0 {
					behind = append(behind, fmt.Sprintf("%s: none of up to %d", k, v))
				} else if last := s[len(s)-1]; last.value < v {
					behind = append(behind, fmt.Sprintf("%s: %d@%d (shard %d) of %d", k, last.value, last.rev, last.shard, v))
				}
			}
			mu.Unlock()
			slices.Sort(behind)
			t.Fatalf("seed %d: the watch did not deliver every acknowledged write within 60s: %v; schedule: %v", seed, behind, schedule)
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
	var missing []string
	for _, a := range acked {
		if _, ok := seenAt[a.key][a.value]; !ok {
			missing = append(missing, fmt.Sprintf("%s=%d@%d", a.key, a.value, a.rev))
		}
	}
	for _, a := range acked {
		rev, ok := seenAt[a.key][a.value]
		if !ok {
			// What was delivered for any key at revisions near the lost
			// one, and by which shard's stream.
			var around []string
			for k, es := range got {
				for _, e := range es {
					if e.rev+20 >= a.rev && e.rev <= a.rev+20 {
						around = append(around, fmt.Sprintf("%s=%d@%d(shard %d)", k, e.value, e.rev, e.shard))
					}
				}
			}
			slices.Sort(around)
			t.Fatalf("seed %d: acknowledged write %s=%d (revision %d) never delivered, and no error; %d acknowledged writes missing: %v; delivered at revisions within 20 of it: %v; schedule: %v",
				seed, a.key, a.value, a.rev, len(missing), missing[:min(len(missing), 30)], around, schedule)
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

// watchedShards lists the directory's user shards that overlap prefix (none
// if the directory cannot be read).
func watchedShards(t *testing.T, c *testcluster.Cluster, prefix string) []*shalev1.ShardDescriptor {
	t.Helper()
	dir, _ := directory(t, c)
	lo, hi := []byte(prefix), []byte(prefix+"\xff")
	var out []*shalev1.ShardDescriptor
	for _, d := range dir {
		if d.GetSystem() || (len(d.GetEndKey()) > 0 && bytes.Compare(d.GetEndKey(), lo) <= 0) || bytes.Compare(d.GetStartKey(), hi) >= 0 {
			continue
		}
		out = append(out, d)
	}
	return out
}

// moveReplicas moves the replica on node from of every shard under prefix
// that has one there and none on node to, waits (up to 30 s) until each
// move is done, and describes what it did for the schedule.
func moveReplicas(t *testing.T, c *testcluster.Cluster, cl *client.Client, prefix string, from, to uint64) string {
	t.Helper()
	if from == 0 || to == 0 {
		return "move: no replica to move"
	}
	var moved []uint64
	var errs []string
	for _, d := range watchedShards(t, c, prefix) {
		on := map[uint64]bool{}
		for _, rd := range d.GetReplicas() {
			on[rd.GetNodeId()] = true
		}
		if !on[from] || on[to] {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cl.MoveReplica(ctx, d.GetShardId(), from, to, -1)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("shard %d: %v", d.GetShardId(), err))
			continue
		}
		moved = append(moved, d.GetShardId())
	}
	deadline := time.Now().Add(30 * time.Second)
	var pending []uint64
	for _, sh := range moved {
		for {
			done, _ := movedTo(t, c, sh, from, to)
			if done {
				break
			}
			if time.Now().After(deadline) {
				pending = append(pending, sh)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return fmt.Sprintf("move node %d's replicas of shards %v to node %d (not done in 30 s: %v; errors: %v)", from, moved, to, pending, errs)
}
