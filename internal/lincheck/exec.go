package lincheck

import (
	"context"
	"errors"
	"fmt"

	"github.com/shale-db/shale/client"
)

// Exec performs in through cl as an operation of client, recording its
// call, its result and the outcome the error implies (see Classify). Reads
// pass readOpts to Get. It returns the output and the client's error (nil
// for a Get that found the key absent: Output.Found is false).
func Exec(ctx context.Context, r *Recorder, cl *client.Client, clientID int, in Input, readOpts ...client.ReadOption) (Output, error) {
	op := r.Call(clientID, in)
	key := []byte(in.Key)
	var (
		out Output
		err error
	)
	switch in.Kind {
	case KindGet:
		var kv *client.KeyValue
		kv, err = cl.Get(ctx, key, readOpts...)
		switch {
		case err == nil:
			out = Output{Found: true, Value: string(kv.Value)}
		case errors.Is(err, client.ErrNotFound):
			out, err = Output{}, nil
		}
	case KindPut:
		_, err = cl.Put(ctx, key, []byte(in.Value))
	case KindCAS:
		var (
			ok   bool
			cur  *client.KeyValue
			opts []client.CASOption
		)
		if in.ExpectAbsent {
			opts = append(opts, client.ExpectAbsent())
		} else if in.Expect == "" {
			err = fmt.Errorf("%w: lincheck: compare-and-swap with an empty expected value", client.ErrInvalidArgument)
			op.Fail(err)
			return Output{}, err
		}
		ok, cur, err = cl.CompareAndSwap(ctx, key, []byte(in.Expect), []byte(in.Value), opts...)
		if err == nil {
			out = Output{Swapped: ok}
			if cur != nil {
				out.Found, out.Value = true, string(cur.Value)
			}
		}
	case KindDelete:
		var res *client.DeleteResult
		res, err = cl.Delete(ctx, key)
		if err == nil {
			out = Output{Deleted: res.Deleted}
		}
	default:
		err = fmt.Errorf("%w: lincheck: unknown operation kind %v", client.ErrInvalidArgument, in.Kind)
	}
	switch Classify(in.Kind, err) {
	case Known:
		op.Return(out)
	case Failed:
		op.Fail(err)
	default:
		op.Unknown(err)
		out = Output{Unknown: true}
	}
	return out, err
}

// Outcome classifies the result of an operation.
type Outcome uint8

// The outcomes.
const (
	// Known: the operation returned a result.
	Known Outcome = iota
	// Failed: the operation definitely did not take effect.
	Failed
	// Unknown: the operation may or may not have taken effect.
	Unknown
)

// Classify returns the outcome an operation of kind k had when the Go SDK
// returned err (nil, or for a Get ErrNotFound, is a known result). A request
// the SDK or the server rejected as malformed (ErrInvalidArgument) never
// applied; any other error leaves a write's outcome unknown (it may have
// been applied before a timeout, a lost connection or a leader change), and
// a read with an error observed nothing.
func Classify(k Kind, err error) Outcome {
	switch {
	case err == nil:
		return Known
	case k == KindGet && errors.Is(err, client.ErrNotFound):
		return Known
	case errors.Is(err, client.ErrInvalidArgument):
		return Failed
	}
	return Unknown
}
