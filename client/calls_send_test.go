package client

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// senderBatches sums, over the client's connections, the KV.Calls
// messages their sender goroutines sent.
func senderBatches(c *Client) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, m := range c.muxes {
		if m != nil {
			n += m.senderBatches.Load()
		}
	}
	return n
}

// TestCallsSentByCaller: a call made while no send is under way on its
// KV.Calls stream is sent by its caller, not handed to the stream's sender
// goroutine (a wake-up and a wait for the scheduler per call, when one
// call is in flight on a connection); calls made while another is being
// sent are handed over and answered too.
func TestCallsSentByCaller(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	ctx := context.Background()
	cl, err := New(ctx, c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	before := senderBatches(cl)
	const gets = 50
	for range gets {
		if kv, err := cl.Get(ctx, []byte("k")); err != nil || string(kv.Value) != "v" {
			t.Fatalf("get: %v, %v", kv, err)
		}
	}
	if n := senderBatches(cl) - before; n != 0 {
		t.Fatalf("%d of %d sequential gets' messages sent by the sender goroutine; want 0", n, gets)
	}

	const workers, each = 32, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				k := fmt.Appendf(nil, "w%d/%d", w, i)
				if _, err := cl.Put(ctx, k, k); err != nil {
					errs <- fmt.Errorf("put %s: %w", k, err)
					return
				}
				if kv, err := cl.Get(ctx, k); err != nil || string(kv.Value) != string(k) {
					errs <- fmt.Errorf("get %s: %v, %v", k, kv, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d messages of %d concurrent calls sent by the sender goroutines", senderBatches(cl)-before, 2*workers*each)
}

// sendCountingStream is a KV.Calls stream that takes every message and
// answers none.
type sendCountingStream struct {
	shalev1.KV_CallsClient
	mu    sync.Mutex
	calls int
}

func (s *sendCountingStream) Send(b *shalev1.CallBatch) error {
	s.mu.Lock()
	s.calls += len(b.GetCalls())
	s.mu.Unlock()
	return nil
}

func (s *sendCountingStream) sent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// TestCallsHandedOffWhenManyWait: a caller sends its own call only while
// few calls wait on the stream (directSendMaxWaiting); with more in flight
// the node may have stopped reading the stream, a send could block past
// the caller's deadline, and the call goes to the sender goroutine.
func TestCallsHandedOffWhenManyWait(t *testing.T) {
	fake := &sendCountingStream{}
	m := &callMux{}
	s := &callStream{m: m, stream: fake, wake: make(chan struct{}, 1), waiting: map[uint64]waiter{}}
	go s.send()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		s.mu.Lock()
		s.err = context.Canceled
		s.mu.Unlock()
		s.wakeSender() // ends send
	}()
	waitSent := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for fake.sent() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls sent, want %d", fake.sent(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i := range directSendMaxWaiting + 3 {
		wg.Go(func() { _ = s.call(ctx, "Get", []byte("k"), &shalev1.GetResponse{}, nil, nil) })
		waitSent(i + 1)
		if i < directSendMaxWaiting && m.senderBatches.Load() != 0 {
			t.Fatalf("call %d (%d waiting) handed to the sender goroutine", i+1, i+1)
		}
	}
	if n := m.senderBatches.Load(); n == 0 {
		t.Fatalf("with %d calls waiting, no call was handed to the sender goroutine", directSendMaxWaiting+3)
	}
}

// TestCallsExpireAtAttemptDeadline: a call on the direct path fails with
// DeadlineExceeded at its attempt's deadline although its context's Done
// channel was never made (the stream's timer ends the wait), a call with a
// later deadline made first does not hold back one with an earlier
// deadline, and a cancellation of the attempt's parent ends the wait too.
func TestCallsExpireAtAttemptDeadline(t *testing.T) {
	fake := &sendCountingStream{}
	s := &callStream{m: &callMux{}, stream: fake, wake: make(chan struct{}, 1), waiting: map[uint64]waiter{}}
	defer func() {
		s.mu.Lock()
		s.err = context.Canceled
		if s.timer != nil {
			s.timer.Stop()
		}
		s.mu.Unlock()
	}()
	call := func(parent context.Context, d time.Duration) (error, time.Duration) {
		a := &attemptCtx{parent: parent, deadline: time.Now().Add(d), write: true}
		start := time.Now()
		err := s.call(a, "Put", []byte("k"), &shalev1.PutResponse{}, nil, &a.probe)
		if a.made.Load() {
			t.Errorf("the call made its attempt context's Done channel")
		}
		if !a.probe.sent.Load() {
			t.Errorf("the call was not marked sent")
		}
		return err, time.Since(start)
	}
	type result struct {
		err     error
		elapsed time.Duration
	}
	late := make(chan result, 1)
	go func() {
		err, d := call(context.Background(), 2*time.Second)
		late <- result{err, d}
	}()
	for fake.sent() < 1 {
		time.Sleep(time.Millisecond)
	}
	err, d := call(context.Background(), 50*time.Millisecond)
	if status.Code(err) != codes.DeadlineExceeded || d < 50*time.Millisecond || d > time.Second {
		t.Fatalf("call with a 50 ms deadline: %v after %v; want DeadlineExceeded after 50 ms", err, d)
	}
	parent, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if err, d := call(parent, time.Minute); status.Code(err) != codes.Canceled || d > time.Second {
		t.Fatalf("call whose parent was canceled after 20 ms: %v after %v; want Canceled", err, d)
	}
	r := <-late
	if status.Code(r.err) != codes.DeadlineExceeded || r.elapsed < 2*time.Second || r.elapsed > 5*time.Second {
		t.Fatalf("call with a 2 s deadline: %v after %v; want DeadlineExceeded after 2 s", r.err, r.elapsed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) != 0 {
		t.Fatalf("%d calls still waiting", len(s.waiting))
	}
}
