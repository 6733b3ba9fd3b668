package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// A connection's unary KV calls go over one KV.Calls stream (callMux, the
// connection's innermost interceptor): the calls made while a send is under
// way leave together in one message, and the node answers many
// in one, instead of each call being its own HTTP/2 stream with its own
// headers and writes. Everything around a call is unchanged: the outer
// interceptors (auth, wrong-node, sent) see each call as a unary call, the
// node serves each as its unary method, and errors come back with the same
// status and details. A node without KV.Calls (Unimplemented) gets unary
// calls from then on. The stream goes over the gRPC connection, or over a
// connection of its own (callsConn) when the mux has a dialer.

// kvCallsPrefix is the prefix of the KV service's methods.
const kvCallsPrefix = "/shale.v1.KV/"

// callBatchBytes bounds the requests sent in one KV.Calls message; a
// request larger than it goes as a unary call (a message over the node's
// limit would end the stream and every call on it).
const callBatchBytes = 1 << 20

// directSendMaxWaiting bounds the calls waiting on a stream for a caller
// to send its own call (sendDirect). A send blocks while the connection's
// flow-control window is full, which happens when the node stops reading
// the stream: it does once thousands of the stream's calls are in flight.
// Below this bound that cannot be the case, so a caller's wait in the send
// is short and its deadline holds; above it the sender goroutine sends.
const directSendMaxWaiting = 64

// streamable reports whether the unary method goes over KV.Calls, and
// its name there.
func streamable(method string) (string, bool) {
	name, ok := strings.CutPrefix(method, kvCallsPrefix)
	if !ok {
		return "", false
	}
	switch name {
	case "Get", "MultiGet", "Put", "Delete", "DeleteRange", "Scan", "Batch", "CompareAndSwap", "Txn":
		return name, true
	}
	return "", false
}

// callMux carries one connection's unary KV calls over a KV.Calls stream.
type callMux struct {
	mu  sync.Mutex
	cur *callStream
	// unary is set once the node answered Unimplemented: calls are unary.
	// It is read by every call, without taking mu.
	unary atomic.Bool
	// senderBatches counts the messages the streams' sender goroutines
	// sent (the calls sendDirect handed over), for tests.
	senderBatches atomic.Int64
	// dialer opens the streams on connections of their own (callsConn);
	// nil: on the gRPC connection.
	dialer *callsDialer
}

// close retires the open stream: it takes no new calls and ends once its
// calls are answered.
func (m *callMux) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur != nil {
		m.cur.retire()
	}
}

// errNoCalls is how a call learns that the node has no KV.Calls and must
// be made unary.
var errNoCalls = errors.New("shale client: the node has no KV.Calls")

