package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// diskLatency makes every write and sync of the node's files sleep for a
// random time in a range written in a file, re-read as the file changes:
// the chaos tests give a running node a slow disk this way. It is for
// testing only; production nodes use the operating system's filesystem
// unwrapped.
type diskLatency struct {
	log      *slog.Logger
	min, max atomic.Int64 // nanoseconds; max 0: no delay
}

// newDiskLatencyFS returns fs wrapped so that its writes and syncs follow
// the latency file at path (a missing or empty file, or "0": no delay; a
// malformed one is an error), re-read until ctx ends.
func newDiskLatencyFS(ctx context.Context, fs vfs.FS, path string, log *slog.Logger) (vfs.FS, error) {
	d := &diskLatency{log: log.With("file", path)}
	if err := followFile(ctx, path, log, d.set); err != nil {
		return nil, err
	}
	return errorfs.Wrap(fs, errorfs.Filter(errorfs.Ops(errorfs.OpWrite, errorfs.OpSync), d)), nil
}

// MaybeError sleeps for the current latency and never fails.
func (d *diskLatency) MaybeError(errorfs.Op, string) error {
	lo, hi := d.min.Load(), d.max.Load()
	if hi <= 0 {
		return nil
	}
	time.Sleep(time.Duration(lo + rand.Int64N(hi-lo+1)))
	return nil
}

// set takes the latency file's content: "MIN-MAX" (e.g. 100ms-2s), one
// duration, or empty / "0" for none.
func (d *diskLatency) set(s string) error {
	lo, hi, err := parseLatencyRange(s)
	if err != nil {
		return err
	}
	if d.min.Load() != int64(lo) || d.max.Load() != int64(hi) {
		d.max.Store(0) // no half-updated range in between
		d.min.Store(int64(lo))
		d.max.Store(int64(hi))
		d.log.Warn("TESTING: disk latency changed", "min", lo, "max", hi)
	}
	return nil
}

// parseLatencyRange parses "MIN-MAX", a single duration (MIN = MAX), or
// empty / "0" (no latency).
func parseLatencyRange(s string) (lo, hi time.Duration, err error) {
	if s == "" || s == "0" {
		return 0, 0, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = time.ParseDuration(strings.TrimSpace(a)); err != nil {
		return 0, 0, fmt.Errorf("%q is not a latency such as 100ms-2s or 500ms: %w", s, err)
	}
	hi = lo
	if isRange {
		if hi, err = time.ParseDuration(strings.TrimSpace(b)); err != nil {
			return 0, 0, fmt.Errorf("%q is not a latency such as 100ms-2s or 500ms: %w", s, err)
		}
	}
	if lo < 0 || hi < lo {
		return 0, 0, fmt.Errorf("%q: a latency range needs 0 <= MIN <= MAX", s)
	}
	return lo, hi, nil
}
