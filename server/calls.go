package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Limits of one KV.Calls stream.
const (
	// callsInFlight bounds the calls of one stream running at once; the
	// stream reads no more batches meanwhile (HTTP/2 flow control then
	// holds the client back).
	callsInFlight = 4096
	// callsPerResultBatch and resultBatchBytes bound the results sent in
	// one message (a larger result goes alone).
	callsPerResultBatch = 512
	resultBatchBytes    = 1 << 20
	// callWorkerIdle is how long a call worker waits for its next call
	// before it ends.
	callWorkerIdle = 10 * time.Second
)

// callWorkers runs the calls of every KV.Calls stream of a node on
// long-lived goroutines. A fresh goroutine starts with a small stack, and
// a put's handler outgrows it (the Raft command's encoding recursed
// deeply through protobuf's reflection; the generated code it uses now
// goes less deep): the runtime copied the stack over and over, 5% of a loaded
// server's CPU. A worker's stack stays grown from one call to the next,
// as gRPC's NumStreamWorkers keeps its stream workers' stacks.
//
// run never makes a call wait for another: a call goes to an idle worker
// if one waits, else to a new worker, so there are as many workers as
// calls in flight at the busiest moment (the streams bound those). A
// worker ends once it has had no call for idle, or once stop is closed
// and it has finished its call.
type callWorkers struct {
	work chan func()
	idle time.Duration
	stop <-chan struct{}
	// started counts the workers started and live those not yet ended,
	// for tests.
	started, live atomic.Int64
}

func newCallWorkers(idle time.Duration, stop <-chan struct{}) *callWorkers {
	return &callWorkers{work: make(chan func()), idle: idle, stop: stop}
}

// run runs f on an idle worker, or on a new one if none is idle, and
// returns without waiting for f.
func (w *callWorkers) run(f func()) {
	select {
	case w.work <- f:
	default:
		w.started.Add(1)
		w.live.Add(1)
		go w.serve(f)
	}
}

// serve runs f, then the calls handed to it, until it has been idle for
// w.idle or w.stop is closed.
func (w *callWorkers) serve(f func()) {
	defer w.live.Add(-1)
	idle := time.NewTimer(w.idle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(w.idle)
		select {
		case f = <-w.work:
		case <-idle.C:
			return
		case <-w.stop:
			return
		}
	}
}

// kvUnaryMethods are the KV service's unary methods, by name: what a
// KV.Calls stream may carry. They run through the generated handlers, as a
// unary call does.
var kvUnaryMethods = func() map[string]grpc.MethodDesc {
	m := map[string]grpc.MethodDesc{}
	for _, md := range shalev1.KV_ServiceDesc.Methods {
		m[md.MethodName] = md
	}
	return m
}()

// Calls implements KV.Calls: every call of every batch runs concurrently
// (on the node's call workers) through the unary method's handler,
// authorized as a unary call of that method is; results go back batched,
// in the order they complete, sent by the workers that made them
// (resultSender). The stream ends once the client closed its side and
// every call answered.
func (s *kvService) Calls(stream shalev1.KV_CallsServer) error {
	ctx := stream.Context()
	slots := make(chan struct{}, callsInFlight)
	out := &resultSender{stream: stream, release: func(n int) {
		for range n {
			<-slots
		}
	}}
	budgets := &callBudgets{stream: ctx}
	defer budgets.close()
	var wg sync.WaitGroup
	var recvErr error
recv:
	for {
		in, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				recvErr = err
			}
			break
		}
		for _, c := range in.GetCalls() {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				recvErr = ctx.Err()
				break recv
			}
			wg.Add(1)
			s.workers.run(func() {
				defer wg.Done()
				out.send(s.serveCall(ctx, budgets, c))
			})
		}
	}
	wg.Wait()
	if err := out.err(); err != nil {
		return err
	}
	return recvErr
}

// resultSender sends the results of a KV.Calls stream from the call
// workers that made them, with no hand-off to a sending goroutine (a
// wake-up and a wait for the scheduler per result, which at 16 clients
// on two loaded cores cost more than the send itself). The worker that
// finds no send under way sends its result and every result queued while
// it sent, each message holding what is queued (up to callsPerResultBatch
// results and resultBatchBytes; a larger result goes alone); the others
// queue theirs and go on. A result keeps its call's slot until it is sent,
// so a client that reads no results holds at most callsInFlight of them
// on the server. After a failed send the results are dropped.
type resultSender struct {
	stream shalev1.KV_CallsServer
	// release frees the slots of n results sent or dropped.
	release func(n int)

	mu      sync.Mutex
	queued  []*shalev1.CallResult
	sending bool
	failed  error
	// batch is the message the sending worker fills and sends (gRPC has
	// encoded it once Send returns), used only while sending is set.
	batch shalev1.ResultBatch
}

