package chaos

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/chaos/harness"
	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/lincheck"
	"github.com/shale-db/shale/internal/logring"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// Flags of TestChaos. `make chaos` runs it for 30 minutes; a failing seed
// runs again with -chaos.seed=N (and the same duration, nodes and nemeses).
var (
	chaosDuration = flag.Duration("chaos.duration", 3*time.Minute, "TestChaos: how long the workload runs under faults (the smoke run in make test; make chaos: 30m)")
	chaosSeed     = flag.Uint64("chaos.seed", 0, "TestChaos: seed of the schedule and the workload (0: from the clock, printed)")
	chaosNodes    = flag.Int("chaos.nodes", 5, "TestChaos: founding nodes (3 or more; ring and bridge partitions need 5)")
	chaosNemeses  = flag.String("chaos.nemeses", "smoke", "TestChaos: comma-separated fault kinds; all; or smoke, all but those with an open bug (make chaos runs all)")
	chaosArgs     = flag.String("chaos.server-args", "", "TestChaos: extra space-separated shale-server flags for every node (e.g. --log-level=debug to trace elections)")
	chaosDisk     = flag.Int64("chaos.disk-bytes", 1<<30, "TestChaos: size of every node's disk when the disk-full nemesis runs")
	chaosInsecure = flag.Bool("chaos.insecure", false, "TestChaos: run the cluster in plaintext, without auth (for debugging; by default nodes and clients use mutual TLS and auth is on)")
	chaosOut      = flag.String("chaos.out", "", "TestChaos: directory for the node logs and statuses, kept for every run when given (by default only a failed run's, in a new temporary directory), and a failed run's history and porcupine visualisation")
)

func TestMain(m *testing.M) {
	// No registry: testcontainers must not try to pull its reaper.
	_ = os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	flag.Parse()
	os.Exit(m.Run())
}

// userSplits cut the workload's keys over four user shards.
var userSplits = []string{"k10", "k20", "k30"}

