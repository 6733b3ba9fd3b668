package cluster

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// TestRunBackup: a small run of the backup benchmark loads, backs up (full
// and incremental), restores and reads back, and reports every figure.
func TestRunBackup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six shale-server processes")
	}
	SetShaleOptions(ShaleOptions{ServerPath: os.Getenv("SHALE_BENCH_SERVER")})
	t.Cleanup(CleanupShaleServer)
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := RunBackup(ctx, BackupConfig{Dir: t.TempDir(), DataBytes: 4 << 20, IncrementalBytes: 256 << 10, ValueSize: 1024, Log: &log})
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, log.String())
	}
	if r.Loaded < 4<<20 || r.FullBytes < 2<<20 || r.IncrementalBytes <= 0 || r.IncrementalBytes >= r.FullBytes {
		t.Fatalf("loaded %d, full %d, incremental %d bytes", r.Loaded, r.FullBytes, r.IncrementalBytes)
	}
	if r.FullSeconds <= 0 || r.IncrementalSeconds <= 0 || r.RestoreSeconds <= 0 || r.DiskWriteSeconds <= 0 {
		t.Fatalf("timings %+v", r)
	}
}
