package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shale-db/shale/backup"
)

// BackupConfig configures RunBackup.
type BackupConfig struct {
	// Dir holds the cluster's, the restored cluster's and the backups'
	// directories (removed at the end unless Keep).
	Dir  string
	Keep bool
	// Location is where the backups go: a directory or an S3 URL, as
	// shalectl backup takes it (empty: Dir/backups). Backups RunBackup made
	// at an S3 location are deleted at the end unless Keep.
	Location string
	// DataBytes of values are loaded, in ValueSize-byte values
	// (incompressible), before the full backup; then IncrementalBytes
	// more before the incremental one.
	DataBytes, IncrementalBytes int64
	ValueSize                   int
	// Restores are the ways the incremental backup is restored, each as a
	// new 3-node cluster, in this order: RestoreServer, RestoreShalectl
	// (empty: both).
	Restores []string
	// Shalectl is the shalectl binary RestoreShalectl runs (empty: build
	// it from the bench module).
	Shalectl string
	// Log receives progress (nil: none).
	Log io.Writer
}

// The ways RunBackup restores a backup.
const (
	// RestoreServer starts every founding node with --restore-from: each
	// copies the parts of the shards it hosts from the location.
	RestoreServer = "server"
	// RestoreShalectl runs `shalectl restore` for the three nodes' data
	// directories at once (as three machines would, each its own), then
	// starts the nodes on them.
	RestoreShalectl = "shalectl"
)

// RestoreResult is what one restore measured.
type RestoreResult struct {
	// Method is RestoreServer or RestoreShalectl.
	Method string
	// Seconds: from starting the restore (the shalectl processes, or the
	// founding processes with --restore-from) until every shard has a
	// leader and the last key loaded reads back.
	Seconds float64
	// ReplicaBytes is what the restored replicas need from the backup,
	// all nodes together: each node's hosted parts' checkpoint files and
	// log segments (3 copies of every user part on 3 nodes with 3
	// replicas). The restore's MB/s "counting every copy written" are
	// ReplicaBytes over Seconds, whatever a build writes beyond them.
	ReplicaBytes int64
	// WrittenBytes is what the restore wrote from the backup, all nodes
	// together: the files shalectl staged (its -o json "bytes") plus the
	// checkpoint files the nodes copied ("restore: parts copied" in their
	// logs). A node that links a prepared restore's files writes none.
	WrittenBytes int64
	// CopySeconds is the span of the copying: the shalectl processes'
	// (from their start to the last one's end), or the nodes' copying
	// from their logs (from the first one's start to the last one's end).
	CopySeconds float64
	// StartedSeconds is from starting the nodes to the last node's "node
	// started" (copies and opened shards done, serving). What the restore
	// takes beyond it is the first elections and the client finding the
	// leaders. Zero when the logs do not say.
	StartedSeconds float64
	// ServerCPUSeconds is the CPU time (user + system, from /proc) the
	// restored nodes' processes used from their start until the last key
	// read back: with Seconds, how busy the restore kept the machine's
	// cores. It leaves out shalectl's processes. Zero when /proc cannot
	// be read.
	ServerCPUSeconds float64
}

// BackupResult is what RunBackup measured.
type BackupResult struct {
	// Loaded is the user data written (keys and values).
	Loaded int64
	// Full: the full backup's stored bytes and seconds; Incremental: the
	// incremental's copied bytes and seconds.
	FullBytes, IncrementalBytes     int64
	FullSeconds, IncrementalSeconds float64
	// Restores are the restores of the incremental backup, in
	// BackupConfig.Restores' order.
	Restores []RestoreResult
	// DiskWriteSeconds: writing FullBytes to one file in 1 MiB writes and
	// syncing it, in Dir: the disk's sequential write speed.
	DiskWriteSeconds float64
}

// idleAfterLoad is how long RunBackup waits after loading for the nodes to
// count as idle (the servers' foreground window is 1 s, checked every
// 100 ms), so that their backup streams go out unpaced.
const idleAfterLoad = 1500 * time.Millisecond

// MBps is bytes per second in MB/s (10^6).
func MBps(bytes int64, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return float64(bytes) / seconds / 1e6
}