// TestChaos runs the workload on a containerised cluster under a seeded
// schedule of faults, heals everything, reads every key, and checks that
// the replicas of every shard converge to the same data, that the history
// is linearizable and that no acknowledged write was lost.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("containers and minutes of faults; skipped with -short")
	}
	harness.RequireDocker(t)
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) % 1_000_000_007
	}
	replay := fmt.Sprintf("cd chaos && go test -run TestChaos -timeout 0 -chaos.seed=%d -chaos.duration=%v -chaos.nodes=%d -chaos.nemeses=%s",
		seed, *chaosDuration, *chaosNodes, *chaosNemeses)
	if *chaosInsecure {
		replay += " -chaos.insecure"
	}
	t.Logf("seed %d (replay: %s)", seed, replay)
	// go test shows a test's log only when it ends: the seed goes to
	// stderr at once, and a run stuck long after its schedule ended dumps
	// every goroutine and exits, instead of being killed by go test's
	// timeout, which may cut the dump short.
	fmt.Fprintf(os.Stderr, "chaos: TestChaos seed %d (replay: %s)\n", seed, replay)
	const stuckAfter = 15 * time.Minute
	watchdog := time.AfterFunc(*chaosDuration+stuckAfter, func() {
		buf := make([]byte, 64<<20)
		n := runtime.Stack(buf, true)
		fmt.Fprintf(os.Stderr, "chaos: TestChaos (seed %d) still running %s after its schedule ended; every goroutine:\n%s\n", seed, stuckAfter, buf[:n])
		os.Exit(2)
	})
	defer watchdog.Stop()
	out := *chaosOut
	if out == "" {
		out = filepath.Join(os.TempDir(), fmt.Sprintf("shale-chaos-%d-%d", seed, time.Now().Unix()))
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))

	ctx := context.Background()
	splits := "--initial-splits=" + strings.Join(userSplits, ",")
	args := append([]string{splits}, strings.Fields(*chaosArgs)...)
	opts := harness.Options{Nodes: *chaosNodes, Args: args, Logger: log, Insecure: *chaosInsecure}
	if slices.Contains(SelectNemeses(*chaosNemeses, *chaosNodes), "disk-full") {
		// Disks small enough to fill with one copy (tmpfs, so at
		// most this much memory per node, and only while full).
		opts.DiskBytes = *chaosDisk
	}
	c, err := harness.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The first client, which also makes the final reads, keeps a trace of
	// its last failed attempts (which node answered what): on a failure it
	// is printed, and saved with the logs.
	trace := logring.New(200, slog.LevelDebug)
	failed := true
	defer func() {
		if failed || *chaosOut != "" {
			saveLogs(t, c, out)
			reportAttempts(t, trace, out)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("clean up: %v", err)
		}
	}()
	var clients []*client.Client
	for i := 0; i < 3; i++ {
		opts := []client.Option{client.WithDefaultTimeout(5 * time.Second), client.WithBackoff(10*time.Millisecond, 200*time.Millisecond)}
		if i == 0 {
			opts = append(opts, client.WithLogger(slog.New(trace)))
		}
		cl, err := c.Client(ctx, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients = append(clients, cl)
	}
	// The workload's clients are the workload user's (read and write
	// keys); the nemesis and the convergence check need root's.
	admin, err := c.AdminClient(ctx, client.WithDefaultTimeout(5*time.Second), client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	t.Logf("TLS and auth: %v", c.Secure())
	rec := lincheck.NewRecorder()
	w := NewWorkload(rec, clients, WorkloadOptions{Seed: seed})
	nem, err := NewNemesis(c, clients[0], admin, rec, seed, *chaosNemeses, log)
	if err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithTimeout(ctx, *chaosDuration)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.Run(runCtx)
	}()
	nemErr := nem.Run(runCtx)
	stop()
	wg.Wait()
	if nemErr != nil {
		t.Errorf("%v\nreplay: %s", nemErr, replay)
	}
	t.Logf("faults injected: %v (nodes stopped by a full disk: %d)", nem.Counts, nem.DiskExits)

	// Heal whatever is left, then read every key once more.
	c.Heal()
	finalCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	final, err := w.FinalReads(finalCtx, clients[0])
	if err != nil {
		t.Fatalf("the cluster does not serve after healing: %v\nreplay: %s", err, replay)
	}

	// Every shard's replicas reach one applied index with one checksum.
	problems, err := CheckConvergence(finalCtx, admin, time.Minute)
	if err != nil {
		t.Errorf("replica checksums: %v", err)
	}
	for _, p := range problems {
		t.Errorf("%s\nreplay: %s", p, replay)
	}

	h := rec.History()
	h.Info = map[string]string{"seed": fmt.Sprint(seed), "replay": replay}
	t.Logf("history: %s", h.Stats)
	t.Logf("latency of operations by the fault held when they were called:\n  %s", formatLatencies(LatencyByFault(h)))
	if h.Stats.Known < 100 {
		t.Errorf("only %d operations completed: the workload made no progress\nreplay: %s", h.Stats.Known, replay)
	}
	if lost := lostWrites(h, final); len(lost) > 0 {
		t.Errorf("acknowledged writes lost:\n  %s\nreplay: %s", strings.Join(lost, "\n  "), replay)
	}
	// Five minutes a million operations (a 36-minute run records about 3.4
	// million), at least five.
	res, err := lincheck.Check(h, max(5*time.Minute, time.Duration(len(h.Ops))*5*time.Minute/1_000_000), out)
	if err != nil {
		t.Errorf("save the history: %v", err)
	}
	if !res.OK() {
		t.Errorf("%s\nreplay: %s", res, replay)
	}
	failed = t.Failed()
}

