package client

import (
	"context"
	crand "crypto/rand"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// maxImmediate is how many leader hints in a row are followed without a
// backoff (two replicas pointing at each other during an election would
// otherwise spin).
const maxImmediate = 3

// callSpec describes one logical request for invoke.
type callSpec struct {
	op string
	// leaderOnly sends the request to the leader only (writes and
	// linearizable reads); otherwise any replica may serve it.
	leaderOnly bool
	// write marks a write: its failure may leave its outcome unknown.
	write bool
	// requestID is the write's request ID, sent with every attempt.
	requestID []byte
	// appRequestID marks a requestID the application chose
	// (WithRequestID): it may have been sent before, by an earlier call.
	appRequestID bool
	consistency  shalev1.ReadConsistency
}

// attemptFunc sends one attempt of a request to the replica behind cc
// (whose calls are all meant for that node, see kvConn), with the header
// already addressed to shard sh.
type attemptFunc func(ctx context.Context, cc grpc.ClientConnInterface, sh *shardRoute, hdr *shalev1.RequestHeader) error

// requestIDLen is the length of the SDK's request IDs: 96 random bits,
// for which a collision among the entries of a shard's deduplication table
// (100,000 by default) has a probability below 10^-19, at 4 bytes less per
// write in the Raft log and in the table than 16.
const requestIDLen = 12

// newRequestID returns a fresh random request ID of requestIDLen bytes.
func newRequestID() []byte {
	id := make([]byte, requestIDLen)
	_, _ = crand.Read(id) // crypto/rand.Read never fails
	return id
}

// backoff returns the wait before the n-th consecutive retry (n >= 1):
// uniformly random in [0, min(max, initial·2^(n-1))).
func (c *Client) backoff(n int) time.Duration {
	d := c.opts.backoffInitial
	for i := 1; i < n && d < c.opts.backoffMax; i++ {
		d *= 2
	}
	d = min(d, c.opts.backoffMax)
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// sleep waits d or until ctx is done; it reports whether the full wait
// passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// stopped is the error of a call whose context ended while retrying.
func (c *Client) stopped(ctx context.Context, op string, last error) error {
	if c.isClosed() {
		return ErrClosed
	}
	reason := ctx.Err()
	switch {
	case reason != nil:
	case callOver(ctx):
		reason = context.DeadlineExceeded
	default:
		reason = errAttempts
	}
	return &retryError{op: op, reason: reason, last: last}
}

// attemptContext bounds one attempt by the attempt timeout.
func (c *Client) attemptContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.opts.attemptTimeout > 0 {
		return context.WithTimeout(ctx, c.opts.attemptTimeout)
	}
	return ctx, func() {}
}

// callBounds bounds one call of invoke and its attempts with as few
// contexts as it can: the first attempt runs in one context with the
// earlier of the call's deadline and the attempt timeout, derived from
// the caller's context; the call's own context (callContext: the
// deadline, and an end when the client closes) is made only for what
// comes after, a retry or a routing refresh. Two deadline contexts and a
// registration with the client's per call otherwise, which are a tenth
// of the SDK's CPU per put at 256 clients. A first attempt in flight when
// the client closes ends all the same: Close closes its connection.
type callBounds struct {
	c      *Client
	caller context.Context
	// deadline is the call's: the caller's, or the default timeout from
	// the call's start (zero: none).
	deadline time.Time
	// call is the call's context once made, cancel its end.
	call   context.Context
	cancel context.CancelFunc
}

func (c *Client) newCallBounds(ctx context.Context) callBounds {
	b := callBounds{c: c, caller: ctx}
	if dl, ok := ctx.Deadline(); ok {
		b.deadline = dl
	} else if c.opts.defaultTimeout > 0 {
		b.deadline = time.Now().Add(c.opts.defaultTimeout)
	}
	return b
}

// callCtx returns the call's context, making it the first time: the
// caller's context ended at the call's deadline, and when the client
// closes.
func (b *callBounds) callCtx() context.Context {
	if b.call == nil {
		ctx, cancelDeadline := b.caller, context.CancelFunc(func() {})
		if !b.deadline.IsZero() {
			ctx, cancelDeadline = context.WithDeadline(ctx, b.deadline)
		}
		call, cancel := b.c.callContext(ctx) // has a deadline: the client's lifetime only
		b.call, b.cancel = call, func() { cancel(); cancelDeadline() }
	}
	return b.call
}

// attempt returns the context of the next attempt: the call's context
// (or before it is made, the caller's) bounded by the attempt timeout and
// the call's deadline, carrying the attempt's probe when write is set.
// End it with end.
func (b *callBounds) attempt(write bool) *attemptCtx {
	parent := b.call
	if parent == nil {
		parent = b.caller
	}
	dl := b.deadline
	if t := b.c.opts.attemptTimeout; t > 0 {
		if adl := time.Now().Add(t); dl.IsZero() || adl.Before(dl) {
			dl = adl
		}
	}
	return &attemptCtx{parent: parent, deadline: dl, write: write}
}

// release ends the call's context, if made.
func (b *callBounds) release() {
	if b.cancel != nil {
		b.cancel()
	}
}

// attemptProbe learns whether an attempt's RPC got a transport stream, that
// is, whether the request may have reached the node (see sentInterceptor).
type attemptProbe struct{ sent atomic.Bool }

type attemptProbeKey struct{}

// attemptCtx is the context of one attempt (callBounds.attempt): parent
// ended at deadline (zero: parent's own), holding a write's attemptProbe
// (its Value for attemptProbeKey{}). It makes no timer and no registration
// with parent until it is asked for its Done channel or Err, which gRPC's
// Invoke and streams do: a call on the direct path (kvConn.callDirect)
// waits for its result on parent's Done and its KV.Calls stream's deadline
// timer instead (callStream.call). Per put at 256 clients that saves a
// timer started and stopped, a registration with the caller's context
// (under a lock every client's calls share when they share the context)
// and five allocations. After end it is canceled.
type attemptCtx struct {
	parent   context.Context
	deadline time.Time
	write    bool
	probe    attemptProbe

	// made is set once ctx is: parent with the deadline, and cancel.
	made   atomic.Bool
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	ended  bool
}

// Deadline is the attempt's deadline, or parent's if it has none.
func (a *attemptCtx) Deadline() (time.Time, bool) {
	if a.deadline.IsZero() {
		return a.parent.Deadline()
	}
	return a.deadline, true
}

// Done is closed at the deadline, when parent ends, or at end.
func (a *attemptCtx) Done() <-chan struct{} { return a.real().Done() }

// Err is the reason Done is closed.
func (a *attemptCtx) Err() error { return a.real().Err() }

// Value is the attempt's probe for attemptProbeKey{} (a write's), else
// parent's value (the real context's once made, so that contexts derived
// from the attempt find it as their parent to cancel them).
func (a *attemptCtx) Value(key any) any {
	if _, ok := key.(attemptProbeKey); ok && a.write {
		return &a.probe
	}
	if a.made.Load() {
		return a.ctx.Value(key)
	}
	return a.parent.Value(key)
}

// real returns the context that Done and Err report on, making it the
// first time (canceled already after end).
func (a *attemptCtx) real() context.Context {
	if a.made.Load() {
		return a.ctx
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ctx == nil {
		if a.deadline.IsZero() {
			a.ctx, a.cancel = context.WithCancel(a.parent)
		} else {
			a.ctx, a.cancel = context.WithDeadline(a.parent, a.deadline)
		}
		if a.ended {
			a.cancel()
		}
		a.made.Store(true)
	}
	return a.ctx
}

// end ends the attempt: its context, if made, is canceled.
func (a *attemptCtx) end() {
	a.mu.Lock()
	a.ended = true
	cancel := a.cancel
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// sentInterceptor marks the attemptProbe of the call's context when the
// RPC got a transport stream. It is the innermost interceptor of every
// connection but the KV.Calls one (callMux, which reports a call it queued
// on its stream as sent), so a call the auth interceptor resends is seen
// each time.
func sentInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	p, _ := ctx.Value(attemptProbeKey{}).(*attemptProbe)
	if p == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	// gRPC fills the peer only once a transport stream exists: an RPC
	// failed before that (no connection) never left the client.
	var pr peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&pr))...)
	if pr.Addr != nil {
		p.sent.Store(true)
	}
	return err
}

