package cluster

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// TestRunWatch runs a tiny watch benchmark on real etcd and Shale clusters:
// every due event is delivered and timed, on both engines.
func TestRunWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd and three shale-server processes")
	}
	SetShaleOptions(ShaleOptions{ServerPath: os.Getenv("SHALE_BENCH_SERVER")})
	t.Cleanup(CleanupShaleServer)
	var log bytes.Buffer
	cfg := WatchConfig{
		Engines:   []string{"etcd", "shale"},
		Watchers:  []int{3},
		Conns:     2,
		Rate:      100,
		Writers:   4,
		ValueSize: 32,
		Duration:  time.Second,
		Dir:       t.TempDir(),
		Log:       &log,
	}
	results := RunWatch(context.Background(), cfg, nil)
	if len(results) != 2 {
		t.Fatalf("%d results, want 2; log:\n%s", len(results), log.String())
	}
	for _, r := range results {
		if r.Err != nil {
			t.Fatalf("%s: %v; log:\n%s", r.Engine, r.Err, log.String())
		}
		if r.Puts < 50 || r.Expected != 3*r.Puts || r.Delivered != r.Expected || r.Latency.Count() != uint64(r.Delivered) {
			t.Errorf("%s: %d puts, %d of %d events delivered, %d latencies", r.Engine, r.Puts, r.Delivered, r.Expected, r.Latency.Count())
		}
		if r.Latency.Quantile(0.5) <= 0 || r.EventsPerSec() <= 0 {
			t.Errorf("%s: p50 %s, %.0f events/s", r.Engine, r.Latency.Quantile(0.5), r.EventsPerSec())
		}
	}
}
