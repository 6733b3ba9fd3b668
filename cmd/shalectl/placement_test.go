package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// matches requires a multi-line regexp to match out.
func matches(t *testing.T, what, out string, res ...string) {
	t.Helper()
	for _, re := range res {
		if !regexp.MustCompile("(?m)" + re).MatchString(out) {
			t.Errorf("%s: no line matching %q in:\n%s", what, re, out)
		}
	}
}

// pins returns a copy of a recorded list of the fake, under its lock.
func pins[T any](fc *fakeCluster, l *[]T) []T {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return slices.Clone(*l)
}

const stuckReason = "no eligible node: every live node in another zone already holds a replica"

// seedPlacement gives the fake a history (a done and a failed operation)
// and a stuck replica of shard 2 on node 2.
func seedPlacement(fc *fakeCluster) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	fc.ops = []*shalev1.PlacementOperation{
		{ShardId: 1, Kind: "transfer-leader", NodeId: 2, FromNodeId: 1, Reason: "balance: leaders 2 vs 0",
			StartedUnixNanos: at.UnixNano(), FinishedUnixNanos: at.Add(time.Second).UnixNano(), State: "done"},
		{ShardId: 2, Kind: "add-learner", NodeId: 1, Reason: "repair: node 3 dead for 5m0s",
			StartedUnixNanos: at.Add(time.Minute).UnixNano(), State: "failed", Error: "epoch mismatch"},
	}
	fc.stuck = []*shalev1.StuckReplica{{ShardId: 2, NodeId: 2, Reason: stuckReason}}
}

func TestPlacementStatusAndHistory(t *testing.T) {
	t.Parallel()
	fc := newFakeCluster(t)
	seedPlacement(fc)

	out := ok(t, fc.args("placement", "status")...)
	contains(t, "placement status", out, "placement leader: node 1\n",
		"balanced: no (replica spread 2, leader spread 1, bytes spread 100.0%)\n", "nodes: 2\n",
		"running operations: none\n", "stuck replicas: 1\n")
	matches(t, "placement status", out,
		`^ID\s+ADDRESS\s+ZONE\s+STATE\s+REPLICAS\s+LEADERS\s+BYTES\s+DECOMMISSIONING\s+LAST HEARTBEAT$`,
		`^1\s+127\.0\.0\.1:\d+\s+zone-a\s+live\s+2\s+1\s+6\.0M\s+no\s+\d+s ago$`,
		`^SHARD\s+NODE\s+REASON$`,
		`^2\s+2\s+`+regexp.QuoteMeta(stuckReason)+`$`)
	var st struct {
		Leader string `json:"placement_leader_node_id"`
		Nodes  []struct {
			Node struct {
				NodeID          string `json:"node_id"`
				Decommissioning bool   `json:"decommissioning"`
			} `json:"node"`
			Replicas string `json:"replicas"`
		} `json:"nodes"`
		Stuck    []any `json:"stuck"`
		Balanced *bool `json:"balanced"`
	}
	if err := json.Unmarshal([]byte(ok(t, fc.args("placement", "status", "-o", "json")...)), &st); err != nil ||
		st.Leader != "1" || len(st.Nodes) != 2 || st.Nodes[1].Node.NodeID != "2" || st.Nodes[1].Replicas != "2" ||
		len(st.Stuck) != 1 || st.Balanced == nil || *st.Balanced {
		t.Errorf("placement status json: %+v %v", st, err)
	}

	out = ok(t, fc.args("placement", "history")...)
	matches(t, "placement history", out,
		`^STARTED\s+SHARD\s+KIND\s+FROM\s+TO\s+STATE\s+REASON\s+ERROR$`,
		`^2026-11-22T10:00:00Z\s+1\s+transfer-leader\s+1\s+2\s+done\s+balance: leaders 2 vs 0\s+-$`,
		`^2026-11-22T10:01:00Z\s+2\s+add-learner\s+-\s+1\s+failed\s+repair: node 3 dead for 5m0s\s+epoch mismatch$`)
	out = ok(t, fc.args("placement", "history", "--limit", "1")...)
	if len(lines(out)) != 2 || !strings.Contains(out, "failed") {
		t.Errorf("placement history --limit 1:\n%s", out)
	}
	if l := pins(fc, &fc.historyLimits); !slices.Equal(l, []uint32{0, 1}) {
		t.Errorf("history limits sent: %v", l)
	}
	var h struct {
		Operations []struct {
			Kind  string `json:"kind"`
			Error string `json:"error"`
		} `json:"operations"`
	}
	if err := json.Unmarshal([]byte(ok(t, fc.args("placement", "history", "-o", "json")...)), &h); err != nil ||
		len(h.Operations) != 2 || h.Operations[1].Error != "epoch mismatch" {
		t.Errorf("placement history json: %+v %v", h, err)
	}

	contains(t, "history negative limit", fails(t, fc.args("placement", "history", "--limit", "-1")...),
		"--limit must not be negative", "Run 'shalectl placement history --help'")
	if l := pins(fc, &fc.historyLimits); len(l) != 3 {
		t.Errorf("a negative --limit sent a request: %v", l)
	}
	contains(t, "status args", fails(t, fc.args("placement", "status", "x")...), "takes no arguments")
	contains(t, "placement bogus", fails(t, fc.args("placement", "bogus")...), `unknown command "bogus" for "shalectl placement"`)

	// No operations, nothing stuck.
	fc.mu.Lock()
	fc.ops, fc.stuck = nil, nil
	fc.mu.Unlock()
	contains(t, "empty history", ok(t, fc.args("placement", "history")...), "no operations")
	contains(t, "nothing stuck", ok(t, fc.args("placement", "status")...), "stuck replicas: none")
}

