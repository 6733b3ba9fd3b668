package snapshot

import (
	"context"
	"sync"
	"time"
)

// Limiter is a token bucket that paces snapshot bytes: it refills at a fixed
// number of bytes per second and holds at most one chunk (DefaultChunkSize)
// of unused tokens, so an idle limiter lets one chunk through at once and
// then holds every sender to the rate. One Limiter is meant to be shared by
// all concurrent snapshot sends of a node; it is safe for concurrent use.
//
// A nil *Limiter, or one made with a rate <= 0, is unlimited. One made by
// NewIdleAwareLimiter paces only while its node is busy.
type Limiter struct {
	rate  float64 // bytes per second; <= 0 = unlimited
	burst float64
	busy  func() bool // nil: always busy

	mu     sync.Mutex
	tokens float64 // may go negative: bytes reserved by waiters ahead
	last   time.Time
}

// NewLimiter returns a Limiter that lets bytesPerSec bytes through per second
// on average across all its users, with a burst of one chunk
// (DefaultChunkSize). bytesPerSec <= 0 returns an unlimited Limiter.
func NewLimiter(bytesPerSec int64) *Limiter {
	l := &Limiter{rate: float64(bytesPerSec), burst: DefaultChunkSize}
	l.tokens = l.burst
	l.last = time.Now()
	return l
}

// NewIdleAwareLimiter returns a Limiter like NewLimiter(bytesPerSec) that
// paces only while busy() is true: when busy() reports the node idle (no
// foreground work), WaitN lets every byte through at once and reserves
// nothing, so a transfer on an idle node runs as fast as the disk and
// network allow, and the rate holds again from the first WaitN after the
// node gets busy. busy is called once per WaitN, from any goroutine: it must
// be cheap and safe for concurrent use. A nil busy is always busy.
func NewIdleAwareLimiter(bytesPerSec int64, busy func() bool) *Limiter {
	l := NewLimiter(bytesPerSec)
	l.busy = busy
	return l
}

// Rate returns the limiter's rate in bytes per second (0 = unlimited).
func (l *Limiter) Rate() int64 {
	if l == nil || l.rate <= 0 {
		return 0
	}
	return int64(l.rate)
}

// WaitN blocks until n bytes may be sent, or until ctx is done (then it
// returns ctx's error and gives the bytes back). Concurrent callers are served
// in the order they call: each reserves its bytes at once and sleeps until
// the bucket has refilled past its reservation, so the total rate holds no
// matter how many goroutines share the limiter. n may exceed the burst. On
// an idle-aware limiter whose node is idle, it returns at once.
func (l *Limiter) WaitN(ctx context.Context, n int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if l == nil || l.rate <= 0 || n <= 0 {
		return nil
	}
	idle := l.busy != nil && !l.busy()
	l.mu.Lock()
	now := time.Now()
	l.refillLocked(now)
	if idle {
		l.mu.Unlock()
		return nil
	}
	l.tokens -= float64(n)
	var wait time.Duration
	if l.tokens < 0 {
		wait = time.Duration(-l.tokens / l.rate * float64(time.Second))
	}
	l.mu.Unlock()
	if wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		l.mu.Lock()
		l.refillLocked(time.Now())
		l.tokens += float64(n)
		if l.tokens > l.burst {
			l.tokens = l.burst
		}
		l.mu.Unlock()
		return ctx.Err()
	}
}

func (l *Limiter) refillLocked(now time.Time) {
	if elapsed := now.Sub(l.last); elapsed > 0 {
		l.tokens += elapsed.Seconds() * l.rate
		if l.tokens > l.burst {
			l.tokens = l.burst
		}
		l.last = now
	}
}
