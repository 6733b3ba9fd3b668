package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// testWriteCall returns a put of a KV.Calls stream as startWrite leaves it
// once proposed, on a node of its own whose results go to f.
func testWriteCall(t *testing.T, f *fakeCallsStream, ctx context.Context) (*writeCall, *resultSender) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	n := &Node{cfg: Config{NodeID: 1}, streamCalls: newCallCounters(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls"}, []string{"method", "code"}))}
	s := &kvService{n: n, workers: newCallWorkers(time.Minute, stop)}
	out := newResultSender(f, func(int) {})
	wc := &writeCall{s: s, out: out, m: putWrite, id: 7, ctx: ctx, cancel: func() {}, release: func() {},
		t:   target{desc: &shalev1.ShardDescriptor{ShardId: 4, Epoch: 1}},
		cmd: &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{}}}}
	return wc, out
}

// TestWriteCallAnswersWithoutWaitingForTheClient: the completion of a
// write's proposal, which runs on an apply worker, queues the write's result and
// returns while the stream's send is blocked (a client that reads no
// results); a call worker sends it once the client reads.
func TestWriteCallAnswersWithoutWaitingForTheClient(t *testing.T) {
	f := &fakeCallsStream{block: make(chan struct{})}
	wc, _ := testWriteCall(t, f, t.Context())
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
		ctx, cancel := callBudget(t.Context(), time.Now().Add(tc.caller))
		wc, _ := testWriteCall(t, &fakeCallsStream{}, ctx)
		if r := wc.resultOf(nil, noQuorum); codes.Code(r.GetCode()) != tc.want {
			t.Errorf("caller's deadline in %v: %v %q, want %v", tc.caller, codes.Code(r.GetCode()), r.GetMessage(), tc.want)
		}
		cancel()
	}
}
