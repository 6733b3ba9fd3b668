package shard

import (
	"bytes"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// This file is the one validator of the commands that change a shard's
// keys. The server runs it before proposing a command (with its configured
// limits, so a bad request is refused at once) and the apply logic runs it
// again on the replicated command against the descriptor it applies under
// (with no limits: limits are node configuration and may differ between
// replicas, while apply must decide the same on all of them).

// Limits bounds the size of a command. A zero field is no bound.
type Limits struct {
	// MaxKeyBytes bounds every key and range bound.
	MaxKeyBytes int
	// MaxValueBytes bounds every value.
	MaxValueBytes int
	// MaxOps bounds the compares and operations of one command together.
	MaxOps int
	// MaxBytes bounds a command's encoded size.
	MaxBytes int
}

// Request names the client request a Txn was built from; it decides what
// the Txn may hold and how errors name its parts.
type Request int

const (
	// RequestSingle is a Put, Delete, DeleteRange or CompareAndSwap: errors
	// name the key, not an operation number.
	RequestSingle Request = iota
	// RequestBatch is a Batch: writes only.
	RequestBatch
	// RequestTxn is a Txn: compares, and reads and writes in each branch.
	RequestTxn
)

// Invalid is why a command fails validation. Code is InvalidArgument for a
// malformed command and OutOfRange for a well-formed one with a key outside
// the shard.
type Invalid struct {
	// Code is InvalidArgument or OutOfRange.
	Code codes.Code
	// Message says what is wrong, naming the operation and the key.
	Message string
	// Boundary is, for OutOfRange, the shard boundary the key lies beyond:
	// the shard's start key for a key below it, its end key otherwise.
	Boundary []byte
}

// Error returns the message.
func (e *Invalid) Error() string { return e.Message }

func malformed(format string, args ...any) *Invalid {
	return &Invalid{Code: codes.InvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// CheckTxn checks what txn holds, wherever it runs: it is not empty, within
// lim, every operation has one, every key and range start is non-empty,
// every range is non-empty and not inverted, TTLs are not negative, compare
// targets and results are known, and a RequestBatch holds no reads. It
// returns nil when all hold.
func CheckTxn(txn *shalev1.TxnRequest, lim Limits, req Request) *Invalid {
	nops := len(txn.GetCompares()) + len(txn.GetSuccess()) + len(txn.GetFailure())
	what := "txn"
	if req == RequestBatch {
		what = "batch"
	}
	if nops == 0 {
		return malformed("%s has no operations", what)
	}
	if lim.MaxOps > 0 && nops > lim.MaxOps {
		return malformed("%s has %d compares and operations, limit %d", what, nops, lim.MaxOps)
	}
	if lim.MaxBytes > 0 {
		if sz := codec.Size(txn); sz > lim.MaxBytes {
			return malformed("%s is %d bytes, limit %d", what, sz, lim.MaxBytes)
		}
	}
	single := req == RequestSingle
	for i, c := range txn.GetCompares() {
		at := where{single, "compare", i}
		if inv := checkKey(c.GetKey(), lim, at); inv != nil {
			return inv
		}
		if _, ok := shalev1.Compare_Target_name[int32(c.GetTarget())]; !ok {
			return malformed("%sunknown compare target %d", at, c.GetTarget())
		}
		if _, ok := shalev1.Compare_Result_name[int32(c.GetResult())]; !ok {
			return malformed("%sunknown compare result %d", at, c.GetResult())
		}
	}
	for branch, ops := range [][]*shalev1.RequestOp{txn.GetSuccess(), txn.GetFailure()} {
		part := "op"
		if branch == 1 {
			part = "failure op"
		}
		for i, op := range ops {
			if inv := checkOp(op, lim, req, where{single, part, i}); inv != nil {
				return inv
			}
		}
	}
	return nil
}

// where names the part of a command an error is about ("op 2: "), or
// nothing in a single-operation request; it is formatted only for an error.
type where struct {
	single bool
	part   string
	i      int
}

func (w where) String() string {
	if w.single {
		return ""
	}
	return fmt.Sprintf("%s %d: ", w.part, w.i)
}

func checkOp(op *shalev1.RequestOp, lim Limits, req Request, at where) *Invalid {
	switch o := op.GetOp().(type) {
	case *shalev1.RequestOp_Put:
		if inv := checkKey(o.Put.GetKey(), lim, at); inv != nil {
			return inv
		}
		if v := o.Put.GetValue(); lim.MaxValueBytes > 0 && len(v) > lim.MaxValueBytes {
			return malformed("%svalue is %d bytes, limit %d", at, len(v), lim.MaxValueBytes)
		}
		if o.Put.GetTtlMs() < 0 {
			return malformed("%sttl_ms is negative", at)
		}
	case *shalev1.RequestOp_Delete:
		return checkKey(o.Delete.GetKey(), lim, at)
	case *shalev1.RequestOp_Get:
		if req == RequestBatch {
			return malformed("%sa Batch holds only writes; use Txn to read", at)
		}
		return checkKey(o.Get.GetKey(), lim, at)
	case *shalev1.RequestOp_DeleteRange:
		start, end := o.DeleteRange.GetStartKey(), o.DeleteRange.GetEndKey()
		if len(start) == 0 {
			return malformed("%sdelete range: start_key is empty", at)
		}
		if lim.MaxKeyBytes > 0 && (len(start) > lim.MaxKeyBytes || len(end) > lim.MaxKeyBytes) {
			return malformed("%sdelete range: bound over %d bytes", at, lim.MaxKeyBytes)
		}
		if len(end) > 0 && bytes.Compare(start, end) >= 0 {
			return malformed("%sdelete range [%q, %q) is empty or inverted", at, start, end)
		}
	default:
		return malformed("%sthe operation is empty", at)
	}
	return nil
}

// CheckKey checks a key as CheckTxn checks the keys of a command: not
// empty and within lim.
func CheckKey(k []byte, lim Limits) *Invalid {
	return checkKey(k, lim, where{single: true})
}

func checkKey(k []byte, lim Limits, at where) *Invalid {
	if len(k) == 0 {
		return malformed("%skey is empty", at)
	}
	if lim.MaxKeyBytes > 0 && len(k) > lim.MaxKeyBytes {
		return malformed("%skey is %d bytes, limit %d", at, len(k), lim.MaxKeyBytes)
	}
	return nil
}

// TxnKey returns the key a Txn is routed by: its first compare's key, or
// else its first operation's key (a range's start), nil if it names none.
func TxnKey(txn *shalev1.TxnRequest) []byte {
	if cs := txn.GetCompares(); len(cs) > 0 {
		return cs[0].GetKey()
	}
	for _, ops := range [][]*shalev1.RequestOp{txn.GetSuccess(), txn.GetFailure()} {
		for _, op := range ops {
			switch o := op.GetOp().(type) {
			case *shalev1.RequestOp_Put:
				return o.Put.GetKey()
			case *shalev1.RequestOp_Delete:
				return o.Delete.GetKey()
			case *shalev1.RequestOp_DeleteRange:
				return o.DeleteRange.GetStartKey()
			case *shalev1.RequestOp_Get:
				return o.Get.GetKey()
			}
		}
	}
	return nil
}

// TxnInShard checks that every key of txn, and every range, lies inside the
// range of the shard desc describes; a range with an empty end runs to the
// shard's end. txn must have passed CheckTxn. It returns nil when all hold,
// and otherwise an OutOfRange Invalid naming the first key outside.
func TxnInShard(txn *shalev1.TxnRequest, desc *shalev1.ShardDescriptor) *Invalid {
	rng := shardRange(desc)
	for _, c := range txn.GetCompares() {
		if inv := keyInShard(c.GetKey(), rng); inv != nil {
			return inv
		}
	}
	for _, ops := range [][]*shalev1.RequestOp{txn.GetSuccess(), txn.GetFailure()} {
		for _, op := range ops {
			var inv *Invalid
			switch o := op.GetOp().(type) {
			case *shalev1.RequestOp_Put:
				inv = keyInShard(o.Put.GetKey(), rng)
			case *shalev1.RequestOp_Delete:
				inv = keyInShard(o.Delete.GetKey(), rng)
			case *shalev1.RequestOp_Get:
				inv = keyInShard(o.Get.GetKey(), rng)
			case *shalev1.RequestOp_DeleteRange:
				_, inv = deleteRangeInShard(o.DeleteRange, rng)
			}
			if inv != nil {
				return inv
			}
		}
	}
	return nil
}

// KeysInShard checks that every key lies inside the range of the shard desc
// describes, as TxnInShard does.
func KeysInShard(keys [][]byte, desc *shalev1.ShardDescriptor) *Invalid {
	rng := shardRange(desc)
	for _, k := range keys {
		if inv := keyInShard(k, rng); inv != nil {
			return inv
		}
	}
	return nil
}

func keyInShard(k []byte, rng keyRange) *Invalid {
	if rng.contains(k) {
		return nil
	}
	return outside(k, rng)
}

func outside(k []byte, rng keyRange) *Invalid {
	b := rng.start
	if rng.end != nil && bytes.Compare(k, rng.end) >= 0 {
		b = rng.end
	}
	return &Invalid{Code: codes.OutOfRange, Boundary: bytes.Clone(b),
		Message: fmt.Sprintf("key %q is outside the shard [%q, %q)", k, rng.start, rng.end)}
}

// deleteRangeInShard returns the range op deletes, its empty end closed at
// the shard's end, or an OutOfRange Invalid when it reaches outside.
func deleteRangeInShard(op *shalev1.DeleteRangeOp, rng keyRange) (keyRange, *Invalid) {
	start, end := op.GetStartKey(), endOrNil(op.GetEndKey())
	if !rng.contains(start) {
		return keyRange{}, outside(start, rng)
	}
	if end == nil {
		return keyRange{start: start, end: rng.end}, nil
	}
	if rng.end != nil && bytes.Compare(end, rng.end) > 0 {
		return keyRange{}, &Invalid{Code: codes.OutOfRange, Boundary: bytes.Clone(rng.end),
			Message: fmt.Sprintf("delete range [%q, %q) reaches past the shard [%q, %q)", start, end, rng.start, rng.end)}
	}
	return keyRange{start: start, end: end}, nil
}