// intercept is the unary interceptor.
func (m *callMux) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	name, ok := streamable(method)
	if !ok || m.isUnary() {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	body, err := codec.Marshal(req.(proto.Message))
	if err != nil {
		return status.Errorf(codes.Internal, "shale client: encode %s request: %v", name, err)
	}
	if len(body) > callBatchBytes {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	s := m.stream(ctx, cc)
	err = s.call(ctx, name, body, reply, opts, nil)
	if errors.Is(err, errNoCalls) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	return err
}

// stream returns the open stream for calls with ctx's outgoing metadata
// (the target node and the token), opening one if there is none or the
// open one was opened with other metadata (a renewed token). It reads the
// two values it compares, not a copy of the whole metadata, which it takes
// only to open a stream.
func (m *callMux) stream(ctx context.Context, cc *grpc.ClientConn) *callStream {
	auth := strings.Join(metadata.ValueFromOutgoingContext(ctx, AuthorizationMetadataKey), ",")
	node := strings.Join(metadata.ValueFromOutgoingContext(ctx, shalev1.TargetNodeMetadataKey), ",")
	return m.streamFor(cc, auth, node, ctx)
}

// streamFor returns the open stream for calls with the authorization and
// target node metadata values auth and node ("" for none), opening one if
// there is none or the open one has other values. A stream it opens
// carries mdCtx's outgoing metadata, or with mdCtx nil the target node
// alone.
func (m *callMux) streamFor(cc *grpc.ClientConn, auth, node string, mdCtx context.Context) *callStream {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.cur; s != nil && s.auth == auth && s.node == node && !s.isBroken() {
		return s
	}
	if old := m.cur; old != nil {
		old.retire()
	}
	var md metadata.MD
	if mdCtx != nil {
		md, _ = metadata.FromOutgoingContext(mdCtx)
	} else if node != "" {
		md = metadata.Pairs(shalev1.TargetNodeMetadataKey, node)
	}
	s := openCallStream(m, cc, md, auth)
	s.auth, s.node = auth, node
	m.cur = s
	return s
}

// warm reports whether the mux has a stream open (or needs none: the node
// has no KV.Calls).
func (m *callMux) warm() bool {
	if m.isUnary() {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur != nil && !m.cur.isBroken()
}

// isUnary reports whether the node answered Unimplemented to KV.Calls.
func (m *callMux) isUnary() bool { return m.unary.Load() }

// noCalls records that the node has no KV.Calls.
func (m *callMux) noCalls() {
	m.unary.Store(true)
}

// callStream is one KV.Calls stream and its calls in flight.
type callStream struct {
	m *callMux
	// auth and node are the outgoing metadata the stream was opened with:
	// the token and the target node (values joined by commas).
	auth, node string
	stream     callsTransport
	cancel     context.CancelFunc
	// wake hands the sending to the sender goroutine (send): a caller that
	// sent finds calls queued meanwhile. fail wakes it too, to end it.
	wake chan struct{}

	mu   sync.Mutex
	next uint64
	// queue holds the calls not yet sent. sending is set while a caller or
	// the sender goroutine sends: calls queued meanwhile wait for it.
	queue   []*shalev1.Call
	sending bool
	waiting map[uint64]waiter
	// timer fails the calls whose deadline passed (expire); armed is when
	// it fires (zero: it is not set). It is set for the earliest deadline
	// of the calls waiting, or earlier: a call answered leaves it as it
	// is, so that with one call at a time it is set again only when it
	// fires, about once per attempt timeout, not once per call.
	timer *time.Timer
	armed time.Time
	// err is set once the stream broke: calls fail with it.
	err error
	// retired: no new calls; it closes once its calls are answered.
	retired bool
	// received is set once a result arrived (the node has KV.Calls).
	received bool
}

// openCallStream opens a stream with the call's outgoing metadata: on the
// connection, whose stream interceptors add the current token, or with
// the mux's dialer on a connection of its own, with auth as its token.
func openCallStream(m *callMux, cc *grpc.ClientConn, md metadata.MD, auth string) *callStream {
	md = md.Copy()
	md.Delete(AuthorizationMetadataKey)
	// Each call carries its own trace context (Call.trace_context).
	md.Delete(shalev1.TraceParentMetadataKey)
	md.Delete(shalev1.TraceStateMetadataKey)
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
	s := &callStream{m: m, cancel: cancel, wake: make(chan struct{}, 1),
		waiting: map[uint64]waiter{}}
	var st callsTransport
	var err error
	if m.dialer != nil {
		var cc *callsConn
		cc, err = m.dialer.dial(md, auth, s.retire)
		if err == nil {
			st = cc
			s.cancel = func() { cancel(); cc.close() }
		}
	} else {
		st, err = shalev1.NewKVClient(cc).Calls(ctx)
	}
	if err != nil {
		s.err = err
		cancel()
		return s
	}
	s.stream = st
	go s.send()
	go s.receive()
	return s
}

func (s *callStream) isBroken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil || s.retired
}

// waiter is a call waiting for its result: done gets the result, nil
// when the stream broke, or expiredResult once deadline (zero: none) has
// passed.
type waiter struct {
	done     chan *shalev1.CallResult
	deadline time.Time
}

// expiredResult is what a call whose deadline passed gets (expire).
var expiredResult = &shalev1.CallResult{}

// retire stops new calls; the stream ends once its calls are answered.
func (s *callStream) retire() {
	s.mu.Lock()
	s.retired = true
	idle := len(s.waiting) == 0 && s.err == nil
	s.mu.Unlock()
	if idle {
		s.cancel()
	}
}

// call sends one call (its encoded request) and waits for its result, or
// until ctx ends. Once the call is queued on the open stream it counts as
// sent: the peer of every grpc.PeerCallOption in opts is set, and probe
// (if not nil) is marked. An attempt's context (attemptCtx) is not asked
// for its Done channel: the wait watches its parent's, and the stream's
// timer fails the call at the attempt's deadline.
func (s *callStream) call(ctx context.Context, method string, body []byte, reply any, opts []grpc.CallOption, probe *attemptProbe) error {
	c := &shalev1.Call{Method: method, Request: body, TraceContext: traceContext(ctx)}
	if dl, ok := ctx.Deadline(); ok {
		c.TimeoutMs = max(time.Until(dl).Milliseconds(), 1)
	}
	w, waitCtx := waiter{done: make(chan *shalev1.CallResult, 1)}, ctx
	if a, ok := ctx.(*attemptCtx); ok {
		waitCtx, w.deadline = a.parent, a.deadline
	}
	done := w.done
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	s.next++
	c.Id = s.next
	s.waiting[c.Id] = w
	if !w.deadline.IsZero() {
		s.armLocked(w.deadline)
	}
	s.queue = append(s.queue, c)
	var q []*shalev1.Call
	handOff := false
	if !s.sending {
		s.sending = true
		if len(s.waiting) <= directSendMaxWaiting {
			q, s.queue = s.queue, nil
		} else {
			handOff = true
		}
	}
	s.mu.Unlock()
	switch {
	case q != nil:
		s.sendDirect(q)
	case handOff:
		s.wakeSender()
	}
	// The call left the client once it is queued on an open stream: mark
	// it sent for the outer interceptors (an outcome may be unknown).
	for _, o := range opts {
		if p, ok := o.(grpc.PeerCallOption); ok && p.PeerAddr != nil {
			*p.PeerAddr = peer.Peer{Addr: streamAddr{}}
		}
	}
	if probe != nil {
		probe.sent.Store(true)
	}
	select {
	case r := <-done:
		if r == nil {
			s.mu.Lock()
			err := s.err
			s.mu.Unlock()
			return err
		}
		if r == expiredResult {
			return status.FromContextError(context.DeadlineExceeded).Err()
		}
		if r.GetCode() != 0 {
			return status.FromProto(&spb.Status{Code: int32(r.GetCode()), Message: r.GetMessage(), Details: r.GetDetails()}).Err()
		}
		if err := codec.Unmarshal(r.GetResponse(), reply.(proto.Message)); err != nil {
			return status.Errorf(codes.Internal, "shale client: decode %s response: %v", method, err)
		}
		return nil
	case <-waitCtx.Done():
		s.mu.Lock()
		delete(s.waiting, c.Id)
		s.mu.Unlock()
		return status.FromContextError(waitCtx.Err()).Err()
	}
}

// armLocked makes the timer fire by deadline (under s.mu).
func (s *callStream) armLocked(deadline time.Time) {
	if !s.armed.IsZero() && !deadline.Before(s.armed) {
		return
	}
	s.armed = deadline
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(deadline), s.expire)
	} else {
		s.timer.Reset(time.Until(deadline))
	}
}

