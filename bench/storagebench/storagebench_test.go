package storagebench

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	// Buckets are contiguous, increasing, and hold their values.
	prevHi := uint64(0)
	for i := 0; i < histBuckets; i++ {
		lo, hi := bucketBounds(i)
		if i > 0 && lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		if bucketOf(lo) != i || bucketOf(hi) != i {
			t.Fatalf("bucket %d [%d, %d] maps back to %d, %d", i, lo, hi, bucketOf(lo), bucketOf(hi))
		}
		if lo > 0 && float64(hi-lo) > float64(lo)/float64(1<<histSubBits) {
			t.Fatalf("bucket %d [%d, %d] wider than 1/64 of its values", i, lo, hi)
		}
		prevHi = hi
		if hi == ^uint64(0) {
			break
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([]int64, 100000)
	for i := range vals {
		vals[i] = int64(rng.ExpFloat64() * 5000)
		h.Record(time.Duration(vals[i]))
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		want := float64(vals[int(q*float64(len(vals)))-1])
		got := float64(h.Quantile(q))
		if d := (got - want) / want; d > 0.02 || d < -0.02 {
			t.Errorf("q%.3f = %.0f, want %.0f (±2%%)", q, got, want)
		}
	}
	if h.Max() != time.Duration(vals[len(vals)-1]) || h.Min() != time.Duration(vals[0]) {
		t.Errorf("min/max %v/%v, want %v/%v", h.Min(), h.Max(), vals[0], vals[len(vals)-1])
	}
	var h2 Histogram
	h2.Merge(&h)
	if h2.Count() != h.Count() || h2.Quantile(0.99) != h.Quantile(0.99) {
		t.Errorf("merge changed the histogram")
	}
}

func TestMinOpsIn1s(t *testing.T) {
	r := &recorder{}
	base := time.Unix(1000, 0)
	r.start = base
	r.end = base.Add(3500 * time.Millisecond)
	r.perSec = []int64{10, 0, 7, 5}
	if m, z := r.minOpsIn1s(); m != 0 || z != 1 {
		t.Errorf("minOpsIn1s = %d, %d; want 0, 1", m, z)
	}
	r.perSec = []int64{10, 9, 7, 1}
	if m, z := r.minOpsIn1s(); m != 7 || z != 0 {
		t.Errorf("minOpsIn1s = %d, %d; want 7, 0 (partial last second left out)", m, z)
	}
	r.end = base.Add(300 * time.Millisecond)
	r.ops = 42
	if m, _ := r.minOpsIn1s(); m != 42 {
		t.Errorf("short run: minOpsIn1s = %d, want all 42 ops", m)
	}
}

func TestValueGenCompressibility(t *testing.T) {
	g := NewValueGen(100, newRand(1, 0))
	v := g.Next()
	if len(v) != 100 || !bytes.Equal(v[:50], v[50:]) {
		t.Fatalf("value is not half random, half repeated: %q", v)
	}
	if w := g.Next(); bytes.Equal(v, w) {
		t.Fatalf("consecutive values are equal")
	}
}

func TestKeys(t *testing.T) {
	k := NewKeyGen(16)
	a := string(k.Present(5))
	b := string(k.Absent(5))
	c := string(k.Present(6))
	if len(a) != 16 || !(a < b && b < c) {
		t.Fatalf("keys do not interleave: %x %x %x", a, b, c)
	}
}

func TestParse(t *testing.T) {
	if _, err := ParseEngines("shale,rocks"); err == nil {
		t.Error("unknown engine accepted")
	}
	e, err := ParseEngines(" pebble, shale,pebble")
	if err != nil || !slices.Equal(e, []string{"pebble", "shale"}) {
		t.Errorf("ParseEngines = %v, %v", e, err)
	}
	if _, err := ParseWorkloads("fillseq,nope"); err == nil {
		t.Error("unknown workload accepted")
	}
	w, err := ParseWorkloads(strings.Join(WorkloadNames(), ","))
	if err != nil || len(w) != 9 {
		t.Errorf("ParseWorkloads = %v, %v", w, err)
	}
}

// TestEveryWorkloadEveryEngine runs a tiny instance of every workload
// against every engine and checks the results and both output formats.
func TestEveryWorkloadEveryEngine(t *testing.T) {
	const num = 3000
	settings := DefaultSettings()
	settings.ShaleAtRestDelay = 20 * time.Millisecond
	cfg := Config{
		Engines:       append(EngineNames(), "shale-universal", "shale-vector"),
		Workloads:     WorkloadNames(),
		Settings:      settings,
		Dir:           t.TempDir(),
		Num:           num,
		Reads:         1000,
		KeySize:       16,
		ValueSize:     100,
		Seed:          7,
		SettleTimeout: 10 * time.Second,
		HangTimeout:   2 * time.Minute,
		OnHang:        func() { panic("benchmark hung") },
	}
	var jsonOut bytes.Buffer
	results := Run(cfg, func(r Result) {
		if err := WriteJSONLine(&jsonOut, r); err != nil {
			t.Error(err)
		}
	})
	if len(results) != len(cfg.Engines)*len(cfg.Workloads) {
		t.Fatalf("%d results", len(results))
	}
	for i, r := range results {
		// Engines are interleaved per workload.
		if r.Workload != cfg.Workloads[i/len(cfg.Engines)] || r.Engine != cfg.Engines[i%len(cfg.Engines)] {
			t.Errorf("result %d is %s/%s", i, r.Workload, r.Engine)
		}
		if r.Err != nil {
			t.Errorf("%s/%s: %v", r.Workload, r.Engine, r.Err)
			continue
		}
		wantOps := int64(num)
		if r.Workload == ReadRandom || r.Workload == ReadRandom50 || r.Workload == SeekRandom || r.Workload == MultiGet {
			wantOps = 1000
		}
		if r.Ops != wantOps || r.OpsPerSec() <= 0 || r.MBPerSec() <= 0 || r.Latency.Count() == 0 {
			t.Errorf("%s/%s: ops %d (want %d), %.0f ops/s, %.1f MB/s, %d latencies",
				r.Workload, r.Engine, r.Ops, wantOps, r.OpsPerSec(), r.MBPerSec(), r.Latency.Count())
		}
		if r.Workload == Overwrite {
			if r.SpaceAmp < 1 || r.DiskOverLogical <= 0 {
				t.Errorf("%s/%s: space amp %.2f, disk/logical %.2f", r.Workload, r.Engine, r.SpaceAmp, r.DiskOverLogical)
			}
		} else if r.SpaceAmp != 0 || r.DiskOverLogical != 0 {
			t.Errorf("%s/%s: space amplification measured", r.Workload, r.Engine)
		}
		// Every written byte is flushed once at least (the values are only
		// half compressible), and no engine writes 20 times over at this
		// size; the reads measure none.
		if writes := (IsFill(r.Workload) || r.Workload == Overwrite) && r.Engine != "goleveldb"; writes != (r.SSTWriteAmp > 0.3 && r.SSTWriteAmp < 20) {
			t.Errorf("%s/%s: SST write amplification %.2f", r.Workload, r.Engine, r.SSTWriteAmp)
		}
	}

	lines := strings.Split(strings.TrimSpace(jsonOut.String()), "\n")
	if len(lines) != len(results) {
		t.Fatalf("%d JSON lines for %d results", len(lines), len(results))
	}
	wantFields := []string{"disk_over_logical", "engine", "max_us", "mb_per_sec", "min_ops_in_1s",
		"ops_in_each_1s", "ops_per_sec", "p50_us", "p9999_us", "p999_us", "p99_us", "space_amp", "sst_write_amp", "workload"}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if !slices.Equal(keys, wantFields) {
			t.Fatalf("JSON fields %v, want %v", keys, wantFields)
		}
	}

	var table bytes.Buffer
	WriteTable(&table, results, "shale")
	out := table.String()
	for _, want := range append(WorkloadNames(), "shale/engine", "shale metrics:", "geomean") {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
