package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func near(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); d < -time.Second || d > time.Second {
		t.Fatalf("%s: clock reads %v, want about %v (off by %v)", what, got, want, d)
	}
}

func TestOffsetClock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	path := filepath.Join(t.TempDir(), "offset")

	// No file yet: no offset.
	c, err := newOffsetClock(ctx, path, log)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "without a file", c.Now(), time.Now())

	// The file changes while the node runs: the clock follows.
	for _, tc := range []struct {
		content string
		offset  time.Duration
	}{{"+1h\n", time.Hour}, {"-90s", -90 * time.Second}, {"", 0}} {
		if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for time.Duration(c.offset.Load()) != tc.offset && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		near(t, "offset "+tc.content, c.Now(), time.Now().Add(tc.offset))
	}

	// A malformed file keeps the last good offset.
	if err := os.WriteFile(path, []byte("2m"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Duration(c.offset.Load()) != 2*time.Minute && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(path, []byte("soon"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.set("soon"); err == nil || !strings.Contains(err.Error(), "not a duration") {
		t.Fatalf("malformed offset: %v", err)
	}
	time.Sleep(3 * testingFilePoll)
	near(t, "after a malformed file", c.Now(), time.Now().Add(2*time.Minute))

	// At start, a malformed file is an error.
	if _, err := newOffsetClock(ctx, path, log); err == nil {
		t.Fatal("a malformed offset file at start was accepted")
	}
}
