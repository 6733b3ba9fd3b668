package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	shaleclient "github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// PlacementConfig is one run of the rebalance benchmark: a cluster of
// Members shale-server processes with Shards user shards is loaded with
// DataBytes of incompressible values, then Join more nodes join it, and the
// benchmark times the placement service until replicas and leaderships are
// balanced over every node.
type PlacementConfig struct {
	// Members is the size of the initial cluster (3); Join the number of
	// nodes that join it after the load (2).
	Members, Join int
	// Shards is the number of user shards the cluster starts with
	// (PlacementSplits).
	Shards int
	// DataBytes is how much value data is loaded, in ValueSize-byte values
	// (random bytes, incompressible) under keys spread uniformly over the
	// shards, by Writers concurrent writers.
	DataBytes int64
	ValueSize int
	Writers   int
	// JoinArgs are extra shale-server flags of the joining nodes only
	// (ShaleOptions.ExtraArgs go to every node).
	JoinArgs []string
	// Timeout caps the wait for a balanced placement after the join.
	Timeout time.Duration
	// Poll is the interval between placement checks (500 ms); Stable the
	// number of consecutive balanced checks that count as converged (3).
	Poll   time.Duration
	Stable int
	// DiskTestBytes is the size of the sequential-write test of the disk
	// under Dir (1 MiB writes, then fsync); 0 skips it.
	DiskTestBytes int64
	// ForegroundRate is a steady put load (puts a second of
	// ForegroundValueSize-byte values to new keys over every shard) that
	// runs from ForegroundBefore before the join until the placement is
	// balanced, so that its latency before the join and during the
	// rebalance can be compared; 0: none.
	ForegroundRate      int
	ForegroundValueSize int
	ForegroundBefore    time.Duration
	// ForegroundTrace, if set, is a file that gets every foreground put:
	// its due time in milliseconds from the join (every new node listed),
	// its latency in milliseconds, and whether it failed.
	ForegroundTrace string
	// Seed seeds the values.
	Seed uint64
	// Dir is the parent of the run's cluster directory.
	Dir string
	// Keep leaves the cluster directory in place.
	Keep bool
	// Log receives progress messages (nil: none).
	Log io.Writer
}

func (c *PlacementConfig) logf(format string, args ...any) { logLine(c.Log, format, args...) }

// PlacementNode is one node at the end of a placement run.
type PlacementNode struct {
	NodeID uint64 `json:"node_id"`
	// Joined is true for the nodes that joined after the load.
	Joined bool `json:"joined"`
	// Replicas and Leaders are the shards with a replica on the node and
	// those it leads (ClusterStatus); ShardBytes is the sum of its
	// replicas' shard sizes (ShardStatus.size_bytes).
	Replicas   int    `json:"replicas"`
	Leaders    int    `json:"leaders"`
	ShardBytes uint64 `json:"shard_bytes"`
	// DiskBytes is the node's data directory on disk (allocated blocks,
	// as du counts them) before the join and at the end.
	DiskBytesBefore int64 `json:"disk_bytes_before"`
	DiskBytes       int64 `json:"disk_bytes"`
}

