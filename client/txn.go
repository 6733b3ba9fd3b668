package client

import (
	"bytes"
	"context"
	"fmt"

	"google.golang.org/grpc"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// OpType names the kind of an Op.
type OpType int

// The operation types.
const (
	// OpTypePut sets a key.
	OpTypePut OpType = iota + 1
	// OpTypeDelete removes a key.
	OpTypeDelete
	// OpTypeDeleteRange removes a range of keys.
	OpTypeDeleteRange
	// OpTypeGet reads a key (Txn only).
	OpTypeGet
)

// String returns "put", "delete", "delete-range" or "get".
func (t OpType) String() string {
	switch t {
	case OpTypePut:
		return "put"
	case OpTypeDelete:
		return "delete"
	case OpTypeDeleteRange:
		return "delete-range"
	case OpTypeGet:
		return "get"
	}
	return fmt.Sprintf("OpType(%d)", int(t))
}

// Op is one operation of a Batch or Txn, built with OpPut, OpDelete,
// OpDeleteRange or OpGet.
type Op struct {
	pb  *shalev1.RequestOp
	err error // an invalid option (negative TTL), reported by Commit
}

// Type returns the operation's kind (0 for the zero Op).
func (o Op) Type() OpType {
	switch o.pb.GetOp().(type) {
	case *shalev1.RequestOp_Put:
		return OpTypePut
	case *shalev1.RequestOp_Delete:
		return OpTypeDelete
	case *shalev1.RequestOp_DeleteRange:
		return OpTypeDeleteRange
	case *shalev1.RequestOp_Get:
		return OpTypeGet
	}
	return 0
}

// OpPut sets key to value. Options: WithTTL, WithPrevKV.
func OpPut(key, value []byte, opts ...PutOption) Op {
	o := applied(opts, PutOption.applyPut)
	ttl, err := ttlMillis(o.ttl)
	if o.rid.set {
		err = errRequestIDInOp()
	}
	return Op{pb: &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{
		Key: key, Value: value, TtlMs: ttl, PrevKv: o.prevKV,
	}}}, err: err}
}

// OpDelete removes key. Option: WithPrevKV.
func OpDelete(key []byte, opts ...DeleteOption) Op {
	o := applied(opts, DeleteOption.applyDelete)
	var err error
	if o.rid.set {
		err = errRequestIDInOp()
	}
	return Op{pb: &shalev1.RequestOp{Op: &shalev1.RequestOp_Delete{Delete: &shalev1.DeleteOp{Key: key, PrevKv: o.prevKV}}}, err: err}
}

// OpDeleteRange removes every key in [start, end), which must lie within
// the shard of the Batch or Txn (an empty end means the end of the key
// space, so the shard must be the last).
func OpDeleteRange(start, end []byte) Op {
	var err error
	if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		err = invalidArgf("empty range [%q, %q)", start, end)
	}
	return Op{pb: &shalev1.RequestOp{Op: &shalev1.RequestOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeOp{
		StartKey: start, EndKey: end,
	}}}, err: err}
}

// OpGet reads key within a Txn (its result is in OpResult.KV).
func OpGet(key []byte) Op {
	return Op{pb: &shalev1.RequestOp{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: key}}}}
}

// OpResult is the result of the Op at the same position.
type OpResult struct {
	// Type is the operation's kind.
	Type OpType
	// Revision is the shard revision of the write (for reads, the
	// revision read at).
	Revision uint64
	// KV is the value read by an OpGet, nil when the key is absent.
	KV *KeyValue
	// PrevKV is the previous value of a put or delete with WithPrevKV.
	PrevKV *KeyValue
	// Deleted is true when an OpDelete removed an existing key.
	Deleted bool
}

func opResults(rs []*shalev1.ResponseOp) []OpResult {
	out := make([]OpResult, len(rs))
	for i, r := range rs {
		switch v := r.GetOp().(type) {
		case *shalev1.ResponseOp_Put:
			out[i] = OpResult{Type: OpTypePut, Revision: v.Put.GetHeader().GetRevision(), PrevKV: fromProto(v.Put.GetPrevKv())}
		case *shalev1.ResponseOp_Delete:
			out[i] = OpResult{Type: OpTypeDelete, Revision: v.Delete.GetHeader().GetRevision(),
				PrevKV: fromProto(v.Delete.GetPrevKv()), Deleted: v.Delete.GetDeleted() > 0}
		case *shalev1.ResponseOp_DeleteRange:
			out[i] = OpResult{Type: OpTypeDeleteRange, Revision: v.DeleteRange.GetHeader().GetRevision()}
		case *shalev1.ResponseOp_Get:
			out[i] = OpResult{Type: OpTypeGet, Revision: v.Get.GetHeader().GetRevision(), KV: fromProto(v.Get.GetKv())}
		}
	}
	return out
}

