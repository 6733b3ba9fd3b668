package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	shaleclient "github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// SnapshotConfig is one run of the single-snapshot benchmark: a 3-node
// cluster with one user shard is loaded with DataBytes of incompressible
// values, a fourth node joins, and one replica of the user shard is moved
// onto it (Admin MoveReplica), which the shard's leader does with one Raft
// snapshot streamed to the new node.
type SnapshotConfig struct {
	// DataBytes of ValueSize-byte random values are loaded by Writers
	// concurrent writers before the move.
	DataBytes int64
	ValueSize int
	Writers   int
	// DiskTestBytes is the size of the sequential-write test of the disk
	// under Dir (1 MiB writes, then fsync); 0 skips it.
	DiskTestBytes int64
	// ProfileDir, when set, receives CPU profiles and execution traces of
	// the sending and the receiving node (sender.pprof, receiver.pprof,
	// sender.trace, receiver.trace) taken over the first ProfileSeconds
	// (default 10) of the move.
	ProfileDir     string
	ProfileSeconds int
	// Timeout caps the wait for the move (default 10 minutes).
	Timeout time.Duration
	// Seed seeds the values.
	Seed uint64
	// Dir is the parent of the run's cluster directory.
	Dir string
	// Keep leaves the cluster directory in place.
	Keep bool
	// Log receives progress messages (nil: none).
	Log io.Writer
}

func (c *SnapshotConfig) logf(format string, args ...any) { logLine(c.Log, format, args...) }

// SnapshotResult is the outcome of one single-snapshot run.
type SnapshotResult struct {
	ServerArgs string `json:"server_args"`
	// DiskWriteBytes were written sequentially (1 MiB writes, then fsync)
	// at DiskWriteMBps, MB/s (10^6 bytes).
	DiskWriteBytes int64   `json:"disk_write_bytes"`
	DiskWriteMBps  float64 `json:"disk_write_mb_s"`
	// DataBytes were loaded in LoadSeconds; ShardBytes is the user shard's
	// size (ShardStatus.size_bytes) before the move.
	DataBytes   int64   `json:"data_bytes"`
	LoadSeconds float64 `json:"load_s"`
	ShardBytes  uint64  `json:"shard_bytes"`
	// ShardID is the user shard; its replica on FromNode moved to ToNode,
	// the snapshot sent by SenderNode (the shard's leader).
	ShardID    uint64 `json:"shard_id"`
	FromNode   uint64 `json:"from_node"`
	ToNode     uint64 `json:"to_node"`
	SenderNode uint64 `json:"sender_node"`
	// MoveSeconds is the time from the MoveReplica call until the new
	// node holds a voter of the shard and FromNode none.
	MoveSeconds float64 `json:"move_s"`
	// SnapshotSeconds is the successful send's duration as the sender
	// logged it ("snapshot sent ... took": checkpoint, stream, and the
	// receiver's verification and install); SnapshotAttempts counts the
	// sends the sender started for the new node (failed ones included).
	SnapshotSeconds  float64 `json:"snapshot_s"`
	SnapshotAttempts int     `json:"snapshot_attempts"`
	// SnapshotBytes is the shard's directory on the new node after the
	// move (allocated bytes; it varies with what the new engine compacted
	// by then); SnapshotMBps is ShardBytes over SnapshotSeconds (MB/s,
	// 10^6 bytes) and SnapshotOverDisk that over DiskWriteMBps.
	SnapshotBytes    int64   `json:"snapshot_bytes"`
	SnapshotMBps     float64 `json:"snapshot_mb_s"`
	SnapshotOverDisk float64 `json:"snapshot_over_disk"`
	// SenderCPUSeconds and ReceiverCPUSeconds are the two processes' CPU
	// time (user + system) over the move; CPUSecondsPerGB is their sum
	// per GB (10^9 bytes) of ShardBytes.
	SenderCPUSeconds   float64 `json:"sender_cpu_s"`
	ReceiverCPUSeconds float64 `json:"receiver_cpu_s"`
	CPUSecondsPerGB    float64 `json:"cpu_s_per_gb"`
	// Err is the failure, if any.
	Err   error  `json:"-"`
	Error string `json:"error,omitempty"`
}