// RunBackup loads a 3-node Shale cluster, takes a full backup and an
// incremental one of it into cfg.Location, restores the incremental one
// as a new 3-node cluster, and measures the disk's sequential write
// speed in the same directory for comparison.
func RunBackup(ctx context.Context, cfg BackupConfig) (res BackupResult, err error) {
	if cfg.ValueSize <= 0 {
		cfg.ValueSize = 4096
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return res, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	if !cfg.Keep {
		defer os.RemoveAll(dir)
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "backup: "+format+"\n", args...)
		}
	}
	o := currentShaleOptions()
	nodes, err := StartShaleNodes(ctx, filepath.Join(dir, "source"), 3, o.Splits, cfg.Log)
	if err != nil {
		return res, err
	}
	defer func() { _ = nodes.Stop() }()
	cli, err := nodes.NewClient(ctx, cfg.Log)
	if err != nil {
		return res, err
	}
	defer cli.Close()
	shards := 2 + len(strings.Split(o.Splits, ","))
	if _, err := nodes.WaitReady(ctx, cli, shards); err != nil {
		return res, err
	}
	next := 0
	// load writes bytes of keys and values with 16 concurrent writers and
	// returns the last key written.
	load := func(bytes int64) (string, error) {
		per := int64(16 + cfg.ValueSize)
		n := int((bytes + per - 1) / per)
		keys := make(chan string)
		errc := make(chan error, 16)
		var wg sync.WaitGroup
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v := make([]byte, cfg.ValueSize)
				for k := range keys {
					_, _ = rand.Read(v)
					if _, err := cli.Put(ctx, []byte(k), v); err != nil {
						errc <- fmt.Errorf("load: %w", err)
						return
					}
				}
			}()
		}
		var last string
	feed:
		for i := 0; i < n; i++ {
			last = fmt.Sprintf("%016x", uint64(next)*0x9e3779b97f4a7c15)
			next++
			select {
			case keys <- last:
			case err := <-errc:
				close(keys)
				wg.Wait()
				return "", err
			case <-ctx.Done():
				break feed
			}
		}
		close(keys)
		wg.Wait()
		select {
		case err := <-errc:
			return "", err
		default:
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		res.Loaded += int64(n) * per
		return last, nil
	}
	logf("loading %d MB", cfg.DataBytes/1e6)
	if _, err := load(cfg.DataBytes); err != nil {
		return res, err
	}
	// A node paces the checkpoint files it sends (--snapshot-rate-bytes)
	// while it is busy: while it served a client request or made 10
	// Raft-log syncs within the last second. The backups measured here are
	// of an idle cluster, so each waits for that second to pass after the
	// load.
	idle := func() error {
		select {
		case <-time.After(idleAfterLoad):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := idle(); err != nil {
		return res, err
	}
	where := cfg.Location
	if where == "" {
		where = filepath.Join(dir, "backups")
	}
	loc, err := backup.Open(ctx, where, true)
	if err != nil {
		return res, err
	}
	var made []string // backups created, oldest first
	if !cfg.Keep && strings.HasPrefix(where, "s3://") {
		defer func() {
			for i := len(made) - 1; i >= 0; i-- {
				if _, derr := loc.Delete(context.WithoutCancel(ctx), made[i]); derr != nil && err == nil {
					err = fmt.Errorf("delete backup %s: %w", made[i], derr)
				}
			}
		}()
	}
	start := time.Now()
	full, st, err := backup.Create(ctx, cli, loc, backup.CreateOptions{ID: "full"})
	if err != nil {
		return res, fmt.Errorf("full backup: %w", err)
	}
	made = append(made, "full")
	res.FullSeconds = time.Since(start).Seconds()
	res.FullBytes = int64(full.Bytes())
	logf("full backup: %d MB in %.2fs (%d files copied)", res.FullBytes/1e6, res.FullSeconds, st.FilesCopied)

	last, err := load(cfg.IncrementalBytes)
	if err != nil {
		return res, err
	}
	if err := idle(); err != nil {
		return res, err
	}
	start = time.Now()
	_, st, err = backup.Create(ctx, cli, loc, backup.CreateOptions{ID: "inc", Base: "full"})
	if err != nil {
		return res, fmt.Errorf("incremental backup: %w", err)
	}
	made = append(made, "inc")
	res.IncrementalSeconds = time.Since(start).Seconds()
	res.IncrementalBytes = st.BytesCopied
	logf("incremental backup: %d MB in %.2fs (%d log entries, %d new checkpoints)", res.IncrementalBytes/1e6, res.IncrementalSeconds, st.LogEntries, st.Checkpoints)
	cli.Close()
	if err := nodes.Stop(); err != nil {
		return res, err
	}

	// Restore "inc" as a new cluster, each way asked for.
	m, err := loc.Describe(ctx, "inc")
	if err != nil {
		return res, err
	}
	var replicaBytes int64
	for node := uint64(1); node <= 3; node++ {
		for _, p := range m.PartsHostedBy(node, []uint64{1, 2, 3}, 3) {
			replicaBytes += int64(p.Bytes())
		}
	}
	methods := cfg.Restores
	if len(methods) == 0 {
		methods = []string{RestoreServer, RestoreShalectl}
	}
	for _, method := range methods {
		if local, ok := strings.CutPrefix(loc.String(), "/"); ok {
			// Each restore reads the backup from the disk, as the first
			// would (the backup wrote around the page cache).
			evictCache("/" + local)
		}
		r, err := restoreOnce(ctx, cfg, o, loc, method, filepath.Join(dir, "restored-"+method), last, shards)
		if err != nil {
			return res, fmt.Errorf("restore (%s): %w", method, err)
		}
		r.ReplicaBytes = replicaBytes
		res.Restores = append(res.Restores, r)
		logf("restore (%s): %.2fs; %d MB written from the backup (%d MB the replicas need), copying %.2fs; all served %.2fs after their start; the nodes used %.2f CPU-s",
			method, r.Seconds, r.WrittenBytes/1e6, r.ReplicaBytes/1e6, r.CopySeconds, r.StartedSeconds, r.ServerCPUSeconds)
	}

	res.DiskWriteSeconds, err = diskWrite(filepath.Join(dir, "disk-speed"), res.FullBytes)
	return res, err
}

// diskWrite writes n bytes to path in 1 MiB writes, syncs, and returns the
// seconds it took.
func diskWrite(path string, n int64) (float64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer os.Remove(path)
	buf := make([]byte, 1<<20)
	_, _ = rand.Read(buf)
	start := time.Now()
	for w := int64(0); w < n; w += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return 0, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, err
	}
	secs := time.Since(start).Seconds()
	return secs, f.Close()
}

