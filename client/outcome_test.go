package client

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// shortCtx is a context that ends after d.
func shortCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestOutcomeUnknownOnlyWhenAWriteMayHaveApplied checks, for each way a
// write can fail, whether its error matches ErrOutcomeUnknown: exactly when
// an attempt reached a node and its failure does not rule the write out.
func TestOutcomeUnknownOnlyWhenAWriteMayHaveApplied(t *testing.T) {
	fc := threeShards(t)
	c := fc.client(WithAttemptTimeout(0))
	key := []byte("a")

	t.Run("reply lost after apply", func(t *testing.T) {
		fc.setHooks(nil, func(context.Context, fakeCall) error { return status.Error(codes.Unavailable, "connection reset") })
		defer fc.setHooks(nil, nil)
		_, err := c.Put(shortCtx(t, 200*time.Millisecond), key, []byte("1"))
		if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v; want ErrOutcomeUnknown, ErrUnavailable and DeadlineExceeded", err)
		}
		// The last attempt's code: the leader's Unavailable, or, when the
		// deadline caught an attempt on another replica (a loaded
		// machine), its NotLeader; never the deadline's own.
		if code := status.Code(err); code != codes.Unavailable && code != codes.FailedPrecondition {
			t.Errorf("status code %v, want the last attempt's (Unavailable or FailedPrecondition)", code)
		}
	})

	t.Run("refused before applying", func(t *testing.T) {
		// Overload and a hint-less NotLeader are refusals: the write did not
		// apply, however long the client retries.
		var n atomic.Int32
		fc.setHooks(func(_ context.Context, call fakeCall) error {
			if n.Add(1)%2 == 0 {
				return status.Error(codes.ResourceExhausted, "too many proposals in flight")
			}
			return statusWith(codes.FailedPrecondition, "not leader", &shalev1.NotLeader{ShardId: call.shard})
		}, nil)
		defer fc.setHooks(nil, nil)
		// Bounded by attempts, not by a deadline: an attempt in flight
		// when the deadline passes may have applied.
		c2 := fc.client(WithAttemptTimeout(0), WithMaxAttempts(6))
		_, err := c2.Put(bg(t), key, []byte("1"))
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err = %v; want ErrUnavailable, not ErrOutcomeUnknown", err)
		}
		if n.Load() < 6 {
			t.Fatalf("%d attempts, want 6", n.Load())
		}
	})

	t.Run("cancelled in flight", func(t *testing.T) {
		fc.setHooks(func(ctx context.Context, _ fakeCall) error {
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}, nil)
		defer fc.setHooks(nil, nil)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := c.Delete(ctx, key)
		if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v; want ErrOutcomeUnknown and context.Canceled", err)
		}
	})

	t.Run("a read is never unknown", func(t *testing.T) {
		fc.setHooks(func(context.Context, fakeCall) error { return status.Error(codes.Unavailable, "no quorum") }, nil)
		defer fc.setHooks(nil, nil)
		_, err := c.Get(shortCtx(t, 100*time.Millisecond), key)
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err = %v; want ErrUnavailable only", err)
		}
	})

	t.Run("invalid argument", func(t *testing.T) {
		_, err := c.Put(bg(t), key, []byte("1"), WithTTL(-time.Second))
		if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err = %v; want ErrInvalidArgument only", err)
		}
	})

	t.Run("closed in flight", func(t *testing.T) {
		c2 := fc.client(WithAttemptTimeout(0))
		fc.setHooks(func(ctx context.Context, _ fakeCall) error {
			go c2.Close()
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}, nil)
		defer fc.setHooks(nil, nil)
		_, err := c2.Put(bg(t), key, []byte("1"))
		if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err = %v; want ErrClosed and ErrOutcomeUnknown", err)
		}
	})

	t.Run("never sent", func(t *testing.T) {
		// Every node down: no attempt gets a connection, so nothing can
		// have applied.
		fc2 := threeShards(t)
		c3 := fc2.client(WithAttemptTimeout(0))
		for id := uint64(1); id <= 3; id++ {
			fc2.stopNode(id)
		}
		// Let the client see its connections closed: an attempt on a
		// connection that breaks under it may have been sent.
		time.Sleep(100 * time.Millisecond)
		_, _ = c3.Get(shortCtx(t, 100*time.Millisecond), key)
		_, err := c3.Put(shortCtx(t, 300*time.Millisecond), key, []byte("1"))
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err = %v; want ErrUnavailable, not ErrOutcomeUnknown", err)
		}
	})
}