// expire fails the calls whose deadline passed and sets the timer for the
// earliest deadline of the others.
func (s *callStream) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var next time.Time
	for id, w := range s.waiting {
		switch {
		case w.deadline.IsZero():
		case !now.Before(w.deadline):
			delete(s.waiting, id)
			w.done <- expiredResult
		case next.IsZero() || w.deadline.Before(next):
			next = w.deadline
		}
	}
	s.armed = time.Time{}
	if !next.IsZero() && s.err == nil {
		s.armLocked(next)
	}
}

// streamAddr is the peer of a call made over a KV.Calls stream: what
// matters to the caller is that the call left.
type streamAddr struct{}

func (streamAddr) Network() string { return "tcp" }
func (streamAddr) String() string  { return "kv-calls-stream" }

// sendDirect sends q, the calls queued when no send was under way, from
// the caller that found it so: with one call in flight on a stream (a
// client per connection) the call leaves with no wake-up of the sender
// goroutine and no wait for the scheduler, as the node sends its results
// (server.resultSender). Calls queued while it sent are handed to the
// sender goroutine, so that no caller sends for others for long. After a
// failed send the stream stays marked sending: nothing more is sent on it,
// and receive fails its calls.
func (s *callStream) sendDirect(q []*shalev1.Call) {
	if !s.sendCalls(q) {
		return
	}
	s.mu.Lock()
	more := len(s.queue) > 0 && s.err == nil
	if !more {
		s.sending = false
	}
	s.mu.Unlock()
	if more {
		// sending stays set until send clears it, so this is the one
		// hand-off in flight.
		s.wakeSender()
	}
}