// restoreOnce restores backup "inc" of loc as a new 3-node cluster in
// dir, by method, and waits until the key last loaded reads back.
func restoreOnce(ctx context.Context, cfg BackupConfig, o ShaleOptions, loc *backup.Location, method, dir, last string, shards int) (RestoreResult, error) {
	r := RestoreResult{Method: method}
	extra := append([]string(nil), o.ExtraArgs...)
	start := time.Now()
	switch method {
	case RestoreServer:
		extra = append(extra, "--restore-from", loc.String(), "--restore-backup", "inc")
	case RestoreShalectl:
		bin := cfg.Shalectl
		if bin == "" {
			built, cleanup, err := buildShalectl(cfg.Log)
			if err != nil {
				return r, err
			}
			defer cleanup()
			bin = built
			start = time.Now()
		}
		staged, err := prepareNodes(ctx, bin, loc.String(), dir, 3)
		if err != nil {
			return r, err
		}
		r.WrittenBytes = staged
		r.CopySeconds = time.Since(start).Seconds()
	default:
		return r, fmt.Errorf("unknown restore method %q (want %s or %s)", method, RestoreServer, RestoreShalectl)
	}
	SetShaleOptions(ShaleOptions{ServerPath: o.ServerPath, Splits: o.Splits, ExtraArgs: extra})
	nodesStart := time.Now()
	restored, err := StartShaleNodes(ctx, dir, 3, "", cfg.Log)
	SetShaleOptions(o)
	if err != nil {
		return r, err
	}
	defer func() { _ = restored.Stop() }()
	rcli, err := restored.NewClient(ctx, cfg.Log)
	if err != nil {
		return r, err
	}
	defer rcli.Close()
	if _, err := restored.WaitReady(ctx, rcli, shards); err != nil {
		return r, err
	}
	for {
		kv, err := rcli.Get(ctx, []byte(last))
		if err == nil && kv != nil {
			break
		}
		if ctx.Err() != nil {
			return r, fmt.Errorf("the last key loaded does not read back: %v", err)
		}
		if err == nil {
			return r, errors.New("the last key loaded is missing")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.Seconds = time.Since(start).Seconds()
	// The processes started with the restore: their whole CPU time.
	cpu := &cpuMeter{pids: restored.Pids(), before: make([]uint64, len(restored.Pids()))}
	r.ServerCPUSeconds = cpu.used().Seconds()
	copied, copySeconds, started := restorePhases(dir, nodesStart)
	r.WrittenBytes += copied
	if method == RestoreServer {
		r.CopySeconds = copySeconds
	}
	r.StartedSeconds = started
	return r, nil
}

// prepareNodes runs `shalectl restore inc` for the data directories of
// nodes 1..n under dir at once, each as founding node i of nodes 1..n
// (through $SHALE_NODE_ID and $SHALE_INITIAL_CLUSTER, which a shalectl
// that copies the whole backup ignores), and returns the bytes they
// staged, all together.
func prepareNodes(ctx context.Context, bin, where, dir string, n int) (int64, error) {
	var initial []string
	for i := 1; i <= n; i++ {
		initial = append(initial, fmt.Sprintf("%d=127.0.0.1:%d", i, i))
	}
	staged := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := filepath.Join(dir, fmt.Sprintf("node%d", i+1), "data")
			cmd := exec.CommandContext(ctx, bin, "restore", "inc", "--location", where, "--data-dir", data, "-o", "json")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "SHALE_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, fmt.Sprintf("SHALE_NODE_ID=%d", i+1), "SHALE_INITIAL_CLUSTER="+strings.Join(initial, ","))
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("shalectl restore for node %d: %v: %s", i+1, err, bytes.TrimSpace(stderr.Bytes()))
				return
			}
			var rec struct {
				Bytes int64 `json:"bytes"`
			}
			if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
				errs[i] = fmt.Errorf("shalectl restore for node %d: %v: %s", i+1, err, out.Bytes())
				return
			}
			staged[i] = rec.Bytes
		}()
	}
	wg.Wait()
	var total int64
	for _, b := range staged {
		total += b
	}
	return total, errors.Join(errs...)
}

