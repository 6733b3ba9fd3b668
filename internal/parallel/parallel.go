// Package parallel runs bounded, cancelling groups of calls.
package parallel

import (
	"context"
	"sync"
)

// ForEach calls fn(ctx, i) for every i below n, parallel calls at once,
// and returns once they have all returned: the first error (which cancels
// the ctx the other calls got, and keeps further calls from starting), or
// ctx's.
func ForEach(ctx context.Context, parallel, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		sem      = make(chan struct{}, max(parallel, 1))
		once     sync.Once
		firstErr error
	)
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() {
					firstErr = err
					cancel()
				})
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
