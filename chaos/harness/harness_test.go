package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	mobyclient "github.com/moby/moby/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

var insecureFlag = flag.Bool("chaos.insecure", false, "run the clusters in plaintext, without auth (default: mutual TLS and auth)")

func TestMain(m *testing.M) {
	// No registry: testcontainers must not try to pull its reaper.
	_ = os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	os.Exit(m.Run())
}

// putAll writes n keys with the given value prefix and fails the test on
// any error.
func putAll(t *testing.T, ctx context.Context, cl *client.Client, n int, prefix string) {
	t.Helper()
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%02d", i)
		if _, err := cl.Put(ctx, []byte(k), []byte(prefix+k)); err != nil {
			t.Fatalf("put %s (%s): %v", k, prefix, err)
		}
	}
}

// getAll checks that every key holds the value putAll wrote with prefix.
func getAll(t *testing.T, ctx context.Context, cl *client.Client, n int, prefix string) {
	t.Helper()
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%02d", i)
		kv, err := cl.Get(ctx, []byte(k))
		if err != nil || string(kv.Value) != prefix+k {
			t.Fatalf("get %s: %v %v, want %q", k, kv, err, prefix+k)
		}
	}
}

// TestClusterUnderFaults drives every fault the harness has against one
// 3-node cluster and checks after each that the cluster serves every key
// it acknowledged, then that Close leaves no container, volume or network.
func TestClusterUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("containers; skipped with -short")
	}
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c, cl, closeAndCheck := startForTest(t, ctx, Options{})
	const keys = 20
	putAll(t, ctx, cl, keys, "a-")
	getAll(t, ctx, cl, keys, "a-")
	admin, err := c.AdminClient(ctx, client.WithDefaultTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if c.Secure() {
		checkSecured(t, ctx, c, cl)
	}
	// Every peer link runs through the link proxy (else cutting it there
	// would prove nothing).
	for from := uint64(1); from <= 3; from++ {
		for to := uint64(1); to <= 3; to++ {
			if from != to && c.LinkConnections()[[2]uint64{from, to}] == 0 {
				t.Fatalf("no connection from node %d to node %d went through the link proxy: %v", from, to, c.LinkConnections())
			}
		}
	}

	step := func(name string, fault, undo func() error, prefix string) {
		t.Helper()
		t.Logf("fault: %s", name)
		if err := fault(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		putAll(t, ctx, cl, keys, prefix)
		if err := undo(); err != nil {
			t.Fatalf("undo %s: %v", name, err)
		}
		getAll(t, ctx, cl, keys, prefix)
	}
	step("kill -9 node 3 and restart it on its volume",
		func() error { return c.Kill(ctx, 3) },
		func() error { return c.Start(ctx, 3) }, "b-")
	step("isolate node 1 (link proxy)",
		func() error { c.Isolate(1); return nil },
		func() error { c.Heal(); return nil }, "c-")
	step("disconnect node 2 from the peer network",
		func() error { return c.Disconnect(ctx, 2) },
		func() error { return c.Reconnect(ctx, 2) }, "d-")
	step("pause node 1",
		func() error { return c.Pause(ctx, 1) },
		func() error { return c.Unpause(ctx, 1) }, "e-")
	step("partition {1} | {2,3} one way (1 cannot reach the others) with 50ms peer latency",
		func() error { c.Cut(1, 2); c.Cut(1, 3); c.Delay(50 * time.Millisecond); return nil },
		func() error { c.Heal(); return nil }, "f-")

	// Scale out and back in: a fourth node joins, then founding node 3 is
	// decommissioned, drained and removed.
	added, err := c.AddNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if added != 4 {
		t.Fatalf("the added node got ID %d, want 4", added)
	}
	putAll(t, ctx, cl, keys, "h-")
	if err := c.RemoveNode(ctx, admin, 3); err != nil {
		t.Fatal(err)
	}
	if ids := c.NodeIDs(); len(ids) != 3 || ids[2] != 4 {
		t.Fatalf("nodes after the removal: %v", ids)
	}
	getAll(t, ctx, cl, keys, "h-")

	// A graceful stop hands the node's leaderships away first and exits 0.
	if err := c.Stop(ctx, 2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if code, err := c.ExitCode(ctx, 2); err != nil || code != 0 {
		t.Fatalf("node 2 stopped with exit code %d (%v), want 0", code, err)
	}
	logs, err := c.Logs(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), "drained leaderships") && !strings.Contains(string(logs), "leadership drain cut short") {
		t.Fatalf("node 2 did not drain its leaderships on SIGTERM; log tail:\n%s", c.logTail(2, 20))
	}
	putAll(t, ctx, cl, keys, "g-")
	if err := c.Start(ctx, 2); err != nil {
		t.Fatal(err)
	}
	getAll(t, ctx, cl, keys, "g-")
	// Node 4 (joined) is wired through the link proxy like the others.
	if c.LinkConnections()[[2]uint64{4, 1}] == 0 || c.LinkConnections()[[2]uint64{1, 4}] == 0 {
		t.Fatalf("no proxied connection between nodes 1 and 4: %v", c.LinkConnections())
	}

	closeAndCheck(ctx)
}

// startForTest starts a 3-node cluster with user shards split at k10, and
// a client of it. closeAndCheck closes the cluster and fails the test if
// it left a container or volume behind; the cluster is closed at the end
// of the test if the test did not get that far.
func startForTest(t *testing.T, ctx context.Context, opts Options) (c *Cluster, cl *client.Client, closeAndCheck func(context.Context)) {
	t.Helper()
	opts.Args = append(opts.Args, "--initial-splits=k10")
	opts.LogDir = os.Getenv("SHALE_CHAOS_LOGS")
	opts.Insecure = *insecureFlag
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = c.Close(context.Background())
		}
	})
	cl, err = c.Client(ctx, client.WithDefaultTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return c, cl, func(ctx context.Context) {
		t.Helper()
		closed = true
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		checkRemoved(t, ctx, c.opts.Name)
	}
}

