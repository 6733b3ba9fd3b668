package server

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// TestCallWorkersReuseIdleWorkers: calls made one after another run on the
// same few workers, not on a goroutine each (whose fresh stack a put's
// handler had to grow every time).
func TestCallWorkersReuseIdleWorkers(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	w := newCallWorkers(time.Minute, stop)
	const calls = 1000
	done := make(chan struct{})
	for range calls {
		w.run(func() { done <- struct{}{} })
		<-done
	}
	// A call made while the last worker has not yet gone back to wait
	// starts another one, which then waits too: a few at most.
	if n := w.started.Load(); n > calls/10 {
		t.Fatalf("%d calls one after another started %d workers", calls, n)
	}
}

// TestCallWorkersNeverQueue: a call never waits for another to finish: calls
// that each block until all of them run complete (a pool of fixed size
// would hold some back and never finish).
func TestCallWorkersNeverQueue(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	w := newCallWorkers(time.Minute, stop)
	const calls = 300
	var running, finished sync.WaitGroup
	running.Add(calls)
	finished.Add(calls)
	for range calls {
		w.run(func() {
			defer finished.Done()
			running.Done()
			running.Wait()
		})
	}
	all := make(chan struct{})
	go func() { finished.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d calls that wait for each other did not all run (%d workers)", calls, w.started.Load())
	}
	if n := w.started.Load(); n < calls {
		t.Fatalf("%d calls in flight at once ran on %d workers", calls, n)
	}
}

// TestCallWorkersEnd: a worker ends once it has been idle for its idle
// time, and an idle worker ends when the node stops; a call made after
// the stop still runs.
func TestCallWorkersEnd(t *testing.T) {
	waitLive := func(w *callWorkers, want int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); w.live.Load() != want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d workers live, want %d", w.live.Load(), want)
			}
		}
	}
	stop := make(chan struct{})
	defer close(stop)
	w := newCallWorkers(20*time.Millisecond, stop)
	ran := make(chan struct{}, 1)
	w.run(func() { ran <- struct{}{} })
	<-ran
	waitLive(w, 0)

	stop2 := make(chan struct{})
	w = newCallWorkers(time.Hour, stop2)
	w.run(func() { ran <- struct{}{} })
	<-ran
	if n := w.live.Load(); n != 1 {
		t.Fatalf("%d workers live after a call with an hour's idle time, want 1", n)
	}
	close(stop2)
	waitLive(w, 0)
	w.run(func() { ran <- struct{}{} })
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("a call made after the stop did not run")
	}
	waitLive(w, 0)
}

// TestCallCounters: the cached counters count into the same series as the
// vector's WithLabelValues, made on the first count (no series for a code
// never counted), and a name or code outside the cache still counts.
func TestCallCounters(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls_total"}, []string{"method", "code"})
	c := newCallCounters(vec)
	for range 3 {
		c.inc("Get", codes.OK)
	}
	c.inc("Put", codes.Unavailable)
	c.inc("unknown", codes.InvalidArgument)
	c.inc("NotAMethod", codes.OK)
	c.inc("Get", codes.Code(99))
	want := map[[2]string]float64{
		{"Get", "OK"}: 3, {"Put", "Unavailable"}: 1, {"unknown", "InvalidArgument"}: 1,
		{"NotAMethod", "OK"}: 1, {"Get", codes.Code(99).String()}: 1,
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(vec)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[[2]string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var k [2]string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "method":
					k[0] = l.GetValue()
				case "code":
					k[1] = l.GetValue()
				}
			}
			got[k] = m.GetCounter().GetValue()
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("series %v, want %v", got, want)
	}
}
