package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Consistency chooses how a read is ordered against writes.
type Consistency int

const (
	// Linearizable reads reflect every write acknowledged before the read
	// started. They are served by the shard's leader. The default.
	Linearizable Consistency = iota
	// Follower reads are linearizable too, but any replica may serve them
	// (after a ReadIndex round trip to the leader). The client still
	// prefers the leader and falls back to the other replicas when it
	// fails.
	Follower
	// Stale reads are served from a replica's applied state without any
	// coordination: they may miss recent writes, but need no leader.
	Stale
)

// String returns "linearizable", "follower" or "stale".
func (c Consistency) String() string {
	switch c {
	case Linearizable:
		return "linearizable"
	case Follower:
		return "follower"
	case Stale:
		return "stale"
	}
	return fmt.Sprintf("Consistency(%d)", int(c))
}

// ParseConsistency parses the names String returns.
func ParseConsistency(s string) (Consistency, error) {
	switch s {
	case "linearizable", "":
		return Linearizable, nil
	case "follower":
		return Follower, nil
	case "stale":
		return Stale, nil
	}
	return 0, fmt.Errorf("%w: unknown consistency %q (want linearizable, follower or stale)", ErrInvalidArgument, s)
}

func (c Consistency) proto() shalev1.ReadConsistency {
	switch c {
	case Follower:
		return shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER
	case Stale:
		return shalev1.ReadConsistency_READ_CONSISTENCY_STALE
	}
	return shalev1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE_UNSPECIFIED
}

// readSpec is the callSpec of a read at consistency c.
func readSpec(op string, c Consistency) *callSpec {
	return &callSpec{op: op, leaderOnly: c == Linearizable, consistency: c.proto()}
}

// writeSpec is the callSpec of a write: with the application's request ID
// when it gave one (WithRequestID), else with a fresh one. It is a value,
// which the caller keeps on its stack.
func writeSpec(op string, rid requestIDOpt) callSpec {
	if rid.set {
		return callSpec{op: op, leaderOnly: true, write: true, requestID: rid.id, appRequestID: true}
	}
	return callSpec{op: op, leaderOnly: true, write: true, requestID: newRequestID()}
}

// requestIDOpt is the request ID an application gave a write, if any.
type requestIDOpt struct {
	id  []byte
	set bool
}

// check refuses an ID the server would refuse.
func (r requestIDOpt) check() error {
	if r.set && (len(r.id) < 8 || len(r.id) > 32) {
		return invalidArgf("WithRequestID: the ID is %d bytes; want 8 to 32", len(r.id))
	}
	return nil
}

// RequestIDOption gives a write the application's own request ID; see
// WithRequestID. It is a PutOption, a DeleteOption, a CASOption and a
// CommitOption.
type RequestIDOption struct{ id []byte }

// WithRequestID gives a write (Put, Delete, CompareAndSwap, Client.Commit
// of a Batch, Txn.Commit) the application's own request ID, 8 to 32 bytes
// (ErrInvalidArgument otherwise), instead of a fresh random one.
//
// The cluster applies a write with a given ID at most once. An application
// that sends the same write again with the same ID — after an error
// matching ErrOutcomeUnknown, or after a restart of its own — gets the
// earlier application's result if it applied, and applies it now if it
// did not. The promise holds while the shard remembers the ID: each shard
// keeps the IDs of its last 100,000 writes (the server's deduplication
// capacity), through leader changes, restarts, splits and merges.
//
// An ID must name one write: another write sent with it returns the first
// one's result without applying. Use 16 random bytes (a UUID) or a name
// unique to the write. The option is refused in OpPut and OpDelete: it
// names a whole Batch or Txn, so pass it to Commit.
func WithRequestID(id []byte) RequestIDOption { return RequestIDOption{id: id} }

