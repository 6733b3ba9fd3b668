package client

import (
	"context"
	"testing"
	"time"
)

// TestCallBounds: a call's first attempt runs in one context bounded by
// the earlier of the attempt timeout and the call's deadline; the call's
// own context, made later, keeps the deadline the call started with (the
// default timeout from the call's start, not from when it is made) and
// ends when the client closes; later attempts derive from it.
func TestCallBounds(t *testing.T) {
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	c := &Client{ctx: cctx, cancel: ccancel, opts: options{defaultTimeout: time.Second, attemptTimeout: 100 * time.Millisecond}}
	near := func(what string, got, want time.Time) {
		t.Helper()
		if d := got.Sub(want).Abs(); d > 20*time.Millisecond {
			t.Errorf("%s: deadline %v, want %v (off by %v)", what, got, want, d)
		}
	}

	start := time.Now()
	b := c.newCallBounds(context.Background())
	a := b.attempt(false)
	dl, ok := a.Deadline()
	if !ok {
		t.Fatal("first attempt without a deadline")
	}
	near("first attempt", dl, start.Add(100*time.Millisecond))
	a.end()
	if b.call != nil {
		t.Fatal("the call's context was made for the first attempt")
	}

	time.Sleep(50 * time.Millisecond)
	call := b.callCtx()
	dl, _ = call.Deadline()
	near("the call", dl, start.Add(time.Second))
	a = b.attempt(false)
	dl, _ = a.Deadline()
	near("a retry", dl, time.Now().Add(100*time.Millisecond))

	// The caller's deadline, earlier than the attempt timeout, bounds the
	// first attempt.
	short, scancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer scancel()
	want, _ := short.Deadline()
	b2 := c.newCallBounds(short)
	a2 := b2.attempt(false)
	dl, _ = a2.Deadline()
	near("first attempt, short deadline", dl, want)
	a2.end()
	b2.release()

	// Close ends the call's context and the attempts derived from it.
	ccancel()
	<-call.Done()
	<-a.Done()
	a.end()
	b.release()
	if call.Err() == nil || a.Err() == nil {
		t.Fatal("the call went on after the client closed")
	}
}
