package snapshot

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestIdleAwareLimiter: while busy() is false the limiter lets everything
// through at once; while it is true it paces at its rate.
func TestIdleAwareLimiter(t *testing.T) {
	var busy atomic.Bool
	const rate = 4 << 20
	l := NewIdleAwareLimiter(rate, busy.Load)
	start := time.Now()
	for range 64 { // 64 MiB: 16 s at the rate
		if err := l.WaitN(context.Background(), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("idle: 64 MiB took %v", d)
	}
	busy.Store(true)
	start = time.Now()
	for range 3 { // the first MiB is the burst, the other two take 0.5 s
		if err := l.WaitN(context.Background(), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("busy: 3 MiB at 4 MiB/s took only %v", d)
	}
	if l.Rate() != rate {
		t.Fatalf("rate %d", l.Rate())
	}
}
