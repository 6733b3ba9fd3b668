package harness

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	mobyclient "github.com/moby/moby/client"

	"github.com/shale-db/shale/client"
)

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
	c, err := Start(ctx, Options{Args: []string{"--initial-splits=k10"}, LogDir: os.Getenv("SHALE_CHAOS_LOGS")})
	if err != nil {
		t.Fatal(err)
	}
	name := c.opts.Name
	closed := false
	defer func() {
		if !closed {
			_ = c.Close(context.Background())
		}
	}()
	cl, err := c.Client(ctx, client.WithDefaultTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const keys = 20
	putAll(t, ctx, cl, keys, "a-")
	getAll(t, ctx, cl, keys, "a-")
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
	if err := c.RemoveNode(ctx, cl, 3); err != nil {
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

	closed = true
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
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
