package proctest

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
)

// TestShalectlShardSplit splits a shard of a cluster of real server
// processes with `shalectl shard split`, then checks with shalectl and the
// SDK that the new shard serves its half and every key reads back, also
// after killing and restarting a node.
func TestShalectlShardSplit(t *testing.T) {
	bins := requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 3, splitKeys)
	cli, err := client.New(ctx, c.endpoints(), client.WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	waitReady(ctx, t, cli, 3)
	ctl := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bins.ctl, append([]string{"--endpoints", strings.Join(c.endpoints(), ",")}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for i := range 40 {
		k := fmt.Sprintf("p/%02d", i)
		if _, err := cli.Put(ctx, []byte(k), valueOf(k)); err != nil {
			t.Fatal(err)
		}
	}
	before := shardOf(ctx, t, cli, []byte("p/20"))
	out, err := ctl("shard", "split", "p/20", "-o", "json")
	if err != nil {
		t.Fatalf("shalectl shard split: %v\n%s", err, out)
	}
	var resp struct {
		Left, Right struct {
			ShardID  string `json:"shard_id"`
			StartKey string `json:"start_key"`
			EndKey   string `json:"end_key"`
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("split -o json: %v\n%s", err, out)
	}
	if resp.Left.ShardID != fmt.Sprint(before) || resp.Right.ShardID == resp.Left.ShardID || resp.Right.ShardID == "" {
		t.Fatalf("split answer: %s", out)
	}
	out, err = ctl("shard", "split", "p/20")
	if err == nil || !strings.Contains(out, "already where shard") {
		t.Fatalf("a second split at p/20: %v\n%s", err, out)
	}
	waitReady(ctx, t, cli, 3)
	out, err = ctl("shard", "list")
	if err != nil || !strings.Contains(out, "p/20") {
		t.Fatalf("shard list after the split: %v\n%s", err, out)
	}
	check := func(cli *client.Client) {
		t.Helper()
		for i := range 40 {
			k := fmt.Sprintf("p/%02d", i)
			kv, err := cli.Get(ctx, []byte(k))
			if err != nil || string(kv.Value) != string(valueOf(k)) {
				t.Fatalf("get %s: %v %v", k, kv, err)
			}
		}
		if got := shardOf(ctx, t, cli, []byte("p/20")); fmt.Sprint(got) != resp.Right.ShardID {
			t.Fatalf("p/20 is in shard %d, want the new shard %s", got, resp.Right.ShardID)
		}
	}
	check(cli)
	// The shard directory records both halves within a few seconds.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err = ctl("shard", "directory")
		if err == nil && strings.Contains(out, resp.Right.ShardID+"  ") && strings.Contains(out, "p/20") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard directory after the split: %v\n%s", err, out)
		}
	}
	if out, err := ctl("kv", "put", "p/30x", "after"); err != nil {
		t.Fatalf("shalectl kv put into the new shard: %v\n%s", err, out)
	}
	// A node killed and restarted hosts both halves again.
	c.node(2).kill()
	c.node(2).start(t, bins.server)
	waitReady(ctx, t, cli, 3)
	check(cli)
	var rightID uint64
	fmt.Sscan(resp.Right.ShardID, &rightID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := c.shardOn(ctx, 2, rightID)
		if err == nil && st.GetDescriptor_().GetShardId() == rightID && string(st.GetDescriptor_().GetStartKey()) == "p/20" && st.GetAppliedIndex() > 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted node 2 does not serve the new shard %d: %v %v", rightID, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// shalectl shard merge joins them again: the left shard takes the
	// right's keys and range, the right is gone from the directory.
	var merged string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		merged, err = ctl("shard", "merge", "p/10")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shalectl shard merge: %v\n%s", err, merged)
		}
	}
	if !strings.Contains(merged, fmt.Sprintf("shard %d:", before)) || !strings.Contains(merged, "absorbed shard "+resp.Right.ShardID) {
		t.Fatalf("merge answer: %s", merged)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err = ctl("shard", "directory")
		if err == nil && !strings.Contains(out, "p/20") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard directory after the merge: %v\n%s", err, out)
		}
	}
	if got := shardOf(ctx, t, cli, []byte("p/20")); got != before {
		t.Fatalf("p/20 is in shard %d after the merge, want %d", got, before)
	}
	for i := range 40 {
		k := fmt.Sprintf("p/%02d", i)
		if kv, err := cli.Get(ctx, []byte(k)); err != nil || string(kv.Value) != string(valueOf(k)) {
			t.Fatalf("get %s after the merge: %v %v", k, kv, err)
		}
	}
	if out, err := ctl("kv", "get", "p/30x"); err != nil || !strings.Contains(out, "after") {
		t.Fatalf("p/30x after the merge: %v\n%s", err, out)
	}
}