// buildShalectl builds shalectl into a new temporary directory from the
// main module (the bench module's parent: shalectl needs modules the bench
// module does not list); cleanup removes it.
func buildShalectl(log io.Writer) (path string, cleanup func(), err error) {
	mod := findBenchModule()
	if mod == "" {
		return "", nil, errors.New("no shalectl: the bench module is not found from the working directory or the executable (give --shalectl PATH)")
	}
	dir, err := os.MkdirTemp("", "shale-bench-shalectl-")
	if err != nil {
		return "", nil, err
	}
	out := filepath.Join(dir, "shalectl")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/shalectl")
	cmd.Dir = filepath.Dir(mod)
	if msg, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build of shalectl in %s: %v: %s", mod, err, bytes.TrimSpace(msg))
	}
	logLine(log, "shale: built %s", out)
	return out, func() { _ = os.RemoveAll(dir) }, nil
}

// restorePhases reads the restored nodes' logs (dir/node*/server.log): the
// bytes all of them copied from the backup and the span of time from the
// first copy's start to the last one's end, and the time from start to
// the last "node started" line.
func restorePhases(dir string, start time.Time) (bytes int64, copySeconds, startedSeconds float64) {
	logs, _ := filepath.Glob(filepath.Join(dir, "node*", "server.log"))
	var first, last, started time.Time
	for _, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			at, fields, ok := logFields(line)
			if !ok {
				continue
			}
			switch fields["msg"] {
			case "restore: parts copied":
				took, err := time.ParseDuration(fields["took"])
				n, nerr := strconv.ParseInt(fields["bytes"], 10, 64)
				if err != nil || nerr != nil {
					continue
				}
				bytes += n
				if from := at.Add(-took); first.IsZero() || from.Before(first) {
					first = from
				}
				if at.After(last) {
					last = at
				}
			case "node started":
				if at.After(started) {
					started = at
				}
			}
		}
	}
	if !first.IsZero() {
		copySeconds = last.Sub(first).Seconds()
	}
	if !started.IsZero() {
		startedSeconds = started.Sub(start).Seconds()
	}
	return bytes, copySeconds, startedSeconds
}

// logFields splits one line of slog's text format into its time and its
// key=value fields (quoted values unquoted).
func logFields(line string) (time.Time, map[string]string, bool) {
	fields := map[string]string{}
	for line != "" {
		eq := strings.IndexByte(line, '=')
		if eq <= 0 {
			break
		}
		key := strings.TrimSpace(line[:eq])
		line = line[eq+1:]
		var val string
		if strings.HasPrefix(line, `"`) {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				break
			}
			val, _ = strconv.Unquote(q)
			line = line[len(q):]
		} else {
			sp := strings.IndexByte(line, ' ')
			if sp < 0 {
				sp = len(line)
			}
			val, line = line[:sp], line[sp:]
		}
		fields[key] = val
		line = strings.TrimLeft(line, " ")
	}
	at, err := time.Parse(time.RFC3339Nano, fields["time"])
	return at, fields, err == nil
}
