package server

import (
	"context"
	"testing"
	"time"
)

// TestCallBudgetsShared: calls of one KV.Calls stream arriving close
// together with the same timeout share one budget context, which ends no
// later than any holder's own budget (callBudget's) and carries a caller's
// deadline no later than theirs; a call whose deadline is earlier, or
// later by more than the slack, or whose timeout is short, gets a context
// of its own; a replaced context is canceled once its last holder returns,
// the newest when the stream's budgets close, and every one when the
// stream's context ends.
func TestCallBudgetsShared(t *testing.T) {
	stream, endStream := context.WithCancel(t.Context())
	defer endStream()
	b := &callBudgets{stream: stream}
	ownBudget := func(dl time.Time) time.Time { return dl.Add(-requestMargin(dl)) }
	check := func(name string, ctx context.Context, dl time.Time) {
		t.Helper()
		got, ok := ctx.Deadline()
		if !ok || got.After(ownBudget(dl)) {
			t.Errorf("%s: budget ends %v, after the call's own %v", name, got, ownBudget(dl))
		}
		if c, ok := ctx.Value(callerDeadlineKey{}).(time.Time); !ok || c.After(dl) {
			t.Errorf("%s: caller's deadline %v (%v), after the call's %v", name, c, ok, dl)
		}
	}

	now := time.Now()
	dl1 := now.Add(10 * time.Second)
	ctx1, release1 := b.acquire(dl1)
	check("first", ctx1, dl1)
	dl2 := dl1.Add(20 * time.Millisecond) // within the slack of 10 s
	ctx2, release2 := b.acquire(dl2)
	check("second", ctx2, dl2)
	if ctx2 != ctx1 {
		t.Error("a call 20 ms after another with the same timeout did not share its budget")
	}
	// A stream with one call at a time: the next call, one put later (about
	// 30 ms at 256 clients) with the SDK's 3-s attempt timeout, shares.
	b3 := &callBudgets{stream: stream}
	dl3 := now.Add(3 * time.Second)
	ctx3, release3 := b3.acquire(dl3)
	release3()
	dl4 := dl3.Add(40 * time.Millisecond)
	ctx4, release4 := b3.acquire(dl4)
	check("one call later", ctx4, dl4)
	if ctx4 != ctx3 {
		t.Error("a call 40 ms after the stream's previous one, both with 3-s timeouts, did not share its budget")
	}
	release4()
	b3.close()
	// An earlier deadline must not share a later budget.
	dlEarly := dl1.Add(-time.Second)
	ctxEarly, releaseEarly := b.acquire(dlEarly)
	check("earlier", ctxEarly, dlEarly)
	if ctxEarly == ctx1 {
		t.Error("a call with an earlier deadline shared a later budget")
	}
	// Later by more than the slack (100 ms): a new context.
	dlLate := dl1.Add(150 * time.Millisecond)
	ctxLate, releaseLate := b.acquire(dlLate)
	check("later", ctxLate, dlLate)
	if ctxLate == ctx1 || ctxLate == ctxEarly {
		t.Error("a call 150 ms later shared an older budget")
	}
	// A short timeout: a context of its own, exactly callBudget's.
	dlShort := time.Now().Add(300 * time.Millisecond)
	ctxShort, releaseShort := b.acquire(dlShort)
	if got, _ := ctxShort.Deadline(); got.Sub(ownBudget(dlShort)).Abs() > 2*time.Millisecond {
		t.Errorf("short timeout: budget ends %v, want about %v", got, ownBudget(dlShort))
	}
	releaseShort()
	if ctxShort.Err() == nil {
		t.Error("a short call's own context was not canceled when it returned")
	}

	// ctx1 was replaced; it ends once both of its holders have returned.
	release1()
	if ctx1.Err() != nil {
		t.Fatal("a shared budget ended while a call still held it")
	}
	release2()
	if ctx1.Err() == nil {
		t.Error("a replaced budget was not canceled after its last holder returned")
	}
	releaseEarly()
	if ctxEarly.Err() == nil {
		t.Error("a replaced budget (earlier deadline) was not canceled after its holder returned")
	}
	// The newest stays for the next calls after its holder returns.
	releaseLate()
	if ctxLate.Err() != nil {
		t.Error("the newest budget was canceled while calls may still share it")
	}
	b.close()
	if ctxLate.Err() == nil {
		t.Error("the newest budget outlived the stream's budgets")
	}

	// The stream's end ends every budget still held.
	b2 := &callBudgets{stream: stream}
	held, release := b2.acquire(time.Now().Add(10 * time.Second))
	defer release()
	endStream()
	select {
	case <-held.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a shared budget outlived its stream")
	}
}

// TestCallBudgetsDeadline: a shared budget ends at its deadline, while a
// call holds it.
func TestCallBudgetsDeadline(t *testing.T) {
	b := &callBudgets{stream: t.Context()}
	defer b.close()
	dl := time.Now().Add(sharedBudgetMin + 100*time.Millisecond)
	ctx, release := b.acquire(dl)
	defer release()
	select {
	case <-ctx.Done():
		if !time.Now().Before(dl) {
			t.Errorf("the budget ended at %v, not before the caller's deadline %v", time.Now(), dl)
		}
	case <-time.After(time.Minute):
		t.Fatal("a shared budget did not end at its deadline")
	}
}