func TestNodeDecommissionAndStatus(t *testing.T) {
	t.Parallel()
	fc := newFakeCluster(t)
	seedPlacement(fc)

	out := ok(t, fc.args("node", "status", "2")...)
	matches(t, "node status", out, `^node:\s+2$`, `^address:\s+127\.0\.0\.1:\d+$`, `^zone:\s+zone-b$`, `^state:\s+live$`,
		`^decommissioning:\s+no$`, `^replicas:\s+2$`, `^leaders:\s+1$`, `^bytes:\s+6\.0M \(6291456 bytes\)$`,
		`^disk:\s+60\.0G available of 100\.0G$`, `^last heartbeat:\s+\d+s ago$`,
		`^\s+SHARD\s+NODE\s+REASON$`, `^\s+2\s+2\s+`+regexp.QuoteMeta(stuckReason)+`$`)
	contains(t, "node status", out, "stuck replicas: 1\n")
	if strings.Contains(out, "progress:") {
		t.Errorf("progress shown for a node not decommissioning:\n%s", out)
	}

	contains(t, "decommission", ok(t, fc.args("node", "decommission", "2")...),
		`node 2: decommissioning (its replicas and leaderships move to other nodes; follow with "shalectl node status 2")`)
	matches(t, "draining", ok(t, fc.args("node", "status", "2")...), `^decommissioning:\s+yes$`,
		`^progress:\s+draining: 2 replicas left$`)
	contains(t, "placement status decommissioning", ok(t, fc.args("placement", "status")...), " yes ")

	// A node without replicas, decommissioned: drained.
	ok(t, fc.args("node", "add", "10.0.0.3:7001", "--zone", "zone-c")...)
	var dec map[string]any
	if err := json.Unmarshal([]byte(ok(t, fc.args("node", "decommission", "3", "-o", "json")...)), &dec); err != nil ||
		dec["node_id"] != 3.0 || dec["decommissioning"] != true {
		t.Errorf("decommission json: %v %v", dec, err)
	}
	out = ok(t, fc.args("node", "status", "3")...)
	matches(t, "drained", out, `^progress:\s+drained: 0 replicas, safe to remove with `+"`shalectl node remove 3`$")
	contains(t, "drained", out, "stuck replicas: none")
	var np struct {
		Node struct {
			NodeID          string `json:"node_id"`
			Decommissioning bool   `json:"decommissioning"`
		} `json:"node"`
		State    string `json:"state"`
		Replicas string `json:"replicas"`
		Stuck    []any  `json:"stuck"`
	}
	if err := json.Unmarshal([]byte(ok(t, fc.args("node", "status", "3", "-o", "json")...)), &np); err != nil ||
		np.Node.NodeID != "3" || !np.Node.Decommissioning || np.State != "live" || np.Replicas != "0" || len(np.Stuck) != 0 {
		t.Errorf("node status json: %+v %v", np, err)
	}
	if err := json.Unmarshal([]byte(ok(t, fc.args("node", "status", "2", "-o", "json")...)), &np); err != nil || len(np.Stuck) != 1 {
		t.Errorf("node status 2 json stuck: %+v %v", np, err)
	}

	contains(t, "recommission", ok(t, fc.args("node", "recommission", "2")...),
		"node 2: recommissioned (it may take replicas and leaderships again)")
	if err := json.Unmarshal([]byte(ok(t, fc.args("node", "recommission", "3", "-o", "json")...)), &dec); err != nil ||
		dec["node_id"] != 3.0 || dec["decommissioning"] != false {
		t.Errorf("recommission json: %v %v", dec, err)
	}
	out = ok(t, fc.args("node", "status", "2")...)
	matches(t, "recommissioned", out, `^decommissioning:\s+no$`)
	if strings.Contains(out, "progress:") {
		t.Errorf("progress shown after recommission:\n%s", out)
	}

	// Errors.
	contains(t, "status unknown", fails(t, fc.args("node", "status", "9")...), "node status 9: node 9 not found")
	contains(t, "status bad id", fails(t, fc.args("node", "status", "x")...), `ID must be a positive integer, got "x"`,
		"Run 'shalectl node status --help'")
	contains(t, "status zero", fails(t, fc.args("node", "status", "0")...), "ID must be a positive integer")
	contains(t, "status arity", fails(t, fc.args("node", "status")...), "takes 1 argument(s), ID; got 0")
	contains(t, "decommission unknown", fails(t, fc.args("node", "decommission", "99")...), "node decommission 99", "not found")
	contains(t, "recommission unknown", fails(t, fc.args("node", "recommission", "99")...), "node recommission 99", "not found")
	contains(t, "decommission bad id", fails(t, fc.args("node", "decommission", "2x")...), "ID must be a positive integer")
	contains(t, "recommission bad id", fails(t, fc.args("node", "recommission", "two")...), "ID must be a positive integer")
}