// span is a key or key range an operation touches, for the single-shard
// check.
type span struct {
	start, end []byte
	isRange    bool
}

func opSpan(op Op) (span, error) {
	if op.err != nil {
		return span{}, op.err
	}
	switch v := op.pb.GetOp().(type) {
	case *shalev1.RequestOp_Put:
		return span{start: v.Put.GetKey()}, nil
	case *shalev1.RequestOp_Delete:
		return span{start: v.Delete.GetKey()}, nil
	case *shalev1.RequestOp_DeleteRange:
		return span{start: v.DeleteRange.GetStartKey(), end: v.DeleteRange.GetEndKey(), isRange: true}, nil
	case *shalev1.RequestOp_Get:
		return span{start: v.Get.GetKey()}, nil
	}
	return span{}, invalidArgf("empty Op (build ops with OpPut, OpDelete, OpDeleteRange or OpGet)")
}

// checkOneShard returns a *CrossShardError unless every span lies in the
// shard d.
func checkOneShard(d *shalev1.ShardDescriptor, spans []span) error {
	for _, s := range spans {
		if bytes.Compare(s.start, d.GetStartKey()) < 0 {
			return newCrossShardError(d.GetStartKey(), d.GetShardId())
		}
		if len(d.GetEndKey()) == 0 {
			continue
		}
		if bytes.Compare(s.start, d.GetEndKey()) >= 0 ||
			(s.isRange && (len(s.end) == 0 || bytes.Compare(s.end, d.GetEndKey()) > 0)) {
			return newCrossShardError(d.GetEndKey(), d.GetShardId())
		}
	}
	return nil
}

// invokeOneShard runs a Batch or Txn: it checks against the cached routing
// that all spans lie in one shard (returning a *CrossShardError without a
// round trip if not, also after a routing refresh), then sends it there.
func (c *Client) invokeOneShard(ctx context.Context, spec *callSpec, spans []span, fn attemptFunc) error {
	if len(spans) == 0 {
		return invalidArgf("no operations")
	}
	// The shard of the first key decides; sending to the shard of some
	// other key would only make the server find the same crossing.
	return c.invoke(ctx, spec, target{key: spans[0].start},
		func(ctx context.Context, cc grpc.ClientConnInterface, sh *shardRoute, hdr *shalev1.RequestHeader) error {
			if err := checkOneShard(sh.desc, spans); err != nil {
				return err
			}
			return fn(ctx, cc, sh, hdr)
		})
}

// Batch is a list of writes applied atomically by Client.Commit. All its
// keys must be in one shard. Build it with NewBatch and the Put, Delete and
// DeleteRange methods, which return the batch for chaining. A Batch is not
// safe for concurrent modification.
type Batch struct {
	ops []Op
}

// NewBatch returns an empty Batch.
func NewBatch() *Batch { return &Batch{} }

// Put adds a put of key (options WithTTL, WithPrevKV).
func (b *Batch) Put(key, value []byte, opts ...PutOption) *Batch {
	b.ops = append(b.ops, OpPut(key, value, opts...))
	return b
}

// Delete adds a delete of key (option WithPrevKV).
func (b *Batch) Delete(key []byte, opts ...DeleteOption) *Batch {
	b.ops = append(b.ops, OpDelete(key, opts...))
	return b
}

// DeleteRange adds a delete of [start, end), which must lie in the batch's
// shard.
func (b *Batch) DeleteRange(start, end []byte) *Batch {
	b.ops = append(b.ops, OpDeleteRange(start, end))
	return b
}

// Len returns the number of operations in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// BatchResult is the outcome of a committed Batch.
type BatchResult struct {
	// Revision is the shard revision at which the batch applied.
	Revision uint64
	// Results holds one result per operation, in order.
	Results []OpResult
}

// CommitOption configures Client.Commit and Txn.Commit: WithRequestID.
type CommitOption interface{ applyCommit(*commitOptions) }

type commitOptions struct{ rid requestIDOpt }

func commitOpts(opts []CommitOption) commitOptions {
	return applied(opts, CommitOption.applyCommit)
}

