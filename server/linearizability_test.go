package server_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/lincheck"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// Flags of TestLinearizability. Run one seed again with
//
//	go test ./server -run TestLinearizability -lincheck.seed=N
var (
	linSeeds    = flag.Int("lincheck.seeds", 20, "TestLinearizability: number of seeds to run (200 with SHALE_SOAK)")
	linSeed     = flag.Int64("lincheck.seed", -1, "TestLinearizability: run only this seed")
	linDuration = flag.Duration("lincheck.duration", linDefaultDuration, "TestLinearizability: minimum workload duration per seed (15s with SHALE_SOAK)")
	linParallel = flag.Int("lincheck.parallel", 2, "TestLinearizability: seeds run at once (each is a cluster of its own)")
	linFirst    = flag.Int64("lincheck.first", 1, "TestLinearizability: first seed of the run (random with SHALE_SOAK)")
)

// Workload shape.
const (
	linKeys        = 30                      // keys k00..k29, over three user shards
	linHotKeys     = 6                       // half the operations go to k00, k05, k10, ...
	linWorkers     = 12                      // concurrent logical clients
	linClients     = 3                       // SDK clients they share
	linMaxInFlight = 8                       // operations in flight per key
	linOpTimeout   = 1500 * time.Millisecond // deadline of one operation, retries included
	linShortOps    = 10                      // percent of operations with a deadline of 20-200ms
	linCheckTime   = 60 * time.Second        // porcupine's time limit

	linDefaultDuration = 4 * time.Second // minimum workload duration per seed
)

// linSplits cut k00..k29 into three user shards.
var linSplits = [][]byte{[]byte("k10"), []byte("k20")}

func linKey(i int) string { return fmt.Sprintf("k%02d", i) }

// flagSet reports whether the named flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// TestLinearizability runs concurrent clients doing get/put/cas/delete on a
// few keys of a three-node cluster while a seeded nemesis stops the leader
// of a shard (and restarts it) and isolates a node (and heals it), records
// the history and checks it with porcupine. Each seed's schedule (workload
// choices, faults, their order and timing) derives from the seed, so a
// failing seed can be run again on its own (see the failure message); on a
// violation the history and porcupine's visualisation are saved under
// $SHALE_LINCHECK_OUT (or the system's temporary directory) and their paths
// printed.
func TestLinearizability(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster fault test; skipped with -short")
	}
	seeds, dur, first := *linSeeds, *linDuration, uint64(max(0, *linFirst))
	if os.Getenv("SHALE_SOAK") != "" {
		if !flagSet("lincheck.seeds") {
			seeds = 200
		}
		if !flagSet("lincheck.first") {
			first = rand.Uint64N(1 << 40)
		}
		if !flagSet("lincheck.duration") {
			dur = 15 * time.Second
		}
	}
	var list []uint64
	if *linSeed >= 0 {
		list = []uint64{uint64(*linSeed)}
	} else {
		for s := range uint64(max(0, seeds)) {
			list = append(list, first+s)
		}
		if len(list) > 0 {
			t.Logf("seeds %d to %d", list[0], list[len(list)-1])
		}
	}
	slots := make(chan struct{}, max(1, *linParallel))
	for _, seed := range list {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			if len(list) > 1 {
				t.Parallel()
			}
			slots <- struct{}{}
			defer func() { <-slots }()
			runLinearizability(t, seed, dur)
		})
	}
}

// nemesisStep is one fault of a schedule: after a pause of gap, either
// stop the leader of shard and restart it after hold, or isolate a node
// (the leader of shard, or node when it is non-zero) and heal it after hold.
// Hold counts from when the fault is in place (stopping a node takes a
// while).
type nemesisStep struct {
	gap, hold time.Duration
	kill      bool
	shard     uint64
	node      uint64
}