// learnShards installs the shards an EpochMismatch describes (the
// shard's current descriptor and the shard after it, with its leader) and
// reports whether it learnt anything new.
func (c *Client) learnShards(em *shalev1.EpochMismatch) bool {
	learnt := c.rt.apply(em.GetCurrent())
	if nx := em.GetNext(); nx != nil && c.rt.apply(nx.GetDescriptor_()) {
		learnt = true
		if l := nx.GetLeaderNodeId(); l != 0 && c.rt.addr(l) != "" {
			c.rt.setLeader(nx.GetDescriptor_().GetShardId(), l)
		}
	}
	return learnt
}

// invoke runs one logical request against the shard of tg, retrying as the
// package documentation describes until it succeeds, fails for good, or
// ctx (with the default timeout applied) ends. The error of a write
// (spec.write) some attempt of which may have applied matches
// ErrOutcomeUnknown.
func (c *Client) invoke(ctx context.Context, spec *callSpec, tg target, fn attemptFunc) error {
	var maybeApplied bool
	ctx, sp := c.startCall(ctx, spec.op)
	err := c.attempts(ctx, spec, tg, fn, &maybeApplied)
	if err != nil && maybeApplied {
		err = &outcomeUnknownError{op: spec.op, cause: err}
	}
	endCall(sp, err)
	return err
}

