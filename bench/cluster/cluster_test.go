package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shale-db/shale/bench/storagebench"
	shaleclient "github.com/shale-db/shale/client"
)

// TestMain lets the test binary stand in for shale-bench etcd-member, so
// that TestEtcdCluster can start real member processes (the etcd peer
// re-executes os.Executable()).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == EtcdMemberCommand {
		var mc MemberConfig
		fields := map[string]*string{
			"--name": &mc.Name, "--data-dir": &mc.DataDir, "--listen-peer": &mc.ListenPeer,
			"--listen-client": &mc.ListenClient, "--initial-cluster": &mc.InitialCluster,
			"--initial-cluster-token": &mc.Token, "--log-file": &mc.LogFile,
		}
		args := os.Args[2:]
		for i := 0; i+1 < len(args); i += 2 {
			if p, ok := fields[args[i]]; ok {
				*p = args[i+1]
			}
		}
		ctx, stop := signalContext()
		defer stop()
		if err := RunEtcdMember(ctx, mc); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// TestHistogramPercentiles checks the percentiles of latencies recorded by
// several clients and merged, as runCell does, and their JSON form.
func TestHistogramPercentiles(t *testing.T) {
	// Client a records 1..1000 µs, client b 1001..2000 µs, client c
	// nothing: merged, the latencies are 1..2000 µs, once each.
	var a, b, c storagebench.Histogram
	for i := 1; i <= 1000; i++ {
		a.Record(time.Duration(i) * time.Microsecond)
		b.Record(time.Duration(1000+i) * time.Microsecond)
	}
	r := Result{Engine: "e", Workload: "w", Clients: 3, Latency: &storagebench.Histogram{}, Ops: 2000, Elapsed: time.Second}
	for _, h := range []*storagebench.Histogram{&a, &b, &c} {
		r.Latency.Merge(h)
	}
	if r.Latency.Count() != 2000 {
		t.Fatalf("count %d, want 2000", r.Latency.Count())
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{
		{0.50, 1000 * time.Microsecond},
		{0.99, 1980 * time.Microsecond},
		{0.999, 1998 * time.Microsecond},
		{1, 2000 * time.Microsecond},
		{0, time.Microsecond},
	} {
		got := r.Latency.Quantile(tc.q)
		if rel := math.Abs(float64(got-tc.want)) / float64(tc.want); rel > 1.0/64 {
			t.Errorf("p%g = %s, want %s within 1/64 (off by %.2f%%)", tc.q*100, got, tc.want, rel*100)
		}
	}
	if r.Latency.Max() != 2000*time.Microsecond || r.Latency.Min() != time.Microsecond {
		t.Errorf("min %s max %s, want exact 1µs and 2ms", r.Latency.Min(), r.Latency.Max())
	}

	var buf bytes.Buffer
	if err := WriteJSONLine(&buf, r); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	// The storage benchmark's fields, plus clients.
	want := []string{"engine", "workload", "clients", "ops_per_sec", "mb_per_sec", "p50_us", "p99_us", "p999_us",
		"max_us", "min_ops_in_1s", "space_amp", "disk_over_logical"}
	if len(m) != len(want) {
		t.Errorf("JSON has %d fields, want %d: %s", len(m), len(want), buf.String())
	}
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, buf.String())
		}
	}
	if m["clients"] != 3.0 || m["ops_per_sec"] != 2000.0 || m["max_us"] != 2000.0 {
		t.Errorf("JSON values: %s", buf.String())
	}
	if p := m["p50_us"].(float64); math.Abs(p-1000) > 1000.0/64 {
		t.Errorf("p50_us %v, want about 1000", p)
	}
}

