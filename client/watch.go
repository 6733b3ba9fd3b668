package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// ErrCompacted is matched (errors.Is) by the error that ends a watch whose
// start revision, on some shard, is older than the history the shard's
// replicas still keep: changes would be lost, so the watch stops instead.
var ErrCompacted = errors.New("shale: watch: revision compacted")

// WatchOption configures Watch.
type WatchOption interface{ applyWatch(*watchOptions) }

type watchOptions struct {
	prefix    []byte
	hasPrefix bool
	prevKV    bool
	progress  bool
	startRev  uint64
	created   bool
}

type watchOptionFunc func(*watchOptions)

func (f watchOptionFunc) applyWatch(o *watchOptions) { f(o) }

// WithWatchPrefix watches the keys starting with p, in place of a range:
// Watch's start and end must then be nil.
func WithWatchPrefix(p []byte) WatchOption {
	return watchOptionFunc(func(o *watchOptions) { o.prefix, o.hasPrefix = bytes.Clone(p), true })
}

// WithProgressNotify delivers a WatchResponse without events whenever a
// shard's part of the range has been idle for the server's progress
// interval: its Revision says the part is current through it.
func WithProgressNotify() WatchOption {
	return watchOptionFunc(func(o *watchOptions) { o.progress = true })
}

// WithStartRevision starts the watch at revision rev of every shard the
// range covers (revisions are per shard: use it for a range inside one
// shard, or with the revisions of an earlier watch's responses). By
// default a watch starts after the revision each shard is at when the
// watch's stream reaches it, which can be after Watch returns: to see a
// write made just after Watch, watch from that write's revision.
func WithStartRevision(rev uint64) WatchOption {
	return watchOptionFunc(func(o *watchOptions) { o.startRev = rev })
}

// WithCreatedNotify makes the watch's first response a Created one,
// delivered once a stream of every shard's part of the range has started
// (as etcd's clientv3.WithCreatedNotify): every change made after it
// arrives is delivered, so a caller that writes after it needs no start
// revision. No change is delivered before it.
func WithCreatedNotify() WatchOption {
	return watchOptionFunc(func(o *watchOptions) { o.created = true })
}

// EventType says what a change did.
type EventType int

const (
	// EventPut wrote a value.
	EventPut EventType = iota
	// EventDelete removed a key: a Delete, a DeleteRange that covered it,
	// or its expiry (a TTL's end is deleted by the shard's leader as a
	// replicated write, with its own revision).
	EventDelete
)

