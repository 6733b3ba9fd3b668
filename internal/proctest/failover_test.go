//go:build unix

package proctest

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Failover test parameters.
const (
	// tickInterval is the servers' Raft tick. With the default 10 election
	// ticks, a follower campaigns after 0.5–1 s without a leader (instead of
	// 1–2 s with the default 100ms tick), which keeps the test short.
	tickInterval = 50 * time.Millisecond
	// writersN concurrent clients write unique keys to one shard.
	writersN = 8
	// maxUnavailable bounds the measured unavailability window: generous,
	// because an election takes about 1 s here but CI machines are slow.
	maxUnavailable = 15 * time.Second
	// writePrefix is where the writers write: the shard [m, max).
	writePrefix = "p/"
	splitKeys   = "m"
)

// procCluster is a cluster of shale-server processes on loopback ports.
type procCluster struct {
	t     *testing.T
	bins  binaries
	nodes []*serverProc // node i+1 is nodes[i]

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// startProcCluster starts n founding nodes, each with its own data dir and
// log file under a temporary directory, with extra flags appended.
func startProcCluster(t *testing.T, bins binaries, n int, splits string, extra ...string) *procCluster {
	t.Helper()
	dir := t.TempDir()
	ports := freePorts(t, n)
	var ic []string
	for i, p := range ports {
		ic = append(ic, fmt.Sprintf("%d=127.0.0.1:%d", i+1, p))
	}
	c := &procCluster{t: t, bins: bins, conns: map[string]*grpc.ClientConn{}}
	t.Cleanup(c.closeConns)
	var logs []string
	for i, p := range ports {
		id := uint64(i + 1)
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		logPath := filepath.Join(dir, fmt.Sprintf("node%d.log", id))
		logs = append(logs, logPath)
		args := []string{
			"--node-id", strconv.FormatUint(id, 10),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("node%d", id)),
			"--listen", addr,
			"--initial-cluster", strings.Join(ic, ","),
			"--initial-splits", splits,
			"--tick-interval", tickInterval.String(),
		}
		args = append(args, extra...)
		c.nodes = append(c.nodes, startServer(t, bins.server, id, addr, logPath, args))
	}
	dumpLogsOnFailure(t, logs...)
	return c
}

func (c *procCluster) node(id uint64) *serverProc { return c.nodes[id-1] }

func (c *procCluster) endpoints() []string {
	var eps []string
	for _, p := range c.nodes {
		eps = append(eps, p.addr)
	}
	return eps
}

// conn is a raw gRPC connection to one node (for requests that must reach
// that node and no other).
func (c *procCluster) conn(addr string) *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatalf("dial %s: %v", addr, err)
	}
	c.conns[addr] = cc
	return cc
}

func (c *procCluster) closeConns() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		cc.Close()
	}
}

// shardOn is the status of a shard as the given node's own replica reports
// it (Admin.NodeInfo sent to that node), or nil if it has none.
func (c *procCluster) shardOn(ctx context.Context, id, shardID uint64) (*shalev1.ShardStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := shalev1.NewAdminClient(c.conn(c.node(id).addr)).NodeInfo(ctx, &shalev1.NodeInfoRequest{})
	if err != nil {
		return nil, err
	}
	for _, s := range resp.GetShards() {
		if s.GetDescriptor_().GetShardId() == shardID {
			return s, nil
		}
	}
	return nil, nil
}

