package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
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
// as its unary method serves it, authorized as a unary call of that
// method is; results go back batched, in the order they complete
// (resultSender). A write (Put, Delete, DeleteRange, Batch,
// CompareAndSwap, Txn) that this node leads is proposed from the stream's
// own goroutine, and its result made by the call worker sending the
// stream's results once its proposal applied (startWrite); every other
// call runs on the node's call workers. The stream ends once the client
// closed its side and every call answered.
func (s *kvService) Calls(stream shalev1.KV_CallsServer) error {
	ctx := stream.Context()
	slots := make(chan struct{}, callsInFlight)
	out := newResultSender(stream, func(n int) {
		for range n {
			<-slots
		}
	})
	budgets := &callBudgets{stream: ctx}
	defer budgets.close()
	deadlines := newWriteDeadlines(ctx)
	defer deadlines.close()
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
			if s.startWrite(ctx, deadlines, c, out) {
				continue
			}
			s.workers.run(func() {
				out.send(s.serveCall(ctx, budgets, c))
			})
		}
	}
	// Every call holds its slot until its result is sent or dropped: once
	// all are free, nothing uses the stream any more. Every call ends by
	// the stream context's end at the latest.
	for range callsInFlight {
		slots <- struct{}{}
	}
	if err := out.err(); err != nil {
		return err
	}
	return recvErr
}

// resultSender sends the results of a KV.Calls stream from the goroutines
// that made them, with no hand-off to a sending goroutine (a wake-up and a
// wait for the scheduler per result, which at 16 clients on two loaded
// cores cost more than the send itself). The goroutine that finds no send
// under way sends its result and every result queued while it sent, each
// message holding what is queued (up to callsPerResultBatch results and
// resultBatchBytes; a larger result goes alone); the others queue theirs
// and go on. A goroutine that must not wait for the network (an apply
// worker) only queues its result, or the call whose result the sending
// goroutine is to make (queueFinished), and has a call worker send when no
// send is under way (flush). A result keeps its call's slot until it is
// sent, so a client that reads no results holds at most callsInFlight of
// them on the server. After a failed send the results are dropped.
type resultSender struct {
	stream shalev1.KV_CallsServer
	// release frees the slots of n results sent or dropped.
	release func(n int)
	// flushFn is flush, made once for the call workers.
	flushFn func()

	mu     sync.Mutex
	queued []*shalev1.CallResult
	// finished are calls whose results flush makes before it sends them;
	// spare is the slice finished had before flush took it, and made the
	// results flush made, both used only while sending is set.
	finished, spare []finishedCall
	made            []*shalev1.CallResult
	sending         bool
	failed          error
	// batch is the message the sending goroutine fills and sends (gRPC has
	// encoded it once Send returns), used only while sending is set.
	batch shalev1.ResultBatch
}

func newResultSender(stream shalev1.KV_CallsServer, release func(n int)) *resultSender {
	o := &resultSender{stream: stream, release: release}
	o.flushFn = o.flush
	return o
}

// send sends r, and what others queue meanwhile, or queues it for the
// goroutine sending now.
func (o *resultSender) send(r *shalev1.CallResult) {
	if o.queue(r) {
		o.flush()
	}
}

// queue queues r without waiting for the network. It returns true when no
// send is under way: the caller must then have flush run (it owns the
// send until flush returns).
func (o *resultSender) queue(r *shalev1.CallResult) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.queued = append(o.queued, r)
	return o.claim()
}

// claim makes its caller the one to run flush when no send is under way
// (under mu).
func (o *resultSender) claim() bool {
	if o.sending {
		return false
	}
	o.sending = true
	return true
}

// finishedCall is a call whose result the sending goroutine makes: a write
// whose proposal an apply worker finished, which thus only queues it.
type finishedCall interface {
	// result makes the call's result; it may wait (not on the client).
	result() *shalev1.CallResult
}

