package cluster

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/internal/s3test"
)

// TestRunBackup: a small run of the backup benchmark loads, backs up (full
// and incremental), restores both ways (--restore-from, and shalectl
// restore then the nodes) and reads back, and reports every figure: into
// the default location under Dir, and into an S3 location (a versitygw
// server). Neither keeps a file afterwards.
func TestRunBackup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six shale-server processes")
	}
	SetShaleOptions(ShaleOptions{ServerPath: os.Getenv("SHALE_BENCH_SERVER")})
	t.Cleanup(CleanupShaleServer)
	s3test.EachLocation(t, func(t *testing.T, where, objects string) {
		cfg := BackupConfig{Dir: t.TempDir(), DataBytes: 4 << 20, IncrementalBytes: 256 << 10, ValueSize: 1024}
		if strings.HasPrefix(where, "s3://") {
			cfg.Location = where
		} else {
			cfg.Dir = filepath.Dir(where) // the default location, Dir/backups
		}
		var log bytes.Buffer
		cfg.Log = &log
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r, err := RunBackup(ctx, cfg)
		if err != nil {
			t.Fatalf("%v; log:\n%s", err, log.String())
		}
		if r.Loaded < 4<<20 || r.FullBytes < 2<<20 || r.IncrementalBytes <= 0 || r.IncrementalBytes >= r.FullBytes {
			t.Fatalf("loaded %d, full %d, incremental %d bytes", r.Loaded, r.FullBytes, r.IncrementalBytes)
		}
		if r.FullSeconds <= 0 || r.IncrementalSeconds <= 0 || r.DiskWriteSeconds <= 0 || len(r.Restores) != 2 {
			t.Fatalf("timings %+v", r)
		}
		// Both restores: every replica's bytes are the user parts' three
		// times over; shalectl stages them, and the nodes then link them
		// rather than copy them again; with --restore-from the nodes copy
		// the checkpoints (not the logs, which they read in place).
		srv, ctl := r.Restores[0], r.Restores[1]
		if srv.Method != RestoreServer || ctl.Method != RestoreShalectl || srv.ReplicaBytes != ctl.ReplicaBytes ||
			srv.ReplicaBytes < 3*(r.FullBytes/2) || srv.Seconds <= 0 || ctl.Seconds <= 0 || ctl.CopySeconds <= 0 {
			t.Fatalf("restores %+v", r.Restores)
		}
		if _, err := os.Stat("/proc/self/stat"); err == nil && (srv.ServerCPUSeconds <= 0 || ctl.ServerCPUSeconds <= 0) {
			t.Fatalf("the restored nodes' CPU time: %v s (server), %v s (shalectl)", srv.ServerCPUSeconds, ctl.ServerCPUSeconds)
		}
		if ctl.WrittenBytes != ctl.ReplicaBytes || srv.WrittenBytes <= 0 || srv.WrittenBytes > srv.ReplicaBytes {
			t.Fatalf("restores wrote %d (shalectl) and %d (server) bytes for %d bytes of replicas", ctl.WrittenBytes, srv.WrittenBytes, srv.ReplicaBytes)
		}
		var left []string
		err = filepath.WalkDir(objects, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				left = append(left, p)
			}
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		})
		if err != nil || len(left) > 0 {
			t.Fatalf("the backups' files are left behind: %v, %v", left, err)
		}
	})
}

// TestRestorePhases: the copy span runs from the earliest copy's start to
// the latest one's end over every node's log, bytes add up, and the last
// "node started" counts.
func TestRestorePhases(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	logs := map[string]string{
		"node1": `time=2026-11-28T08:00:02.000Z level=INFO msg="restore: parts copied" node=1 parts=7 bytes=1000 took=1.5s
time=2026-11-28T08:00:02.500Z level=INFO msg="node started" node=1 cluster=x listen=127.0.0.1:1
`,
		"node2": `time=2026-11-28T08:00:03.000Z level=INFO msg="restore: parts copied" node=2 parts=7 bytes=2000 took=2s
time=2026-11-28T08:00:03.250Z level=INFO msg="node started" node=2 cluster=x listen=127.0.0.1:2
time=2026-11-28T08:00:09.000Z level=INFO msg="some other line" took=9s bytes=5
`,
	}
	for n, text := range logs {
		if err := os.MkdirAll(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n, "server.log"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, cp, st := restorePhases(dir, start)
	if b != 3000 || cp != 2.5 || st != 3.25 {
		t.Fatalf("restorePhases: %d bytes, copy %.3fs, started %.3fs; want 3000, 2.5, 3.25", b, cp, st)
	}
}
