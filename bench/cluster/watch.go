package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	shaleclient "github.com/shale-db/shale/client"

	"github.com/shale-db/shale/bench/storagebench"
)

// Watcher is a KV whose engine has change feeds.
type Watcher interface {
	// WatchPrefix calls fn with the key and value of every put under
	// prefix, from one goroutine, until ctx ends or the watch fails (its
	// error is returned then; nil when ctx ended).
	WatchPrefix(ctx context.Context, prefix []byte, fn func(key, value []byte)) error
}

// WatchPrefix implements Watcher with an etcd watch.
func (kv etcdKV) WatchPrefix(ctx context.Context, prefix []byte, fn func(key, value []byte)) error {
	for resp := range kv.cli.Watch(ctx, string(prefix), clientv3.WithPrefix()) {
		if err := resp.Err(); err != nil {
			return err
		}
		for _, e := range resp.Events {
			if e.Type == clientv3.EventTypePut {
				fn(e.Kv.Key, e.Kv.Value)
			}
		}
	}
	return nil
}

// WatchPrefix implements Watcher with the SDK's watch.
func (kv shaleKV) WatchPrefix(ctx context.Context, prefix []byte, fn func(key, value []byte)) error {
	for resp := range kv.c.Watch(ctx, nil, nil, shaleclient.WithWatchPrefix(prefix)) {
		if resp.Err != nil {
			return resp.Err
		}
		for _, e := range resp.Events {
			if e.Type == shaleclient.EventPut {
				fn(e.KV.Key, e.KV.Value)
			}
		}
	}
	return nil
}

// WatchConfig configures RunWatch.
type WatchConfig struct {
	Engines []string
	// Watchers are the numbers of watchers to measure, each on a fresh
	// cluster.
	Watchers []int
	// Conns is the number of client connections the watchers share
	// (round robin).
	Conns int
	// Rate is the puts per second of the steady write stream, by Writers
	// concurrent writers.
	Rate    int
	Writers int
	// ValueSize is the size of each value (at least 8: the put's send
	// time).
	ValueSize int
	// Duration is the timed phase.
	Duration time.Duration
	// Dir holds the clusters' data, removed after each run unless Keep.
	Dir  string
	Keep bool
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// WatchResult is one (engine, watchers) cell.
type WatchResult struct {
	Engine   string
	Watchers int
	// Puts were acknowledged in the timed phase; Expected = Puts ×
	// Watchers events were due, Delivered arrived by the end of the drain.
	Puts, Expected, Delivered int64
	Elapsed                   time.Duration
	// Latency is put-sent-to-event-received, over every delivered event.
	Latency *storagebench.Histogram
	Err     error
}

// EventsPerSec is the events delivered per second of the timed phase.
func (r *WatchResult) EventsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Delivered) / r.Elapsed.Seconds()
}

// watchPrefix is where the benchmark writes and watches.
const watchPrefix = "w/"

// RunWatch measures change-feed delivery: for every engine and number of
// watchers, a fresh cluster, that many watchers of one prefix, and a
// steady stream of puts under it; each watcher records the time from each
// put's sending to its event's arrival.
func RunWatch(ctx context.Context, cfg WatchConfig, emit func(WatchResult)) []WatchResult {
	if cfg.Conns <= 0 {
		cfg.Conns = 4
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 16
	}
	cfg.ValueSize = max(cfg.ValueSize, 8)
	var out []WatchResult
	for _, n := range cfg.Watchers {
		for _, engine := range cfg.Engines {
			if ctx.Err() != nil {
				return out
			}
			r := runWatchCell(ctx, &cfg, engine, n)
			if r.Err != nil && ctx.Err() != nil {
				return out
			}
			out = append(out, r)
			if emit != nil {
				emit(r)
			}
		}
	}
	return out
}