// PlacementResult is the outcome of one placement run.
type PlacementResult struct {
	Members    int    `json:"members"`
	Joined     int    `json:"joined"`
	UserShards int    `json:"user_shards"`
	ServerArgs string `json:"server_args"`
	// DiskWriteBytes were written sequentially (1 MiB writes, then fsync)
	// at DiskWriteMBps, MB/s (10^6 bytes).
	DiskWriteBytes int64   `json:"disk_write_bytes"`
	DiskWriteMBps  float64 `json:"disk_write_mb_s"`
	// DataBytes of ValueSize-byte values were loaded by Writers writers in
	// LoadSeconds; ShardsAfterLoad counts the shards then (system shard
	// included) and StoredBytes sums their sizes.
	DataBytes       int64   `json:"data_bytes"`
	ValueSize       int     `json:"value_size"`
	Writers         int     `json:"writers"`
	LoadSeconds     float64 `json:"load_s"`
	LoadMBps        float64 `json:"load_mb_s"`
	ShardsAfterLoad int     `json:"shards_after_load"`
	StoredBytes     uint64  `json:"stored_bytes"`
	// JoinSeconds is the time from starting the joining processes to the
	// cluster listing all of them as live nodes.
	JoinSeconds float64 `json:"join_s"`
	// Converged reports whether the placement was balanced within the
	// timeout; RebalanceSeconds is the time from the join (every new node
	// listed) to the first of Stable consecutive balanced checks (or to
	// the timeout).
	Converged        bool    `json:"converged"`
	RebalanceSeconds float64 `json:"rebalance_s"`
	// MovedReplicas are the (shard, node) replicas at the end that were
	// not there before the join; MovedShardBytes sums their shards' sizes.
	// NewNodesDiskBytes is the joined nodes' data directories on disk at
	// the end. MovedMBps is NewNodesDiskBytes over RebalanceSeconds (MB/s,
	// 10^6 bytes), MovedShardMBps the same from MovedShardBytes, and
	// MovedOverDisk is MovedMBps / DiskWriteMBps.
	MovedReplicas     int     `json:"moved_replicas"`
	MovedShardBytes   uint64  `json:"moved_shard_bytes"`
	NewNodesDiskBytes int64   `json:"new_nodes_disk_bytes"`
	MovedMBps         float64 `json:"moved_mb_s"`
	MovedShardMBps    float64 `json:"moved_shard_mb_s"`
	MovedOverDisk     float64 `json:"moved_over_disk"`
	// Nodes are the nodes at the end, by node ID; ReplicaSpread,
	// LeaderSpread and BytesSpreadPercent their spreads (max - min, and
	// (max - min) / max of ShardBytes) as the benchmark computes them;
	// NonVoters counts learners and joint-configuration replicas left.
	Nodes              []PlacementNode `json:"nodes"`
	ReplicaSpread      int             `json:"replica_spread"`
	LeaderSpread       int             `json:"leader_spread"`
	BytesSpreadPercent float64         `json:"bytes_spread_pct"`
	NonVoters          int             `json:"non_voters"`
	// Server* are the placement leader's view at the end (PlacementStatus;
	// ServerBalanced nil when it could not be read).
	ServerBalanced           *bool   `json:"server_balanced,omitempty"`
	ServerReplicaSpread      uint64  `json:"server_replica_spread"`
	ServerLeaderSpread       uint64  `json:"server_leader_spread"`
	ServerBytesSpreadPercent float64 `json:"server_bytes_spread_pct"`
	// Operations counts the placement operations the nodes logged from
	// the join to the convergence (every node's server.log, "placement
	// operation" lines), by kind ("failed" for failures);
	// LearnersOnOldNodes counts the add-learner operations among them that
	// added a replica to one of the original nodes (replicas moving back:
	// churn), and PlacementLeaders the "became placement leader" lines in
	// that time.
	Operations         map[string]int `json:"operations,omitempty"`
	LearnersOnOldNodes int            `json:"learners_on_old_nodes"`
	PlacementLeaders   int            `json:"placement_leader_changes"`
	// ServerBalancedSeconds is the time from the join to the first of
	// Stable consecutive polls where the placement leader called the
	// cluster balanced (nothing running, stuck or left to schedule); the
	// benchmark keeps polling up to a minute past its own convergence for
	// it; -1 if not seen. ServerNotBalanced says why it was not, at the
	// last poll that found it not balanced.
	ServerBalancedSeconds float64 `json:"server_balanced_s"`
	ServerNotBalanced     string  `json:"server_not_balanced,omitempty"`
	// ForegroundBefore and ForegroundDuring are the foreground puts
	// (PlacementConfig.ForegroundRate) due in the ForegroundBefore
	// seconds before the join and from the join (every new node listed)
	// to the balanced placement; ForegroundP99Ratio is During's p99 over
	// Before's.
	ForegroundRate     int       `json:"foreground_rate,omitempty"`
	ForegroundBefore   *FgWindow `json:"foreground_before,omitempty"`
	ForegroundDuring   *FgWindow `json:"foreground_during,omitempty"`
	ForegroundP99Ratio float64   `json:"foreground_p99_ratio,omitempty"`
	// Err is the failure, if any.
	Err   error  `json:"-"`
	Error string `json:"error,omitempty"`
}

// PlacementSplits returns the --initial-splits making n user shards of the
// benchmark's keys (16 lowercase hex digits, uniform over the key order):
// n-1 four-digit hex keys evenly spaced, so each shard gets an equal share.
func PlacementSplits(n int) string {
	if n <= 1 {
		return ""
	}
	n = min(n, 1<<16)
	keys := make([]string, 0, n-1)
	for i := 1; i < n; i++ {
		keys = append(keys, fmt.Sprintf("%04x", i*(1<<16)/n))
	}
	return strings.Join(keys, ",")
}

