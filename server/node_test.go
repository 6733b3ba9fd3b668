package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
	"github.com/shale-db/shale/server/shard"
)

func TestRestartAllNodesKeepsData(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("k10")}})
	cl := newClient(t, c)
	ctx := context.Background()
	for i := 0; i < 40; i++ {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("k%02d", i)), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	c.StopAll()
	for id := uint64(1); id <= 3; id++ {
		c.Restart(id)
	}
	c.WaitLeaders(30e9)
	cl2 := newClient(t, c)
	for i := 0; i < 40; i++ {
		kv, err := cl2.Get(ctx, []byte(fmt.Sprintf("k%02d", i)))
		if err != nil || string(kv.Value) != fmt.Sprint(i) {
			t.Fatalf("k%02d after restart: %v %v", i, kv, err)
		}
	}
	if _, err := cl2.Put(ctx, []byte("after"), []byte("restart")); err != nil {
		t.Fatal(err)
	}
}

// TestRestartFindsEngineSetAsideByRestore: a node stopped while a
// snapshot's install had set a shard's engine aside (shards/<id> renamed to
// <id>.restore-old) and not yet moved the checkpoint in hosts the shard again
// at its restart, from the engine set aside, with all it had applied.
func TestRestartFindsEngineSetAsideByRestore(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx := context.Background()
	if _, err := cl.Put(ctx, []byte("kept"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	id := c.ShardIDs()[1] // the user shard
	node := c.Leader(id)%3 + 1
	var applied uint64
	waitFor(t, 10*time.Second, func() (bool, string) {
		applied = c.Node(node).Shard(id).AppliedState().Index
		l := c.LeaderShard(id)
		return l != nil && applied >= l.AppliedState().Index, "the follower has not applied the put"
	})
	c.Stop(node)
	dir := shard.Dir(filepath.Join(c.Dir(), fmt.Sprintf("node%d", node), "shards"), id)
	if err := os.Rename(dir, dir+".restore-old"); err != nil {
		t.Fatal(err)
	}
	c.Restart(node)
	if _, err := os.Stat(dir + ".restore-old"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the engine set aside is still there after the restart (%v): the node did not open it", err)
	}
	s := c.Node(node).Shard(id)
	if s == nil {
		t.Fatalf("node %d does not host shard %d after its restart", node, id)
	}
	if got := s.AppliedState().Index; got < applied {
		t.Fatalf("shard %d on node %d applied to %d after the restart, had %d", id, node, got, applied)
	}
	kv, _, err := s.Get([]byte("kept"), time.Now().UnixNano())
	if err != nil || kv == nil || string(kv.GetValue()) != "v" {
		t.Fatalf("kept on node %d after the restart: %v, %v", node, kv, err)
	}
}

// TestShardEnginesHoldOneFile: a shard engine keeps only its WAL open (no
// LOCK, no MANIFEST), so a node's descriptors grow by one per shard; the
// node's raft log engine holds the data directory's LOCK.
func TestShardEnginesHoldOneFile(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	var splits [][]byte
	for i := 1; i <= 20; i++ {
		splits = append(splits, []byte(fmt.Sprintf("k%02d", i)))
	}
	c := testcluster.Start(t, testcluster.Options{Splits: splits})
	cl := newClient(t, c)
	for i := 0; i < 200; i++ {
		if _, err := cl.Put(context.Background(), []byte(fmt.Sprintf("k%03d", i%25)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	engines := 3 * (len(splits) + 2) // user shards and the system shard, on each node
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(target, c.Dir()+string(filepath.Separator)) {
			continue
		}
		name := filepath.Base(target)
		switch {
		case strings.Contains(target, string(filepath.Separator)+"raftlog"+string(filepath.Separator)):
			if name == "LOCK" {
				kinds["raftlog LOCK"]++
			} else {
				kinds["raftlog other"]++
			}
		case strings.HasSuffix(name, ".log"):
			kinds["shard WAL"]++
		case strings.HasSuffix(name, ".sst"):
			kinds["shard SST"]++ // the shared table cache's
		default:
			kinds["shard "+name]++
		}
	}
	t.Logf("open files under the cluster directory: %v", kinds)
	for k, n := range kinds {
		switch {
		case k == "shard WAL":
			if n > engines {
				t.Errorf("%d shard WALs open for %d shard engines", n, engines)
			}
		case k == "shard SST" || strings.HasPrefix(k, "raftlog"):
		default:
			t.Errorf("shard engines hold %d × %q open; want only their WALs", n, k)
		}
	}
	if kinds["shard WAL"] < engines {
		t.Errorf("%d shard WALs open for %d shard engines: the count does not see them", kinds["shard WAL"], engines)
	}
	if kinds["raftlog LOCK"] != 3 {
		t.Errorf("%d raft log LOCKs held by 3 nodes", kinds["raftlog LOCK"])
	}
}

func TestMetricsHealthAndPprof(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) { cfg.HTTPAddr = "127.0.0.1:0" }})
	cl := newClient(t, c)
	ctx := context.Background()
	// Written twice: the second write's apply finds the first's record
	// in the record cache.
	for _, v := range []string{"1", "2"} {
		if _, err := cl.Put(ctx, []byte("m"), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	lead := c.Node(c.Leader(2))
	get := func(path string) string {
		resp, err := http.Get("http://" + lead.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		return string(b)
	}
	metrics := get("/metrics")
	for _, name := range []string{
		"shale_raft_proposals_total", "shale_raft_commit_latency_seconds", "shale_raft_leader_changes_total",
		"shale_raft_snapshots_sent_total", "shale_raft_log_sync_seconds", "shale_storage_level_bytes",
		"shale_storage_compactions_total", "shale_storage_compaction_read_bytes_total",
		"shale_storage_compaction_written_bytes_total", "shale_storage_flush_written_bytes_total",
		"shale_shard_applied_index", "grpc_server_handled_total",
		"grpc_server_handling_seconds", "shale_record_cache_bytes", "shale_record_cache_misses_total",
	} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if hits := regexp.MustCompile(`(?m)^shale_record_cache_hits_total ([0-9.e+]+)$`).FindStringSubmatch(metrics); hits == nil || hits[1] == "0" {
		t.Errorf("shale_record_cache_hits_total after a key's second write: %v", hits)
	}
	if !strings.Contains(get("/debug/pprof/"), "goroutine") {
		t.Error("/debug/pprof/ index lacks profiles")
	}
	cc, err := grpc.NewClient(lead.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hr, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "shale.v1.KV"})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hr, err)
	}
}

// TestFoundByAdvertiseOrJoin: nodes configured as the pods of a
// StatefulSet are (one shared configuration, no --node-id): a node whose
// advertised address is in the initial cluster founds it under that
// address's ID, and a node whose address is not joins through --join.
func TestFoundByAdvertiseOrJoin(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		if len(cfg.InitialCluster) == 0 {
			return // a restart
		}
		cfg.NodeID = 0
		cfg.Join = cfg.InitialCluster[1]
	}})
	join := c.Endpoints()[0]
	for _, id := range []uint64{1, 2, 3} {
		if n := c.Node(id); n == nil || n.ID() != id {
			t.Fatalf("node listed as %d did not take ID %d: %v", id, id, n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	initial := map[uint64]string{}
	for i, a := range c.Endpoints() {
		initial[uint64(i+1)] = a
	}
	extra, err := server.Start(ctx, server.Config{
		DataDir:        filepath.Join(t.TempDir(), "pod-3"),
		ListenAddr:     "127.0.0.1:0",
		AdvertiseAddr:  "127.0.0.1:1", // not in the initial cluster
		InitialCluster: initial,
		Join:           join,
		TickInterval:   20 * time.Millisecond,
		Logger:         testcluster.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Stop()
	if extra.ID() != 4 || extra.ClusterID() != c.Node(1).ClusterID() {
		t.Fatalf("unlisted node: ID %d in cluster %q, want a joined node 4 of %q", extra.ID(), extra.ClusterID(), c.Node(1).ClusterID())
	}
	cl := newClient(t, c)
	if _, err := cl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func TestInitialClusterConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  server.Config
		want string
	}{
		{"unlisted and no join", server.Config{InitialCluster: map[uint64]string{1: "a:1", 2: "b:1"}, AdvertiseAddr: "c:1"},
			"--node-id is required with --initial-cluster unless the advertised address c:1 is one of its addresses"},
		{"id not listed", server.Config{NodeID: 3, InitialCluster: map[uint64]string{1: "a:1", 2: "b:1"}},
			"node 3 is not in the initial cluster"},
		{"shared address", server.Config{NodeID: 1, InitialCluster: map[uint64]string{1: "a:1", 2: "a:1"}},
			"the initial cluster gives nodes 1 and 2 the same address a:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir = t.TempDir()
			tc.cfg.Logger = testcluster.Logger()
			n, err := server.Start(context.Background(), tc.cfg)
			if err == nil {
				n.Stop()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q", err, tc.want)
			}
		})
	}
}

// TestFoundingNodeLostData: a founding node that ran, then starts again
// with an empty data directory (a lost volume), refuses to found the
// cluster again; once an operator removed it, it joins as a new node.
func TestFoundingNodeLostData(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	// Wait until the registry records that node 3 ran.
	deadline := time.Now().Add(20 * time.Second)
	for {
		nodes, err := cl.ListNodes(ctx)
		started := false
		for _, ns := range nodes {
			if ns.GetNode().GetNodeId() == 3 && ns.GetNode().GetStarted() {
				started = true
			}
		}
		if err == nil && started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 not recorded as started: %v %v", nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Stop(3)
	dir := filepath.Join(c.Dir(), "node3")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	initial := map[uint64]string{}
	for i, a := range c.Endpoints() {
		initial[uint64(i+1)] = a
	}
	cfg := server.Config{DataDir: dir, NodeID: 3, ListenAddr: initial[3], InitialCluster: initial,
		TickInterval: 20 * time.Millisecond, Logger: testcluster.Logger()}
	n, err := server.Start(ctx, cfg)
	if err == nil {
		n.Stop()
		t.Fatal("a founding node with lost data founded again")
	}
	if !strings.Contains(err.Error(), "already ran: its data was lost") {
		t.Fatalf("error %q does not say the data was lost", err)
	}
	if err := cl.RemoveNode(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// Removed, and without --join: it says what to do.
	if n, err := server.Start(ctx, cfg); err == nil {
		n.Stop()
		t.Fatal("a removed founding node started without --join")
	} else if !strings.Contains(err.Error(), "was removed") {
		t.Fatalf("error %q", err)
	}
	cfg.NodeID = 0
	cfg.AdvertiseAddr = initial[3]
	cfg.Join = initial[1]
	n, err = server.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	if n.ID() != 4 {
		t.Fatalf("the replaced node joined as %d, want the new ID 4", n.ID())
	}
	if kv, err := cl.Get(ctx, []byte("k")); err != nil || string(kv.Value) != "v" {
		t.Fatalf("get after the replacement: %v %v", kv, err)
	}
}

// TestRestartWithNewAddress restarts a node on another address. The
// registry takes the address its heartbeats report, the other nodes dial it
// there (a shard it leads commits writes, which needs its followers to
// reach it), and a client that knows only the other nodes finds it.
func TestRestartWithNewAddress(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t, c)
	if _, err := cl.Put(ctx, []byte("before"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	old := c.Endpoints()[2]
	c.Stop(3)
	addr := c.RestartAt(3)
	if addr == old {
		t.Fatalf("new address %s is the old one", addr)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		nodes, err := cl.ListNodes(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, ns := range nodes {
			if ns.GetNode().GetNodeId() == 3 {
				return ns.GetNode().GetAddress() == addr, fmt.Sprintf("node 3 registered at %s, want %s", ns.GetNode().GetAddress(), addr)
			}
		}
		return false, "node 3 not registered"
	})
	c.WaitLeaders(30 * time.Second)
	// Every user shard led by node 3 in turn: its followers answer it at its
	// new address, or no write commits.
	dir, err := directory(t, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dir {
		if d.GetSystem() {
			continue
		}
		c.MoveLeader(d.GetShardId(), 3, 30*time.Second)
		key := append(append([]byte{}, d.GetStartKey()...), "after"...)
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := cl.Put(wctx, key, []byte("v"))
		wcancel()
		if err != nil {
			t.Fatalf("write to shard %d led by the moved node: %v", d.GetShardId(), err)
		}
	}
	// A client that knows only nodes 1 and 2 reaches node 3 through the
	// registry.
	cl2 := newClientAt(t, c.Endpoints()[0])
	if _, err := cl2.Get(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if _, nodes := cl2.Routing(); nodes[3] != addr {
		t.Fatalf("the client's routing has node 3 at %q, want %s", nodes[3], addr)
	}
}