func (s nemesisStep) String() string {
	what := fmt.Sprintf("isolate the leader of shard %d", s.shard)
	switch {
	case s.kill:
		what = fmt.Sprintf("stop the leader of shard %d", s.shard)
	case s.node != 0:
		what = fmt.Sprintf("isolate node %d", s.node)
	}
	return fmt.Sprintf("after %v %s for %v", s.gap.Round(time.Millisecond), what, s.hold.Round(time.Millisecond))
}

// linSchedule draws the faults of a run of at least dur: a stop and an
// isolation in random order, then more of either kind while their gaps and
// holds add up to less than dur less 2s.
func linSchedule(rng *rand.Rand, dur time.Duration, userShards []uint64) []nemesisStep {
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	killFirst := rng.IntN(2) == 0
	var (
		steps []nemesisStep
		total time.Duration
	)
	for i := 0; i < 2 || total < dur-2*time.Second; i++ {
		s := nemesisStep{
			gap:   between(200*time.Millisecond, 700*time.Millisecond),
			hold:  between(300*time.Millisecond, 1000*time.Millisecond),
			shard: userShards[rng.IntN(len(userShards))],
			kill:  rng.IntN(2) == 0,
		}
		if i < 2 {
			s.kill = (i == 0) == killFirst
		}
		if !s.kill && rng.IntN(4) == 0 {
			s.node = uint64(1 + rng.IntN(3)) // any node, leader or not
		}
		steps = append(steps, s)
		total += s.gap + s.hold
	}
	return steps
}

// keyHints remembers a recent value of each key, for compare-and-swap
// expectations (a guess: stale guesses make swaps fail, which is fine).
type keyHints struct {
	mu sync.Mutex
	v  map[string]string
}

func (h *keyHints) get(k string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.v[k]
}

func (h *keyHints) set(k, v string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.v[k] = v
}

// linOp draws an operation on key for client id.
func linOp(rng *rand.Rand, rec *lincheck.Recorder, hints *keyHints, id int, key string) (lincheck.Input, []client.ReadOption) {
	switch p := rng.IntN(100); {
	case p < 40:
		var opts []client.ReadOption
		if rng.IntN(4) == 0 {
			opts = append(opts, client.WithConsistency(client.Follower))
		}
		return lincheck.Input{Kind: lincheck.KindGet, Key: key}, opts
	case p < 65:
		return lincheck.Input{Kind: lincheck.KindPut, Key: key, Value: rec.NewValue(id)}, nil
	case p < 90:
		in := lincheck.Input{Kind: lincheck.KindCAS, Key: key, Value: rec.NewValue(id), Expect: hints.get(key)}
		if in.Expect == "" || rng.IntN(6) == 0 {
			in.Expect, in.ExpectAbsent = "", true
		}
		return in, nil
	default:
		return lincheck.Input{Kind: lincheck.KindDelete, Key: key}, nil
	}
}