// TestWithRequestIDAppliesOnce re-sends writes with the application's own
// request ID: each applies once, later sends get the first result, no
// attempt claims to be the ID's first, and bad IDs are refused.
func TestWithRequestIDAppliesOnce(t *testing.T) {
	fc := threeShards(t)
	c := fc.client()
	ctx := bg(t)
	id := []byte("order-0001-payment")

	// The first send applies but its reply is lost until the deadline:
	// the outcome is unknown to the application.
	fc.setHooks(nil, func(context.Context, fakeCall) error { return status.Error(codes.Unavailable, "connection reset") })
	_, err := c.Put(shortCtx(t, 150*time.Millisecond), []byte("a"), []byte("1"), WithRequestID(id))
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("first send: %v, want ErrOutcomeUnknown", err)
	}
	fc.setHooks(nil, nil)
	// The application sends it again with the same ID: one application.
	r, err := c.Put(ctx, []byte("a"), []byte("1"), WithRequestID(id))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Put(ctx, []byte("a"), []byte("1"), WithRequestID(id))
	if err != nil || r2.Revision != r.Revision {
		t.Fatalf("third send: %+v, %v; want the first result (revision %d)", r2, err, r.Revision)
	}
	fc.mu.Lock()
	applied := fc.applies[string(id)]
	fc.mu.Unlock()
	if applied != 1 {
		t.Errorf("applied %d times, want 1", applied)
	}
	for _, call := range fc.callsOf("Put") {
		if call.requestID != string(id) {
			t.Errorf("attempt sent request ID %q, want %q", call.requestID, id)
		}
		if call.first {
			t.Errorf("attempt at node %d marked first_attempt with the application's ID: the server would skip its dedup lookup", call.node)
		}
	}
	kv, err := c.Get(ctx, []byte("a"))
	if err != nil || kv.Version != 1 {
		t.Errorf("Get = %+v, %v; want version 1", kv, err)
	}

	// Every kind of write passes the ID on.
	fc.resetCalls()
	if _, err := c.Delete(ctx, []byte("b"), WithRequestID([]byte("delete-b-0001"))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.CompareAndSwap(ctx, []byte("c"), nil, []byte("x"), ExpectAbsent(), WithRequestID([]byte("cas-c-000001"))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, NewBatch().Put([]byte("d"), []byte("1")), WithRequestID([]byte("batch-d-00001"))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Txn(ctx).Then(OpPut([]byte("e"), []byte("1"))).Commit(WithRequestID([]byte("txn-e-000001"))); err != nil {
		t.Fatal(err)
	}
	for method, want := range map[string]string{"Delete": "delete-b-0001", "CompareAndSwap": "cas-c-000001", "Batch": "batch-d-00001", "Txn": "txn-e-000001"} {
		calls := fc.callsOf(method)
		if len(calls) != 1 || calls[0].requestID != want || calls[0].first {
			t.Errorf("%s calls %+v; want one with request ID %q, not first", method, calls, want)
		}
	}

	// Refused: IDs the server would refuse, and the option on one
	// operation of a batch.
	for _, bad := range [][]byte{nil, []byte("short"), bytes.Repeat([]byte("x"), 33)} {
		if _, err := c.Put(ctx, []byte("a"), []byte("1"), WithRequestID(bad)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ID of %d bytes: %v, want ErrInvalidArgument", len(bad), err)
		}
	}
	if _, err := c.Commit(ctx, NewBatch().Put([]byte("a"), []byte("1"), WithRequestID(id))); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("WithRequestID on a batch's put: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Txn(ctx).Then(OpDelete([]byte("a"), WithRequestID(id))).Commit(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("WithRequestID on a txn's delete: %v, want ErrInvalidArgument", err)
	}
}