func (o RequestIDOption) applyPut(p *putOptions)       { p.rid = requestIDOpt{id: o.id, set: true} }
func (o RequestIDOption) applyDelete(d *deleteOptions) { d.rid = requestIDOpt{id: o.id, set: true} }
func (o RequestIDOption) applyCAS(c *casOptions)       { c.rid = requestIDOpt{id: o.id, set: true} }
func (o RequestIDOption) applyCommit(c *commitOptions) { c.rid = requestIDOpt{id: o.id, set: true} }

// errRequestIDInOp is the error of an OpPut or OpDelete given WithRequestID.
func errRequestIDInOp() error {
	return invalidArgf("WithRequestID names a whole write: pass it to Commit, not to one operation of a Batch or Txn")
}

// KeyValue is a key with its value and revisions, as stored by the shard
// that holds it.
type KeyValue struct {
	// Key is the key.
	Key []byte
	// Value is the value (nil for scans with WithKeysOnly).
	Value []byte
	// CreateRevision is the shard revision of the write that created the
	// key (since it was last absent).
	CreateRevision uint64
	// ModRevision is the shard revision of the last write to the key.
	ModRevision uint64
	// Version counts the writes to the key since its creation (1 after the
	// creating write).
	Version uint64
	// ExpireAt is when the key expires (its TTL); the zero time for never.
	ExpireAt time.Time
}

// fromProto converts a KeyValue message (nil stays nil).
func fromProto(kv *shalev1.KeyValue) *KeyValue {
	if kv == nil {
		return nil
	}
	out := &KeyValue{
		Key:            kv.GetKey(),
		Value:          kv.GetValue(),
		CreateRevision: kv.GetCreateRevision(),
		ModRevision:    kv.GetModRevision(),
		Version:        kv.GetVersion(),
	}
	if ns := kv.GetExpireUnixNanos(); ns != 0 {
		out.ExpireAt = time.Unix(0, ns)
	}
	return out
}

// ReadOption configures Get and MultiGet.
type ReadOption func(*readOptions)

type readOptions struct{ consistency Consistency }

// WithConsistency sets the read's consistency (default Linearizable).
func WithConsistency(c Consistency) ReadOption {
	return func(o *readOptions) { o.consistency = c }
}

func readOpts(opts []ReadOption) readOptions {
	return applied(opts, func(f ReadOption, o *readOptions) { f(o) })
}

// PutOption configures Put (and OpPut and Batch.Put).
type PutOption interface{ applyPut(*putOptions) }

// DeleteOption configures Delete (and OpDelete and Batch.Delete).
type DeleteOption interface{ applyDelete(*deleteOptions) }

// PrevKVOption is a PutOption, a DeleteOption and a WatchOption.
type PrevKVOption interface {
	PutOption
	DeleteOption
	WatchOption
}

type putOptions struct {
	ttl    time.Duration
	prevKV bool
	rid    requestIDOpt
}

type deleteOptions struct {
	prevKV bool
	rid    requestIDOpt
}

// applied returns the options opts set, applying each with apply. With
// no opts it takes no allocation (the options applied to escape to the
// heap: apply sees their address).
func applied[T, O any](opts []O, apply func(O, *T)) T {
	if len(opts) == 0 {
		var none T
		return none
	}
	var o T
	for _, opt := range opts {
		apply(opt, &o)
	}
	return o
}

type ttlOption time.Duration

func (t ttlOption) applyPut(o *putOptions) { o.ttl = time.Duration(t) }

// WithTTL makes the key expire d after the write applies. d is rounded up
// to whole milliseconds; 0 (the default) means never, a negative d is
// rejected with ErrInvalidArgument.
func WithTTL(d time.Duration) PutOption { return ttlOption(d) }

type prevKVOption struct{}

func (prevKVOption) applyPut(o *putOptions)       { o.prevKV = true }
func (prevKVOption) applyDelete(o *deleteOptions) { o.prevKV = true }
func (prevKVOption) applyWatch(o *watchOptions)   { o.prevKV = true }