// RunSnapshot runs the single-snapshot benchmark once.
func RunSnapshot(ctx context.Context, cfg SnapshotConfig) (r SnapshotResult) {
	if cfg.Writers <= 0 {
		cfg.Writers = 32
	}
	if cfg.ValueSize <= 0 {
		cfg.ValueSize = 16 << 10
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.ProfileSeconds <= 0 {
		cfg.ProfileSeconds = 10
	}
	r = SnapshotResult{ServerArgs: strings.Join(currentShaleOptions().ExtraArgs, " "), DataBytes: cfg.DataBytes}
	defer func() {
		if r.Err != nil {
			r.Error = r.Err.Error()
		}
	}()
	dir, err := freshRunDir(cfg.Dir, "snapshot", cfg.Log)
	if err != nil {
		r.Err = err
		return r
	}
	if cfg.DiskTestBytes > 0 {
		if r.DiskWriteMBps, err = diskTest(dir, cfg.DiskTestBytes, cfg.Seed, "snapshot", cfg.Log); err != nil {
			r.Err = err
			return r
		}
		r.DiskWriteBytes = cfg.DiskTestBytes
	}
	rc, err := startRunCluster(ctx, dir, 3, "", cfg.Keep, cfg.Log)
	if err != nil {
		r.Err = err
		return r
	}
	nodes := rc.nodes
	defer func() {
		if err := rc.stop(); err != nil && r.Err == nil {
			r.Err = err
			r.Error = r.Err.Error()
		}
	}()
	fail := func(err error) SnapshotResult {
		r.Err = rc.fail(err)
		return r
	}
	cli, err := rc.connect(ctx, 5*time.Minute, 2, cfg.Log)
	if err != nil {
		r.Err = err
		return r
	}
	defer cli.Close()

	cfg.logf("snapshot: loading %d MiB in %d-byte values with %d writers", cfg.DataBytes>>20, cfg.ValueSize, cfg.Writers)
	t := time.Now()
	lcfg := PlacementConfig{DataBytes: cfg.DataBytes, ValueSize: cfg.ValueSize, Writers: cfg.Writers, Seed: cfg.Seed, Log: cfg.Log}
	if err := loadPlacementData(ctx, &lcfg, nodes); err != nil {
		return fail(fmt.Errorf("load: %w", err))
	}
	r.LoadSeconds = round(time.Since(t).Seconds(), 2)

	shard, err := userShard(ctx, cli)
	if err != nil {
		return fail(err)
	}
	r.ShardID, r.ShardBytes, r.SenderNode = shard.GetDescriptor_().GetShardId(), shard.GetSizeBytes(), shard.GetLeaderNodeId()
	for _, rd := range shard.GetDescriptor_().GetReplicas() {
		if rd.GetNodeId() != r.SenderNode {
			r.FromNode = rd.GetNodeId()
			break
		}
	}
	if r.SenderNode == 0 || r.FromNode == 0 {
		return fail(fmt.Errorf("shard %d: no leader or no follower: %v", r.ShardID, shard.GetDescriptor_()))
	}
	cfg.logf("snapshot: shard %d holds %d MB; leader node %d", r.ShardID, r.ShardBytes/1_000_000, r.SenderNode)

	k, err := nodes.StartJoiningNode(ctx, dir, nil, cfg.Log)
	if err != nil {
		return fail(fmt.Errorf("join: %w", err))
	}
	joinCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = waitJoined(joinCtx, cli, nodes, []string{nodes.Endpoints[k]})
	cancel()
	if err != nil {
		return fail(fmt.Errorf("join: %w", err))
	}
	if r.ToNode, err = nodeAt(ctx, cli, nodes.Endpoints[k]); err != nil {
		return fail(err)
	}
	senderIdx, receiverIdx := int(r.SenderNode)-1, k
	if senderIdx < 0 || senderIdx >= len(nodes.Endpoints) {
		return fail(fmt.Errorf("leader node %d is not one of the founding nodes", r.SenderNode))
	}
	pids := nodes.Pids()
	cpu0s, err1 := cpuTicks(pids[senderIdx])
	cpu0r, err2 := cpuTicks(pids[receiverIdx])
	if err := errors.Join(err1, err2); err != nil {
		return fail(err)
	}
	var profiles sync.WaitGroup
	profileErrs := make([]error, 4)
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return fail(err)
		}
		for i, p := range []struct{ http, name string }{{nodes.HTTP[senderIdx], "sender"}, {nodes.HTTP[receiverIdx], "receiver"}} {
			for j, kind := range []string{"profile", "trace"} {
				profiles.Add(1)
				go func() {
					defer profiles.Done()
					ext := map[string]string{"profile": ".pprof", "trace": ".trace"}[kind]
					profileErrs[2*i+j] = fetchProfile(ctx, p.http, kind, cfg.ProfileSeconds, filepath.Join(cfg.ProfileDir, p.name+ext))
				}()
			}
		}
		// Let both profiles start before the move does.
		time.Sleep(100 * time.Millisecond)
	}

	cfg.logf("snapshot: moving shard %d from node %d to node %d (pid %d), sent by node %d (pid %d)", r.ShardID, r.FromNode, r.ToNode, pids[receiverIdx], r.SenderNode, pids[senderIdx])
	t0 := time.Now()
	if err := moveReplica(ctx, cli, r.ShardID, r.FromNode, r.ToNode); err != nil {
		return fail(err)
	}
	if err := waitMoved(ctx, cli, r.ShardID, r.FromNode, r.ToNode, cfg.Timeout); err != nil {
		return fail(err)
	}
	r.MoveSeconds = round(time.Since(t0).Seconds(), 2)
	cpu1s, err1 := cpuTicks(pids[senderIdx])
	cpu1r, err2 := cpuTicks(pids[receiverIdx])
	if err := errors.Join(err1, err2); err != nil {
		return fail(err)
	}
	hz := clockTicks()
	r.SenderCPUSeconds = round(float64(cpu1s-cpu0s)/hz, 2)
	r.ReceiverCPUSeconds = round(float64(cpu1r-cpu0r)/hz, 2)
	cfg.logf("snapshot: moved in %.2f s", r.MoveSeconds)
	profiles.Wait()
	if err := errors.Join(profileErrs...); err != nil {
		cfg.logf("snapshot: profiles: %v", err)
	}

	r.SnapshotBytes = DirDiskBytes(filepath.Join(dir, fmt.Sprintf("node%d", receiverIdx+1), "data", "shards", strconv.FormatUint(r.ShardID, 10)))
	took, attempts, err := snapshotSentTook(filepath.Join(dir, fmt.Sprintf("node%d", senderIdx+1), "server.log"), r.ShardID, r.ToNode)
	if err != nil {
		return fail(err)
	}
	r.SnapshotSeconds, r.SnapshotAttempts = round(took.Seconds(), 3), attempts
	if took > 0 {
		r.SnapshotMBps = round(float64(r.ShardBytes)/1e6/took.Seconds(), 1)
		if r.DiskWriteMBps > 0 {
			r.SnapshotOverDisk = round(r.SnapshotMBps/r.DiskWriteMBps, 3)
		}
	}
	if r.ShardBytes > 0 {
		r.CPUSecondsPerGB = round((r.SenderCPUSeconds+r.ReceiverCPUSeconds)/(float64(r.ShardBytes)/1e9), 2)
	}
	return r
}