func runLinearizability(t *testing.T, seed uint64, dur time.Duration) {
	t0 := time.Now()
	rng := rand.New(rand.NewPCG(seed, 0x5a1e))
	leaseReads := rng.IntN(2) == 0
	// Odd seeds run the secured configuration: mutual TLS, and auth on with
	// the clients logged in as a user allowed only the workload's keys.
	secure := seed%2 == 1
	c := testcluster.Start(t, testcluster.Options{
		Splits:       linSplits,
		TickInterval: 10 * time.Millisecond,
		TLS:          secure,
		Configure:    func(cfg *server.Config) { cfg.LeaseReads = leaseReads },
	})
	var secured []client.Option
	if secure {
		setUpAuth(t, c, map[string][]*shalev1.Permission{
			"lin": {{Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Key: []byte("k"), Prefix: true}},
		})
		secured = []client.Option{client.WithTLSFiles(c.Certs().CAFile(), "", ""), client.WithCredentials("lin", "linpw")}
	}
	t.Logf("cluster up in %v", time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() { stopAllAtOnce(c) }) // before the cluster's own, slower, StopAll
	var userShards []uint64
	for _, id := range c.ShardIDs() {
		if id != server.SystemShardID {
			userShards = append(userShards, id)
		}
	}
	if len(userShards) < 2 {
		t.Fatalf("user shards %v: want at least 2", userShards)
	}
	steps := linSchedule(rng, dur, userShards)
	var plan strings.Builder
	fmt.Fprintf(&plan, "seed %d: lease reads %v, TLS and auth %v, workload for at least %v and a quiet second after the faults:", seed, leaseReads, secure, dur)
	for _, s := range steps {
		fmt.Fprintf(&plan, "\n  %v", s)
	}
	t.Log(plan.String())

	clients := make([]*client.Client, linClients)
	for i := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cl, err := client.New(ctx, c.Endpoints(), append([]client.Option{
			client.WithAttemptTimeout(300 * time.Millisecond),
			client.WithBackoff(5*time.Millisecond, 100*time.Millisecond),
			client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, secured...)...)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = cl
		t.Cleanup(func() { cl.Close() })
	}

	rec := lincheck.NewRecorder()
	hints := &keyHints{v: map[string]string{}}
	sems := map[string]chan struct{}{}
	for i := 0; i < linKeys; i++ {
		sems[linKey(i)] = make(chan struct{}, linMaxInFlight)
	}
	var maxInFlight atomic.Int64 // per-key maximum seen, for the log
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < linWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wrng := rand.New(rand.NewPCG(seed, uint64(w)+1))
			cl := clients[w%len(clients)]
			for ctx.Err() == nil {
				var key string
				if wrng.IntN(2) == 0 {
					key = linKey(wrng.IntN(linHotKeys) * (linKeys / linHotKeys))
				} else {
					key = linKey(wrng.IntN(linKeys))
				}
				select {
				case sems[key] <- struct{}{}:
				case <-ctx.Done():
					return
				}
				if n := int64(len(sems[key])); n > maxInFlight.Load() {
					maxInFlight.Store(n) // racy maximum, only logged
				}
				in, ropts := linOp(wrng, rec, hints, w, key)
				// A few operations get a deadline short enough to
				// expire in flight: writes whose outcome is unknown
				// (applied or not) even without faults.
				timeout := linOpTimeout
				if wrng.IntN(100) < linShortOps {
					timeout = time.Duration(20+wrng.IntN(181)) * time.Millisecond
				}
				opCtx, cancel := context.WithTimeout(context.Background(), timeout)
				out, err := lincheck.Exec(opCtx, rec, cl, w, in, ropts...)
				cancel()
				<-sems[key]
				switch {
				case err != nil || out.Unknown:
				case in.Kind == lincheck.KindGet && out.Found, in.Kind == lincheck.KindCAS && !out.Swapped && out.Found:
					hints.set(key, out.Value)
				case in.Kind == lincheck.KindPut, in.Kind == lincheck.KindCAS && out.Swapped:
					hints.set(key, in.Value)
				}
			}
		}()
	}

	// The nemesis, on the test goroutine (the cluster calls t.Fatal).
	begin := time.Now()
	leaderOf := func(shard uint64) uint64 {
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			if id := c.Leader(shard); id != 0 {
				return id
			}
			time.Sleep(10 * time.Millisecond)
		}
		return c.NodeIDs()[0] // no leader: any running node
	}
	for _, s := range steps {
		time.Sleep(s.gap)
		start := rec.Now()
		var a lincheck.Annotation
		if s.kill {
			id := leaderOf(s.shard)
			// Stopping may take a while (gRPC's graceful stop waits
			// for calls in flight, up to 2s); the hold counts from its
			// start.
			stopped := make(chan struct{})
			go func() { defer close(stopped); c.Stop(id) }()
			time.Sleep(s.hold)
			<-stopped
			c.Restart(id)
			a = lincheck.Annotation{Tag: "nemesis", Description: fmt.Sprintf("node %d stopped", id),
				Details: fmt.Sprintf("stopped node %d, leader of shard %d, then restarted it", id, s.shard)}
		} else {
			id := s.node
			if id == 0 {
				id = leaderOf(s.shard)
			}
			c.Isolate(id)
			time.Sleep(s.hold)
			c.Heal()
			a = lincheck.Annotation{Tag: "nemesis", Description: fmt.Sprintf("node %d isolated", id),
				Details: fmt.Sprintf("cut node %d off from the other nodes (leader of shard %d: %v), then healed", id, s.shard, s.node == 0)}
		}
		a.Start, a.End = start, rec.Now()
		rec.Annotate(a)
		t.Logf("%v: %v to %v", s, time.Duration(a.Start).Round(time.Millisecond), time.Duration(a.End).Round(time.Millisecond))
	}
	time.Sleep(max(time.Second, time.Until(begin.Add(dur))))
	stop()
	wg.Wait()

	// Read every key once more after the faults, with time to spare: an
	// acknowledged write lost by the faults shows here at the latest.
	c.WaitLeaders(20 * time.Second)
	for i := 0; i < linKeys; i++ {
		opCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := lincheck.Exec(opCtx, rec, clients[0], linWorkers, lincheck.Input{Kind: lincheck.KindGet, Key: linKey(i)}); err != nil {
			t.Errorf("final read of %s: %v", linKey(i), err)
		}
		cancel()
	}

	t.Logf("workload and final reads done at %v", time.Since(t0).Round(time.Millisecond))
	h := rec.History()
	h.Info = map[string]string{"seed": fmt.Sprint(seed), "schedule": plan.String()}
	st := h.Stats
	t.Logf("%v in %v (max %d in flight per key); %d unknown writes seen applied",
		st, time.Since(begin).Round(time.Millisecond), maxInFlight.Load(), seenUnknownWrites(h))
	res, err := lincheck.Check(h, linCheckTime, linOutDir(seed))
	if err != nil {
		t.Errorf("saving the failed history: %v", err)
	}
	t.Logf("history of %d operations: %v", len(h.Ops), res)
	if !res.OK() {
		replay := fmt.Sprintf("go test ./server -run TestLinearizability -lincheck.seed=%d", seed)
		if dur != linDefaultDuration {
			replay += fmt.Sprintf(" -lincheck.duration=%v", dur)
		}
		t.Errorf("seed %d: history %v\nreplay: %s\n%s", seed, res, replay, plan.String())
	}
	if float64(st.Known) < 0.3*float64(st.Calls) || st.KnownByKind["get"] == 0 || st.KnownByKind["put"] == 0 || st.KnownByKind["cas"] == 0 {
		t.Errorf("seed %d: too few operations succeeded to mean anything: %v", seed, st)
	}
}

