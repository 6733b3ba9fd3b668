package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// testWriteCall returns a put of a KV.Calls stream as startWrite leaves it
// once proposed, on a node of its own whose results go to f, its caller's
// deadline dl.
func testWriteCall(t *testing.T, f *fakeCallsStream, dl time.Time) (*writeCall, *resultSender) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	n := &Node{cfg: Config{NodeID: 1}, streamCalls: newCallCounters(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls"}, []string{"method", "code"}))}
	s := &kvService{n: n, workers: newCallWorkers(time.Minute, stop)}
	out := newResultSender(f, func(int) {})
	d := newWriteDeadlines(t.Context())
	t.Cleanup(d.close)
	wc := &writeCall{s: s, out: out, m: putWrite, id: 7, deadlines: d,
		t:   target{desc: &shalev1.ShardDescriptor{ShardId: 4, Epoch: 1}},
		cmd: &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{}}}}
	wc.wctx.start(t.Context(), dl)
	wc.ctx = &wc.wctx
	return wc, out
}

// TestWriteCallAnswersWithoutWaitingForTheClient: the completion of a
// write's proposal, which runs on an apply worker, queues the write's result and
// returns while the stream's send is blocked (a client that reads no
// results); a call worker sends it once the client reads.
func TestWriteCallAnswersWithoutWaitingForTheClient(t *testing.T) {
	f := &fakeCallsStream{block: make(chan struct{})}
	wc, _ := testWriteCall(t, f, time.Now().Add(time.Minute))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3 {
			wc.proposed(&shalev1.CommandResult{Txn: &shalev1.TxnResponse{Header: &shalev1.ResponseHeader{Revision: 9}}}, nil)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the proposal's completion waited for a blocked send")
	}
	close(f.block)
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		sent := 0
		for _, b := range f.batches {
			sent += len(b)
		}
		f.mu.Unlock()
		if sent == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 results sent", sent)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWriteCallDeadline: a write whose proposal ran out of its budget is
// Unavailable while its caller's deadline has not passed, and
// DeadlineExceeded once it has, as the unary handler's replicationErr
// answers.
func TestWriteCallDeadline(t *testing.T) {
	noQuorum := fmt.Errorf("propose: %w", context.DeadlineExceeded)
	for _, tc := range []struct {
		caller time.Duration
		want   codes.Code
	}{{time.Minute, codes.Unavailable}, {-time.Second, codes.DeadlineExceeded}} {
		wc, _ := testWriteCall(t, &fakeCallsStream{}, time.Now().Add(tc.caller))
		if r := wc.resultOf(nil, noQuorum); codes.Code(r.GetCode()) != tc.want {
			t.Errorf("caller's deadline in %v: %v %q, want %v", tc.caller, codes.Code(r.GetCode()), r.GetMessage(), tc.want)
		}
	}
}

// testCanceler is a proposal that records when, and with what, it was
// canceled.
type testCanceler struct {
	mu  sync.Mutex
	at  time.Time
	err error
	n   int
}

func (c *testCanceler) Cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.n == 1 {
		c.at, c.err = time.Now(), err
	}
}

func (c *testCanceler) outcome() (time.Time, error, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at, c.err, c.n
}

// TestWriteDeadlines: a KV.Calls stream's writes proposed out of the order
// of their deadlines each have their proposal canceled with
// DeadlineExceeded once its budget (requestMargin before the caller's
// deadline) has passed and not before, once; a write answered before its
// budget, or before it was added, is never canceled; when the stream ends
// the writes pending are canceled at once with the stream's error, and so
// is a write added after.
func TestWriteDeadlines(t *testing.T) {
	stream, endStream := context.WithCancel(t.Context())
	d := newWriteDeadlines(stream)
	defer d.close()
	start := time.Now()
	write := func(after time.Duration) (*writeCall, *testCanceler) {
		wc := &writeCall{deadlines: d}
		wc.wctx.start(stream, start.Add(after))
		return wc, &testCanceler{}
	}
	type pending struct {
		wc *writeCall
		p  *testCanceler
	}
	var due []pending
	for _, after := range []time.Duration{600 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		wc, p := write(after)
		d.add(wc, p)
		due = append(due, pending{wc, p})
	}
	answered, ap := write(300 * time.Millisecond)
	d.add(answered, ap)
	early, ep := write(100 * time.Millisecond)
	d.done(early) // its result was made before the proposal was added
	d.add(early, ep)
	d.done(answered)
	long, lp := write(time.Minute)
	d.add(long, lp)

	for _, w := range due {
		budget, _ := w.wc.wctx.Deadline()
		deadline := time.Now().Add(10 * time.Second)
		for {
			at, err, n := w.p.outcome()
			if n > 0 {
				if at.Before(budget) || !errors.Is(err, context.DeadlineExceeded) || n != 1 {
					t.Errorf("write with budget %v: canceled %d times, at %v, with %v", budget.Sub(start), n, at.Sub(start), err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("write with budget %v not canceled", budget.Sub(start))
			}
			time.Sleep(time.Millisecond)
		}
	}
	if _, _, n := ap.outcome(); n != 0 {
		t.Errorf("a write answered before its budget was canceled")
	}
	if _, _, n := ep.outcome(); n != 0 {
		t.Errorf("a write answered before it was added was canceled")
	}
	if _, _, n := lp.outcome(); n != 0 {
		t.Fatalf("a write with a minute left was canceled")
	}

	endStream()
	after, afterP := write(time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err, n := lp.outcome(); n > 0 {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("write pending at the stream's end: canceled with %v, want context.Canceled", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the write pending at the stream's end was not canceled")
		}
		time.Sleep(time.Millisecond)
	}
	d.add(after, afterP)
	if _, err, n := afterP.outcome(); n != 1 || !errors.Is(err, context.Canceled) {
		t.Errorf("write added after the stream's end: canceled %d times with %v, want once with context.Canceled", n, err)
	}
}