// checkRemoved fails the test if a container or volume of the cluster
// named name is left.
func checkRemoved(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	docker, err := mobyclient.New(mobyclient.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer docker.Close()
	ctrs, err := docker.ContainerList(ctx, mobyclient.ContainerListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, ctr := range ctrs.Items {
		if ctr.Labels["shale-chaos"] == name {
			t.Errorf("container %v left behind", ctr.Names)
		}
	}
	vols, err := docker.VolumeList(ctx, mobyclient.VolumeListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols.Items {
		if strings.HasPrefix(v.Name, name) {
			t.Errorf("volume %s left behind", v.Name)
		}
	}
}

// TestSmallDiskAndClockOffset: nodes on small disks keep their data across
// a kill -9; a node whose disk fills loses no acknowledged write and
// serves again once it is freed; a node's clock offset reaches its process.
func TestSmallDiskAndClockOffset(t *testing.T) {
	if testing.Short() {
		t.Skip("containers; skipped with -short")
	}
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c, cl, closeAndCheck := startForTest(t, ctx, Options{DiskBytes: 256 << 20})
	const keys = 20
	putAll(t, ctx, cl, keys, "a-")

	// The disk outlives the container: a founding node restarted on an
	// empty data directory would refuse to start (it ran before).
	if err := c.Kill(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, 2); err != nil {
		t.Fatal(err)
	}
	getAll(t, ctx, cl, keys, "a-")

	// A full disk on node 1: the other two keep serving writes.
	if err := c.FillDisk(ctx, 1); err != nil {
		t.Fatal(err)
	}
	putAll(t, ctx, cl, keys, "b-")
	// More than the 1 MiB the Raft log's WAL has preallocated, so node 1
	// needs space it has not got.
	big := strings.Repeat("x", 64<<10)
	for i := 0; i < 48; i++ {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("k%02d", i%keys)), []byte("b-"+big)); err != nil {
			t.Fatalf("put %d on a full disk of node 1: %v", i, err)
		}
	}
	putAll(t, ctx, cl, keys, "b-")
	logs, _ := c.Logs(ctx, 1)
	if !strings.Contains(string(logs), "no space left on device") {
		t.Errorf("node 1 never ran out of space; log tail:\n%s", c.logTail(1, 20))
	}
	// It stopped itself (fail-stop), exit code 1, saying why.
	if err := c.waitExited(ctx, c.Node(1)); err != nil {
		t.Fatal(err)
	}
	if code, err := c.ExitCode(ctx, 1); err != nil || code != 1 {
		t.Fatalf("node 1 on a full disk: exit code %d (%v), want 1", code, err)
	}
	if tail := c.logTail(1, 5); !strings.Contains(tail, "storage failed") {
		t.Fatalf("node 1's last words do not say its storage failed:\n%s", tail)
	}
	if err := c.FreeDisk(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	getAll(t, ctx, cl, keys, "b-")
	putAll(t, ctx, cl, keys, "c-")
	getAll(t, ctx, cl, keys, "c-")

	// An hour's clock offset on node 3: the time it reports a live node
	// last seen (its own wall clock) moves by the offset.
	if err := c.SetClockOffset(ctx, 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.ownClusterStatus(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		var seen time.Time
		for _, ns := range st.GetNodes() {
			if ns.GetNode().GetNodeId() == 3 {
				seen = time.Unix(0, ns.GetLastSeenUnixNanos())
			}
		}
		if off := time.Until(seen); off > 59*time.Minute && off < 61*time.Minute {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 reports itself last seen at %v, not an hour ahead", seen)
		}
		time.Sleep(200 * time.Millisecond)
	}
	putAll(t, ctx, cl, keys, "d-")
	if err := c.SetClockOffset(ctx, 3, 0); err != nil {
		t.Fatal(err)
	}
	getAll(t, ctx, cl, keys, "d-")

	// A slow disk (100 ms to 2 s a write and a sync) on the node leading
	// the most shards: it hands them all away while the cluster serves.
	slowID, most := uint64(0), -1
	for _, id := range c.NodeIDs() {
		if led := ledShards(t, ctx, c, id); len(led) > most {
			slowID, most = id, len(led)
		}
	}
	if err := c.SetDiskLatency(ctx, slowID, 100*time.Millisecond, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(45 * time.Second)
	for round := 0; ; round++ {
		putAll(t, ctx, cl, keys, fmt.Sprintf("e%d-", round))
		led := ledShards(t, ctx, c, slowID)
		if len(led) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d, its disk slow for 45 s, still leads shards %v; log tail:\n%s", slowID, led, c.logTail(slowID, 20))
		}
	}
	if logs, _ := c.Logs(ctx, slowID); !strings.Contains(string(logs), "disk slow") {
		t.Errorf("node %d never said its disk was slow; log tail:\n%s", slowID, c.logTail(slowID, 20))
	}
	if err := c.SetDiskLatency(ctx, slowID, 0, 0); err != nil {
		t.Fatal(err)
	}
	putAll(t, ctx, cl, keys, "f-")
	getAll(t, ctx, cl, keys, "f-")

	closeAndCheck(ctx)
}

// ledShards lists the shards that node id, asked itself, leads.
func ledShards(t *testing.T, ctx context.Context, c *Cluster, id uint64) []uint64 {
	t.Helper()
	info, err := c.NodeInfo(ctx, id)
	if err != nil {
		t.Fatalf("node %d's info: %v", id, err)
	}
	var led []uint64
	for _, sh := range info.GetShards() {
		if sh.GetLeaderNodeId() == id {
			led = append(led, sh.GetDescriptor_().GetShardId())
		}
	}
	return led
}

// ownClusterStatus asks node id itself for the cluster's status.
func (c *Cluster) ownClusterStatus(ctx context.Context, id uint64) (*shalev1.ClusterStatusResponse, error) {
	addr, n := c.ClientAddr(id), c.Node(id)
	if addr == "" || n == nil {
		return nil, fmt.Errorf("harness: no address for node %d", id)
	}
	cc, err := grpc.NewClient(addr, c.nodeDialOption(n))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	return shalev1.NewAdminClient(cc).ClusterStatus(ctx, &shalev1.ClusterStatusRequest{})
}

// checkSecured checks that the cluster's security is on: a plaintext call
// is refused, and the workload user (cl) may not make admin calls.
func checkSecured(t *testing.T, ctx context.Context, c *Cluster, cl *client.Client) {
	t.Helper()
	cc, err := grpc.NewClient(c.ClientAddr(1), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = shalev1.NewKVClient(cc).Get(ctx, &shalev1.GetRequest{Key: []byte("a-0")})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a plaintext Get on a secured node: %v, want Unauthenticated", err)
	}
	if _, err := cl.PlacementStatus(ctx); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("PlacementStatus as the workload user: %v, want permission denied", err)
	}
}
