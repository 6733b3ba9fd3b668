package replication

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// proposeFuncOutcome is what ProposeFunc's callback got, and how many
// times it ran, and the proposal ProposeFunc returned.
type proposeFuncOutcome struct {
	calls atomic.Int32
	done  chan struct{}
	res   any
	err   error
	p     Proposal
}

func proposeFunc(r *Replica, ctx context.Context, payload string) *proposeFuncOutcome {
	o := &proposeFuncOutcome{done: make(chan struct{})}
	o.p = r.ProposeFunc(ctx, []byte(payload), nil, func(res any, err error) {
		if o.calls.Add(1) == 1 {
			o.res, o.err = res, err
			close(o.done)
		}
	})
	return o
}

func (o *proposeFuncOutcome) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-o.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: ProposeFunc's callback did not run", what)
	}
}

// TestProposeFunc: ProposeFunc's callback gets what Propose returns, once:
// the state machine's result of an applied command; NotLeader on a
// follower and ErrBusy when the proposals in flight are all taken, before
// ProposeFunc returns; and Cancel's error when it comes first, with the
// proposal's place in flight freed and no second answer when the entry
// commits later. The context is not watched: a proposal whose context
// ended waits for Cancel.
func TestProposeFunc(t *testing.T) {
	c := newThreeNodeCluster(t, func(cfg *Config) { cfg.MaxInflightProposals = 2 })
	c.propose(1, "a", "1")
	lead := c.leader(1)
	r := c.get(lead).store.Replica(1)

	o := proposeFunc(r, context.Background(), "b=2")
	o.wait(t, "applied")
	if ix, ok := o.res.([2]uint64); o.err != nil || !ok || ix[0] == 0 {
		t.Fatalf("applied proposal: %v, %v", o.res, o.err)
	}
	if v, _ := c.get(lead).sm(1).get("b"); v != "2" {
		t.Fatalf("b=%q after its proposal's callback", v)
	}

	follower := lead%3 + 1
	o = proposeFunc(c.get(follower).store.Replica(1), context.Background(), "c=3")
	var nl *NotLeaderError
	if o.calls.Load() != 1 || !errors.As(o.err, &nl) {
		t.Fatalf("proposal on a follower: %d answers before ProposeFunc returned, %v; want NotLeader", o.calls.Load(), o.err)
	}

	// Without followers nothing commits.
	c.net.Isolate(lead)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stuck := []*proposeFuncOutcome{proposeFunc(r, ctx, "d=4"), proposeFunc(r, ctx, "e=5")}
	if busy := proposeFunc(r, ctx, "f=6"); busy.calls.Load() != 1 || !errors.Is(busy.err, ErrBusy) {
		t.Fatalf("third proposal: %d answers before ProposeFunc returned, %v; want ErrBusy", busy.calls.Load(), busy.err)
	} else {
		busy.p.Cancel(context.Canceled) // the zero Proposal: nothing
	}
	time.Sleep(100 * time.Millisecond)
	for _, o := range stuck {
		select {
		case <-o.done: // only a lost leadership answers it before Cancel
			if !errors.Is(o.err, ErrOutcomeUnknown) {
				t.Fatalf("a proposal whose context ended was answered (%v) before Cancel", o.err)
			}
		default:
		}
		o.p.Cancel(context.DeadlineExceeded)
		o.wait(t, "canceled")
		if !errors.Is(o.err, context.DeadlineExceeded) && !errors.Is(o.err, ErrOutcomeUnknown) {
			t.Fatalf("proposal without a quorum: %v, want Cancel's error (or a lost leadership)", o.err)
		}
		o.p.Cancel(context.Canceled)
	}
	if n := r.inflight.Load(); n != 0 {
		t.Fatalf("%d proposals in flight after both were answered", n)
	}
	c.net.Heal()
	c.propose(1, "g", "7")
	for _, o := range stuck {
		if n := o.calls.Load(); n != 1 {
			t.Fatalf("a proposal answered %d times", n)
		}
	}
}