// RunPlacement runs the rebalance benchmark once.
func RunPlacement(ctx context.Context, cfg PlacementConfig) (r PlacementResult) {
	if cfg.Members <= 0 {
		cfg.Members = 3
	}
	if cfg.Join <= 0 {
		cfg.Join = 2
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	if cfg.Stable <= 0 {
		cfg.Stable = 3
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 32
	}
	if cfg.ValueSize <= 0 {
		cfg.ValueSize = 16 << 10
	}
	r = PlacementResult{
		Members:    cfg.Members,
		Joined:     cfg.Join,
		UserShards: cfg.Shards,
		ServerArgs: strings.Join(currentShaleOptions().ExtraArgs, " "),
		DataBytes:  cfg.DataBytes,
		ValueSize:  cfg.ValueSize,
		Writers:    cfg.Writers,
	}
	created := missingDirs(cfg.Dir)
	failed := false
	defer func() {
		if r.Err != nil {
			r.Error = r.Err.Error()
		}
		if !failed && !cfg.Keep {
			for _, d := range created {
				if os.Remove(d) != nil {
					break
				}
			}
		}
	}()
	dir, err := freshRunDir(cfg.Dir, "placement", cfg.Log)
	if err != nil {
		r.Err = err
		return r
	}

	// The disk first, while nothing else of ours runs.
	if cfg.DiskTestBytes > 0 {
		if r.DiskWriteMBps, err = diskTest(dir, cfg.DiskTestBytes, cfg.Seed, "placement", cfg.Log); err != nil {
			r.Err = err
			return r
		}
		r.DiskWriteBytes = cfg.DiskTestBytes
	}

	cfg.logf("placement: starting %d shale-server nodes with %d user shards in %s", cfg.Members, cfg.Shards, dir)
	rc, err := startRunCluster(ctx, dir, cfg.Members, PlacementSplits(cfg.Shards), cfg.Keep, cfg.Log)
	if err != nil {
		failed = true
		r.Err = err
		return r
	}
	nodes := rc.nodes
	defer func() {
		if err := rc.stop(); err != nil && r.Err == nil {
			r.Err = err
			r.Error = r.Err.Error()
		}
		failed = failed || rc.failed
	}()
	fail := func(err error) PlacementResult {
		failed = true
		r.Err = rc.fail(err)
		return r
	}
	cli, err := rc.connect(ctx, 5*time.Minute, max(cfg.Shards, 1)+1, cfg.Log)
	if err != nil {
		failed = true
		r.Err = err
		return r
	}
	defer cli.Close()

	// Load.
	cfg.logf("placement: loading %d MiB in %d-byte values with %d writers", cfg.DataBytes>>20, cfg.ValueSize, cfg.Writers)
	t := time.Now()
	if err := loadPlacementData(ctx, &cfg, nodes); err != nil {
		return fail(fmt.Errorf("load: %w", err))
	}
	load := time.Since(t)
	r.LoadSeconds = round(load.Seconds(), 2)
	r.LoadMBps = round(float64(cfg.DataBytes)/1e6/load.Seconds(), 1)
	cfg.logf("placement: loaded %d MiB in %s (%.1f MB/s)", cfg.DataBytes>>20, load.Round(time.Millisecond), r.LoadMBps)

	// The layout before the join.
	before, err := clusterStatus(ctx, cli)
	if err != nil {
		return fail(fmt.Errorf("cluster status after the load: %w", err))
	}
	r.ShardsAfterLoad = len(before.GetShards())
	initial := map[uint64]map[uint64]bool{}
	for _, s := range before.GetShards() {
		r.StoredBytes += s.GetSizeBytes()
		set := map[uint64]bool{}
		for _, rd := range s.GetDescriptor_().GetReplicas() {
			set[rd.GetNodeId()] = true
		}
		initial[s.GetDescriptor_().GetShardId()] = set
	}
	cfg.logf("placement: %d shards after the load, %d MB by shard size", r.ShardsAfterLoad, r.StoredBytes/1_000_000)
	diskBefore := map[string]int64{}
	for i, ep := range nodes.Endpoints {
		diskBefore[ep] = DirDiskBytes(filepath.Join(dir, fmt.Sprintf("node%d", i+1), "data"))
	}

	// The foreground load, alone for a while before the join.
	var fg *foreground
	var fgFrom time.Time
	if cfg.ForegroundRate > 0 {
		if cfg.ForegroundValueSize <= 0 {
			cfg.ForegroundValueSize = 256
		}
		if cfg.ForegroundBefore <= 0 {
			cfg.ForegroundBefore = 10 * time.Second
		}
		r.ForegroundRate = cfg.ForegroundRate
		cfg.logf("placement: foreground load: %d puts/s of %d-byte values; %s before the join", cfg.ForegroundRate, cfg.ForegroundValueSize, cfg.ForegroundBefore)
		fg = startForeground(ctx, cli, cfg.ForegroundRate, cfg.ForegroundValueSize, uint64(cfg.DataBytes/int64(cfg.ValueSize))+1<<40)
		defer fg.stop()
		fgFrom = time.Now()
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(cfg.ForegroundBefore):
		}
	}

	// Join.
	cfg.logf("placement: starting %d joining nodes", cfg.Join)
	t = time.Now()
	fgTo := t
	var joined []string
	for range cfg.Join {
		k, err := nodes.StartJoiningNode(ctx, dir, cfg.JoinArgs, cfg.Log)
		if err != nil {
			return fail(fmt.Errorf("join: %w", err))
		}
		joined = append(joined, nodes.Endpoints[k])
	}
	joinCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = waitJoined(joinCtx, cli, nodes, joined)
	cancel()
	if err != nil {
		return fail(fmt.Errorf("join: %w", err))
	}
	t0 := time.Now()
	r.JoinSeconds = round(t0.Sub(t).Seconds(), 2)
	cfg.logf("placement: %d nodes joined after %s; waiting for a balanced placement (timeout %s)", cfg.Join, t0.Sub(t).Round(time.Millisecond), cfg.Timeout)

	// Wait for a balanced placement.
	deadline := t0.Add(cfg.Timeout)
	var (
		streak      int
		streakStart time.Time
		streakKey   string
		last        *placementView
		lastLog     time.Time
		lastShown   string
	)
	r.ServerBalancedSeconds = -1
	var srvStreak int
	var srvStart time.Time
	pollServer := func() {
		if r.ServerBalancedSeconds >= 0 {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ps, err := cli.PlacementStatus(pctx)
		cancel()
		now := time.Now()
		switch {
		case err != nil:
			srvStreak = 0
		case ps.GetBalanced() && serverSeesAll(ps, cfg.Members+cfg.Join):
			if srvStreak == 0 {
				srvStart = now
			}
			srvStreak++
			if srvStreak >= cfg.Stable {
				r.ServerBalancedSeconds = round(srvStart.Sub(t0).Seconds(), 2)
				r.ServerNotBalanced = ""
				cfg.logf("placement: +%5.1fs the placement leader calls the cluster balanced (since +%.1fs)", now.Sub(t0).Seconds(), srvStart.Sub(t0).Seconds())
			}
		default:
			srvStreak = 0
			r.ServerNotBalanced = serverNotBalanced(ps)
		}
	}
	for {
		if err := nodes.checkRunning(); err != nil {
			return fail(err)
		}
		pollServer()
		st, err := clusterStatus(ctx, cli)
		now := time.Now()
		if err == nil {
			v := viewOf(st, cfg.Members)
			last = v
			if v.balanced() {
				if streak == 0 || v.key() != streakKey {
					streak, streakStart, streakKey = 0, now, v.key()
				}
				streak++
			} else {
				streak = 0
			}
			if shown := v.shown(); shown != lastShown || now.Sub(lastLog) >= 5*time.Second || streak >= cfg.Stable {
				lastLog, lastShown = now, shown
				cfg.logf("placement: +%5.1fs %s", now.Sub(t0).Seconds(), v)
			}
			if streak >= cfg.Stable {
				r.Converged = true
				r.RebalanceSeconds = round(streakStart.Sub(t0).Seconds(), 2)
				break
			}
		} else {
			cfg.logf("placement: +%5.1fs cluster status: %v", now.Sub(t0).Seconds(), err)
		}
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		if now.After(deadline) {
			r.RebalanceSeconds = round(now.Sub(t0).Seconds(), 2)
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(cfg.Poll):
		}
	}

	// What moved, and the final layout.
	newNode := map[string]bool{}
	for _, a := range joined {
		newNode[a] = true
	}
	if last != nil {
		for _, s := range last.shards {
			set := initial[s.GetDescriptor_().GetShardId()]
			for _, rd := range s.GetDescriptor_().GetReplicas() {
				if !set[rd.GetNodeId()] {
					r.MovedReplicas++
					r.MovedShardBytes += s.GetSizeBytes()
				}
			}
		}
		r.ReplicaSpread, r.LeaderSpread, r.BytesSpreadPercent = last.spreads()
		r.NonVoters = last.nonVoters
		for _, id := range last.ids {
			addr := last.addrs[id]
			pn := PlacementNode{NodeID: id, Joined: newNode[addr], Replicas: last.replicas[id], Leaders: last.leaders[id], ShardBytes: last.bytes[id], DiskBytesBefore: diskBefore[addr]}
			if i := slices.Index(nodes.Endpoints, addr); i >= 0 {
				pn.DiskBytes = DirDiskBytes(filepath.Join(dir, fmt.Sprintf("node%d", i+1), "data"))
			}
			if pn.Joined {
				r.NewNodesDiskBytes += pn.DiskBytes
			}
			r.Nodes = append(r.Nodes, pn)
		}
		r.BytesSpreadPercent = round(r.BytesSpreadPercent, 1)
	}
	if fg != nil {
		fg.stop()
		b := fg.window(fgFrom, fgTo)
		d := fg.window(t0, t0.Add(time.Duration(r.RebalanceSeconds*float64(time.Second))))
		r.ForegroundBefore, r.ForegroundDuring = &b, &d
		if cfg.ForegroundTrace != "" {
			if err := fg.writeTrace(cfg.ForegroundTrace, t0); err != nil {
				cfg.logf("placement: %v", err)
			}
		}
		if b.P99ms > 0 {
			r.ForegroundP99Ratio = round(d.P99ms/b.P99ms, 2)
		}
		cfg.logf("placement: foreground puts before the join: %d (%d failed), p50 %.1f ms, p99 %.1f ms; during the rebalance: %d (%d failed), p50 %.1f ms, p99 %.1f ms (%.2fx)",
			b.Puts, b.Failed, b.P50ms, b.P99ms, d.Puts, d.Failed, d.P50ms, d.P99ms, r.ForegroundP99Ratio)
	}
	if s := r.RebalanceSeconds; s > 0 {
		r.MovedMBps = round(float64(r.NewNodesDiskBytes)/1e6/s, 1)
		r.MovedShardMBps = round(float64(r.MovedShardBytes)/1e6/s, 1)
		if r.DiskWriteMBps > 0 {
			r.MovedOverDisk = round(r.MovedMBps/r.DiskWriteMBps, 4)
		}
	}
	// The placement leader's own verdict: poll it for up to a minute more.
	if r.Converged {
		until := time.Now().Add(time.Minute)
		for r.ServerBalancedSeconds < 0 && time.Now().Before(until) && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(cfg.Poll):
			}
			pollServer()
		}
		if r.ServerBalancedSeconds < 0 {
			cfg.logf("placement: the placement leader did not call the cluster balanced within a minute of convergence: %s", r.ServerNotBalanced)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if ps, err := cli.PlacementStatus(sctx); err == nil {
		b := ps.GetBalanced()
		r.ServerBalanced = &b
		r.ServerReplicaSpread, r.ServerLeaderSpread = ps.GetReplicaSpread(), ps.GetLeaderSpread()
		r.ServerBytesSpreadPercent = round(ps.GetBytesSpreadPercent(), 1)
	} else {
		cfg.logf("placement: placement status: %v", err)
	}
	cancel()
	old := map[uint64]bool{}
	for _, n := range r.Nodes {
		if !n.Joined {
			old[n.NodeID] = true
		}
	}
	end := t0.Add(time.Duration(r.RebalanceSeconds*float64(time.Second)) + time.Duration(cfg.Stable)*cfg.Poll)
	r.Operations, r.LearnersOnOldNodes, r.PlacementLeaders = placementLogOps(dir, t, end, old)
	if !r.Converged {
		return fail(fmt.Errorf("placement not balanced %s after the join; last: %s", cfg.Timeout, last))
	}
	return r
}

// serverSeesAll reports whether the placement leader lists nodes live
// nodes with replica and leader spreads of at most one: before it has the
// new nodes' heartbeats it may call the cluster balanced.
func serverSeesAll(ps *shalev1.PlacementStatusResponse, nodes int) bool {
	live := 0
	for _, n := range ps.GetNodes() {
		if n.GetState() == "live" {
			live++
		}
	}
	return live >= nodes && ps.GetReplicaSpread() <= 1 && ps.GetLeaderSpread() <= 1
}

// placementLogOps counts the "placement operation" lines logged by the
// nodes under dir (node*/server.log) from start to end, by operation kind
// ("failed" for "placement operation failed"), the add-learner operations
// onto the nodes in old, and the "became placement leader" lines.
func placementLogOps(dir string, start, end time.Time, old map[uint64]bool) (ops map[string]int, learnersOnOld, leaders int) {
	ops = map[string]int{}
	logs, _ := filepath.Glob(filepath.Join(dir, "node*", "server.log"))
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			rest, ok := strings.CutPrefix(line, "time=")
			if !ok {
				continue
			}
			ts, _, _ := strings.Cut(rest, " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil || at.Before(start) || at.After(end) {
				continue
			}
			switch {
			case strings.Contains(line, `msg="became placement leader"`):
				leaders++
			case strings.Contains(line, `msg="placement operation failed"`):
				ops["failed"]++
			case strings.Contains(line, `msg="placement operation"`):
				_, op, ok := strings.Cut(line, ` op="shard `)
				if !ok {
					continue
				}
				_, op, _ = strings.Cut(op, ": ")
				kind, args, _ := strings.Cut(op, " ")
				ops[kind]++
				if kind == "add-learner" {
					var node uint64
					if _, err := fmt.Sscanf(args, "on n%d", &node); err == nil && old[node] {
						learnersOnOld++
					}
				}
			}
		}
		f.Close()
	}
	return ops, learnersOnOld, leaders
}