// waitReady waits until ClusterStatus shows n live nodes and a leader for
// every shard.
func waitReady(ctx context.Context, t *testing.T, cli *client.Client, n int) {
	t.Helper()
	var last string
	for {
		st, err := cli.ClusterStatus(ctx)
		if err == nil {
			live := 0
			for _, ns := range st.GetNodes() {
				if ns.GetLive() && !ns.GetRemoved() {
					live++
				}
			}
			led := 0
			for _, s := range st.GetShards() {
				if s.GetLeaderNodeId() != 0 {
					led++
				}
			}
			if live >= n && len(st.GetShards()) > 0 && led == len(st.GetShards()) {
				return
			}
			last = fmt.Sprintf("%d of %d nodes live, %d of %d shards with a leader", live, n, led, len(st.GetShards()))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("cluster not ready: %s", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// shardOf returns the ID of the shard holding key (from ListShards).
func shardOf(ctx context.Context, t *testing.T, cli *client.Client, key []byte) uint64 {
	t.Helper()
	shards, err := cli.ListShards(ctx)
	if err != nil {
		t.Fatalf("list shards: %v", err)
	}
	for _, s := range shards {
		d := s.GetDescriptor_()
		if d.GetSystem() {
			continue
		}
		if bytes.Compare(key, d.GetStartKey()) >= 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(key, d.GetEndKey()) < 0) {
			return d.GetShardId()
		}
	}
	t.Fatalf("no shard holds %q", key)
	return 0
}

// ack is one acknowledged write: when its Put was called and returned.
type ack struct {
	key        string
	start, end time.Time
}

// writers are concurrent clients writing unique keys until stopped.
type writers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	acks     []ack
	failures int
	lastErr  error
}

func valueOf(key string) []byte { return []byte("value-of/" + key) }

func startWriters(ctx context.Context, cli *client.Client, n int, prefix string) *writers {
	ctx, cancel := context.WithCancel(ctx)
	w := &writers{cancel: cancel}
	for i := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for seq := 0; ctx.Err() == nil; seq++ {
				key := fmt.Sprintf("%sw%02d/%08d", prefix, i, seq)
				start := time.Now()
				// Long enough to ride out an election: the client retries
				// within it.
				pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := cli.Put(pctx, []byte(key), valueOf(key))
				pcancel()
				end := time.Now()
				w.mu.Lock()
				if err == nil {
					w.acks = append(w.acks, ack{key: key, start: start, end: end})
				} else if ctx.Err() == nil {
					// Not acknowledged: it may or may not have applied, so
					// it is not checked.
					w.failures++
					w.lastErr = err
				}
				w.mu.Unlock()
			}
		}()
	}
	return w
}

func (w *writers) stop() {
	w.cancel()
	w.wg.Wait()
}

func (w *writers) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acks)
}

// firstAckIssuedAfter is the earliest acknowledgement of a Put called at
// or after t0.
func (w *writers) firstAckIssuedAfter(t0 time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for _, a := range w.acks {
		if !a.start.Before(t0) && (first.IsZero() || a.end.Before(first)) {
			first = a.end
		}
	}
	return first, !first.IsZero()
}

// snapshot returns the acknowledgements so far, by acknowledgement time.
func (w *writers) snapshot() []ack {
	w.mu.Lock()
	acks := slices.Clone(w.acks)
	w.mu.Unlock()
	slices.SortFunc(acks, func(a, b ack) int { return a.end.Compare(b.end) })
	return acks
}