// seenUnknownWrites counts the writes of unknown outcome whose value a read
// (or a compare-and-swap) later saw: they did apply.
func seenUnknownWrites(h *lincheck.History) int {
	seen := map[string]bool{}
	for _, op := range h.Ops {
		if !op.Output.Unknown && op.Output.Found {
			seen[op.Output.Value] = true
		}
	}
	n := 0
	for _, op := range h.Ops {
		if op.Output.Unknown && op.Input.Value != "" && seen[op.Input.Value] {
			n++
		}
	}
	return n
}

// linOutDir is where a failing seed's history and visualisation go:
// $SHALE_LINCHECK_OUT/seed-N, or a new directory in the system's temporary
// directory (t.TempDir would be removed when the test ends). Check creates
// it only on a failure.
func linOutDir(seed uint64) string {
	if d := os.Getenv("SHALE_LINCHECK_OUT"); d != "" {
		return filepath.Join(d, fmt.Sprintf("seed-%d", seed))
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("shale-lincheck-%d-seed-%d", time.Now().UnixNano(), seed))
}

// stopAllAtOnce stops every node of c concurrently: a node's graceful stop
// may wait up to 2s for calls in flight, which one node after the other adds
// up.
func stopAllAtOnce(c *testcluster.Cluster) {
	var wg sync.WaitGroup
	for _, id := range c.NodeIDs() {
		wg.Add(1)
		go func() { defer wg.Done(); c.Stop(id) }()
	}
	wg.Wait()
}
