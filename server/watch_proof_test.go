package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// TestWatchProof is issue 6's watch proof: with concurrent writers on both
// shards of the key space, a leader killed and restarted, a split, and a
// stream dropped as too slow (so the client reconnects and resumes), an
// SDK watch of the whole key space sees every acknowledged write exactly
// once, each key's changes in revision order, and nothing that was never
// written.
func TestWatchProof(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{
		Splits: [][]byte{[]byte("m")},
		Configure: func(cfg *server.Config) {
			cfg.WatchQueueBytes = 64 << 10 // small: a paused consumer gets its stream dropped
		},
	})
	cl := newClient(t, c)
	// Fixed flow-control windows (no growth by bandwidth estimation), so
	// that a paused consumer soon stops the server's sends.
	ends := &streamEnds{codes: map[codes.Code]int{}}
	wcl, err := client.New(context.Background(), c.Endpoints(), client.WithLogger(slog.New(ends)),
		client.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)))
	if err != nil {
		t.Fatal(err)
	}
	defer wcl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	// From revision 1 of every shard (a fresh cluster: all of its
	// history): a watch with no start revision starts where each shard is
	// when the watch's stream reaches it, which may be after the writers'
	// first puts (chaos/README bug 32).
	events := wcl.Watch(wctx, nil, nil, client.WithStartRevision(1))

	// The watcher: per key, the values seen in order, with revisions.
	type seen struct {
		value string
		rev   uint64
	}
	var (
		mu      sync.Mutex
		got     = map[string][]seen{}
		pause   = make(chan struct{})
		resume  = make(chan struct{})
		werr    error
		wdone   = make(chan struct{})
		nEvents int
	)
	go func() {
		defer close(wdone)
		pause := pause
		for resp := range events {
			if resp.Err != nil {
				mu.Lock()
				werr = resp.Err
				mu.Unlock()
				return
			}
			mu.Lock()
			for _, e := range resp.Events {
				if e.Type != client.EventPut {
					werr = fmt.Errorf("unexpected %v event on %q", e.Type, e.KV.Key)
				}
				k := string(e.KV.Key)
				got[k] = append(got[k], seen{string(e.KV.Value), e.KV.ModRevision})
				nEvents++
			}
			mu.Unlock()
			select {
			case <-pause: // stop reading until the server drops a stream
				select {
				case <-resume:
				case <-wctx.Done():
				}
				pause = nil
			default:
			}
		}
	}()

	// Writers: each owns keys on both sides of "m" (and of the later
	// split at "s") and writes increasing values to them.
	type ack struct {
		key   string
		value int
		rev   uint64
	}
	const writers = 4
	// Values are padded so that a paused consumer's stream fills the
	// flow-control windows and the server's queue.
	padding := strings.Repeat(".", 512)
	var (
		wg      sync.WaitGroup
		acksMu  sync.Mutex
		acked   []ack
		tried   = map[string]int{} // key -> highest value attempted
		stopWrt = make(chan struct{})
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := []string{fmt.Sprintf("a/%d", w), fmt.Sprintf("p/%d", w), fmt.Sprintf("x/%d", w), fmt.Sprintf("z/%d", w)}
			for i := 1; ; i++ {
				select {
				case <-stopWrt:
					return
				default:
				}
				k := keys[i%len(keys)]
				acksMu.Lock()
				tried[k] = i
				acksMu.Unlock()
				pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
				r, err := cl.Put(pctx, []byte(k), []byte(strconv.Itoa(i)+"|"+padding))
				pcancel()
				if err == nil {
					acksMu.Lock()
					acked = append(acked, ack{k, i, r.Revision})
					acksMu.Unlock()
				}
			}
		}()
	}
	time.Sleep(time.Second)
	// A leader killed and restarted.
	victim := c.Leader(shardOf(t, c, []byte("x")))
	c.Stop(victim)
	time.Sleep(time.Second)
	c.Restart(victim)
	time.Sleep(time.Second)
	// A split of the right shard at "s".
	if _, _, err := cl.SplitShard(ctx, []byte("s")); err != nil {
		t.Fatalf("split: %v", err)
	}
	time.Sleep(time.Second)
	// A consumer that stops reading: its stream is dropped, and resumed.
	// It reads again once a node has cancelled its watcher as too slow,
	// which takes as long as the writers need to fill the stream's queue.
	close(pause)
	dropped := waitFor(t, 60*time.Second, func() (bool, string) {
		return watchTooSlow(t, c) > 0, "no watcher cancelled as too slow"
	})
	close(resume)
	t.Logf("a watcher was cancelled as too slow %v after the consumer paused", dropped)
	time.Sleep(time.Second)
	close(stopWrt)
	wg.Wait()

	// Wait until every acknowledged write has been seen.
	acksMu.Lock()
	want := map[string]int{} // key -> highest acknowledged value
	for _, a := range acked {
		want[a.key] = max(want[a.key], a.value)
	}
	acksMu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		done := true
		for k, v := range want {
			s := got[k]
			if len(s) == 0 || mustAtoi(t, s[len(s)-1].value) < v {
				done = false
			}
		}
		err := werr
		mu.Unlock()
		if err != nil {
			t.Fatalf("watch ended: %v", err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			var lag []string
			for k, v := range want {
				last := "none"
				if s := got[k]; len(s) > 0 {
					last = fmt.Sprintf("%s@%d", s[len(s)-1].value, s[len(s)-1].rev)
				}
				lag = append(lag, fmt.Sprintf("%s: acked %d, seen %s", k, v, last))
			}
			mu.Unlock()
			t.Fatalf("the watcher did not see every acknowledged write within 60s: %v", lag)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wcancel()
	<-wdone

	mu.Lock()
	defer mu.Unlock()
	acksMu.Lock()
	defer acksMu.Unlock()
	seenAt := map[string]map[int]uint64{}
	for k, s := range got {
		seenAt[k] = map[int]uint64{}
		for i, e := range s {
			v := mustAtoi(t, e.value)
			if _, dup := seenAt[k][v]; dup {
				t.Fatalf("%s=%d delivered twice", k, v)
			}
			if i > 0 && (e.rev <= s[i-1].rev || v <= mustAtoi(t, s[i-1].value)) {
				t.Fatalf("%s: %s@%d after %s@%d: out of order", k, e.value, e.rev, s[i-1].value, s[i-1].rev)
			}
			if v > tried[k] {
				t.Fatalf("%s=%d delivered, never written", k, v)
			}
			seenAt[k][v] = e.rev
		}
	}
	for _, a := range acked {
		rev, ok := seenAt[a.key][a.value]
		if !ok {
			t.Fatalf("acknowledged write %s=%d (revision %d) never delivered", a.key, a.value, a.rev)
		}
		if rev != a.rev {
			t.Fatalf("%s=%d delivered at revision %d, acknowledged at %d", a.key, a.value, rev, a.rev)
		}
	}
	// The disruptions reached the watch: streams ended on the stopping
	// leader (Unavailable) and as too slow (ResourceExhausted).
	ends.mu.Lock()
	defer ends.mu.Unlock()
	if ends.codes[codes.Unavailable] == 0 || ends.codes[codes.ResourceExhausted] == 0 {
		t.Fatalf("watch streams ended with %v; want Unavailable (the killed leader) and ResourceExhausted (the paused consumer)", ends.codes)
	}
	t.Logf("%d acknowledged writes, %d events, all delivered once in order; streams ended and resumed: %v", len(acked), nEvents, ends.codes)
}

// watchTooSlow sums the running nodes' counts of watchers cancelled as too
// slow (their shale_watch_too_slow_total metric).
func watchTooSlow(t *testing.T, c *testcluster.Cluster) float64 {
	t.Helper()
	var sum float64
	for _, id := range c.NodeIDs() {
		n := c.Node(id)
		if n == nil {
			continue
		}
		mfs, err := n.Metrics().Gather()
		if err != nil {
			t.Fatalf("node %d metrics: %v", id, err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "shale_watch_too_slow_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// streamEnds is a log handler counting, by status code, the watch streams
// the client saw end (its "watch stream ended" debug records).
type streamEnds struct {
	mu    sync.Mutex
	codes map[codes.Code]int
}

func (h *streamEnds) Enabled(context.Context, slog.Level) bool { return true }
func (h *streamEnds) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *streamEnds) WithGroup(string) slog.Handler            { return h }
func (h *streamEnds) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "shale client: watch stream ended" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "err" {
			h.mu.Lock()
			h.codes[status.Code(err)]++
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

// mustAtoi parses a written value: its number, before the padding.
func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	s, _, _ = strings.Cut(s, "|")
	v, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("value %q: %v", s, err)
	}
	return v
}