// serverNotBalanced summarizes why the placement leader does not call the
// cluster balanced: its spreads, running operations and stuck replicas.
func serverNotBalanced(ps *shalev1.PlacementStatusResponse) string {
	s := fmt.Sprintf("replica spread %d, leader spread %d, bytes spread %.1f%%", ps.GetReplicaSpread(), ps.GetLeaderSpread(), ps.GetBytesSpreadPercent())
	var run []string
	for _, op := range ps.GetRunning() {
		run = append(run, fmt.Sprintf("%s shard %d node %d<-%d (%s)", op.GetKind(), op.GetShardId(), op.GetNodeId(), op.GetFromNodeId(), op.GetReason()))
	}
	if len(run) > 0 {
		s += fmt.Sprintf("; %d running: %s", len(run), strings.Join(run, "; "))
	}
	var stuck []string
	for _, st := range ps.GetStuck() {
		stuck = append(stuck, fmt.Sprintf("shard %d on node %d: %s", st.GetShardId(), st.GetNodeId(), st.GetReason()))
	}
	if len(stuck) > 0 {
		s += fmt.Sprintf("; %d stuck: %s", len(stuck), strings.Join(stuck, "; "))
	}
	if len(run) == 0 && len(stuck) == 0 {
		s += "; operations left to schedule"
	}
	return s
}

