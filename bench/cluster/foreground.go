package cluster

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	shaleclient "github.com/shale-db/shale/client"
)

// foreground is an open-loop put load at a steady rate: a dispatcher hands
// out one send time per 1/rate, and workers put a fresh key for each. A
// put's latency counts from its send time, not from when a worker got to
// it, so a stalled cluster shows as latency rather than as fewer puts (no
// coordinated omission). It records every put, so that windows (before a
// rebalance, during it) can be cut afterwards.
type foreground struct {
	cli       *shaleclient.Client
	rate      int
	valueSize int
	first     uint64 // key index of the first put

	mu   sync.Mutex
	puts []fgPut

	cancel context.CancelFunc
	done   chan struct{}
}

// fgPut is one foreground put: when it was due, how long it took from
// then, and whether it failed.
type fgPut struct {
	at      time.Time
	latency time.Duration
	failed  bool
}

// fgWorkers is the number of goroutines sending the foreground puts; at
// the rates used (hundreds a second) they are never all busy unless the
// cluster stalls.
const fgWorkers = 32

// startForeground starts rate puts a second of valueSize-byte values under
// AppendKey(first), AppendKey(first+1), ... until stop.
func startForeground(ctx context.Context, cli *shaleclient.Client, rate, valueSize int, first uint64) *foreground {
	ctx, cancel := context.WithCancel(ctx)
	f := &foreground{cli: cli, rate: rate, valueSize: valueSize, first: first, cancel: cancel, done: make(chan struct{})}
	due := make(chan time.Time, 4*rate+fgWorkers)
	var wg sync.WaitGroup
	for w := range fgWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), first))
			val := make([]byte, valueSize)
			key := make([]byte, 0, KeySize)
			for at := range due {
				for i := range val {
					val[i] = byte('a' + rnd.IntN(26))
				}
				f.mu.Lock()
				i := f.first + uint64(len(f.puts))
				f.puts = append(f.puts, fgPut{at: at})
				k := len(f.puts) - 1
				f.mu.Unlock()
				key = AppendKey(key[:0], i)
				pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := cli.Put(pctx, key, val)
				pcancel()
				lat := time.Since(at)
				f.mu.Lock()
				f.puts[k].latency, f.puts[k].failed = lat, err != nil && ctx.Err() == nil
				f.mu.Unlock()
			}
		}()
	}
	go func() {
		defer close(f.done)
		defer wg.Wait()
		defer close(due)
		interval := time.Second / time.Duration(rate)
		next := time.Now()
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			for !next.After(now) {
				select {
				case due <- next:
				default: // every worker stuck for seconds: the puts count as late when sent
				}
				next = next.Add(interval)
			}
			t.Reset(next.Sub(now))
		}
	}()
	return f
}

// stop ends the load and waits for the puts in flight.
func (f *foreground) stop() {
	f.cancel()
	<-f.done
}

// FgWindow is the foreground puts due in one window of time: how many,
// how many failed, and their latency percentiles (from the due time to
// the answer, in milliseconds).
type FgWindow struct {
	Seconds float64 `json:"seconds"`
	Puts    int     `json:"puts"`
	Failed  int     `json:"failed"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	Maxms   float64 `json:"max_ms"`
}

// window summarizes the puts due in [from, to) that have finished.
func (f *foreground) window(from, to time.Time) FgWindow {
	f.mu.Lock()
	var lats []time.Duration
	w := FgWindow{Seconds: round(to.Sub(from).Seconds(), 2)}
	for _, p := range f.puts {
		if p.at.Before(from) || !p.at.Before(to) || p.latency == 0 {
			continue
		}
		w.Puts++
		if p.failed {
			w.Failed++
		}
		lats = append(lats, p.latency)
	}
	f.mu.Unlock()
	if len(lats) == 0 {
		return w
	}
	slices.Sort(lats)
	q := func(p float64) float64 {
		i := min(len(lats)-1, int(p*float64(len(lats))))
		return round(float64(lats[i])/1e6, 2)
	}
	w.P50ms, w.P99ms, w.Maxms = q(0.50), q(0.99), round(float64(lats[len(lats)-1])/1e6, 2)
	return w
}

// writeTrace writes every finished put as a line "due_ms latency_ms
// failed", due_ms counted from zero, to path.
func (f *foreground) writeTrace(path string, zero time.Time) error {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("foreground trace: %w", err)
	}
	w := bufio.NewWriter(out)
	f.mu.Lock()
	for _, p := range f.puts {
		if p.latency > 0 {
			fmt.Fprintf(w, "%.1f %.2f %v\n", float64(p.at.Sub(zero))/1e6, float64(p.latency)/1e6, p.failed)
		}
	}
	f.mu.Unlock()
	if err := w.Flush(); err != nil {
		out.Close()
		return fmt.Errorf("foreground trace: %w", err)
	}
	return out.Close()
}