func TestZipfian(t *testing.T) {
	const n, draws = 1000, 400_000
	z := NewZipfian(n, ZipfianTheta)
	r := newRand(1, 1)
	counts := make([]int, n)
	for range draws {
		k := z.Next(r)
		if k >= n {
			t.Fatalf("draw %d out of [0, %d)", k, n)
		}
		counts[k]++
	}
	// Item k should have probability p(k) = (1/(k+1)^theta) / zeta(n).
	// Gray's method (YCSB's) is exact for items 0 and 1 and approximates
	// the rest (item 2 comes out about 17% too often), so the others are
	// checked through the cumulative distribution.
	zn := zeta(n, ZipfianTheta)
	p := func(k int) float64 { return 1 / math.Pow(float64(k+1), ZipfianTheta) / zn }
	for _, k := range []int{0, 1} {
		want := draws * p(k)
		if got := float64(counts[k]); math.Abs(got-want) > 0.03*want {
			t.Errorf("item %d drawn %v times, want %.0f (±3%%)", k, got, want)
		}
	}
	var got, want float64
	for k := range n {
		got += float64(counts[k]) / draws
		want += p(k)
		switch k + 1 {
		case 10, 100, 500:
			if math.Abs(got-want) > 0.05*want {
				t.Errorf("first %d items: %.4f of the draws, want %.4f (±5%%)", k+1, got, want)
			}
		}
	}
	if counts[0] <= counts[1] || counts[1] <= counts[2] || counts[2] <= counts[100] {
		t.Errorf("counts not decreasing: %d %d %d %d", counts[0], counts[1], counts[2], counts[100])
	}

	// Same seed, same sequence; one item, always 0.
	r1, r2 := newRand(7, 3), newRand(7, 3)
	for range 1000 {
		if z.Next(r1) != z.Next(r2) {
			t.Fatal("same seed gave different draws")
		}
	}
	one := NewZipfian(1, ZipfianTheta)
	for range 100 {
		if k := one.Next(r); k != 0 {
			t.Fatalf("n=1 drew %d", k)
		}
	}
}

func TestKeys(t *testing.T) {
	seen := map[string]bool{}
	var prev []byte
	for i := uint64(0); i < 100_000; i++ {
		k := AppendKey(nil, i)
		if len(k) != KeySize {
			t.Fatalf("key %d has %d bytes", i, len(k))
		}
		if strings.Trim(string(k), "0123456789abcdef") != "" {
			t.Fatalf("key %q is not lowercase hex", k)
		}
		if seen[string(k)] {
			t.Fatalf("key %q repeats", k)
		}
		seen[string(k)] = true
		prev = AppendKey(prev[:0], i)
		if !bytes.Equal(prev, k) {
			t.Fatal("AppendKey not deterministic")
		}
	}
}

func TestParse(t *testing.T) {
	if got, err := ParseEngines("etcd,shale"); err != nil || len(got) != 2 {
		t.Errorf("ParseEngines(etcd,shale) = %v, %v", got, err)
	}
	if names := EngineNames(); len(names) < 2 || names[0] != "shale" {
		t.Errorf("EngineNames() = %v, want shale first", names)
	}
	if got, err := ParseEngines(" etcd,etcd "); err != nil || len(got) != 1 || got[0] != "etcd" {
		t.Errorf("ParseEngines(etcd,etcd) = %v, %v", got, err)
	}
	if _, err := ParseEngines("zookeeper"); err == nil {
		t.Error("unknown engine accepted")
	}
	if got, err := ParseWorkloads(strings.Join(WorkloadNames(), ",")); err != nil || len(got) != 5 {
		t.Errorf("ParseWorkloads(all) = %v, %v", got, err)
	}
	if _, err := ParseWorkloads("ycsb-c"); err == nil {
		t.Error("unknown workload accepted")
	}
	if names := EngineNames(); len(names) == 0 || names[len(names)-1] != "etcd" && names[0] != "etcd" {
		t.Errorf("EngineNames() = %v, want etcd among them", names)
	}
}

func TestMinOpsIn1s(t *testing.T) {
	if m, z := minOpsIn1s([]int64{5, 0, 7, 3}, 3500*time.Millisecond, 15); m != 0 || z != 1 {
		t.Errorf("got %d, %d; want 0, 1", m, z)
	}
	if m, z := minOpsIn1s([]int64{5, 4, 7}, 2900*time.Millisecond, 16); m != 4 || z != 0 {
		t.Errorf("got %d, %d; want 4, 0", m, z)
	}
	if m, _ := minOpsIn1s([]int64{9}, 500*time.Millisecond, 9); m != 9 {
		t.Errorf("short phase: got %d, want 9", m)
	}
}

// memCluster is an in-memory "cluster" for testing the runner.
type memCluster struct {
	mu   sync.Mutex
	data map[string][]byte
}

type memKV struct{ c *memCluster }

func (c *memCluster) Name() string                       { return "mem" }
func (c *memCluster) Client(context.Context) (KV, error) { return memKV{c}, nil }
func (c *memCluster) Stop() error                        { return nil }

func (kv memKV) Put(_ context.Context, key, value []byte) error {
	kv.c.mu.Lock()
	defer kv.c.mu.Unlock()
	kv.c.data[string(key)] = append([]byte(nil), value...)
	return nil
}