func TestShardMoveAndLeaderPins(t *testing.T) {
	t.Parallel()
	fc := newFakeCluster(t)

	contains(t, "move to unknown node", fails(t, fc.args("shard", "move", "1", "1", "3")...), "shard move of shard 1", "node 3 not found")
	ok(t, fc.args("node", "add", "10.0.0.3:7001")...)

	out := ok(t, fc.args("shard", "move", "1", "1", "3")...)
	contains(t, "shard move", out,
		"shard 1: moving its replica from node 1 to node 3 (pinned for the server's default time)\n",
		"operation: move of shard 1, node 1 -> node 3 (manual move from node 1 to node 3)\n",
		`follow it with "shalectl placement status" and "shalectl placement history"`)
	contains(t, "move --pin", ok(t, fc.args("shard", "move", "2", "2", "3", "--pin", "90s")...), "(pinned for 1m30s)")
	ok(t, fc.args("shard", "move", "2", "1", "3", "--pin", "1500ms")...)
	contains(t, "move --no-pin", ok(t, fc.args("shard", "move", "1", "2", "3", "--no-pin")...), "(pinned only while it runs)")
	var mv struct {
		Operation struct {
			ShardID string `json:"shard_id"`
			Kind    string `json:"kind"`
			NodeID  string `json:"node_id"`
			From    string `json:"from_node_id"`
			State   string `json:"state"`
		} `json:"operation"`
	}
	if err := json.Unmarshal([]byte(ok(t, fc.args("shard", "move", "1", "1", "3", "-o", "json")...)), &mv); err != nil ||
		mv.Operation.ShardID != "1" || mv.Operation.Kind != "move" || mv.Operation.NodeID != "3" ||
		mv.Operation.From != "1" || mv.Operation.State != "done" {
		t.Errorf("shard move json: %+v %v", mv, err)
	}
	// 0 is the server's default, -1 no pin; 1.5s rounds up to 2.
	if p := pins(fc, &fc.movePins); !slices.Equal(p, []int64{0, 0, 90, 2, -1, 0}) {
		t.Errorf("move pins sent: %v", p)
	}
	matches(t, "running", ok(t, fc.args("placement", "status")...), `^running operations: 5$`,
		`^SHARD\s+KIND\s+FROM\s+TO\s+REASON\s+AGE$`, `^1\s+add-learner\s+1\s+3\s+manual move from node 1 to node 3\s+\d+s$`)
	matches(t, "history of moves", ok(t, fc.args("placement", "history", "--limit", "2")...),
		`^\S+Z\s+1\s+move\s+1\s+3\s+done\s+manual move from node 1 to node 3\s+-$`,
		`^\S+Z\s+1\s+add-learner\s+1\s+3\s+running\s+manual move from node 1 to node 3\s+-$`)

	contains(t, "move to a replica", fails(t, fc.args("shard", "move", "1", "1", "2")...), "already has a replica")
	contains(t, "move unknown shard", fails(t, fc.args("shard", "move", "9", "1", "3")...), "shard 9 not found")
	n := len(pins(fc, &fc.movePins))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"x", "1", "3"}, `SHARD must be a positive integer, got "x"`},
		{[]string{"1", "y", "3"}, `FROM must be a positive integer, got "y"`},
		{[]string{"1", "1", "0"}, `TO must be a positive integer, got "0"`},
		{[]string{"1", "1"}, "takes 3 argument(s), SHARD FROM TO; got 2"},
		{[]string{"1", "1", "3", "--pin=-1s"}, "--pin must not be negative"},
		{[]string{"1", "1", "3", "--pin", "1m", "--no-pin"}, "--pin and --no-pin cannot be combined"},
		{[]string{"1", "1", "3", "--pin", "soon"}, `invalid argument "soon"`},
	} {
		args := append([]string{"shard", "move"}, c.args...)
		contains(t, strings.Join(args, " "), fails(t, fc.args(args...)...), c.want, "Run 'shalectl shard move --help'")
	}
	if p := pins(fc, &fc.movePins); len(p) != n {
		t.Errorf("bad arguments sent requests: %v", p)
	}

	contains(t, "transfer", ok(t, fc.args("leader", "transfer", "1", "2")...), "shard 1: leader is now node 2")
	ok(t, fc.args("leader", "transfer", "1", "1", "--pin", "10m")...)
	ok(t, fc.args("leader", "transfer", "2", "1", "--no-pin")...)
	contains(t, "transfer --pin=-5s", fails(t, fc.args("leader", "transfer", "1", "2", "--pin=-5s")...), "--pin must not be negative")
	contains(t, "transfer both", fails(t, fc.args("leader", "transfer", "1", "2", "--pin", "1s", "--no-pin")...), "cannot be combined")
	contains(t, "transfer bad id", fails(t, fc.args("leader", "transfer", "1", "n2")...), "NODE must be a positive integer")
	if p := pins(fc, &fc.transferPins); !slices.Equal(p, []int64{0, 600, -1}) {
		t.Errorf("transfer pins sent: %v", p)
	}
}

// TestDocsCoverClusterCommands checks that docs/shalectl.md has a section
// and a contents link for every cluster command.
func TestDocsCoverClusterCommands(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/shalectl.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	root := newRootCmd()
	var n int
	for _, g := range root.Commands() {
		if g.Name() == "debug" {
			continue
		}
		var walk func(c *cobra.Command)
		walk = func(c *cobra.Command) {
			if c.HasSubCommands() {
				for _, s := range c.Commands() {
					walk(s)
				}
				return
			}
			n++
			name := strings.TrimPrefix(c.CommandPath(), "shalectl ")
			anchor := strings.ReplaceAll(name, " ", "-")
			for _, want := range []string{"\n### " + name + "\n", "[" + name + "](#" + anchor + ")"} {
				if !strings.Contains(doc, want) {
					t.Errorf("docs/shalectl.md: no %q for %q", strings.TrimSpace(want), c.CommandPath())
				}
			}
		}
		walk(g)
	}
	if n < 20 {
		t.Errorf("found only %d cluster commands", n)
	}
}