// wakeSender wakes the sender goroutine (send): to send what is queued, or
// to end once the stream broke. It never blocks: a full channel holds a
// wake-up the sender has yet to take, which does both.
func (s *callStream) wakeSender() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// send sends the calls handed to it (sendDirect), and those queued while
// it sends, until the queue is empty; it ends once the stream broke.
func (s *callStream) send() {
	for range s.wake {
		for {
			s.mu.Lock()
			if s.err != nil {
				s.mu.Unlock()
				return
			}
			q := s.queue
			s.queue = nil
			if len(q) == 0 {
				s.sending = false
				s.mu.Unlock()
				break
			}
			s.mu.Unlock()
			s.m.senderBatches.Add(1)
			if !s.sendCalls(q) {
				return
			}
		}
	}
}

// sendCalls sends q, as many calls in one message as callBatchBytes
// allows. It reports false if the stream failed (receive reports its
// status).
func (s *callStream) sendCalls(q []*shalev1.Call) bool {
	for len(q) > 0 {
		n, size := 0, 0
		for n < len(q) && (n == 0 || size+len(q[n].GetRequest()) <= callBatchBytes) {
			size += len(q[n].GetRequest())
			n++
		}
		if err := s.stream.Send(&shalev1.CallBatch{Calls: q[:n]}); err != nil {
			return false
		}
		q = q[n:]
	}
	return true
}

// receive delivers results until the stream ends, then fails the calls
// still waiting.
func (s *callStream) receive() {
	for {
		rb, err := s.stream.Recv()
		if err != nil {
			s.fail(err)
			return
		}
		s.mu.Lock()
		s.received = true
		for _, r := range rb.GetResults() {
			if w, ok := s.waiting[r.GetId()]; ok {
				delete(s.waiting, r.GetId())
				w.done <- r
			}
		}
		idle := s.retired && len(s.waiting) == 0
		s.mu.Unlock()
		if idle {
			s.cancel()
		}
	}
}

// fail ends the stream: the calls waiting get nil (and read s.err). A node
// without KV.Calls makes them unary calls; otherwise they fail Unavailable
// (a write's outcome is unknown: the node may have applied it).
//
// Lock order: a callMux's mu before a callStream's (callMux.stream holds
// m.mu while it asks a stream whether it is broken), so fail marks the mux
// unary only after it has let go of s.mu.
func (s *callStream) fail(err error) {
	if s.failLocked(err) {
		s.m.noCalls()
	}
}