func (kv memKV) Get(_ context.Context, key []byte) ([]byte, bool, error) {
	kv.c.mu.Lock()
	defer kv.c.mu.Unlock()
	v, ok := kv.c.data[string(key)]
	return v, ok, nil
}

func (kv memKV) Scan(_ context.Context, start []byte, limit int) (int, error) {
	kv.c.mu.Lock()
	defer kv.c.mu.Unlock()
	var keys []string
	for k := range kv.c.data {
		if k >= string(start) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return min(len(keys), limit), nil
}

func (kv memKV) Close() error { return nil }

var registerMem sync.Once

// TestRunAllWorkloads runs every workload against the in-memory cluster.
func TestRunAllWorkloads(t *testing.T) {
	registerMemTest()
	dir := t.TempDir()
	cfg := Config{
		Engines:   []string{"mem-test"},
		Workloads: WorkloadNames(),
		Clients:   []int{1, 4},
		Conns:     2,
		Duration:  100 * time.Millisecond,
		Keys:      500,
		Dir:       dir,
		Seed:      1,
	}
	var emitted int
	results := Run(context.Background(), cfg, func(Result) { emitted++ })
	if len(results) != 10 || emitted != 10 {
		t.Fatalf("%d results, %d emitted; want 10", len(results), emitted)
	}
	for _, r := range results {
		if r.Err != nil {
			t.Errorf("%s/%d: %v", r.Workload, r.Clients, r.Err)
			continue
		}
		if r.Ops == 0 || r.OpsPerSec() == 0 || r.Latency.Count() != uint64(r.Ops) || r.Bytes == 0 {
			t.Errorf("%s/%d: ops %d, ops/s %.0f, latencies %d, bytes %d", r.Workload, r.Clients, r.Ops, r.OpsPerSec(), r.Latency.Count(), r.Bytes)
		}
		if want := min(r.Clients, 2); r.Conns != want {
			t.Errorf("%s/%d: %d conns, want %d", r.Workload, r.Clients, r.Conns, want)
		}
	}
	var table bytes.Buffer
	WriteTable(&table, results, BaseEngine(cfg.Engines))
	for _, w := range WorkloadNames() {
		if !strings.Contains(table.String(), "== "+w+" ==") {
			t.Errorf("table lacks %s:\n%s", w, table.String())
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("cluster directories left behind: %v", entries)
	}
}

// TestSlowOpsLog: with SlowOps every cell logs its operations per second
// and the operations that took at least that long, with their start.
func TestSlowOpsLog(t *testing.T) {
	registerMemTest()
	var log bytes.Buffer
	cfg := Config{
		Engines:   []string{"mem-test"},
		Workloads: []string{"put"},
		Clients:   []int{2},
		Duration:  100 * time.Millisecond,
		Keys:      100,
		Dir:       t.TempDir(),
		Seed:      1,
		SlowOps:   time.Nanosecond,
		Log:       &log,
	}
	results := Run(context.Background(), cfg, nil)
	if len(results) != 1 || results[0].Err != nil {
		t.Fatalf("results %+v", results)
	}
	out := log.String()
	want := fmt.Sprintf("put/mem-test/2 clients: %d operations took 1ns or more; the slowest:", results[0].Ops)
	if !strings.Contains(out, "operations completed per second from") || !strings.Contains(out, want) || strings.Count(out, "  started ") != min(20, int(results[0].Ops)) {
		t.Fatalf("log lacks the slow operations (want %q):\n%s", want, out)
	}
}

// registerMemTest registers the in-memory "mem-test" engine (once).
func registerMemTest() {
	registerMem.Do(func() {
		Register("mem-test", func(context.Context, ClusterConfig) (Cluster, error) {
			return &memCluster{data: map[string][]byte{}}, nil
		})
	})
}

// TestRunRounds: with several rounds every cell is run once per round and
// the median round is reported, with each round's rate noted.
func TestRunRounds(t *testing.T) {
	registerMemTest()
	var starts []string
	var mu sync.Mutex
	cfg := Config{
		Engines:   []string{"mem-test"},
		Workloads: []string{"put"},
		Clients:   []int{1, 2},
		Duration:  50 * time.Millisecond,
		Keys:      100,
		Dir:       t.TempDir(),
		Rounds:    3,
		Log: writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			if s := string(p); strings.Contains(s, "round ") {
				starts = append(starts, strings.TrimSpace(s))
			}
			return len(p), nil
		}),
	}
	var emitted int
	results := Run(context.Background(), cfg, func(Result) { emitted++ })
	if len(results) != 2 || emitted != 2 || len(starts) != 3 {
		t.Fatalf("%d results, %d emitted, rounds started %q; want 2, 2 and 3 rounds", len(results), emitted, starts)
	}
	for _, r := range results {
		if r.Err != nil || len(r.Notes) == 0 || !strings.Contains(r.Notes[len(r.Notes)-1], "median of 3 rounds") {
			t.Fatalf("%d clients: err %v, notes %q", r.Clients, r.Err, r.Notes)
		}
	}
}