// clusterStatus is ClusterStatus with a 10 s timeout.
func clusterStatus(ctx context.Context, cli *shaleclient.Client) (*shalev1.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cli.ClusterStatus(ctx)
}

// waitJoined waits until the cluster lists a live node at each address.
func waitJoined(ctx context.Context, cli *shaleclient.Client, nodes *ShaleNodes, addrs []string) error {
	var last error
	for {
		if err := nodes.checkRunning(); err != nil {
			return err
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ns, err := cli.ListNodes(lctx)
		cancel()
		if err == nil {
			live := map[string]bool{}
			for _, n := range ns {
				if n.GetLive() && !n.GetNode().GetRemoved() {
					live[n.GetNode().GetAddress()] = true
				}
			}
			missing := 0
			for _, a := range addrs {
				if !live[a] {
					missing++
				}
			}
			if missing == 0 {
				return nil
			}
			last = fmt.Errorf("%d of %d joining nodes not listed live yet", missing, len(addrs))
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// placementView is the placement as one ClusterStatus shows it.
type placementView struct {
	shards    []*shalev1.ShardStatus
	ids       []uint64 // the nodes not removed, ascending
	addrs     map[uint64]string
	replicas  map[uint64]int
	leaders   map[uint64]int
	bytes     map[uint64]uint64
	nonVoters int // learners and joint-configuration replicas
	noLeader  int // shards without a known leader
	badRF     int // shards whose replica count is not the replication factor
}

func viewOf(st *shalev1.ClusterStatusResponse, rf int) *placementView {
	v := &placementView{shards: st.GetShards(), addrs: map[uint64]string{}, replicas: map[uint64]int{}, leaders: map[uint64]int{}, bytes: map[uint64]uint64{}}
	for _, n := range st.GetNodes() {
		if n.GetNode().GetRemoved() {
			continue
		}
		id := n.GetNode().GetNodeId()
		v.ids = append(v.ids, id)
		v.addrs[id] = n.GetNode().GetAddress()
	}
	slices.Sort(v.ids)
	for _, s := range v.shards {
		reps := s.GetDescriptor_().GetReplicas()
		if len(reps) != rf {
			v.badRF++
		}
		for _, rd := range reps {
			v.replicas[rd.GetNodeId()]++
			v.bytes[rd.GetNodeId()] += s.GetSizeBytes()
			if rd.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED {
				v.nonVoters++
			}
		}
		if l := s.GetLeaderNodeId(); l != 0 {
			v.leaders[l]++
		} else {
			v.noLeader++
		}
	}
	return v
}

// spreads are max - min of the replica and leader counts over the nodes,
// and (max - min) / max of their shard bytes, in percent.
func (v *placementView) spreads() (replicas, leaders int, bytesPct float64) {
	if len(v.ids) == 0 {
		return 0, 0, 0
	}
	minR, maxR, minL, maxL := math.MaxInt, 0, math.MaxInt, 0
	var minB, maxB uint64 = math.MaxUint64, 0
	for _, id := range v.ids {
		minR, maxR = min(minR, v.replicas[id]), max(maxR, v.replicas[id])
		minL, maxL = min(minL, v.leaders[id]), max(maxL, v.leaders[id])
		minB, maxB = min(minB, v.bytes[id]), max(maxB, v.bytes[id])
	}
	if maxB > 0 {
		bytesPct = 100 * float64(maxB-minB) / float64(maxB)
	}
	return maxR - minR, maxL - minL, bytesPct
}

// balanced: every shard has a leader and exactly the replication factor
// of replicas, all voters; replica counts per node differ by at most one
// (or shard bytes by at most 20%); leader counts by at most one.
func (v *placementView) balanced() bool {
	if v.nonVoters > 0 || v.noLeader > 0 || v.badRF > 0 || len(v.shards) == 0 {
		return false
	}
	r, l, b := v.spreads()
	return (r <= 1 || b <= 20) && l <= 1
}

// shown is String without the byte spread (which moves with every size
// report), to log only changes.
func (v *placementView) shown() string {
	return fmt.Sprintf("%s %d %d %d", v.key(), v.nonVoters, v.noLeader, v.badRF)
}

// key identifies the layout's per-node counts (a balanced streak must keep
// them).
func (v *placementView) key() string {
	var sb strings.Builder
	for _, id := range v.ids {
		fmt.Fprintf(&sb, "%d:%d/%d ", id, v.replicas[id], v.leaders[id])
	}
	return sb.String()
}

// String shows the per-node counts, e.g. "replicas 1:11 2:10 ...; leaders
// 1:4 ...; 2 learners".
func (v *placementView) String() string {
	if v == nil {
		return "no cluster status"
	}
	var reps, leads []string
	for _, id := range v.ids {
		reps = append(reps, fmt.Sprintf("%d:%d", id, v.replicas[id]))
		leads = append(leads, fmt.Sprintf("%d:%d", id, v.leaders[id]))
	}
	r, l, b := v.spreads()
	s := fmt.Sprintf("replicas %s (spread %d, bytes %.0f%%); leaders %s (spread %d); %d shards", strings.Join(reps, " "), r, b, strings.Join(leads, " "), l, len(v.shards))
	if v.nonVoters > 0 {
		s += fmt.Sprintf("; %d learners/joint", v.nonVoters)
	}
	if v.noLeader > 0 {
		s += fmt.Sprintf("; %d without a leader", v.noLeader)
	}
	if v.badRF > 0 {
		s += fmt.Sprintf("; %d not at the replication factor", v.badRF)
	}
	if v.balanced() {
		s += "; balanced"
	}
	return s
}

// loadPlacementData writes cfg.DataBytes / cfg.ValueSize random values under
// AppendKey(0), AppendKey(1), ... with cfg.Writers writers.
func loadPlacementData(ctx context.Context, cfg *PlacementConfig, nodes *ShaleNodes) error {
	count := cfg.DataBytes / int64(cfg.ValueSize)
	if count <= 0 {
		return nil
	}
	nclients := max(1, cfg.Writers/8)
	clients := make([]*shaleclient.Client, 0, nclients)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range nclients {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err := nodes.NewClient(cctx, cfg.Log)
		cancel()
		if err != nil {
			return err
		}
		clients = append(clients, c)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next, done atomic.Int64
		errOnce    sync.Once
		firstErr   error
		wg         sync.WaitGroup
	)
	for w := range cfg.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := clients[w%len(clients)]
			var seed [32]byte
			for i := range 4 {
				v := mix64(cfg.Seed*1000003 + uint64(w)*4 + uint64(i))
				for b := range 8 {
					seed[i*8+b] = byte(v >> (8 * b))
				}
			}
			rnd := rand.NewChaCha8(seed)
			val := make([]byte, cfg.ValueSize)
			key := make([]byte, 0, KeySize)
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= count {
					return
				}
				_, _ = rnd.Read(val)
				key = AppendKey(key[:0], uint64(i))
				var err error
				for attempt := 1; attempt <= 3; attempt++ {
					pctx, pcancel := context.WithTimeout(ctx, time.Minute)
					_, err = cli.Put(pctx, key, val)
					pcancel()
					if err == nil || ctx.Err() != nil {
						break
					}
				}
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("put %s: %w", key, err); cancel() })
					return
				}
				done.Add(1)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	t := time.Now()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-finished:
			if firstErr != nil {
				return firstErr
			}
			return ctx.Err()
		case <-tick.C:
			d := done.Load() * int64(cfg.ValueSize)
			cfg.logf("placement: load: %d of %d MiB (%.1f MB/s)", d>>20, cfg.DataBytes>>20, float64(d)/1e6/time.Since(t).Seconds())
			if err := nodes.checkRunning(); err != nil {
				cancel()
				<-finished
				return err
			}
		}
	}
}

