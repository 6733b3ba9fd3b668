package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
)

// offsetClock is a wall clock shifted by the duration written in a file,
// re-read as the file changes: the chaos tests move a node's clock while
// it runs. It is for testing only; production nodes use time.Now.
type offsetClock struct {
	log    *slog.Logger
	offset atomic.Int64 // nanoseconds
}

// newOffsetClock reads path once (a missing file is offset 0; a malformed
// one is an error) and keeps re-reading it until ctx ends.
func newOffsetClock(ctx context.Context, path string, log *slog.Logger) (*offsetClock, error) {
	c := &offsetClock{log: log.With("file", path)}
	if err := followFile(ctx, path, log, c.set); err != nil {
		return nil, err
	}
	return c, nil
}

// Now returns the wall-clock time shifted by the current offset, without a
// monotonic reading: comparisons and differences of its values follow the
// shifted wall clock, jumps included, as a machine's stepped clock does.
func (c *offsetClock) Now() time.Time {
	return time.Now().Round(0).Add(time.Duration(c.offset.Load()))
}

// set takes the offset file's content: a Go duration such as "2m",
// "-750ms" or "+1h"; empty means no offset.
func (c *offsetClock) set(s string) error {
	var d time.Duration
	if s != "" {
		var err error
		if d, err = time.ParseDuration(strings.TrimPrefix(s, "+")); err != nil {
			return fmt.Errorf("%q is not a duration such as 2m or -750ms: %w", s, err)
		}
	}
	if prev := time.Duration(c.offset.Swap(int64(d))); prev != d {
		c.log.Warn("TESTING: wall clock offset changed", "offset", d, "previous", prev)
	}
	return nil
}