// Commit applies the batch atomically: all its writes or none. It returns a
// *CrossShardError (errors.Is ErrInvalidArgument) when the keys span more
// than one shard; the client detects this from its routing without sending
// the batch, and the server rejects such batches too. Like every write, a
// retried Commit carries one request ID and applies at most once. Option:
// WithRequestID.
func (c *Client) Commit(ctx context.Context, b *Batch, opts ...CommitOption) (*BatchResult, error) {
	if b == nil || len(b.ops) == 0 {
		return nil, wrapOp("batch", invalidArgf("empty batch"))
	}
	o := commitOpts(opts)
	if err := o.rid.check(); err != nil {
		return nil, wrapOp("batch", err)
	}
	spans := make([]span, len(b.ops))
	pbOps := make([]*shalev1.RequestOp, len(b.ops))
	for i, op := range b.ops {
		s, err := opSpan(op)
		if err != nil {
			return nil, wrapOp("batch", err)
		}
		if op.Type() == OpTypeGet {
			return nil, wrapOp("batch", invalidArgf("a batch cannot hold gets (use a Txn)"))
		}
		spans[i], pbOps[i] = s, op.pb
	}
	var resp *shalev1.BatchResponse
	spec := writeSpec("batch", o.rid)
	err := c.invokeOneShard(ctx, &spec, spans,
		func(ctx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			var err error
			resp, err = shalev1.NewKVClient(cc).Batch(ctx, &shalev1.BatchRequest{Header: hdr, Ops: pbOps})
			return err
		})
	if err != nil {
		return nil, wrapOp("batch", err)
	}
	return &BatchResult{Revision: resp.GetHeader().GetRevision(), Results: opResults(resp.GetResults())}, nil
}

// Cmp is one condition of a Txn, built from Value, Version, CreateRevision,
// ModRevision or Exists and a comparison method, or with KeyExists and
// KeyMissing.
type Cmp struct {
	pb *shalev1.Compare
}

// ValueCmp compares a key's value bytewise; build it with Value.
type ValueCmp struct{ key []byte }

// Value starts a comparison of key's value. An absent key compares as
// failed for every comparison.
func Value(key []byte) ValueCmp { return ValueCmp{key: key} }

func (v ValueCmp) cmp(r shalev1.Compare_Result, x []byte) Cmp {
	return Cmp{pb: &shalev1.Compare{Key: v.key, Target: shalev1.Compare_TARGET_VALUE_UNSPECIFIED, Result: r, Value: x}}
}

// Equal holds when the value equals x.
func (v ValueCmp) Equal(x []byte) Cmp { return v.cmp(shalev1.Compare_RESULT_EQUAL_UNSPECIFIED, x) }

// NotEqual holds when the value differs from x.
func (v ValueCmp) NotEqual(x []byte) Cmp { return v.cmp(shalev1.Compare_RESULT_NOT_EQUAL, x) }

// Greater holds when the value sorts after x.
func (v ValueCmp) Greater(x []byte) Cmp { return v.cmp(shalev1.Compare_RESULT_GREATER, x) }

// Less holds when the value sorts before x.
func (v ValueCmp) Less(x []byte) Cmp { return v.cmp(shalev1.Compare_RESULT_LESS, x) }

// NumberCmp compares one of a key's numbers; build it with Version,
// CreateRevision, ModRevision or Exists. An absent key has version and
// revisions 0.
type NumberCmp struct {
	key    []byte
	target shalev1.Compare_Target
}

// Version starts a comparison of key's version (writes since creation).
func Version(key []byte) NumberCmp {
	return NumberCmp{key: key, target: shalev1.Compare_TARGET_VERSION}
}

// CreateRevision starts a comparison of key's create revision.
func CreateRevision(key []byte) NumberCmp {
	return NumberCmp{key: key, target: shalev1.Compare_TARGET_CREATE_REVISION}
}

// ModRevision starts a comparison of key's last modification revision.
func ModRevision(key []byte) NumberCmp {
	return NumberCmp{key: key, target: shalev1.Compare_TARGET_MOD_REVISION}
}

// Exists starts a comparison of key's existence as a number: 1 when
// present, 0 when absent (Exists(k).Equal(1) holds when k exists). See also
// KeyExists and KeyMissing.
func Exists(key []byte) NumberCmp {
	return NumberCmp{key: key, target: shalev1.Compare_TARGET_EXISTS}
}

// KeyExists holds when key is present.
func KeyExists(key []byte) Cmp { return Exists(key).Equal(1) }

// KeyMissing holds when key is absent.
func KeyMissing(key []byte) Cmp { return Exists(key).Equal(0) }