// failLocked is fail's work under s.mu; it reports whether the node has no
// KV.Calls.
func (s *callStream) failLocked(err error) (noCalls bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false
	}
	switch {
	case status.Code(err) == codes.Unimplemented && !s.received:
		noCalls = true
		s.err = errNoCalls
	case errors.Is(err, io.EOF), status.Code(err) == codes.Canceled && s.retired:
		s.err = status.Error(codes.Unavailable, "shale client: KV.Calls stream closed")
	default:
		st := status.Convert(err)
		if st.Code() == codes.Canceled || st.Code() == codes.Internal {
			st = status.New(codes.Unavailable, fmt.Sprintf("shale client: KV.Calls stream: %s", st.Message()))
		}
		s.err = st.Err()
	}
	for id, w := range s.waiting {
		delete(s.waiting, id)
		w.done <- nil
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.cancel()
	s.wakeSender() // the sender sees the stream broken and ends
	return noCalls
}

// kvConn is the connection to one node, as a request's attempt uses it:
// every call on it is meant for node (see toNode), and a KV call takes the
// direct path onto the connection's KV.Calls stream when it can (see
// callDirect); anything else is an ordinary gRPC call through the
// connection's interceptors.
type kvConn struct {
	c    *Client
	cc   *grpc.ClientConn
	addr string
	node uint64
	// mux is the connection's KV.Calls multiplexer when the direct path is
	// allowed (nil: every call goes through gRPC's Invoke).
	mux *callMux
}

// Invoke makes a unary call to k's node.
func (k *kvConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if k.mux != nil && staticOnly(opts) {
		if done, err := k.callDirect(ctx, method, args, reply); done {
			return err
		}
	}
	return k.cc.Invoke(toNode(ctx, k.node), method, args, reply, opts...)
}

// staticOnly reports whether opts hold nothing but the grpc.StaticMethod
// option the generated clients add to every call (other options ask for
// what only gRPC's Invoke does).
func staticOnly(opts []grpc.CallOption) bool {
	for _, o := range opts {
		if _, ok := o.(grpc.StaticMethodCallOption); !ok {
			return false
		}
	}
	return true
}

// NewStream opens a stream to k's node.
func (k *kvConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return k.cc.NewStream(toNode(ctx, k.node), desc, method, opts...)
}

// callDirect puts a KV call straight onto the connection's KV.Calls
// stream, doing on the way what the connection's unary interceptors would
// (see Client.conn), without gRPC's Invoke and the interceptor chain: the
// token attached, a refused token renewed and the call resent, the error
// typed (authTyped), a wrong-node refusal retiring the connection, and the
// attempt's probe marked sent once the call is queued. It reports done =
// false, having sent nothing, when the call must take the ordinary path:
// a method that is not carried over KV.Calls, a context with a span (the
// tracing interceptor makes the call's client span) or with outgoing
// metadata of the caller's (a stream opened for the call carries it), a
// node without KV.Calls, or a request over callBatchBytes.
func (k *kvConn) callDirect(ctx context.Context, method string, req, reply any) (done bool, err error) {
	name, ok := streamable(method)
	if !ok || trace.SpanContextFromContext(ctx).IsValid() || k.mux.isUnary() {
		return false, nil
	}
	if _, ok := metadata.FromOutgoingContext(ctx); ok {
		return false, nil
	}
	body, err := codec.Marshal(req.(proto.Message))
	if err != nil {
		return true, status.Errorf(codes.Internal, "shale client: encode %s request: %v", name, err)
	}
	if len(body) > callBatchBytes {
		return false, nil
	}
	node := strconv.FormatUint(k.node, 10)
	probe, _ := ctx.Value(attemptProbeKey{}).(*attemptProbe)
	send := func(tok string) error {
		auth := ""
		if tok != "" {
			auth = "Bearer " + tok
		}
		return k.mux.streamFor(k.cc, auth, node, nil).call(ctx, name, body, reply, nil, probe)
	}
	err = k.c.tokenCall(ctx, method, send)
	if errors.Is(err, errNoCalls) {
		// The node has no KV.Calls: nothing reached it; the ordinary path
		// makes the call unary.
		return false, nil
	}
	k.c.retireWrongNode(k.addr, k.cc, err)
	return true, err
}