// send sends r, and what others queue meanwhile, or queues it for the
// worker sending now.
func (o *resultSender) send(r *shalev1.CallResult) {
	o.mu.Lock()
	o.queued = append(o.queued, r)
	if o.sending {
		o.mu.Unlock()
		return
	}
	o.sending = true
	batch := &o.batch
	for len(o.queued) > 0 {
		batch.Results = o.take(batch.Results[:0])
		failed := o.failed
		o.mu.Unlock()
		if failed == nil {
			failed = o.stream.Send(batch)
		}
		o.release(len(batch.Results))
		clear(batch.Results)
		o.mu.Lock()
		o.failed = failed
	}
	o.sending = false
	o.mu.Unlock()
}

// take moves the next message's results from the queue to b (under mu).
func (o *resultSender) take(b []*shalev1.CallResult) []*shalev1.CallResult {
	n, size := 0, 0
	for n < len(o.queued) && n < callsPerResultBatch {
		next := len(o.queued[n].GetResponse())
		if n > 0 && size+next > resultBatchBytes {
			break
		}
		size += next
		n++
	}
	b = append(b, o.queued[:n]...)
	rest := copy(o.queued, o.queued[n:])
	clear(o.queued[rest:])
	o.queued = o.queued[:rest]
	return b
}

// err returns the failure of a send, if any.
func (o *resultSender) err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failed
}

// serveCall runs one call of a KV.Calls stream, in a context from the
// stream's budgets, and returns its result.
func (s *kvService) serveCall(ctx context.Context, budgets *callBudgets, c *shalev1.Call) *shalev1.CallResult {
	out := &shalev1.CallResult{Id: c.GetId()}
	md, ok := kvUnaryMethods[c.GetMethod()]
	method := md.MethodName
	var resp any
	var err error
	switch {
	case !ok:
		method = "unknown" // a label per name a client sends would grow without bound
		err = status.Errorf(codes.InvalidArgument, "KV.Calls: %q is not a unary method of the KV service", c.GetMethod())
	case c.GetTimeoutMs() < 0:
		err = status.Error(codes.InvalidArgument, "KV.Calls: timeout_ms is negative")
	default:
		if ms := c.GetTimeoutMs(); ms > 0 {
			// The handler's requestCtx uses this context as it is.
			var release func()
			ctx, release = budgets.acquire(time.Now().Add(time.Duration(ms) * time.Millisecond))
			defer release()
		}
		dec := func(m any) error {
			if err := codec.Unmarshal(c.GetRequest(), m.(proto.Message)); err != nil {
				return status.Errorf(codes.InvalidArgument, "KV.Calls: %s request: %v", method, err)
			}
			return nil
		}
		ctx, sp := s.n.startCallSpan(ctx, method, c)
		if resp, err = md.Handler(s, ctx, dec, s.n.kvCallInterceptor()); err == nil {
			out.Response, err = codec.Marshal(resp.(proto.Message))
		}
		if sp != nil {
			endServerSpan(sp, err)
		}
	}
	if err != nil {
		st := status.Convert(err)
		out.Response = nil
		out.Code, out.Message, out.Details = uint32(st.Code()), st.Message(), st.Proto().GetDetails()
	}
	s.n.streamCalls.inc(method, codes.Code(out.Code))
	return out
}

// kvCallInterceptor returns the interceptor a KV.Calls call runs its
// handler through: authUnaryInterceptor, or none while the node's auth
// state is loaded and disabled, when authUnaryInterceptor would let the
// call through as it is (a KV method is neither open nor peer-only, and
// authorize returns no user). Without an interceptor the generated handler
// makes no UnaryServerInfo and no closure for it.
func (n *Node) kvCallInterceptor() grpc.UnaryServerInterceptor {
	if st := n.auth(); st != nil && !st.Enabled() {
		return nil
	}
	return n.authUnaryInterceptor
}