// WithPrevKV asks a Put or Delete to return the key's previous value (in
// PutResult.PrevKV or DeleteResult.PrevKV, nil when the key was absent),
// and a Watch to deliver every event's previous value (Event.PrevKV).
func WithPrevKV() PrevKVOption { return prevKVOption{} }

// ttlMillis converts a TTL to the wire's milliseconds, rounding up.
func ttlMillis(d time.Duration) (int64, error) {
	if d < 0 {
		return 0, invalidArgf("negative TTL %v", d)
	}
	if d == 0 {
		return 0, nil
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond), nil
}

// PutResult is the outcome of a Put.
type PutResult struct {
	// Revision is the shard revision at which the write applied.
	Revision uint64
	// PrevKV is the previous key-value with WithPrevKV, nil otherwise or
	// when the key was absent.
	PrevKV *KeyValue
}

// DeleteResult is the outcome of a Delete.
type DeleteResult struct {
	// Revision is the shard revision at which the delete applied.
	Revision uint64
	// Deleted is true if the key existed.
	Deleted bool
	// PrevKV is the deleted key-value with WithPrevKV, nil otherwise or when
	// the key was absent.
	PrevKV *KeyValue
}

// Get reads key. It returns ErrNotFound when the key is absent.
func (c *Client) Get(ctx context.Context, key []byte, opts ...ReadOption) (*KeyValue, error) {
	o := readOpts(opts)
	var resp *shalev1.GetResponse
	err := c.invoke(ctx, readSpec("get", o.consistency), target{key: key},
		func(ctx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			var err error
			resp, err = shalev1.NewKVClient(cc).Get(ctx, &shalev1.GetRequest{Header: hdr, Key: key})
			return err
		})
	if err != nil {
		return nil, wrapOp("get", err)
	}
	if resp.GetKv() == nil {
		return nil, ErrNotFound
	}
	return fromProto(resp.GetKv()), nil
}

// errRegroup tells MultiGet that a group's keys no longer share a shard.
var errRegroup = errors.New("shale: keys no longer in one shard")

// MultiGet reads keys. result[i] is the value of keys[i], nil when absent.
// The keys are split per shard and each shard is asked once (concurrently),
// so the values of one shard are read at one point of its history, but
// different shards at different points. Duplicate keys are allowed.
func (c *Client) MultiGet(ctx context.Context, keys [][]byte, opts ...ReadOption) ([]*KeyValue, error) {
	o := readOpts(opts)
	out := make([]*KeyValue, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	pending := make([]int, len(keys))
	for i := range pending {
		pending[i] = i
	}
	for round := 1; len(pending) > 0; round++ {
		if round > 2 && !sleep(ctx, c.backoff(round-2)) {
			return nil, c.stopped(ctx, "multiget", errRegroup)
		}
		groups := c.groupByShard(keys, pending)
		var (
			mu       sync.Mutex
			wg       sync.WaitGroup
			firstErr error
			again    []int
		)
		for _, g := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := c.multiGetGroup(ctx, keys, g, o, out)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, errRegroup):
					again = append(again, g...)
				case err != nil && firstErr == nil:
					firstErr = err
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return nil, wrapOp("multiget", firstErr)
		}
		pending = again
	}
	return out, nil
}

