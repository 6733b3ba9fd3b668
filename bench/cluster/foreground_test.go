package cluster

import (
	"testing"
	"time"
)

// TestForegroundWindow: a window counts the finished puts due inside it,
// failures included, and takes the percentiles over their latencies only.
func TestForegroundWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	f := &foreground{}
	for i := range 200 {
		// 100 puts due in [t0, t0+1s) taking 1..100 ms, then 100 in the
		// next second taking 1 s each.
		lat := time.Duration(i%100+1) * time.Millisecond
		if i >= 100 {
			lat = time.Second
		}
		f.puts = append(f.puts, fgPut{at: t0.Add(time.Duration(i) * 10 * time.Millisecond), latency: lat, failed: i == 5})
	}
	f.puts = append(f.puts, fgPut{at: t0.Add(500 * time.Millisecond)}) // still in flight: left out
	w := f.window(t0, t0.Add(time.Second))
	if w.Puts != 100 || w.Failed != 1 || w.P50ms != 51 || w.P99ms != 100 || w.Maxms != 100 || w.Seconds != 1 {
		t.Fatalf("first second: %+v", w)
	}
	w = f.window(t0.Add(time.Second), t0.Add(2*time.Second))
	if w.Puts != 100 || w.Failed != 0 || w.P99ms != 1000 {
		t.Fatalf("second second: %+v", w)
	}
	if w := f.window(t0.Add(time.Hour), t0.Add(2*time.Hour)); w.Puts != 0 || w.P99ms != 0 {
		t.Fatalf("empty window: %+v", w)
	}
}