// lostWrites checks each key's final value against its last acknowledged
// write, where there is one for certain: an acknowledged write (a put, a
// delete, a compare-and-swap that swapped) that every other write that may
// have taken effect returned before. The final read must see that write's
// value, or the key's absence after a delete.
func lostWrites(h *lincheck.History, final map[string]string) []string {
	// effective: writes that took or may have taken effect (a failed write
	// is not in the history; a compare-and-swap known not to swap did not).
	effective := map[string][]lincheck.Operation{}
	for _, op := range h.Ops {
		if !op.Input.Kind.IsWrite() || (op.Input.Kind == lincheck.KindCAS && !op.Output.Unknown && !op.Output.Swapped) {
			continue
		}
		effective[op.Input.Key] = append(effective[op.Input.Key], op)
	}
	var lost []string
	for key, ops := range effective {
		for i, a := range ops {
			if a.Output.Unknown {
				continue
			}
			last := true
			for j, b := range ops {
				if j != i && b.Return >= a.Call { // b may be ordered after a
					last = false
					break
				}
			}
			if !last {
				continue
			}
			got, present := final[key]
			if a.Input.Kind == lincheck.KindDelete {
				if present {
					lost = append(lost, fmt.Sprintf("%s: deleted (acknowledged), finally %q", key, got))
				}
			} else if !present || got != a.Input.Value {
				lost = append(lost, fmt.Sprintf("%s: %q written (acknowledged), finally %q (present %v)", key, a.Input.Value, got, present))
			}
			break
		}
	}
	sort.Strings(lost)
	return lost
}

func saveLogs(t *testing.T, c *harness.Cluster, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("save logs: %v", err)
		return
	}
	for _, id := range c.NodeIDs() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, err := c.Logs(ctx, id)
		cancel()
		if err != nil {
			t.Logf("save logs of node %d: %v", id, err)
			continue
		}
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("node%d.log", id)), b, 0o644)
		// A CI run keeps only the test's output: a line per node of what
		// most often explains a stuck replica.
		t.Logf("node %d: %s", id, logDigest(b))
		// Every replica's own view of its shard: who it thinks leads, its
		// term and indexes, whether it is quiesced or stopped.
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		info, err := c.NodeInfo(ctx, id)
		cancel()
		if err != nil {
			t.Logf("save the status of node %d: %v", id, err)
			continue
		}
		js, err := protojson.MarshalOptions{Multiline: true}.Marshal(info)
		if err != nil {
			t.Logf("save the status of node %d: %v", id, err)
			continue
		}
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("node%d-status.json", id)), js, 0o644)
	}
	t.Logf("node logs and statuses, history and visualisation (if the check failed) in %s", dir)
}

// logDigest summarises a node's log in one line: its snapshot traffic and
// its last warning or error.
func logDigest(log []byte) string {
	counts := map[string]int{}
	kinds := []string{"snapshot sent", "snapshot send failed", "snapshot installed", "snapshot refused by handler", "snapshot receive failed"}
	var last string
	for _, line := range strings.Split(string(log), "\n") {
		for _, k := range kinds {
			if strings.Contains(line, `msg="`+k+`"`) {
				counts[k]++
			}
		}
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			last = line
		}
	}
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	if len(last) > 300 {
		last = last[:300] + "..."
	}
	return strings.Join(parts, ", ") + "; last warning: " + last
}

// testWriter sends the harness's log lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestLostWrites: the lost-write check finds a final value that misses the
// last acknowledged write, and accepts histories where another write may
// come last.
func TestLostWrites(t *testing.T) {
	put := func(key, v string, call, ret int64, unknown bool) lincheck.Operation {
		return lincheck.Operation{Input: lincheck.Input{Kind: lincheck.KindPut, Key: key, Value: v}, Output: lincheck.Output{Unknown: unknown}, Call: call, Return: ret}
	}
	del := func(key string, call, ret int64) lincheck.Operation {
		return lincheck.Operation{Input: lincheck.Input{Kind: lincheck.KindDelete, Key: key}, Call: call, Return: ret}
	}
	h := &lincheck.History{End: 1000, Ops: []lincheck.Operation{
		put("a", "1", 0, 10, false), put("a", "2", 20, 30, false), // a: last is 2
		put("b", "1", 0, 10, false), put("b", "2", 5, 30, false), // b: overlapping, either may be last
		put("c", "1", 0, 10, false), put("c", "2", 20, 1000, true), // c: an unknown write may be last
		put("d", "1", 0, 10, false), del("d", 20, 30), // d: deleted
	}}
	if lost := lostWrites(h, map[string]string{"a": "2", "b": "1", "c": "1"}); len(lost) != 0 {
		t.Fatalf("a correct final state reported lost writes: %v", lost)
	}
	lost := lostWrites(h, map[string]string{"a": "1", "b": "2", "c": "2", "d": "1"})
	if len(lost) != 2 || !strings.HasPrefix(lost[0], "a:") || !strings.HasPrefix(lost[1], "d:") {
		t.Fatalf("lost writes %v, want a and d", lost)
	}
}