func TestMedianRounds(t *testing.T) {
	res := func(clients int, ops int64) Result {
		return Result{Clients: clients, Ops: ops, Elapsed: time.Second, Latency: &storagebench.Histogram{}}
	}
	rounds := [][]Result{
		{res(1, 300), res(8, 10)},
		{res(1, 100), res(8, 30)},
		{res(1, 200), res(8, 20)},
	}
	got := medianRounds(rounds)
	if len(got) != 2 || got[0].Ops != 200 || got[1].Ops != 20 {
		t.Fatalf("medians %+v; want 200 and 20 ops", got)
	}
	if n := got[0].Notes[0]; n != "median of 3 rounds; ops/s by round: 300, 100, 200" {
		t.Fatalf("note %q", n)
	}
	failed := res(8, 0)
	failed.Err = errors.New("boom")
	rounds[1][1] = failed
	if got := medianRounds(rounds); got[1].Err == nil {
		t.Fatalf("a failed round must be reported: %+v", got[1])
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestEtcdCluster starts a real 3-member etcd cluster (member processes of
// this test binary) and runs a tiny get and ycsb-e.
func TestEtcdCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd processes")
	}
	runTinyCluster(t, "etcd", []string{"get", "ycsb-e"})
}

// TestShaleCluster builds shale-server (or uses --shale-server's binary via
// SHALE_BENCH_SERVER), starts a real 3-node cluster and runs a tiny put,
// get and ycsb-e.
func TestShaleCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shale-server and starts three processes")
	}
	SetShaleOptions(ShaleOptions{ServerPath: os.Getenv("SHALE_BENCH_SERVER")})
	t.Cleanup(CleanupShaleServer)
	log := runTinyCluster(t, "shale", []string{"put", "get", "ycsb-e"})
	if !strings.Contains(log, "leader 3") {
		t.Errorf("no shard led by node 3 after the leader moves; log:\n%s", log)
	}
}

