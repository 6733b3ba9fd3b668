package proctest

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
)

// TestShalectlPlacement drives placement from the CLI against real server
// processes: placement status until balanced, a node drained with
// shalectl node decommission (node status shows the progress, then
// "drained") and removed, the history, and a drain that cannot finish
// (three nodes left, replication factor 3), which node status explains.
func TestShalectlPlacement(t *testing.T) {
	bins := requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 4, splitKeys)
	cli, err := client.New(ctx, c.endpoints(), client.WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	waitReady(ctx, t, cli, 4)
	ctl := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bins.ctl, append([]string{"--endpoints", strings.Join(c.endpoints(), ",")}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	until := func(what string, timeout time.Duration, cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			ok, last := cond()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached in %v; last: %s", what, timeout, last)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	jsonOf := func(out string) map[string]any {
		m := map[string]any{}
		_ = json.Unmarshal([]byte(out), &m)
		return m
	}
	until("placement status balanced", time.Minute, func() (bool, string) {
		out, err := ctl("placement", "status", "-o", "json")
		return err == nil && jsonOf(out)["balanced"] == true, out
	})
	if out, err := ctl("placement", "status"); err != nil || !strings.Contains(out, "live") {
		t.Fatalf("placement status: %v\n%s", err, out)
	}
	if out, err := ctl("node", "decommission", "4"); err != nil {
		t.Fatalf("node decommission 4: %v\n%s", err, out)
	}
	until("node 4 drained", 2*time.Minute, func() (bool, string) {
		out, err := ctl("node", "status", "4", "-o", "json")
		if err != nil {
			return false, out
		}
		m := jsonOf(out)
		zero := func(v any) bool { return v == nil || v == "0" } // uint64s are JSON strings
		return zero(m["replicas"]) && zero(m["leaders"]), out
	})
	if out, err := ctl("node", "status", "4"); err != nil || !strings.Contains(out, "drained") {
		t.Fatalf("node status 4 after the drain: %v\n%s", err, out)
	}
	if out, err := ctl("node", "remove", "4"); err != nil {
		t.Fatalf("node remove 4: %v\n%s", err, out)
	}
	c.node(4).kill()
	if out, err := ctl("placement", "history"); err != nil || !strings.Contains(out, "drain") {
		t.Fatalf("placement history: %v\n%s", err, out)
	}
	// Everything written before is still there, served by nodes 1-3.
	if out, err := ctl("kv", "put", "after/drain", "x"); err != nil {
		t.Fatalf("kv put after the drain: %v\n%s", err, out)
	}
	// Three nodes, replication factor 3: node 3 cannot drain, and says why.
	if out, err := ctl("node", "decommission", "3"); err != nil {
		t.Fatalf("node decommission 3: %v\n%s", err, out)
	}
	until("node 3 stuck with a reason", time.Minute, func() (bool, string) {
		out, err := ctl("node", "status", "3")
		return err == nil && strings.Contains(out, "no eligible node"), out
	})
	if out, err := ctl("node", "recommission", "3"); err != nil {
		t.Fatalf("node recommission 3: %v\n%s", err, out)
	}
	until("balanced after the recommission", time.Minute, func() (bool, string) {
		out, err := ctl("placement", "status", "-o", "json")
		return err == nil && jsonOf(out)["balanced"] == true, out
	})
}
