package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

func TestParseLatencyRange(t *testing.T) {
	for _, tc := range []struct {
		in     string
		lo, hi time.Duration
		bad    bool
	}{
		{in: ""}, {in: "0"},
		{in: "100ms-2s", lo: 100 * time.Millisecond, hi: 2 * time.Second},
		{in: "500ms", lo: 500 * time.Millisecond, hi: 500 * time.Millisecond},
		{in: " 1s - 3s", lo: time.Second, hi: 3 * time.Second},
		{in: "2s-1s", bad: true}, {in: "slow", bad: true}, {in: "1s-", bad: true}, {in: "-1s", bad: true},
	} {
		lo, hi, err := parseLatencyRange(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted as %v-%v", tc.in, lo, hi)
			}
			continue
		}
		if err != nil || lo != tc.lo || hi != tc.hi {
			t.Errorf("%q: got %v-%v, %v; want %v-%v", tc.in, lo, hi, err, tc.lo, tc.hi)
		}
	}
}

// TestDiskLatencyFile: writes and syncs through the wrapped filesystem take
// the latency the file says, from the moment it says so, and none after.
func TestDiskLatencyFile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	latency := filepath.Join(dir, "latency")
	// The wrapped filesystem is in memory: its own writes and syncs take
	// no time, so the injected latency is all there is to measure.
	mem := vfs.NewMem()
	fs, err := newDiskLatencyFS(ctx, mem, latency, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := fs.Create("data")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	writeAndSync := func() time.Duration {
		start := time.Now()
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := writeAndSync(); d >= 500*time.Millisecond {
		t.Fatalf("without a latency file a write and sync took %v", d)
	}
	if err := os.WriteFile(latency, []byte("500ms-600ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * testingFilePoll)
	if d := writeAndSync(); d < time.Second {
		t.Fatalf("with 500ms-600ms a write and a sync took %v together, want at least 1s", d)
	}
	if err := os.WriteFile(latency, []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * testingFilePoll)
	if d := writeAndSync(); d >= 500*time.Millisecond {
		t.Fatalf("after the latency was set to 0 a write and sync took %v", d)
	}
	// At start, a malformed file is an error.
	if err := os.WriteFile(latency, []byte("slow"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newDiskLatencyFS(ctx, mem, latency, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Fatal("a malformed latency file at start was accepted")
	}
}