// TestShaleClusterSecured runs the smallest comparison of plaintext and
// secured Shale (what shale-bench cluster --tls --auth --quick runs, made
// tiny): both report every cell without error, side by side with the
// ratios; and a secured cluster refuses plaintext and anonymous clients,
// so the secured cells did run with TLS and auth.
func TestShaleClusterSecured(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shale-server and starts three processes, three times")
	}
	SetShaleOptions(ShaleOptions{ServerPath: os.Getenv("SHALE_BENCH_SERVER")})
	t.Cleanup(CleanupShaleServer)
	secured := ShaleEngineName(ShaleSecurity{TLS: true, Auth: true})
	if secured != "shale+tls+auth" {
		t.Fatalf("secured engine %q", secured)
	}
	if _, err := ParseEngines("shale," + secured); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(EngineNames(), secured) {
		t.Errorf("EngineNames() = %v: a variant is not a default engine", EngineNames())
	}
	cfg := tinyConfig(t, []string{"shale", secured}, []string{"put", "get"})
	var log bytes.Buffer
	cfg.Log = &log
	results := Run(context.Background(), cfg, nil)
	if len(results) != 8 {
		t.Fatalf("%d results, want 8; log:\n%s", len(results), log.String())
	}
	for _, r := range results {
		if r.Err != nil || r.Ops == 0 || r.Latency.Count() != uint64(r.Ops) {
			t.Errorf("%s/%s/%d: ops %d, err %v", r.Engine, r.Workload, r.Clients, r.Ops, r.Err)
		}
		if _, err := os.Stat("/proc/self/stat"); err == nil && r.ServerCPU <= 0 {
			t.Errorf("%s/%s/%d: no server CPU time measured", r.Engine, r.Workload, r.Clients)
		}
	}
	if !strings.Contains(log.String(), "auth enabled") {
		t.Errorf("the secured cluster's log does not say auth was enabled:\n%s", log.String())
	}
	var table bytes.Buffer
	WriteTable(&table, results, BaseEngine(cfg.Engines))
	out := table.String()
	for _, want := range []string{"== put ==", "== get ==", "== " + secured + " ÷ shale ==", "CPU µs/op"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, wl := range []string{"put", "get"} {
		for _, c := range []string{"1", "8"} {
			if !regexp.MustCompile(`(?m)^\s*`+c+`\s+shale\s+\d`).MatchString(sectionOf(out, wl)) ||
				!regexp.MustCompile(`(?m)^\s*`+c+`\s+shale\+tls\+auth\s+\d`).MatchString(sectionOf(out, wl)) ||
				!regexp.MustCompile(`(?m)^\s*`+wl+`\s+`+c+`\s+\d+\.\d\dx`).MatchString(out) {
				t.Errorf("%s/%s clients: a row or ratio is missing:\n%s", wl, c, out)
			}
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", log.String())
	}

	// A secured cluster refuses plaintext and anonymous clients.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := Start(ctx, secured, ClusterConfig{Dir: t.TempDir(), Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	sc := cl.(*shaleCluster)
	key := AppendKey(nil, 1)
	kv, err := cl.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	if err := kv.Put(ctx, key, []byte("v")); err != nil {
		t.Fatalf("put as %s: %v", BenchUser, err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	anon, err := sc.nodes.newClient(rctx, sc.nodes.Endpoints, "", "", nil)
	if err == nil { // New may already be refused
		_, err = anon.Get(rctx, key)
		anon.Close()
	}
	if !errors.Is(err, shaleclient.ErrUnauthenticated) {
		t.Errorf("get without credentials: %v, want ErrUnauthenticated", err)
	}
	if plain, err := shaleclient.New(rctx, sc.nodes.Endpoints); err == nil {
		_, err = plain.Get(rctx, key)
		plain.Close()
		if err == nil {
			t.Error("a plaintext client read from the TLS cluster")
		}
	}
}

// sectionOf is the part of a WriteTable output under "== name ==".
func sectionOf(table, name string) string {
	_, rest, _ := strings.Cut(table, "== "+name+" ==")
	sec, _, _ := strings.Cut(rest, "\n== ")
	return sec
}

// tinyConfig is a run of the given engines and workloads at 1 and 8
// clients for 300 ms each, on 200 keys, in a temporary directory.
func tinyConfig(t *testing.T, engines, workloads []string) Config {
	return Config{
		Engines:   engines,
		Workloads: workloads,
		Clients:   []int{1, 8},
		Duration:  300 * time.Millisecond,
		Keys:      200,
		Dir:       t.TempDir(),
		Seed:      1,
	}
}

// runTinyCluster runs the workloads on a fresh cluster of engine at 1 and
// 8 clients for 300 ms each, checks that every cell did operations without
// error, and returns the run's log.
func runTinyCluster(t *testing.T, engine string, workloads []string) string {
	t.Helper()
	cfg := tinyConfig(t, []string{engine}, workloads)
	var log bytes.Buffer
	cfg.Log = &log
	results := Run(context.Background(), cfg, func(Result) {})
	if want := 2 * len(workloads); len(results) != want {
		t.Fatalf("%d results, want %d; log:\n%s", len(results), want, log.String())
	}
	for _, r := range results {
		if r.Err != nil || r.Ops == 0 {
			t.Errorf("%s/%d: ops %d, err %v", r.Workload, r.Clients, r.Ops, r.Err)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", log.String())
	}
	return log.String()
}

func TestIdleSplits(t *testing.T) {
	if got := IdleSplits(1); got != "" {
		t.Errorf("IdleSplits(1) = %q, want empty", got)
	}
	if got := IdleSplits(4); got != "k1,k2,k3" {
		t.Errorf("IdleSplits(4) = %q", got)
	}
	keys := strings.Split(IdleSplits(1000), ",")
	if len(keys) != 999 || keys[0] != "k001" || keys[998] != "k999" || !sort.StringsAreSorted(keys) {
		t.Errorf("IdleSplits(1000): %d keys from %s to %s, sorted %v", len(keys), keys[0], keys[len(keys)-1], sort.StringsAreSorted(keys))
	}
}

func TestCPUTicks(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	a, err := cpuTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	b, err := cpuTicks(os.Getpid())
	if err != nil || b <= a {
		t.Errorf("CPU ticks %d then %d (%v) after 300 ms of spinning (%d)", a, b, err, x)
	}
}
