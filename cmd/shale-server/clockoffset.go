package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// offsetClock is a wall clock shifted by the duration written in a file,
// re-read as the file changes: the chaos tests move a node's clock while
// it runs. It is for testing only; production nodes use time.Now.
type offsetClock struct {
	path   string
	log    *slog.Logger
	offset atomic.Int64 // nanoseconds
}

// clockOffsetPoll is how often the offset file is read again.
const clockOffsetPoll = 250 * time.Millisecond

// newOffsetClock reads path once (a missing file is offset 0; a malformed
// one is an error) and keeps re-reading it until ctx ends.
func newOffsetClock(ctx context.Context, path string, log *slog.Logger) (*offsetClock, error) {
	c := &offsetClock{path: path, log: log}
	if err := c.reload(); err != nil {
		return nil, err
	}
	go func() {
		t := time.NewTicker(clockOffsetPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := c.reload(); err != nil {
					// Keep the previous offset: a half-written file must
					// not swing the clock.
					log.Warn("clock offset file", "err", err)
				}
			}
		}
	}()
	return c, nil
}

// Now returns the wall-clock time shifted by the current offset, without a
// monotonic reading: comparisons and differences of its values follow the
// shifted wall clock, jumps included, as a machine's stepped clock does.
func (c *offsetClock) Now() time.Time {
	return time.Now().Round(0).Add(time.Duration(c.offset.Load()))
}

// reload reads the offset file: a Go duration such as "2m", "-750ms" or
// "+1h"; empty or missing means no offset.
func (c *offsetClock) reload() error {
	b, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		b, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", c.path, err)
	}
	s := strings.TrimSpace(string(b))
	var d time.Duration
	if s != "" {
		if d, err = time.ParseDuration(strings.TrimPrefix(s, "+")); err != nil {
			return fmt.Errorf("%s: %q is not a duration such as 2m or -750ms: %w", c.path, s, err)
		}
	}
	if prev := time.Duration(c.offset.Swap(int64(d))); prev != d {
		c.log.Warn("TESTING: wall clock offset changed", "offset", d, "previous", prev, "file", c.path)
	}
	return nil
}