// String returns "PUT" or "DELETE" (or "EventType(N)" for another value).
func (t EventType) String() string {
	switch t {
	case EventPut:
		return "PUT"
	case EventDelete:
		return "DELETE"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change to a watched key.
type Event struct {
	Type EventType
	// KV is the key after the change: its value and revisions for a put;
	// for a delete, the key with ModRevision the deletion's revision.
	KV *KeyValue
	// PrevKV is the key before the change, with WithPrevKV (nil when it was
	// absent).
	PrevKV *KeyValue
}

// WatchResponse is a step of a watch: changes of one shard's part of the
// range, in revision order. Responses of different shards interleave;
// changes to one key always come in its revision order, across splits and
// merges too.
type WatchResponse struct {
	// ShardID is the shard the changes come from.
	ShardID uint64
	// Revision: every change to the shard's part of the range at or below
	// it has been delivered.
	Revision uint64
	// Events are the changes; none in a progress notification.
	Events []Event
	// Created is set on the first response of a watch with
	// WithCreatedNotify, and on no other: the watch's streams have all
	// started. It has no events, and ShardID and Revision are 0.
	Created bool
	// Err, set on the last response before the channel closes, says why
	// the watch ended (nil when its context ended).
	Err error
}

// Watch follows the changes to the keys in [start, end) (nil or empty end:
// the end of the key space) and returns a channel of them, closed when ctx
// ends or the watch fails for good (its last response then carries Err).
//
// The range may span shards: the client watches each shard's part and
// follows splits, merges and leader changes, and reconnects after errors,
// resuming every part from the revision after the last one it delivered,
// so every change is delivered once. A watch whose resumption point is no
// longer in a shard's history ends with ErrCompacted.
//
// Read the channel promptly: a consumer that falls far behind makes the
// server drop the stream, which the client then resumes from where it was.
func (c *Client) Watch(ctx context.Context, start, end []byte, opts ...WatchOption) <-chan WatchResponse {
	var o watchOptions
	for _, opt := range opts {
		opt.applyWatch(&o)
	}
	out := make(chan WatchResponse, 16)
	if o.hasPrefix {
		if start != nil || end != nil {
			out <- WatchResponse{Err: wrapOp("watch", invalidArgf("WithWatchPrefix needs nil start and end"))}
			close(out)
			return out
		}
		start, end = o.prefix, prefixEnd(o.prefix)
	}
	if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		out <- WatchResponse{Err: wrapOp("watch", invalidArgf("watch range [%q, %q) is empty", start, end))}
		close(out)
		return out
	}
	if start == nil {
		start = []byte{}
	}
	if len(end) == 0 {
		end = nil
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	ws := &watchStream{c: c, o: o, out: out, cancel: cancel, created: make(chan struct{})}
	ws.spawn(ctx, &watchPart{lo: bytes.Clone(start), hi: bytes.Clone(end), next: o.startRev})
	go func() {
		ws.wg.Wait()
		cancel()
		ws.mu.Lock()
		err := ws.err
		ws.mu.Unlock()
		if err != nil {
			select {
			case out <- WatchResponse{Err: err}:
			case <-parent.Done(): // nobody reads any more
			}
		}
		close(out)
	}()
	return out
}

// watchStream is one Watch call: a goroutine per part of the range.
type watchStream struct {
	c      *Client
	o      watchOptions
	out    chan WatchResponse
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error // the first terminal error
	// pending counts the parts no stream of which has started yet
	// (WithCreatedNotify), until created is closed: the Created response
	// was sent, and the parts may deliver changes.
	pending        int
	createdClaimed bool // a part is sending the Created response
	created        chan struct{}
}

// watchPart is a part of the range watched on one shard.
type watchPart struct {
	lo, hi []byte // hi nil: the end of the key space
	// shard and epoch: the shard serving the part, and its epoch when the
	// part was found inside it (0: to resolve).
	shard, epoch uint64
	// next is the first revision still to deliver (0: after the shard's
	// current one, until the first response fixes it).
	next uint64
	// revShard is the shard whose revisions next counts: the last shard a
	// stream of the part started on (0: none yet). A shard split off keeps
	// its parent's revisions; one that absorbed the part's shard in a merge
	// does not, and refuses a resume that would skip changes.
	revShard uint64
	// begun is set once a stream of the part has started.
	begun bool
}

func (ws *watchStream) spawn(ctx context.Context, p *watchPart) {
	if ws.o.created {
		ws.mu.Lock()
		ws.pending++
		ws.mu.Unlock()
	}
	ws.wg.Add(1)
	go func() {
		defer ws.wg.Done()
		if err := ws.run(ctx, p); err != nil {
			ws.mu.Lock()
			if ws.err == nil {
				ws.err = err
			}
			ws.mu.Unlock()
			ws.cancel()
		}
	}()
}

// resolve finds the shard holding the start of p; a part reaching beyond
// it is cut there and the rest spawned as a new part.
func (ws *watchStream) resolve(ctx context.Context, p *watchPart) error {
	c := ws.c
	for attempt := 1; ; attempt++ {
		sh, gen := c.rt.locate(target{key: p.lo})
		if sh != nil {
			p.shard, p.epoch = sh.id(), sh.epoch()
			if e := sh.desc.GetEndKey(); len(e) > 0 && (p.hi == nil || bytes.Compare(p.hi, e) > 0) {
				rest := &watchPart{lo: bytes.Clone(e), hi: p.hi, next: p.next, revShard: p.revShard}
				p.hi = bytes.Clone(e)
				ws.spawn(ctx, rest)
			}
			return nil
		}
		if err := c.refreshRouting(ctx, gen); err != nil && ctx.Err() != nil {
			return err
		}
		if !sleep(ctx, c.backoff(attempt)) {
			return ctx.Err()
		}
	}
}

// run watches one part until ctx ends (nil) or a terminal error.
func (ws *watchStream) run(ctx context.Context, p *watchPart) error {
	c := ws.c
	var (
		nback     int
		immediate int    // retries without backoff in a row
		override  uint64 // the node a leader hint named
		lastMove  uint64 // p.next after the last range change
		avoid     = map[uint64]bool{}
		rr        = rand.Uint64()
	)
	backoff := func() bool {
		nback++
		immediate = 0
		return sleep(ctx, c.backoff(nback))
	}
	for ctx.Err() == nil {
		if p.shard == 0 {
			if err := ws.resolve(ctx, p); err != nil {
				return nil // ctx ended
			}
		}
		sh := c.rt.shard(p.shard)
		if sh == nil {
			// The routing no longer knows the shard (merged away): the
			// part's range is elsewhere now.
			p.shard = 0
			if !backoff() {
				return nil
			}
			continue
		}
		node := override
		override = 0
		if node == 0 {
			node = pickReplica(sh, true, avoid, &rr)
		}
		addr := c.rt.addr(node)
		if node == 0 || addr == "" {
			_ = c.refreshRouting(ctx, -1)
			if !backoff() {
				return nil
			}
			continue
		}
		cc, err := c.conn(addr)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return err
			}
			avoid[node] = true
			if !backoff() {
				return nil
			}
			continue
		}
		req := &shalev1.WatchRequest{
			Header:         &shalev1.RequestHeader{ShardId: p.shard},
			StartKey:       p.lo,
			EndKey:         p.hi,
			PrevKv:         ws.o.prevKV,
			StartRevision:  p.next,
			ProgressNotify: ws.o.progress,
		}
		if p.next != 0 {
			req.RangeEpoch = p.epoch
			req.RevisionShardId = p.revShard
		}
		moved, started, err := ws.stream(ctx, shalev1.NewKVClient(cc), node, req, p)
		if started {
			// The replica served the stream: start afresh on trouble.
			nback, immediate = 0, 0
			clear(avoid)
		}
		if moved != nil {
			// A split or merge moved part of the range: resolve it anew.
			// The refreshed routing may predate the change (the shard
			// directory learns of it a little later): the change's own
			// descriptor goes back in, and the same change met again
			// (a stale route sent the part back to it) waits a backoff.
			_ = c.refreshRouting(ctx, -1)
			c.rt.apply(moved)
			p.shard = 0
			again := p.next == lastMove
			lastMove = p.next
			if again && !backoff() {
				return nil
			}
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		hint, terminal := ws.classify(ctx, err, p, node, avoid)
		switch {
		case terminal != nil:
			return terminal
		case hint != 0 && immediate < maxImmediate:
			immediate++
			override = hint
		case hint == 0 && immediate < maxImmediate && status.Code(err) == codes.ResourceExhausted:
			immediate++ // dropped as too slow: resume at once
		default:
			if !backoff() {
				return nil
			}
		}
	}
	return nil
}

// stream runs one Watch stream of p on node's replica (another node at
// its address refuses it); moved is the shard's descriptor when
// the stream ended with a range change (p.next then follows it), started
// reports that the replica accepted the stream.
func (ws *watchStream) stream(ctx context.Context, kv shalev1.KVClient, node uint64, req *shalev1.WatchRequest, p *watchPart) (moved *shalev1.ShardDescriptor, started bool, _ error) {
	st, err := kv.Watch(toNode(ctx, node), req)
	if err != nil {
		return nil, false, err
	}
	gated := ws.o.created // changes wait for the Created response
	for {
		m, err := st.Recv()
		if err != nil {
			return nil, started, err
		}
		rev := m.GetHeader().GetRevision()
		if !started {
			started = true
			if p.next == 0 {
				p.next = rev + 1
			}
			p.revShard = p.shard
			if !p.begun {
				p.begun = true
				if err := ws.partStarted(ctx); err != nil {
					return nil, started, err
				}
			}
			continue
		}
		if gated {
			select {
			case <-ws.created:
				gated = false
			case <-ctx.Done():
				return nil, started, ctx.Err()
			}
		}
		if len(m.GetEvents()) > 0 || (ws.o.progress && m.GetRangeChange() == nil) {
			resp := WatchResponse{ShardID: p.shard, Revision: rev, Events: make([]Event, 0, len(m.GetEvents()))}
			for _, e := range m.GetEvents() {
				ev := Event{KV: fromProto(e.GetKv()), PrevKV: fromProto(e.GetPrevKv())}
				if e.GetType() == shalev1.WatchEvent_TYPE_DELETE {
					ev.Type = EventDelete
				}
				resp.Events = append(resp.Events, ev)
			}
			select {
			case ws.out <- resp:
			case <-ctx.Done():
				return nil, started, ctx.Err()
			}
		}
		if rev+1 > p.next {
			p.next = rev + 1
		}
		if rc := m.GetRangeChange(); rc != nil {
			return rc, started, nil
		}
	}
}

// partStarted counts a part's first stream as started; the last part of
// the range to start sends the Created response (WithCreatedNotify) and
// lets the parts deliver changes.
func (ws *watchStream) partStarted(ctx context.Context) error {
	if !ws.o.created {
		return nil
	}
	ws.mu.Lock()
	ws.pending--
	// A part spawned after the Created response (a split) finds it claimed.
	send := ws.pending == 0 && !ws.createdClaimed
	ws.createdClaimed = ws.createdClaimed || send
	ws.mu.Unlock()
	if !send {
		return nil
	}
	select {
	case ws.out <- WatchResponse{Created: true}:
		close(ws.created)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// classify decides what an error ending a stream means: end the watch
// (terminal), or retry, on the leader a hint named (hint) or, after a
// backoff, on another replica.
func (ws *watchStream) classify(ctx context.Context, err error, p *watchPart, node uint64, avoid map[uint64]bool) (hint uint64, terminal error) {
	c := ws.c
	if c.isClosed() {
		return 0, ErrClosed
	}
	c.log.Debug("shale client: watch stream ended", "shard", p.shard, "node", node, "next", p.next, "err", err)
	st := status.Convert(err)
	d := statusDetails(st)
	var wi *shalev1.WatchInterrupted
	for _, x := range st.Details() {
		if v, ok := x.(*shalev1.WatchInterrupted); ok {
			wi = v
		}
	}
	if wi != nil && wi.GetResumeRevision() > p.next {
		p.next = wi.GetResumeRevision()
	}
	switch {
	case st.Code() == codes.OutOfRange && wi != nil:
		return 0, fmt.Errorf("shale: watch [%q, %q) on shard %d from revision %d: %w (%v)", p.lo, p.hi, p.shard, p.next, ErrCompacted, err)
	case st.Code() == codes.InvalidArgument:
		return 0, wrapOp("watch", typed(err))
	case st.Code() == codes.PermissionDenied, st.Code() == codes.Unauthenticated, errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrPermissionDenied):
		// Not allowed (or no longer: a revoked permission ends the
		// stream), or the credentials were refused even after a new
		// login: waiting cures neither.
		return 0, wrapOp("watch", authTyped(err))
	case st.Code() == codes.ResourceExhausted && wi != nil:
		return 0, nil // too slow: resume (at once, see run)
	case d.notLeader != nil:
		avoid[node] = true
		if h := d.notLeader.GetLeaderNodeId(); h != 0 && h != node {
			c.rt.setAddr(h, d.notLeader.GetLeaderAddress())
			c.rt.setLeader(p.shard, h)
			delete(avoid, h) // fresh news of it
			return h, nil
		}
		return 0, nil
	case d.outside != nil || d.epoch != nil || d.notFound != nil:
		avoid[node] = true
		if cur := d.epoch.GetCurrent(); cur != nil {
			c.rt.apply(cur)
		}
		if cur := d.outside.GetShard(); cur != nil {
			c.rt.apply(cur)
		}
		_ = c.refreshRouting(ctx, -1)
		if d.outside != nil {
			p.shard = 0 // the shard no longer holds the part
		}
		return 0, nil
	}
	// Unavailable, a lost connection, a stopping node: try another replica.
	avoid[node] = true
	if sh := c.rt.shard(p.shard); sh != nil {
		c.rt.clearLeader(sh, node)
	}
	return 0, nil
}