// userShard returns the status of the one user shard (the shard that is
// not the system shard, ID 1) once it has a leader and three voters.
func userShard(ctx context.Context, cli *shaleclient.Client) (*shalev1.ShardStatus, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := clusterStatus(ctx, cli)
		if err == nil {
			for _, s := range st.GetShards() {
				d := s.GetDescriptor_()
				if d.GetShardId() == 1 || s.GetLeaderNodeId() == 0 || len(d.GetReplicas()) != 3 {
					continue
				}
				return s, nil
			}
			err = errors.New("no user shard with a leader and 3 replicas")
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("user shard: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// nodeAt returns the ID of the node listening at addr.
func nodeAt(ctx context.Context, cli *shaleclient.Client, addr string) (uint64, error) {
	ns, err := cli.ListNodes(ctx)
	if err != nil {
		return 0, err
	}
	for _, n := range ns {
		if n.GetNode().GetAddress() == addr {
			return n.GetNode().GetNodeId(), nil
		}
	}
	return 0, fmt.Errorf("no node listed at %s", addr)
}

// moveReplica asks for the move, retrying for a while when the placement
// service refuses it (another operation on the shard, a node not yet
// live). A move the placement service already started on its own onto
// the same node counts.
func moveReplica(ctx context.Context, cli *shaleclient.Client, shard, from, to uint64) error {
	deadline := time.Now().Add(time.Minute)
	for {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := cli.MoveReplica(mctx, shard, from, to, 0)
		cancel()
		if err == nil {
			return nil
		}
		if st, serr := clusterStatus(ctx, cli); serr == nil {
			for _, s := range st.GetShards() {
				if s.GetDescriptor_().GetShardId() != shard {
					continue
				}
				for _, rd := range s.GetDescriptor_().GetReplicas() {
					if rd.GetNodeId() == to {
						return nil
					}
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("move shard %d from node %d to node %d: %w", shard, from, to, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitMoved polls until node to holds a voter of shard and node from holds
// no replica of it.
func waitMoved(ctx context.Context, cli *shaleclient.Client, shard, from, to uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		st, err := clusterStatus(ctx, cli)
		if err == nil {
			for _, s := range st.GetShards() {
				if s.GetDescriptor_().GetShardId() != shard {
					continue
				}
				voter, old := false, false
				for _, rd := range s.GetDescriptor_().GetReplicas() {
					switch rd.GetNodeId() {
					case to:
						voter = rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED
					case from:
						old = true
					}
				}
				if voter && !old {
					return nil
				}
				last = fmt.Sprint(s.GetDescriptor_().GetReplicas())
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("shard %d not moved from node %d to node %d within %s (last: %s)", shard, from, to, timeout, last)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fetchProfile saves a CPU profile (kind "profile") or an execution trace
// (kind "trace") of seconds from the node's /debug/pprof.
func fetchProfile(ctx context.Context, httpAddr, kind string, seconds int, path string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(seconds+30)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", httpAddr, kind, seconds), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", httpAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile of %s: %s", httpAddr, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile of %s: %w", httpAddr, err)
	}
	return f.Close()
}

// snapshotSentTook reads the sender's log for its snapshots of shard to
// node: the duration of the last successful one ("snapshot sent ...
// took=D") and the number of sends that ended (sent or failed).
func snapshotSentTook(logPath string, shard, node uint64) (took time.Duration, attempts int, err error) {
	f, err := os.Open(logPath)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	wantShard, wantNode := fmt.Sprintf("shard=%d", shard), fmt.Sprintf("to_node=%d", node)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if !slices.Contains(fields, wantShard) || !slices.Contains(fields, wantNode) {
			continue
		}
		switch {
		case strings.Contains(line, `msg="snapshot send failed"`):
			attempts++
		case strings.Contains(line, `msg="snapshot sent"`):
			attempts++
			_, rest, ok := strings.Cut(line, " took=")
			if !ok {
				continue
			}
			v, _, _ := strings.Cut(rest, " ")
			if d, perr := time.ParseDuration(v); perr == nil {
				took = d
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, attempts, err
	}
	if took == 0 {
		return 0, attempts, fmt.Errorf("%s: no \"snapshot sent\" line for shard %d to node %d", logPath, shard, node)
	}
	return took, attempts, nil
}

// WriteSnapshotJSONLine writes the result as one JSON object and a newline.
func WriteSnapshotJSONLine(w io.Writer, r SnapshotResult) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteSnapshotReport writes the result as a short report.
func WriteSnapshotReport(w io.Writer, r SnapshotResult) {
	if r.DiskWriteBytes > 0 {
		fmt.Fprintf(w, "disk:      sequential write of %d MiB (1 MiB writes + fsync): %.1f MB/s\n", r.DiskWriteBytes>>20, r.DiskWriteMBps)
	}
	if r.LoadSeconds > 0 {
		fmt.Fprintf(w, "load:      %d MiB in %.1f s; shard %d holds %.0f MB\n", r.DataBytes>>20, r.LoadSeconds, r.ShardID, float64(r.ShardBytes)/1e6)
	}
	if r.MoveSeconds > 0 {
		fmt.Fprintf(w, "move:      node %d -> node %d (snapshot from node %d) in %.2f s\n", r.FromNode, r.ToNode, r.SenderNode, r.MoveSeconds)
	}
	if r.SnapshotSeconds > 0 {
		fmt.Fprintf(w, "snapshot:  %.0f MB (shard size; %.0f MB on the new node's disk after the move) in %.2f s (%d attempts) = %.1f MB/s",
			float64(r.ShardBytes)/1e6, float64(r.SnapshotBytes)/1e6, r.SnapshotSeconds, r.SnapshotAttempts, r.SnapshotMBps)
		if r.DiskWriteMBps > 0 {
			fmt.Fprintf(w, " = %.2fx the disk's sequential write", r.SnapshotOverDisk)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "CPU:       sender %.2f s, receiver %.2f s over the move = %.2f CPU-s per GB\n", r.SenderCPUSeconds, r.ReceiverCPUSeconds, r.CPUSecondsPerGB)
	}
	if r.Err != nil {
		fmt.Fprintf(w, "ERROR: %v\n", r.Err)
	} else if r.Error != "" {
		fmt.Fprintf(w, "ERROR: %s\n", r.Error)
	}
}