// queueFinished queues c, whose result flush makes, as queue queues a
// result.
func (o *resultSender) queueFinished(c finishedCall) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finished = append(o.finished, c)
	return o.claim()
}

// flush makes the results of the finished calls queued and sends them with
// what is queued, and what is queued meanwhile, until the queue is empty;
// it runs only after queue or queueFinished returned true.
func (o *resultSender) flush() {
	o.mu.Lock()
	batch := &o.batch
	for len(o.queued) > 0 || len(o.finished) > 0 {
		if len(o.finished) > 0 {
			finished := o.finished
			o.finished = o.spare[:0]
			o.mu.Unlock()
			for _, c := range finished {
				o.made = append(o.made, c.result())
			}
			clear(finished)
			o.mu.Lock()
			o.spare = finished
			o.queued = append(o.queued, o.made...)
			clear(o.made)
			o.made = o.made[:0]
			continue
		}
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

// flushStall is how long a call worker may spend flushing several streams'
// results (flushQueue) before the streams it has not begun go to workers
// of their own.
const flushStall = 2 * time.Millisecond

// flushQueue hands the streams whose finished writes wait for their
// results (those that resultSender.queueFinished made the caller flush) to
// call workers, several streams per worker: the first stream queued wakes
// a worker, and the streams queued before it runs (an apply worker
// finishes the proposals of one apply pass one after another) are flushed
// by it too, one after another. A worker woken per stream cost a wake-up,
// a park and the scheduler's search for work per put: a prototype that
// flushed on the apply worker itself spent 5% less CPU per put at 256
// clients (BENCHMARKS.md, "issue 21, 2026-11-30"). A stream's flush waits
// for the network only when the client reads no results (gRPC's write
// quota of the stream is used up): so that such a stream holds no other
// stream's results, the streams not begun once a worker has spent
// flushStall on its streams go to workers of their own (flushBatch.rescue).
type flushQueue struct {
	mu    sync.Mutex
	queue []*resultSender
	// scheduled is set from the time a worker is asked to take the queue
	// until it has taken it.
	scheduled bool
}

// add queues o, whose flush the caller must have run, and has a worker of
// w take the queue unless one is about to.
func (q *flushQueue) add(w *callWorkers, o *resultSender) {
	q.mu.Lock()
	q.queue = append(q.queue, o)
	start := !q.scheduled
	q.scheduled = true
	q.mu.Unlock()
	if start {
		w.run(func() { q.drain(w) })
	}
}

// drain flushes the streams queued.
func (q *flushQueue) drain(w *callWorkers) {
	q.mu.Lock()
	streams := q.queue
	q.queue = nil
	q.scheduled = false
	q.mu.Unlock()
	flushAll(w, streams)
}

// flushAll flushes streams one after another; once it has spent
// flushStall, the streams not yet begun go to workers of w of their own.
func flushAll(w *callWorkers, streams []*resultSender) {
	if len(streams) == 1 {
		streams[0].flush()
		return
	}
	b := &flushBatch{w: w, streams: streams}
	stall := time.AfterFunc(flushStall, b.rescue)
	for o := b.next(); o != nil; o = b.next() {
		o.flush()
	}
	stall.Stop()
}

// flushBatch is the streams one worker flushes (flushAll).
type flushBatch struct {
	w *callWorkers

	mu      sync.Mutex
	streams []*resultSender
	// begun counts the streams whose flush has begun, or gone to a
	// worker of its own.
	begun int
}

// next returns the stream to flush next (nil: none is left).
func (b *flushBatch) next() *resultSender {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.begun == len(b.streams) {
		return nil
	}
	b.begun++
	return b.streams[b.begun-1]
}

// rescue hands the streams not yet begun to workers of their own: the
// batch has taken flushStall.
func (b *flushBatch) rescue() {
	b.mu.Lock()
	rest := b.streams[b.begun:]
	b.begun = len(b.streams)
	b.mu.Unlock()
	for _, o := range rest {
		b.w.run(o.flushFn)
	}
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
	md, ok := kvUnaryMethods[c.GetMethod()]
	method := md.MethodName
	var resp any
	var err error
	var sp trace.Span
	switch {
	case !ok:
		method = "unknown" // a label per name a client sends would grow without bound
		err = status.Errorf(codes.InvalidArgument, "KV.Calls: %q is not a unary method of the KV service", c.GetMethod())
	case c.GetTimeoutMs() < 0:
		err = status.Error(codes.InvalidArgument, "KV.Calls: timeout_ms is negative")
	default:
		var release func()
		ctx, release = budgets.forCall(ctx, c)
		defer release()
		dec := func(m any) error { return decodeCall(c, method, m.(proto.Message)) }
		ctx, sp = s.n.startCallSpan(ctx, method, c)
		resp, err = md.Handler(s, ctx, dec, s.n.kvCallInterceptor())
	}
	return s.n.callResult(c.GetId(), method, resp, err, sp)
}

// decodeCall decodes the request of call c of method into m.
func decodeCall(c *shalev1.Call, method string, m proto.Message) error {
	if err := codec.Unmarshal(c.GetRequest(), m); err != nil {
		return status.Errorf(codes.InvalidArgument, "KV.Calls: %s request: %v", method, err)
	}
	return nil
}

// callResult is the result of call id of method from what its handler
// returned (resp when err is nil); it ends the call's span sp (when not
// nil) and counts the call.
func (n *Node) callResult(id uint64, method string, resp any, err error, sp trace.Span) *shalev1.CallResult {
	out := &shalev1.CallResult{Id: id}
	if err == nil {
		out.Response, err = codec.Marshal(resp.(proto.Message))
	}
	if sp != nil {
		endServerSpan(sp, err)
	}
	if err != nil {
		st := status.Convert(err)
		out.Response = nil
		out.Code, out.Message, out.Details = uint32(st.Code()), st.Message(), st.Proto().GetDetails()
	}
	n.streamCalls.inc(method, codes.Code(out.Code))
	return out
}

// startWrite serves call c of a KV.Calls stream if it is a write (a
// method kvWrites holds) whose shard this node leads, without a call
// worker: it does what the method's unary handler does up to the proposal
// on the stream's goroutine (decoding, the span, authorization, the
// method's transaction, validation, routing) and proposes with
// ProposeFunc; the apply worker that finishes the proposal queues the
// write, whose result the call worker sending the stream's results makes
// (writeCall.proposed). A write this node does not lead (which may wait
// for a first leader) continues on a call worker; the result of a write
// that fails before its proposal is queued from the stream's goroutine,
// which never waits for the client to read results. It returns false,
// having done nothing, for any other call, which serveCall then runs.
//
// The write runs in a writeCtx, which makes no timer: the stream's
// deadlines fail its proposal at its budget (or when the stream ends).
func (s *kvService) startWrite(ctx context.Context, deadlines *writeDeadlines, c *shalev1.Call, out *resultSender) bool {
	m, ok := kvWrites[c.GetMethod()]
	if !ok || c.GetTimeoutMs() < 0 {
		return false
	}
	n := s.n
	method, fullMethod := m.names()
	wc := &writeCall{s: s, out: out, m: m, id: c.GetId(), deadlines: deadlines}
	timeout := time.Duration(c.GetTimeoutMs()) * time.Millisecond
	if timeout == 0 {
		timeout = n.cfg.RequestTimeout
	}
	wc.wctx.start(ctx, time.Now().Add(timeout))
	ctx, wc.sp = n.startCallSpan(&wc.wctx, method, c)
	fail := func(err error) bool {
		wc.wctx.end()
		wc.post(n.callResult(wc.id, method, nil, err, wc.sp))
		return true
	}
	req, err := m.decodeCall(c)
	if err != nil {
		return fail(err)
	}
	if n.kvCallInterceptor() != nil {
		if ctx, err = n.authorizeCall(ctx, fullMethod, req); err != nil {
			return fail(err)
		}
	}
	t, cmd, err := m.commandOf(ctx, n, req)
	if err != nil {
		return fail(err)
	}
	if !t.r.IsLeader() {
		s.workers.run(func() {
			defer wc.wctx.end()
			resp, err := n.proposeRouted(ctx, t, cmd)
			var r proto.Message
			if err == nil {
				r = m.responseOf(resp)
			}
			out.send(n.callResult(wc.id, method, r, err, wc.sp))
		})
		return true
	}
	payload, err := n.encodeCommand(t.r, cmd)
	if err != nil {
		return fail(status.Errorf(codes.Internal, "shard %d: encode command: %v", t.r.ShardID(), err))
	}
	wc.ctx = ctx
	wc.t, wc.cmd, wc.payloadBytes = t, cmd, len(payload)
	s.direct.Add(1)
	deadlines.add(wc, t.r.ProposeFunc(ctx, payload, cmd, wc.proposed))
	return true
}

// writeCall is a write of a KV.Calls stream that startWrite proposed.
type writeCall struct {
	s   *kvService
	out *resultSender
	// m is the call's method.
	m  callWrite
	id uint64
	// wctx is the context the write runs in, and ctx what startWrite
	// derived from it (the span, the user).
	wctx writeCtx
	ctx  context.Context
	sp   trace.Span
	// t, cmd and payloadBytes are its shard, its command, and the size of
	// the command's encoding.
	t            target
	cmd          *shalev1.RaftCommand
	payloadBytes int
	// res is what its proposal's apply returned.
	res any

	// deadlines are its stream's; p is its proposal, prev and next link
	// it among the writes deadlines watch while linked is set, and
	// answered is set once its result is being made (all under
	// deadlines.mu).
	deadlines        *writeDeadlines
	p                proposalCanceler
	prev, next       *writeCall
	linked, answered bool
}

// proposalCanceler is a write's proposal as its deadline ends it
// (replication.Proposal).
type proposalCanceler interface{ Cancel(err error) }

// proposed is the write's ProposeFunc callback, on the goroutine that
// finishes its proposal (an apply worker, which must not wait): it queues
// the write, and the call worker sending the stream's results makes its
// result (result) and sends it (the node's flushQueue hands the stream to
// a worker); so the apply worker goes on to its next entries at once. A failed proposal or a result with an error code
// (whose error may look for a shard's leader) is answered on a call
// worker of its own.
func (wc *writeCall) proposed(res any, err error) {
	if cr, _ := res.(*shalev1.CommandResult); err != nil || cr == nil || cr.GetErrorCode() != 0 {
		wc.s.workers.run(func() { wc.out.send(wc.resultOf(res, err)) })
		return
	}
	wc.res = res
	if wc.out.queueFinished(wc) {
		wc.s.flushes.add(wc.s.workers, wc.out)
	}
}

// result makes the result of the write, whose proposal applied with
// wc.res.
func (wc *writeCall) result() *shalev1.CallResult { return wc.resultOf(wc.res, nil) }

// post queues the write's result r without waiting for the network, and
// has a call worker send it when no send is under way.
func (wc *writeCall) post(r *shalev1.CallResult) {
	if wc.out.queue(r) {
		wc.s.workers.run(wc.out.flushFn)
	}
}

// resultOf is the write's result from its proposal's outcome, as the
// method's unary handler returns it.
func (wc *writeCall) resultOf(res any, err error) *shalev1.CallResult {
	wc.deadlines.done(wc)
	n := wc.s.n
	cr, err := n.commandResult(wc.ctx, wc.t.desc.GetShardId(), wc.cmd, wc.payloadBytes, res, err)
	wc.wctx.end()
	var r proto.Message
	if err == nil {
		r = wc.m.responseOf(n.txnResponse(wc.t, cr))
	}
	method, _ := wc.m.names()
	return n.callResult(wc.id, method, r, err, wc.sp)
}

// writeDeadlines fails the writes a KV.Calls stream proposed itself
// (startWrite) that are not answered by their budgets (writeCtx's
// deadline), and all of them once the stream ends, as a context per write
// that ProposeFunc watched did: one timer for the stream's writes instead of
// a registration with each write's context and its removal (with the
// context's deadline timer, 2–3% of a node's CPU per put at 256 clients).
// The timer is set for the earliest budget of the writes pending, or
// earlier: a write answered leaves it as it is, so that on a stream with
// one write at a time it is set again only when it fires, about once per
// call timeout, not once per write.
type writeDeadlines struct {
	stream context.Context
	// unwatch stops watching the stream's end.
	unwatch func() bool

	mu sync.Mutex
	// head is the first of the writes pending (linked by writeCall.next).
	head  *writeCall
	timer *time.Timer
	// armed is when timer fires (zero: it is not set).
	armed time.Time
	// ended is the stream's error once it ended.
	ended error
}

func newWriteDeadlines(stream context.Context) *writeDeadlines {
	d := &writeDeadlines{stream: stream}
	d.unwatch = context.AfterFunc(stream, d.end)
	return d
}

// add watches wc's budget, whose proposal p started, unless wc is being
// answered already; once the stream has ended it cancels p at once.
func (d *writeDeadlines) add(wc *writeCall, p proposalCanceler) {
	d.mu.Lock()
	if wc.answered {
		d.mu.Unlock()
		return
	}
	if err := d.ended; err != nil {
		d.mu.Unlock()
		p.Cancel(err)
		return
	}
	wc.p, wc.linked = p, true
	wc.next = d.head
	if d.head != nil {
		d.head.prev = wc
	}
	d.head = wc
	budget, _ := wc.wctx.Deadline()
	if d.armed.IsZero() || budget.Before(d.armed) {
		d.armed = budget
		if d.timer == nil {
			d.timer = time.AfterFunc(time.Until(budget), d.expire)
		} else {
			d.timer.Reset(time.Until(budget))
		}
	}
	d.mu.Unlock()
}

// done stops watching wc, whose result is being made.
func (d *writeDeadlines) done(wc *writeCall) {
	d.mu.Lock()
	wc.answered = true
	d.unlinkLocked(wc)
	d.mu.Unlock()
}

// unlinkLocked takes wc out of the writes pending, if it is there (under
// mu).
func (d *writeDeadlines) unlinkLocked(wc *writeCall) {
	if !wc.linked {
		return
	}
	if wc.prev != nil {
		wc.prev.next = wc.next
	} else {
		d.head = wc.next
	}
	if wc.next != nil {
		wc.next.prev = wc.prev
	}
	wc.prev, wc.next, wc.linked = nil, nil, false
}

// expire cancels the proposals of the writes whose budget passed, with
// context.DeadlineExceeded, and sets the timer for the earliest budget of
// the others.
func (d *writeDeadlines) expire() {
	d.mu.Lock()
	now := time.Now()
	var due []proposalCanceler
	var next time.Time
	for wc := d.head; wc != nil; {
		following := wc.next
		switch budget, _ := wc.wctx.Deadline(); {
		case !now.Before(budget):
			due = append(due, wc.p)
			d.unlinkLocked(wc)
		case next.IsZero() || budget.Before(next):
			next = budget
		}
		wc = following
	}
	d.armed = time.Time{}
	if !next.IsZero() && d.ended == nil {
		d.armed = next
		d.timer.Reset(time.Until(next))
	}
	d.mu.Unlock()
	for _, p := range due {
		p.Cancel(context.DeadlineExceeded)
	}
}

// end cancels the proposals of every write pending, and of every write
// proposed later, with the stream's error: the stream has ended.
func (d *writeDeadlines) end() {
	d.mu.Lock()
	d.ended = d.stream.Err()
	var due []proposalCanceler
	for d.head != nil {
		due = append(due, d.head.p)
		d.unlinkLocked(d.head)
	}
	if d.timer != nil {
		d.timer.Stop()
	}
	d.mu.Unlock()
	for _, p := range due {
		p.Cancel(d.ended)
	}
}

// close stops the timer and the watch of the stream once every write has
// been answered.
func (d *writeDeadlines) close() {
	d.unwatch()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
}

// writeCtx is the context of a write startWrite serves: parent (the
// stream's) ended at the write's budget, requestMargin before its caller's
// deadline, which it carries for deadlinePassed, as callBudget's context
// does. It makes no timer and no registration with parent until it is
// asked for its Done channel or Err, which a proposed write's path does
// not do (its stream's writeDeadlines fail its proposal at the budget):
// only the paths that wait (a write this node does not lead, the wait for
// a split's new leader when answering a stale epoch) make one. After end it
// is canceled.
type writeCtx struct {
	parent     context.Context
	dl, budget time.Time

	// made is set once ctx is: parent with the budget, and cancel.
	made   atomic.Bool
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	ended  bool
}

// start makes w the context of a write whose caller gives up at dl.
func (w *writeCtx) start(parent context.Context, dl time.Time) {
	w.parent, w.dl, w.budget = parent, dl, dl.Add(-requestMargin(dl))
}

// Deadline is the write's budget.
func (w *writeCtx) Deadline() (time.Time, bool) { return w.budget, true }

// Done is closed at the budget, when parent ends, or at end.
func (w *writeCtx) Done() <-chan struct{} { return w.real().Done() }

// Err is the reason Done is closed.
func (w *writeCtx) Err() error { return w.real().Err() }

// Value is the caller's deadline for callerDeadlineKey{}, else parent's
// value (the real context's once made, so that contexts derived from w
// find it as their parent to cancel them).
func (w *writeCtx) Value(key any) any {
	if w.made.Load() {
		return w.ctx.Value(key)
	}
	if _, ok := key.(callerDeadlineKey); ok {
		return w.dl
	}
	return w.parent.Value(key)
}

// real returns the context that Done and Err report on, making it the
// first time (canceled already after end).
func (w *writeCtx) real() context.Context {
	if w.made.Load() {
		return w.ctx
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil {
		w.ctx, w.cancel = budgetCtx(w.parent, w.dl, w.budget)
		if w.ended {
			w.cancel()
		}
		w.made.Store(true)
	}
	return w.ctx
}

// end cancels the context, if made: the write has been answered.
func (w *writeCtx) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	if w.cancel != nil {
		w.cancel()
	}
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
	// end before its own budget would have. A twentieth: a stream with one
	// call at a time (a client per connection) carries its next call one
	// call's time later, 28–30 ms for a put at 256 clients, which with a
	// hundredth of the SDK's 3-s attempts (30 ms) made 81% of such calls a
	// context of their own.
	sharedBudgetSlack = 20
	maxBudgetSlack    = 100 * time.Millisecond
)

// callBudgets gives the calls of one KV.Calls stream their budget contexts
// (callBudget's), sharing one among calls that arrive close together: a
// context with a deadline costs a timer, an entry in the stream context's
// children and four allocations, 4.3% of a node's CPU per get at 256
// clients, and a client's calls mostly carry the same timeout, so their
// deadlines come in order. A call shares the newest context when that
// context's budget and caller's deadline are both no later than the
// call's own, and its budget at most the slack (5% of the call's timeout,
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

// forCall returns the context call c runs in, from ctx (the stream's),
// and the function the call runs when it has returned: a budget context
// for a call with a timeout, ctx itself for one without.
func (b *callBudgets) forCall(ctx context.Context, c *shalev1.Call) (context.Context, func()) {
	ms := c.GetTimeoutMs()
	if ms <= 0 {
		return ctx, func() {}
	}
	// The handler's requestCtx uses this context as it is.
	return b.acquire(time.Now().Add(time.Duration(ms) * time.Millisecond))
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