// groupByShard splits the key indexes by cached shard (keys without a
// cached shard get a group each; the call will refresh the routing).
func (c *Client) groupByShard(keys [][]byte, idx []int) [][]int {
	byShard := map[uint64]int{}
	var groups [][]int
	for _, i := range idx {
		sh, _ := c.rt.locate(target{key: keys[i]})
		if sh == nil {
			groups = append(groups, []int{i})
			continue
		}
		g, ok := byShard[sh.id()]
		if !ok {
			g = len(groups)
			byShard[sh.id()] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// multiGetGroup reads the keys of one group, which the routing placed in
// one shard, into out.
func (c *Client) multiGetGroup(ctx context.Context, keys [][]byte, g []int, o readOptions, out []*KeyValue) error {
	req := make([][]byte, len(g))
	for j, i := range g {
		req[j] = keys[i]
	}
	gen := c.rt.generation()
	var resp *shalev1.MultiGetResponse
	err := c.invoke(ctx, readSpec("multiget", o.consistency), target{key: req[0]},
		func(ctx context.Context, cc grpc.ClientConnInterface, sh *shardRoute, hdr *shalev1.RequestHeader) error {
			for _, k := range req {
				if !sh.contains(k) {
					return errRegroup
				}
			}
			var err error
			resp, err = shalev1.NewKVClient(cc).MultiGet(ctx, &shalev1.MultiGetRequest{Header: hdr, Keys: req})
			if st, ok := status.FromError(err); ok && statusDetails(st).crossShard != nil {
				// Our routing was wrong about the shard's range.
				_ = c.refreshRouting(ctx, gen)
				return errRegroup
			}
			return err
		})
	if err != nil {
		return err
	}
	if len(resp.GetResults()) != len(req) {
		return fmt.Errorf("shale: multiget: shard %d answered %d results for %d keys", resp.GetHeader().GetShardId(), len(resp.GetResults()), len(req))
	}
	for j, r := range resp.GetResults() {
		out[g[j]] = fromProto(r.GetKv())
	}
	return nil
}

// Put sets key to value. Options: WithTTL, WithPrevKV. A Put retried after
// a failure carries the same request ID, so it applies at most once.
func (c *Client) Put(ctx context.Context, key, value []byte, opts ...PutOption) (*PutResult, error) {
	o := applied(opts, PutOption.applyPut)
	ttl, err := ttlMillis(o.ttl)
	if err == nil {
		err = o.rid.check()
	}
	if err != nil {
		return nil, wrapOp("put", err)
	}
	var resp *shalev1.PutResponse
	spec := writeSpec("put", o.rid)
	err = c.invoke(ctx, &spec, target{key: key},
		func(ctx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			var err error
			resp, err = shalev1.NewKVClient(cc).Put(ctx, &shalev1.PutRequest{
				Header: hdr, Key: key, Value: value, TtlMs: ttl, PrevKv: o.prevKV,
			})
			return err
		})
	if err != nil {
		return nil, wrapOp("put", err)
	}
	return &PutResult{Revision: resp.GetHeader().GetRevision(), PrevKV: fromProto(resp.GetPrevKv())}, nil
}

// Delete removes key. Deleting an absent key is not an error
// (DeleteResult.Deleted is false). Option: WithPrevKV.
func (c *Client) Delete(ctx context.Context, key []byte, opts ...DeleteOption) (*DeleteResult, error) {
	o := applied(opts, DeleteOption.applyDelete)
	if err := o.rid.check(); err != nil {
		return nil, wrapOp("delete", err)
	}
	var resp *shalev1.DeleteResponse
	spec := writeSpec("delete", o.rid)
	err := c.invoke(ctx, &spec, target{key: key},
		func(ctx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			var err error
			resp, err = shalev1.NewKVClient(cc).Delete(ctx, &shalev1.DeleteRequest{Header: hdr, Key: key, PrevKv: o.prevKV})
			return err
		})
	if err != nil {
		return nil, wrapOp("delete", err)
	}
	return &DeleteResult{
		Revision: resp.GetHeader().GetRevision(),
		Deleted:  resp.GetDeleted() > 0,
		PrevKV:   fromProto(resp.GetPrevKv()),
	}, nil
}

// DeleteRange removes every key in [start, end); an empty end means the end
// of the key space, an empty start its beginning. It sends one request per
// shard the range overlaps, in key order, and is atomic only within each
// shard: if it fails part-way, a prefix of the range (whole shards' parts)
// may already be deleted, and a concurrent reader may see some shards'
// parts deleted and others not. Calling it again completes it.
func (c *Client) DeleteRange(ctx context.Context, start, end []byte) error {
	if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		return wrapOp("delete-range", invalidArgf("empty range [%q, %q)", start, end))
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	cur := start
	for {
		var shardEnd []byte
		// Each shard's part is its own write with its own request ID: a
		// shard split after a part applied copies the deduplication table
		// to both halves, so reusing one ID across parts could make a later
		// part look like a duplicate.
		spec := writeSpec("delete-range", requestIDOpt{})
		err := c.invoke(ctx, &spec, target{key: cur},
			func(ctx context.Context, cc grpc.ClientConnInterface, sh *shardRoute, hdr *shalev1.RequestHeader) error {
				partEnd := end
				shardEnd = sh.desc.GetEndKey()
				if len(shardEnd) > 0 && (len(end) == 0 || bytes.Compare(shardEnd, end) < 0) {
					partEnd = shardEnd
				}
				partStart := cur
				if len(partStart) == 0 {
					// Keys are never empty: the smallest is one zero byte
					// (the server refuses an empty start).
					partStart = []byte{0}
				}
				_, err := shalev1.NewKVClient(cc).DeleteRange(ctx, &shalev1.DeleteRangeRequest{
					Header: hdr, StartKey: partStart, EndKey: partEnd,
				})
				return err
			})
		if err != nil {
			return wrapOp("delete-range", err)
		}
		if len(shardEnd) == 0 || (len(end) > 0 && bytes.Compare(shardEnd, end) >= 0) {
			return nil
		}
		cur = shardEnd
	}
}

// CASOption configures CompareAndSwap: ExpectAbsent, WithCASTTL,
// WithRequestID.
type CASOption interface{ applyCAS(*casOptions) }

type casOptionFunc func(*casOptions)

func (f casOptionFunc) applyCAS(o *casOptions) { f(o) }

type casOptions struct {
	expectAbsent bool
	ttl          time.Duration
	rid          requestIDOpt
}

// ExpectAbsent makes CompareAndSwap succeed only if the key is absent (the
// expected value is then ignored): a create-if-not-exists.
func ExpectAbsent() CASOption { return casOptionFunc(func(o *casOptions) { o.expectAbsent = true }) }

// WithCASTTL makes the key written by a successful CompareAndSwap expire d
// after it applies (rounded up to milliseconds; 0 means never).
func WithCASTTL(d time.Duration) CASOption { return casOptionFunc(func(o *casOptions) { o.ttl = d }) }

// CompareAndSwap atomically sets key to newValue if its current value is
// expected (or, with ExpectAbsent, if it is absent). ok reports whether the
// swap happened; current is the key's value before the operation (nil when
// it was absent), so on failure it tells what the value is. A failed
// comparison is not an error.
func (c *Client) CompareAndSwap(ctx context.Context, key, expected, newValue []byte, opts ...CASOption) (ok bool, current *KeyValue, err error) {
	o := applied(opts, CASOption.applyCAS)
	ttl, err := ttlMillis(o.ttl)
	if err == nil {
		err = o.rid.check()
	}
	if err != nil {
		return false, nil, wrapOp("compare-and-swap", err)
	}
	if o.expectAbsent {
		expected = nil
	}
	var resp *shalev1.CompareAndSwapResponse
	spec := writeSpec("compare-and-swap", o.rid)
	err = c.invoke(ctx, &spec, target{key: key},
		func(ctx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			var err error
			resp, err = shalev1.NewKVClient(cc).CompareAndSwap(ctx, &shalev1.CompareAndSwapRequest{
				Header: hdr, Key: key, ExpectedValue: expected, ExpectAbsent: o.expectAbsent,
				NewValue: newValue, TtlMs: ttl,
			})
			return err
		})
	if err != nil {
		return false, nil, wrapOp("compare-and-swap", err)
	}
	return resp.GetSucceeded(), fromProto(resp.GetCurrent()), nil
}

// clampUint32 converts a non-negative count to the wire's uint32.
func clampUint32(n int) uint32 {
	if n <= 0 {
		return 0
	}
	if n > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}