func (n NumberCmp) cmp(r shalev1.Compare_Result, x uint64) Cmp {
	return Cmp{pb: &shalev1.Compare{Key: n.key, Target: n.target, Result: r, Number: x}}
}

// Equal holds when the number equals x.
func (n NumberCmp) Equal(x uint64) Cmp { return n.cmp(shalev1.Compare_RESULT_EQUAL_UNSPECIFIED, x) }

// NotEqual holds when the number differs from x.
func (n NumberCmp) NotEqual(x uint64) Cmp { return n.cmp(shalev1.Compare_RESULT_NOT_EQUAL, x) }

// Greater holds when the number is above x.
func (n NumberCmp) Greater(x uint64) Cmp { return n.cmp(shalev1.Compare_RESULT_GREATER, x) }

// Less holds when the number is below x.
func (n NumberCmp) Less(x uint64) Cmp { return n.cmp(shalev1.Compare_RESULT_LESS, x) }

// Txn is a transaction under construction: If all its comparisons hold,
// its Then operations apply, else its Else operations, atomically. Every
// key it touches (compared or operated on) must be in one shard. Build it
// with Client.Txn, chain If, Then and Else (each may be called several
// times; they append), and finish with Commit. A Txn is not safe for
// concurrent use.
type Txn struct {
	c         *Client
	ctx       context.Context
	cmps      []Cmp
	then, els []Op
}

// Txn starts a transaction that Commit will run with ctx.
func (c *Client) Txn(ctx context.Context) *Txn { return &Txn{c: c, ctx: ctx} }

// If adds comparisons; the transaction succeeds when all hold (an empty If
// always succeeds).
func (t *Txn) If(cs ...Cmp) *Txn { t.cmps = append(t.cmps, cs...); return t }

// Then adds operations applied when the comparisons hold.
func (t *Txn) Then(ops ...Op) *Txn { t.then = append(t.then, ops...); return t }

// Else adds operations applied when a comparison fails.
func (t *Txn) Else(ops ...Op) *Txn { t.els = append(t.els, ops...); return t }

// TxnResult is the outcome of a committed Txn.
type TxnResult struct {
	// Succeeded reports whether the comparisons held (and so which
	// operations applied: Then's or Else's).
	Succeeded bool
	// Revision is the shard revision after the transaction.
	Revision uint64
	// Results holds one result per operation of the branch taken, in order.
	Results []OpResult
}

// Commit runs the transaction atomically on its shard. It returns a
// *CrossShardError (errors.Is ErrInvalidArgument) when its keys span more
// than one shard, without sending it when the client's routing shows it. A
// retried Commit carries one request ID and applies at most once. Option:
// WithRequestID.
func (t *Txn) Commit(opts ...CommitOption) (*TxnResult, error) {
	o := commitOpts(opts)
	if err := o.rid.check(); err != nil {
		return nil, wrapOp("txn", err)
	}
	var spans []span
	cmps := make([]*shalev1.Compare, len(t.cmps))
	for i, cm := range t.cmps {
		if cm.pb == nil {
			return nil, wrapOp("txn", invalidArgf("empty Cmp (build comparisons with Value, Version, ... and Equal, ...)"))
		}
		cmps[i] = cm.pb
		spans = append(spans, span{start: cm.pb.GetKey()})
	}
	conv := func(ops []Op) ([]*shalev1.RequestOp, error) {
		out := make([]*shalev1.RequestOp, len(ops))
		for i, op := range ops {
			s, err := opSpan(op)
			if err != nil {
				return nil, err
			}
			spans = append(spans, s)
			out[i] = op.pb
		}
		return out, nil
	}
	then, err := conv(t.then)
	if err != nil {
		return nil, wrapOp("txn", err)
	}
	els, err := conv(t.els)
	if err != nil {
		return nil, wrapOp("txn", err)
	}
	var resp *shalev1.TxnResponse
	spec := writeSpec("txn", o.rid)
	err = t.c.invokeOneShard(t.ctx, &spec, spans,
		func(ctx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			var err error
			resp, err = shalev1.NewKVClient(cc).Txn(ctx, &shalev1.TxnRequest{
				Header: hdr, Compares: cmps, Success: then, Failure: els,
			})
			return err
		})
	if err != nil {
		return nil, wrapOp("txn", err)
	}
	return &TxnResult{
		Succeeded: resp.GetSucceeded(),
		Revision:  resp.GetHeader().GetRevision(),
		Results:   opResults(resp.GetResults()),
	}, nil
}