// attempts is invoke's retry loop; it sets *maybeApplied once an attempt
// of a write fails in a way that does not rule out that it applied.
func (c *Client) attempts(ctx context.Context, spec *callSpec, tg target, fn attemptFunc, maybeApplied *bool) error {
	// ctx is the caller's context until the call's own is needed (after
	// the first attempt, or before it when routing must be refreshed or a
	// connection made): bounds makes it then.
	bounds := c.newCallBounds(ctx)
	defer bounds.release()
	var (
		last      error
		nback     int // consecutive backoffs
		immediate int // consecutive retries without backoff
		nroute    int // consecutive routing errors
		override  uint64
		avoid     = map[uint64]bool{}
		rr        = rand.Uint64() // replica rotation, spreads load
	)
	// retry waits the backoff before the next attempt; false means stop.
	retry := func() bool {
		immediate = 0
		nback++
		return sleep(ctx, c.backoff(nback))
	}
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return c.stopped(ctx, spec.op, last)
		}
		if c.opts.maxAttempts > 0 && attempt > c.opts.maxAttempts {
			return &retryError{op: spec.op, reason: errAttempts, last: last}
		}
		sh, gen := c.rt.locate(tg)
		if sh == nil {
			ctx = bounds.callCtx()
			// The cache has no shard for the key (a gap left by a split):
			// refresh, and back off if that does not help.
			if err := c.refreshRouting(ctx, gen); err != nil {
				if ctx.Err() == nil {
					last = err
				}
				if !retry() {
					return c.stopped(ctx, spec.op, last)
				}
				continue
			}
			if sh, _ = c.rt.locate(tg); sh == nil {
				last = status.Errorf(codes.Unavailable, "no shard covers key %q", tg.key)
				if !retry() {
					return c.stopped(ctx, spec.op, last)
				}
				continue
			}
		}
		node := override
		override = 0
		if node == 0 {
			node = pickReplica(sh, spec.leaderOnly, avoid, &rr)
		}
		addr := c.rt.addr(node)
		if node == 0 || addr == "" {
			ctx = bounds.callCtx()
			last = status.Errorf(codes.Unavailable, "no address known for a replica of shard %d", sh.id())
			if err := c.refreshRouting(ctx, gen); err != nil && ctx.Err() == nil {
				last = err
			}
			if !retry() {
				return c.stopped(ctx, spec.op, last)
			}
			continue
		}
		cc, mux, err := c.connMux(addr)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return err
			}
			ctx = bounds.callCtx()
			last = err
			avoid[node] = true
			if !retry() {
				return c.stopped(ctx, spec.op, last)
			}
			continue
		}
		hdr := &shalev1.RequestHeader{
			ShardId:     sh.id(),
			Epoch:       sh.epoch(),
			RequestId:   spec.requestID,
			Consistency: spec.consistency,
			// Only the first attempt can promise the server that the ID is
			// new; any later one may follow an attempt that was applied.
			// An application's own ID may have been sent by an earlier
			// call, so no attempt of it is a first.
			FirstAttempt: attempt == 1 && len(spec.requestID) > 0 && !spec.appRequestID,
		}
		// Only a write's outcome can be unknown: reads skip the probe (and
		// the interceptor's peer lookup).
		actx := bounds.attempt(spec.write)
		err = fn(actx, &kvConn{c: c, cc: cc, addr: addr, node: node, mux: mux}, sh, hdr)
		actx.end()
		if err == nil {
			if spec.leaderOnly && sh.leader.Load() != node {
				c.rt.setLeader(sh.id(), node)
			}
			return nil
		}
		ctx = bounds.callCtx()
		if spec.write && !ruledOut(err, actx.probe.sent.Load()) {
			*maybeApplied = true
		}
		if c.isClosed() {
			return ErrClosed
		}
		if _, fromGRPC := err.(interface{ GRPCStatus() *status.Status }); !fromGRPC {
			return err // not an RPC failure: the attempt function's own verdict
		}
		st := status.Convert(err)
		if callOver(ctx) {
			// The call's own deadline or cancellation cut this attempt
			// short: the error before it says more about why.
			if last == nil || !ctxCode(st.Code()) {
				last = typed(err)
			}
			return c.stopped(ctx, spec.op, last)
		}
		last = typed(err)
		d := statusDetails(st)
		c.log.Debug("shale client: attempt failed", "op", spec.op, "shard", sh.id(), "node", node,
			"attempt", attempt, "error", err)
		switch {
		case d.crossShard != nil:
			return last
		case isWrongNode(err) && immediate < maxImmediate:
			// The address reached another node; its connection is
			// retired, so the same node is dialed again.
			immediate++
			override = node
		case d.notLeader != nil:
			nroute = 0
			hint := d.notLeader.GetLeaderNodeId()
			if hint != 0 && hint != node {
				c.rt.setAddr(hint, d.notLeader.GetLeaderAddress())
				c.rt.setLeader(sh.id(), hint)
				override = hint
				if immediate < maxImmediate {
					immediate++
					continue
				}
			} else {
				avoid[node] = true
				c.rt.clearLeader(sh, node)
			}
			if !retry() {
				return c.stopped(ctx, spec.op, last)
			}
		case d.epoch != nil || d.outside != nil || d.notFound != nil:
			nroute++
			if d.notFound != nil {
				avoid[node] = true
			}
			if cur := d.epoch.GetCurrent(); cur != nil && cur.GetShardId() == sh.id() && cur.GetEpoch() < sh.epoch() {
				// The replica lags behind the routing we have: ask another.
				avoid[node] = true
				if !retry() {
					return c.stopped(ctx, spec.op, last)
				}
				continue
			}
			if c.learnShards(d.epoch) && nroute == 1 {
				// The replica told us the shard's new shape, and the shard
				// after it (a split's new shard).
				if sh, _ := c.rt.locate(tg); sh != nil {
					continue
				}
			}
			if err := c.refreshRouting(ctx, gen); err != nil && ctx.Err() == nil {
				last = err
			}
			if nroute > 1 && !retry() {
				return c.stopped(ctx, spec.op, last)
			}
		case overloaded(st):
			if !retry() {
				return c.stopped(ctx, spec.op, last)
			}
		case st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled:
			// Unreachable, stalled or without quorum: try the next replica.
			avoid[node] = true
			c.rt.clearLeader(sh, node)
			if !retry() {
				return c.stopped(ctx, spec.op, last)
			}
		default:
			return last
		}
	}
}