// TestKillLeaderFailover: 3 server processes, 8 concurrent writers on one
// shard, SIGKILL of that shard's leader; writes resume after the election
// (the unavailability window is logged and bounded); the killed node
// restarts from its data, catches up to the leader's applied index, and
// then serves every acknowledged write from its own replica (stale reads
// sent to it alone), while linearizable reads through the client see them
// all too.
func TestKillLeaderFailover(t *testing.T) {
	bins := requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()

	c := startProcCluster(t, bins, 3, splitKeys)
	cli, err := client.New(ctx, c.endpoints(),
		client.WithLogger(testLogger()),
		client.WithBackoff(5*time.Millisecond, 100*time.Millisecond),
		client.WithAttemptTimeout(2*time.Second))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	waitReady(ctx, t, cli, 3)
	t.Logf("cluster of 3 processes ready after %v", time.Since(begin).Round(time.Millisecond))

	shardID := shardOf(ctx, t, cli, []byte(writePrefix))
	w := startWriters(ctx, cli, writersN, writePrefix)
	defer w.stop()

	// Let the writers get going, then find the shard's leader as the
	// leader itself reports it.
	time.Sleep(1500 * time.Millisecond)
	if w.count() == 0 {
		w.mu.Lock()
		failures, lastErr := w.failures, w.lastErr
		w.mu.Unlock()
		t.Fatalf("no write acknowledged in 1.5s (failures: %d, last: %v)", failures, lastErr)
	}
	var leader uint64
	for leader == 0 {
		shards, err := cli.ListShards(ctx)
		if err != nil {
			t.Fatalf("list shards: %v", err)
		}
		for _, s := range shards {
			if s.GetDescriptor_().GetShardId() != shardID {
				continue
			}
			if l := s.GetLeaderNodeId(); l != 0 {
				if st, err := c.shardOn(ctx, l, shardID); err == nil && st.GetLeaderNodeId() == l {
					leader = l
				}
			}
		}
		if leader == 0 {
			if ctx.Err() != nil {
				t.Fatal("no leader found for the written shard")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	before := w.count()

	// Kill it.
	victim := c.node(leader)
	killAt := time.Now()
	victim.kill()
	t.Logf("SIGKILLed node %d, leader of shard %d, after %d acknowledged writes", leader, shardID, before)

	// Writes must resume on a new leader.
	var resumed time.Time
	for {
		if at, ok := w.firstAckIssuedAfter(killAt); ok {
			resumed = at
			break
		}
		if time.Since(killAt) > maxUnavailable+5*time.Second {
			w.mu.Lock()
			failures, lastErr := w.failures, w.lastErr
			w.mu.Unlock()
			t.Fatalf("no write acknowledged within %v of the kill (failures: %d, last: %v)", time.Since(killAt).Round(time.Millisecond), failures, lastErr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	window := resumed.Sub(killAt)

	// Keep writing on the surviving majority, then restart the killed node
	// from its data and keep writing while it catches up.
	time.Sleep(2 * time.Second)
	victim.start(t, bins.server)
	restartAt := time.Now()
	time.Sleep(2 * time.Second)
	w.stop()
	if !victim.running() {
		t.Fatalf("restarted node %d exited: %v", leader, victim.err)
	}

	acks := w.snapshot()
	gap, gapEnd := time.Duration(0), time.Time{}
	for i := 1; i < len(acks); i++ {
		if d := acks[i].end.Sub(acks[i-1].end); d > gap {
			gap, gapEnd = d, acks[i].end
		}
	}
	w.mu.Lock()
	failures, lastErr := w.failures, w.lastErr
	w.mu.Unlock()
	t.Logf("unavailability window: %v (from the SIGKILL to the first acknowledged write issued after it); "+
		"longest gap between acknowledgements: %v (ending %v after the kill)",
		window.Round(time.Millisecond), gap.Round(time.Millisecond), gapEnd.Sub(killAt).Round(time.Millisecond))
	t.Logf("%d writes acknowledged (%d before the kill), %d failed (last: %v)", len(acks), before, failures, lastErr)
	if window > maxUnavailable {
		t.Errorf("unavailability window %v exceeds %v", window, maxUnavailable)
	}
	if len(acks) == before {
		t.Fatal("no write acknowledged after the kill")
	}

	// Catch-up: the restarted replica's applied index reaches the
	// leader's (no writes are in flight any more).
	var caughtUp bool
	var last string
	for !caughtUp {
		ls, err := cli.ListShards(ctx)
		if err != nil {
			t.Fatalf("list shards: %v", err)
		}
		var cur uint64
		for _, s := range ls {
			if s.GetDescriptor_().GetShardId() == shardID {
				cur = s.GetLeaderNodeId()
			}
		}
		if cur != 0 {
			ld, lerr := c.shardOn(ctx, cur, shardID)
			rs, rerr := c.shardOn(ctx, leader, shardID)
			switch {
			case lerr != nil || rerr != nil:
				last = fmt.Sprintf("node info: leader: %v, restarted: %v", lerr, rerr)
			case ld == nil || ld.GetLeaderNodeId() != cur:
				last = fmt.Sprintf("node %d no longer leads shard %d", cur, shardID)
			case rs == nil:
				last = fmt.Sprintf("restarted node %d has no replica of shard %d yet", leader, shardID)
			case rs.GetAppliedIndex() >= ld.GetAppliedIndex() && ld.GetAppliedIndex() > 0:
				t.Logf("restarted node %d caught up: applied index %d, leader node %d's %d (seen %v after the restart; writes ran for the first 2s of it)",
					leader, rs.GetAppliedIndex(), cur, ld.GetAppliedIndex(), time.Since(restartAt).Round(time.Millisecond))
				caughtUp = true
				continue
			default:
				last = fmt.Sprintf("restarted node %d applied %d, leader node %d applied %d", leader, rs.GetAppliedIndex(), cur, ld.GetAppliedIndex())
			}
		}
		if ctx.Err() != nil || time.Since(restartAt) > 45*time.Second {
			t.Fatalf("restarted node did not catch up: %s", last)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Every acknowledged write is there: linearizable reads through the
	// client, and stale reads served by the restarted node's own replica.
	keys := make([][]byte, len(acks))
	for i, a := range acks {
		keys[i] = []byte(a.key)
	}
	kv := shalev1.NewKVClient(c.conn(victim.addr))
	missing := 0
	for lo := 0; lo < len(keys); lo += 500 {
		chunk := keys[lo:min(lo+500, len(keys))]
		got, err := cli.MultiGet(ctx, chunk)
		if err != nil {
			t.Fatalf("linearizable multi-get: %v", err)
		}
		for i, g := range got {
			if g == nil || !bytes.Equal(g.Value, valueOf(string(chunk[i]))) {
				missing++
				if missing <= 5 {
					t.Errorf("linearizable read of acknowledged key %s: %v", chunk[i], g)
				}
			}
		}
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := kv.MultiGet(rctx, &shalev1.MultiGetRequest{
			Header: &shalev1.RequestHeader{Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_STALE},
			Keys:   chunk,
		})
		rcancel()
		if err != nil {
			t.Fatalf("stale multi-get on restarted node %d: %v", leader, err)
		}
		if h := resp.GetHeader(); h.GetNodeId() != leader || h.GetShardId() != shardID {
			t.Fatalf("stale read answered by node %d shard %d, want node %d shard %d", h.GetNodeId(), h.GetShardId(), leader, shardID)
		}
		for i, r := range resp.GetResults() {
			if !bytes.Equal(r.GetKv().GetValue(), valueOf(string(chunk[i]))) {
				missing++
				if missing <= 5 {
					t.Errorf("stale read on restarted node %d of acknowledged key %s: %v", leader, chunk[i], r.GetKv())
				}
			}
		}
	}
	// Single-key linearizable Gets of the writes around the failover.
	for _, a := range acks {
		if a.end.Before(killAt.Add(-500*time.Millisecond)) || a.end.After(resumed.Add(500*time.Millisecond)) {
			continue
		}
		got, err := cli.Get(ctx, []byte(a.key))
		if err != nil || !bytes.Equal(got.Value, valueOf(a.key)) {
			t.Errorf("get %s (acknowledged %v after the kill): %v, %v", a.key, a.end.Sub(killAt).Round(time.Millisecond), got, err)
		}
	}
	if missing > 0 {
		t.Fatalf("%d reads of acknowledged writes failed", missing)
	}
	t.Logf("all %d acknowledged writes read back (linearizable via the client, stale from restarted node %d)", len(keys), leader)

	// Every node stops cleanly on SIGTERM.
	for _, p := range c.nodes {
		if err := p.stop(20 * time.Second); err != nil {
			t.Error(err)
		}
	}
	t.Logf("test took %v", time.Since(begin).Round(time.Millisecond))
}