// Shared call budgets (callBudgets).
const (
	// sharedBudgetMin is the least timeout of a call that shares a
	// budget context; a call with less time gets one of its own.
	sharedBudgetMin = time.Second
	// sharedBudgetSlack is the most, as a fraction of its timeout (1/n),
	// and at most maxBudgetSlack, by which a call sharing a budget may
	// end before its own budget would have.
	sharedBudgetSlack = 100
	maxBudgetSlack    = 100 * time.Millisecond
)

// callBudgets gives the calls of one KV.Calls stream their budget contexts
// (callBudget's), sharing one among calls that arrive close together: a
// context with a deadline costs a timer, an entry in the stream context's
// children and four allocations, 4.3% of a node's CPU per get at 256
// clients, and a client's calls mostly carry the same timeout, so their
// deadlines come in order. A call shares the newest context when that
// context's budget and caller's deadline are both no later than the
// call's own, and its budget at most the slack (1% of the call's timeout,
// at most 100 ms) earlier: a call never runs past its own deadline and
// never outlives the stream (the contexts derive from the stream's), and
// may give up that slack early. A context is canceled (its timer stopped)
// once the last call holding it has returned and a newer one has replaced
// it, or when the stream ends.
type callBudgets struct {
	stream context.Context

	mu sync.Mutex
	// cur is the context new calls may share; nil before the first and
	// after close.
	cur *sharedBudget
}

// sharedBudget is one budget context and the calls holding it.
type sharedBudget struct {
	ctx            context.Context
	cancel         context.CancelFunc
	budget, caller time.Time
	// holders counts the calls holding ctx (under callBudgets.mu).
	holders int
}

// acquire returns the budget context of a call whose caller gives up at
// dl, and the function the call runs when it returns.
func (b *callBudgets) acquire(dl time.Time) (context.Context, func()) {
	left := time.Until(dl)
	if left < sharedBudgetMin {
		return callBudget(b.stream, dl)
	}
	budget := dl.Add(-requestMargin(dl))
	slack := min(left/sharedBudgetSlack, maxBudgetSlack)
	b.mu.Lock()
	defer b.mu.Unlock()
	sb := b.cur
	if sb == nil || sb.budget.After(budget) || sb.caller.After(dl) || budget.Sub(sb.budget) > slack {
		ctx, cancel := budgetCtx(b.stream, dl, budget)
		sb = &sharedBudget{ctx: ctx, cancel: cancel, budget: budget, caller: dl}
		if old := b.cur; old != nil && old.holders == 0 {
			old.cancel()
		}
		b.cur = sb
	}
	sb.holders++
	return sb.ctx, func() { b.release(sb) }
}

// release drops a call's hold on sb.
func (b *callBudgets) release(sb *sharedBudget) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb.holders--
	if sb.holders == 0 && sb != b.cur {
		sb.cancel()
	}
}

// close cancels the newest context once the stream's calls have returned
// (the older ones were canceled by their last holders).
func (b *callBudgets) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil {
		b.cur.cancel()
		b.cur = nil
	}
}

// callCounters holds shale_kv_stream_calls_total's counters by method and
// code for serveCall, which counts every call: the vector's
// WithLabelValues hashed both labels and looked the series up each time. A
// series is made on its first count, as WithLabelValues makes it, so
// /metrics shows the same series as before.
type callCounters struct {
	vec *prometheus.CounterVec
	// byMethod has an entry for every name serveCall counts under (the KV
	// service's unary methods and "unknown"); it is not written after
	// newCallCounters.
	byMethod map[string]*[codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]
}

func newCallCounters(vec *prometheus.CounterVec) *callCounters {
	c := &callCounters{vec: vec, byMethod: map[string]*[codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]{}}
	for name := range kvUnaryMethods {
		c.byMethod[name] = new([codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter])
	}
	c.byMethod["unknown"] = new([codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter])
	return c
}

// inc counts a call of method that ended with code.
func (c *callCounters) inc(method string, code codes.Code) {
	byCode, ok := c.byMethod[method]
	if !ok || int(code) >= len(byCode) {
		c.vec.WithLabelValues(method, code.String()).Inc()
		return
	}
	p := byCode[code].Load()
	if p == nil {
		ctr := c.vec.WithLabelValues(method, code.String())
		p = &ctr
		byCode[code].Store(p)
	}
	(*p).Inc()
}
