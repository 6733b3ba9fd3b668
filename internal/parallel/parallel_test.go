package parallel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestForEach: at most parallel calls run at once and every index is
// called once; the first error is returned, cancels the calls running, and
// no call starts after it.
func TestForEach(t *testing.T) {
	var running, most, calls atomic.Int64
	seen := make([]atomic.Int64, 20)
	err := ForEach(context.Background(), 3, 20, func(ctx context.Context, i int) error {
		calls.Add(1)
		seen[i].Add(1)
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
		return nil
	})
	if err != nil || calls.Load() != 20 || most.Load() != 3 {
		t.Fatalf("err %v, %d calls, at most %d at once; want nil, 20, 3", err, calls.Load(), most.Load())
	}
	for i := range seen {
		if seen[i].Load() != 1 {
			t.Fatalf("index %d called %d times", i, seen[i].Load())
		}
	}

	boom := errors.New("boom")
	var mu sync.Mutex
	var started []int
	cancelled := 0
	err = ForEach(context.Background(), 2, 20, func(ctx context.Context, i int) error {
		mu.Lock()
		started = append(started, i)
		mu.Unlock()
		switch {
		case i < 3:
			return nil
		case i == 3:
			return boom
		}
		select {
		case <-ctx.Done():
			mu.Lock()
			cancelled++
			mu.Unlock()
		case <-time.After(5 * time.Second):
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if len(started) > 6 || cancelled != len(started)-4 {
		t.Fatalf("after the failure of call 3: %d calls started (%v), %d cancelled", len(started), started, cancelled)
	}
}
