package server

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// fakeCallsStream records the result batches sent on a KV.Calls stream;
// block, when set, holds every Send until it is closed.
type fakeCallsStream struct {
	shalev1.KV_CallsServer
	mu      sync.Mutex
	batches [][]uint64
	sending atomic.Int32
	overlap atomic.Bool
	block   chan struct{}
	fail    error
}

func (f *fakeCallsStream) Send(b *shalev1.ResultBatch) error {
	if f.sending.Add(1) > 1 {
		f.overlap.Store(true)
	}
	defer f.sending.Add(-1)
	if f.block != nil {
		<-f.block
	}
	ids := make([]uint64, len(b.GetResults()))
	for i, r := range b.GetResults() {
		ids[i] = r.GetId()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.batches = append(f.batches, ids)
	return nil
}

// TestResultSender: results sent from many workers at once go out each
// once, in messages of at most callsPerResultBatch, never two sends at a
// time; each result's slot is released once it is sent, so a stream whose
// sends block holds its results' slots; after a failed send the rest are
// dropped, their slots released, and the failure reported.
func TestResultSender(t *testing.T) {
	const n = 3000
	f := &fakeCallsStream{block: make(chan struct{})}
	var released atomic.Int64
	o := &resultSender{stream: f, release: func(k int) { released.Add(int64(k)) }}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.send(&shalev1.CallResult{Id: uint64(i + 1)})
		}()
	}
	// The first send blocks: the results queued behind it keep their slots.
	time.Sleep(50 * time.Millisecond)
	if got := released.Load(); got != 0 {
		t.Fatalf("%d slots released while the first send is blocked", got)
	}
	close(f.block)
	wg.Wait()
	if o.err() != nil {
		t.Fatal(o.err())
	}
	if got := released.Load(); got != n {
		t.Fatalf("%d slots released for %d results", got, n)
	}
	if f.overlap.Load() {
		t.Error("two sends at once on the stream")
	}
	seen := make(map[uint64]bool)
	for _, b := range f.batches {
		if len(b) == 0 || len(b) > callsPerResultBatch {
			t.Errorf("a message of %d results", len(b))
		}
		for _, id := range b {
			if seen[id] {
				t.Errorf("result %d sent twice", id)
			}
			seen[id] = true
		}
	}
	if len(seen) != n {
		t.Errorf("%d of %d results sent", len(seen), n)
	}
	if len(f.batches) >= n {
		t.Errorf("%d messages for %d results queued behind a blocked send: none shared", len(f.batches), n)
	}

	// A failed send: the failure is reported and later results dropped.
	boom := errors.New("boom")
	f = &fakeCallsStream{fail: boom}
	released.Store(0)
	o = &resultSender{stream: f, release: func(k int) { released.Add(int64(k)) }}
	for i := range 10 {
		o.send(&shalev1.CallResult{Id: uint64(i + 1)})
	}
	if !errors.Is(o.err(), boom) || released.Load() != 10 {
		t.Fatalf("after a failed send: err %v, %d of 10 slots released", o.err(), released.Load())
	}
}

// TestResultSenderLargeResultAlone: a result that would take a message
// past resultBatchBytes goes in a message of its own.
func TestResultSenderLargeResultAlone(t *testing.T) {
	f := &fakeCallsStream{}
	o := &resultSender{stream: f, release: func(int) {}}
	o.mu.Lock() // queue three results as if a send were under way
	o.queued = []*shalev1.CallResult{
		{Id: 1, Response: make([]byte, 10)},
		{Id: 2, Response: make([]byte, resultBatchBytes)},
		{Id: 3, Response: make([]byte, 10)},
	}
	o.mu.Unlock()
	o.send(&shalev1.CallResult{Id: 4})
	want := [][]uint64{{1}, {2}, {3, 4}}
	if len(f.batches) != len(want) {
		t.Fatalf("messages %v, want %v", f.batches, want)
	}
	for i := range want {
		if len(f.batches[i]) != len(want[i]) || f.batches[i][0] != want[i][0] {
			t.Fatalf("messages %v, want %v", f.batches, want)
		}
	}
}

// TestFlushQueue: streams queued for their flush by apply workers
// (flushQueue) all get their results sent; a stream whose send blocks (a client reading no results) holds the
// results of the streams after it in its worker's batch for flushStall at
// most: they go to workers of their own.
func TestFlushQueue(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	w := newCallWorkers(time.Minute, stop)
	stream := func(f *fakeCallsStream, id uint64) *resultSender {
		o := newResultSender(f, func(int) {})
		if !o.queue(&shalev1.CallResult{Id: id}) {
			t.Fatal("no send under way, yet the result's queuer is not to flush")
		}
		return o
	}
	sent := func(f *fakeCallsStream) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, b := range f.batches {
			n += len(b)
		}
		return n
	}
	waitSent := func(what string, fs ...*fakeCallsStream) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for _, f := range fs {
			for sent(f) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: a stream's result not sent", what)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}

	var q flushQueue
	var fs []*fakeCallsStream
	for i := range 50 {
		f := &fakeCallsStream{}
		fs = append(fs, f)
		q.add(w, stream(f, uint64(i)))
	}
	waitSent("queued streams", fs...)

	blocked := &fakeCallsStream{block: make(chan struct{})}
	after := []*fakeCallsStream{{}, {}, {}}
	streams := []*resultSender{stream(blocked, 1)}
	for i, f := range after {
		streams = append(streams, stream(f, uint64(2+i)))
	}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		flushAll(w, streams)
	}()
	waitSent("streams after a blocked one", after...)
	if d := time.Since(start); d < flushStall {
		t.Errorf("streams after a blocked one sent after %v, before flushStall", d)
	}
	select {
	case <-done:
		t.Fatal("the flush of a blocked stream returned")
	default:
	}
	close(blocked.block)
	<-done
	if sent(blocked) != 1 {
		t.Fatal("the blocked stream's result was not sent once it was read")
	}
}