// callOver reports whether ctx has ended or its deadline has passed (gRPC
// may fail an attempt for the deadline a moment before ctx.Err reports it).
func callOver(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// ctxCode reports whether a status code is what a context's end produces.
func ctxCode(c codes.Code) bool { return c == codes.DeadlineExceeded || c == codes.Canceled }

// pickReplica chooses the node for the next attempt: the cached leader
// unless it failed in this call, else the next replica (a voter when the
// leader is needed) that has not failed, rotating. When every candidate
// failed, the slate is wiped and they are tried again.
func pickReplica(sh *shardRoute, leaderOnly bool, avoid map[uint64]bool, rr *uint64) uint64 {
	if l := sh.leader.Load(); l != 0 && !avoid[l] {
		return l
	}
	reps := sh.desc.GetReplicas()
	var cands []uint64
	for pass := 0; pass < 2 && len(cands) == 0; pass++ {
		for _, r := range reps {
			if leaderOnly && !isVoter(r) {
				continue
			}
			if !avoid[r.GetNodeId()] {
				cands = append(cands, r.GetNodeId())
			}
		}
		if len(cands) == 0 {
			clear(avoid)
		}
	}
	if len(cands) == 0 {
		return 0
	}
	*rr++
	return cands[*rr%uint64(len(cands))]
}