func runWatchCell(ctx context.Context, cfg *WatchConfig, engine string, watchers int) WatchResult {
	res := WatchResult{Engine: engine, Watchers: watchers, Latency: &storagebench.Histogram{}}
	dir, err := filepath.Abs(filepath.Join(cfg.Dir, fmt.Sprintf("watch-%s-%d", engine, watchers)))
	if err == nil {
		err = os.RemoveAll(dir)
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		res.Err = err
		return res
	}
	runtime.GC()
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	cl, err := Start(startCtx, engine, ClusterConfig{Dir: dir, Members: 3, Log: cfg.Log})
	cancel()
	if err != nil {
		res.Err = fmt.Errorf("start: %w (data and logs kept in %s)", err, dir)
		return res
	}
	defer func() {
		if err := cl.Stop(); err != nil && res.Err == nil {
			res.Err = fmt.Errorf("stop: %w", err)
		}
		if res.Err == nil && !cfg.Keep {
			_ = os.RemoveAll(dir)
		}
	}()
	conns, err := openConns(ctx, cl, cfg.Conns)
	if err != nil {
		res.Err = err
		return res
	}
	defer closeConns(conns)
	writer, err := cl.Client(ctx)
	if err != nil {
		res.Err = err
		return res
	}
	defer writer.Close()

	// The watchers: each counts its events and records their latency.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	type watcherState struct {
		hist  storagebench.Histogram
		count atomic.Int64
		ready atomic.Bool
		mu    sync.Mutex
	}
	ws := make([]*watcherState, watchers)
	var wg sync.WaitGroup
	var werrMu sync.Mutex
	var werr error
	for i := range watchers {
		st := &watcherState{}
		ws[i] = st
		w, ok := conns[i%len(conns)].(Watcher)
		if !ok {
			res.Err = fmt.Errorf("%s has no watch", engine)
			return res
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := w.WatchPrefix(wctx, []byte(watchPrefix), func(key, value []byte) {
				if string(key) == watchPrefix+"ready" {
					st.ready.Store(true)
					return
				}
				if len(value) < 8 {
					return
				}
				sent := time.Unix(0, int64(binary.BigEndian.Uint64(value)))
				st.mu.Lock()
				st.hist.Record(time.Since(sent))
				st.mu.Unlock()
				st.count.Add(1)
			})
			if err != nil && wctx.Err() == nil {
				werrMu.Lock()
				werr = errors.Join(werr, err)
				werrMu.Unlock()
			}
		}()
	}
	// Every watcher established: each has seen a marker write.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := writer.Put(ctx, []byte(watchPrefix+"ready"), []byte("ready..")); err != nil {
			res.Err = fmt.Errorf("marker write: %w", err)
			return res
		}
		all := true
		for _, st := range ws {
			all = all && st.ready.Load()
		}
		if all {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			res.Err = errors.New("the watchers were not all established within 60s")
			return res
		}
		time.Sleep(100 * time.Millisecond)
	}
	cfg.logf("watch/%s/%d watchers: established; %d puts/s for %s", engine, watchers, cfg.Rate, cfg.Duration)

	// The steady put stream: Writers goroutines share the rate.
	var puts atomic.Int64
	var perr atomic.Pointer[error]
	start := time.Now()
	end := start.Add(cfg.Duration)
	interval := time.Duration(float64(time.Second) * float64(cfg.Writers) / float64(cfg.Rate))
	var pw sync.WaitGroup
	for w := range cfg.Writers {
		pw.Add(1)
		go func() {
			defer pw.Done()
			value := make([]byte, cfg.ValueSize)
			next := start.Add(time.Duration(w) * interval / time.Duration(cfg.Writers))
			for i := 0; ; i++ {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				if time.Now().After(end) || ctx.Err() != nil {
					return
				}
				next = next.Add(interval)
				binary.BigEndian.PutUint64(value, uint64(time.Now().UnixNano()))
				key := fmt.Sprintf("%s%02d-%06d", watchPrefix, w, i%1000)
				if err := writer.Put(ctx, []byte(key), value); err != nil {
					perr.CompareAndSwap(nil, &err)
					return
				}
				puts.Add(1)
			}
		}()
	}
	pw.Wait()
	res.Elapsed = time.Since(start)
	if p := perr.Load(); p != nil {
		res.Err = fmt.Errorf("put: %w", *p)
		return res
	}
	res.Puts = puts.Load()
	res.Expected = res.Puts * int64(watchers)
	// Drain: wait until every event arrived, at most 30s.
	drain := time.Now().Add(30 * time.Second)
	for time.Now().Before(drain) {
		var n int64
		for _, st := range ws {
			n += st.count.Load()
		}
		if n >= res.Expected {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wcancel()
	wg.Wait()
	for _, st := range ws {
		res.Delivered += st.count.Load()
		res.Latency.Merge(&st.hist)
	}
	if werr != nil {
		res.Err = werr
	}
	cfg.logf("watch/%s/%d watchers: %d puts, %d of %d events (%.0f events/s), p50 %s, p99 %s", engine, watchers,
		res.Puts, res.Delivered, res.Expected, res.EventsPerSec(), res.Latency.Quantile(0.5), res.Latency.Quantile(0.99))
	return res
}

func (c *WatchConfig) logf(format string, args ...any) { logLine(c.Log, format, args...) }