// TestLatencyByFault: operations count for the faults held when they were
// called, or for none; unknown outcomes are left out.
func TestLatencyByFault(t *testing.T) {
	ms := int64(time.Millisecond)
	op := func(call, ret int64, unknown bool) lincheck.Operation {
		return lincheck.Operation{Input: lincheck.Input{Kind: lincheck.KindGet, Key: "k"}, Output: lincheck.Output{Unknown: unknown}, Call: call * ms, Return: ret * ms}
	}
	h := &lincheck.History{
		Ops: []lincheck.Operation{op(0, 5, false), op(100, 400, false), op(150, 160, false), op(120, 10000, true), op(500, 502, false)},
		Annotations: []lincheck.Annotation{
			{Tag: "nemesis", Description: "slow-disk", Start: 90 * ms, End: 200 * ms},
			{Tag: "client", Description: "not a fault", Start: 0, End: 1000 * ms},
		},
	}
	got := LatencyByFault(h)
	want := map[string]LatencySummary{
		"slow-disk": {Ops: 2, P50: 300 * time.Millisecond, P99: 300 * time.Millisecond, Max: 300 * time.Millisecond},
		"none":      {Ops: 2, P50: 5 * time.Millisecond, P99: 5 * time.Millisecond, Max: 5 * time.Millisecond},
	}
	if len(got) != len(want) || got["slow-disk"] != want["slow-disk"] || got["none"] != want["none"] {
		t.Fatalf("LatencyByFault = %v, want %v", got, want)
	}
}

// TestSameIndex: replicas are comparable only once at one applied index.
func TestSameIndex(t *testing.T) {
	r := func(node, idx uint64) *shalev1.ReplicaChecksumResponse {
		return &shalev1.ReplicaChecksumResponse{NodeId: node, AppliedIndex: idx}
	}
	if sameIndex([]*shalev1.ReplicaChecksumResponse{r(1, 10), r(2, 11)}) {
		t.Fatal("different indexes reported as the same")
	}
	if !sameIndex([]*shalev1.ReplicaChecksumResponse{r(1, 10), r(2, 10)}) {
		t.Fatal("one index reported as different")
	}
}

// reportAttempts prints the last 30 records of trace (the first client's
// debug log: its failed attempts, each with the node and the error) to the
// test's output and saves all of them as client-attempts.log in dir.
func reportAttempts(t *testing.T, trace *logring.Handler, dir string) {
	out := trace.Lines()
	_ = os.WriteFile(filepath.Join(dir, "client-attempts.log"), []byte(strings.Join(out, "\n")+"\n"), 0o644)
	t.Logf("the first client's last failed attempts (all %d in client-attempts.log):\n  %s", len(out), strings.Join(out[max(0, len(out)-30):], "\n  "))
}

// TestKeySlotsRotate: a slot moves to a fresh key after OpsPerKey
// operations, its keys stay between its prefix and the next slot's (in the
// slot's shard, and in a scan of its slots), and the final reads cover
// every key used.
func TestKeySlotsRotate(t *testing.T) {
	w := NewWorkload(lincheck.NewRecorder(), nil, WorkloadOptions{Keys: 12, OpsPerKey: 3})
	var got []string
	for range 7 {
		got = append(got, w.useKey(10))
	}
	want := []string{"k10/0", "k10/0", "k10/0", "k10/1", "k10/1", "k10/1", "k10/2"}
	if !slices.Equal(got, want) {
		t.Fatalf("slot 10's keys %v, want %v", got, want)
	}
	for _, k := range got {
		if !(slotPrefix(10) < k && k < slotPrefix(11)) {
			t.Fatalf("key %s is outside slot 10's range [%s, %s)", k, slotPrefix(10), slotPrefix(11))
		}
	}
	w.useKey(3)
	used := w.usedKeys()
	if len(used) != 12+2 || !slices.Contains(used, "k10/2") || !slices.Contains(used, "k03/0") || slices.Contains(used, "k10/3") {
		t.Fatalf("used keys %v", used)
	}
}