// DiskWriteSpeed writes size bytes of random data to a new file at path in
// 1 MiB writes, fsyncs it, removes it, and returns the rate in MB/s
// (10^6 bytes per second), fsync included.
func DiskWriteSpeed(path string, size int64, seed uint64) (float64, error) {
	buf := make([]byte, 1<<20)
	var s [32]byte
	for i := range 8 {
		s[i] = byte(mix64(seed+7) >> (8 * i))
	}
	rnd := rand.NewChaCha8(s)
	_, _ = rnd.Read(buf)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	defer os.Remove(path)
	t := time.Now()
	for n := int64(0); n < size; {
		chunk := buf[:min(int64(len(buf)), size-n)]
		// Vary the data so that nothing below can deduplicate it.
		chunk[0], chunk[1] = byte(n>>20), byte(n>>28)
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			return 0, err
		}
		n += int64(len(chunk))
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, err
	}
	d := time.Since(t)
	if err := f.Close(); err != nil {
		return 0, err
	}
	return float64(size) / 1e6 / d.Seconds(), nil
}

// DirDiskBytes is the disk space used by the files under dir (allocated
// blocks, as du counts them; the apparent size where unknown).
func DirDiskBytes(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		total += allocatedBytes(info)
		return nil
	})
	return total
}

// MemAvailable is the kernel's estimate of the memory available to new
// work (MemAvailable in /proc/meminfo), -1 if unknown.
func MemAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			if fs := strings.Fields(rest); len(fs) >= 1 {
				kb, err := strconv.ParseInt(fs[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return -1
}

// MemoryGuard returns a context that is cancelled when the machine's
// available memory falls below minAvail (checked every 500 ms), so that a
// benchmark too big for the machine stops its servers instead of waking
// the OOM killer, and a function reporting why it was cancelled ("" if it
// was not, or not for lack of memory).
func MemoryGuard(ctx context.Context, minAvail int64) (context.Context, context.CancelFunc, func() string) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu     sync.Mutex
		reason string
	)
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if a := MemAvailable(); a >= 0 && a < minAvail {
					mu.Lock()
					reason = fmt.Sprintf("available memory fell to %d MiB (below the guard's %d MiB)", a>>20, minAvail>>20)
					mu.Unlock()
					cancel()
					return
				}
			}
		}
	}()
	return ctx, cancel, func() string {
		mu.Lock()
		defer mu.Unlock()
		return reason
	}
}

// WritePlacementJSONLine writes the result as one JSON object and a newline.
func WritePlacementJSONLine(w io.Writer, r PlacementResult) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WritePlacementReport writes the result as a short report and a table of
// the nodes.
func WritePlacementReport(w io.Writer, r PlacementResult) {
	mb := func(b int64) float64 { return float64(b) / 1e6 }
	if r.DiskWriteBytes > 0 {
		fmt.Fprintf(w, "disk:      sequential write of %d MiB (1 MiB writes + fsync): %.1f MB/s\n", r.DiskWriteBytes>>20, r.DiskWriteMBps)
	}
	if r.LoadSeconds > 0 {
		splits := "no splits"
		if n := r.ShardsAfterLoad - (max(r.UserShards, 1) + 1); n > 0 {
			splits = fmt.Sprintf("%d splits", n)
		}
		fmt.Fprintf(w, "load:      %d MiB of %d-byte random values, %d writers: %.1f s (%.1f MB/s); %d shards after (%s), %.0f MB by shard size\n",
			r.DataBytes>>20, r.ValueSize, r.Writers, r.LoadSeconds, r.LoadMBps, r.ShardsAfterLoad, splits, mb(int64(r.StoredBytes)))
	}
	if r.JoinSeconds > 0 {
		fmt.Fprintf(w, "join:      %d nodes listed live %.1f s after their start\n", r.Joined, r.JoinSeconds)
	}
	if len(r.Nodes) > 0 {
		if r.Converged {
			fmt.Fprintf(w, "rebalance: balanced %.1f s after the join\n", r.RebalanceSeconds)
		} else {
			fmt.Fprintf(w, "rebalance: NOT balanced after %.1f s (timeout)\n", r.RebalanceSeconds)
		}
		fmt.Fprintf(w, "moved:     %d replicas, %.0f MB by shard size (%.1f MB/s); new nodes' data on disk %.0f MB\n",
			r.MovedReplicas, mb(int64(r.MovedShardBytes)), r.MovedShardMBps, mb(r.NewNodesDiskBytes))
		if r.DiskWriteMBps > 0 {
			fmt.Fprintf(w, "           => %.1f MB/s moved (on-disk bytes of the new nodes / rebalance time) = %.1f%% of the disk's %.1f MB/s sequential write\n",
				r.MovedMBps, 100*r.MovedOverDisk, r.DiskWriteMBps)
		} else {
			fmt.Fprintf(w, "           => %.1f MB/s moved (on-disk bytes of the new nodes / rebalance time)\n", r.MovedMBps)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "node\t\treplicas\tleaders\tshard MB\tdisk MB before\tdisk MB after\t\n")
		for _, n := range r.Nodes {
			j := ""
			if n.Joined {
				j = "joined"
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t\n", n.NodeID, j, n.Replicas, n.Leaders, mb(int64(n.ShardBytes)), mb(n.DiskBytesBefore), mb(n.DiskBytes))
		}
		tw.Flush()
		fmt.Fprintf(w, "spreads:   replicas %d, leaders %d, shard bytes %.1f%%; %d learners/joint replicas left\n", r.ReplicaSpread, r.LeaderSpread, r.BytesSpreadPercent, r.NonVoters)
		if b, d := r.ForegroundBefore, r.ForegroundDuring; b != nil && d != nil {
			fmt.Fprintf(w, "foreground: %d puts/s; before the join (%.0f s): p50 %.1f ms, p99 %.1f ms, %d failed; during the rebalance: p50 %.1f ms, p99 %.1f ms, %d failed; p99 during/before %.2fx\n",
				r.ForegroundRate, b.Seconds, b.P50ms, b.P99ms, b.Failed, d.P50ms, d.P99ms, d.Failed, r.ForegroundP99Ratio)
		}
		if r.ServerBalancedSeconds >= 0 {
			fmt.Fprintf(w, "server:    the placement leader called the cluster balanced %.1f s after the join\n", r.ServerBalancedSeconds)
		} else if r.Converged {
			fmt.Fprintf(w, "server:    the placement leader did not call the cluster balanced within a minute (last: %s)\n", r.ServerNotBalanced)
		}
		if r.ServerBalanced != nil {
			fmt.Fprintf(w, "           at the end: balanced=%v, replica spread %d, leader spread %d, bytes spread %.1f%%\n",
				*r.ServerBalanced, r.ServerReplicaSpread, r.ServerLeaderSpread, r.ServerBytesSpreadPercent)
		}
		if len(r.Operations) > 0 {
			var ks []string
			for k := range r.Operations {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			var parts []string
			for _, k := range ks {
				parts = append(parts, fmt.Sprintf("%s %d", k, r.Operations[k]))
			}
			fmt.Fprintf(w, "ops:       from the join to balanced (nodes' logs): %s; %d add-learner onto original nodes (moves back); %d placement leader changes\n",
				strings.Join(parts, ", "), r.LearnersOnOldNodes, r.PlacementLeaders)
		}
	}
	if r.Err != nil {
		fmt.Fprintf(w, "ERROR: %v\n", r.Err)
	} else if r.Error != "" {
		fmt.Fprintf(w, "ERROR: %s\n", r.Error)
	}
}

// errMemoryGuard marks a case stopped by MemoryGuard.
var errMemoryGuard = errors.New("stopped by the memory guard")

// IdleWithGuard runs RunIdle under MemoryGuard(minAvail) and returns its
// results; a case the guard stopped comes back as a result with Err set
// (RunIdle itself drops cases cut short by a cancelled context).
func IdleWithGuard(ctx context.Context, cfg IdleConfig, minAvail int64, emit func(IdleResult)) []IdleResult {
	gctx, cancel, why := MemoryGuard(ctx, minAvail)
	defer cancel()
	results := RunIdle(gctx, cfg, emit)
	if reason := why(); reason != "" && ctx.Err() == nil {
		done := map[int]bool{}
		for _, r := range results {
			done[r.Shards] = true
		}
		for _, n := range cfg.Shards {
			if done[n] {
				continue
			}
			err := fmt.Errorf("%w: %s (the servers were stopped; %d shards x %d nodes do not fit this machine's memory with these settings)", errMemoryGuard, reason, n, max(cfg.Members, 3))
			r := IdleResult{Shards: n, Nodes: max(cfg.Members, 3), ServerArgs: strings.Join(currentShaleOptions().ExtraArgs, " "), Err: err, Error: err.Error()}
			emit(r)
			results = append(results, r)
			if !cfg.Keep {
				_ = os.RemoveAll(filepath.Join(cfg.Dir, fmt.Sprintf("idle-%d", n)))
			}
			break
		}
	}
	return results
}
