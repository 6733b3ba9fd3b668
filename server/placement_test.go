package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// placementSplits cuts the key space into 12 user shards.
var placementSplits = func() [][]byte {
	var out [][]byte
	for _, c := range "bcdefghijkl" {
		out = append(out, []byte(string(c)))
	}
	return out
}()

// adminOf returns an Admin client of a running node of c.
func adminOf(t *testing.T, c *testcluster.Cluster) shalev1.AdminClient {
	t.Helper()
	ids := c.NodeIDs()
	if len(ids) == 0 {
		t.Fatal("no running node")
	}
	conn, err := grpc.NewClient(c.Node(ids[0]).Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return shalev1.NewAdminClient(conn)
}

// movedTo reports whether the directory places shard on node to, as a
// voter, and not on node from.
func movedTo(t *testing.T, c *testcluster.Cluster, shard, from, to uint64) (bool, string) {
	dir, err := directory(t, c)
	if err != nil {
		return false, err.Error()
	}
	for _, d := range dir {
		if d.GetShardId() != shard {
			continue
		}
		on := map[uint64]shalev1.ReplicaRole{}
		for _, rd := range d.GetReplicas() {
			on[rd.GetNodeId()] = rd.GetRole()
		}
		_, onFrom := on[from]
		role, onTo := on[to]
		return !onFrom && onTo && role == shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED, fmt.Sprintf("shard %d: %v", shard, d.GetReplicas())
	}
	return false, fmt.Sprintf("shard %d missing from the directory", shard)
}

// waitFor polls cond every 250 ms until it holds, failing the test with
// cond's last explanation after timeout. It returns how long it took.
func waitFor(t *testing.T, timeout time.Duration, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < timeout {
		ok, why := cond()
		if ok {
			return time.Since(start)
		}
		last = why
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("not reached in %v: %s", timeout, last)
	return 0
}

// retryUnavailable calls op until it returns an error other than
// Unavailable or DeadlineExceeded (what a request that did not finish in
// the server's time returns: a leadership transfer or a proposal that a
// loaded machine did not complete in time), and returns that, or the last
// error after timeout.
func retryUnavailable(timeout time.Duration, op func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := op()
		c := status.Code(err)
		late := c == codes.Unavailable || c == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)
		if err == nil || !late || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// directory reads the shard directory through a running node.
func directory(t *testing.T, c *testcluster.Cluster) ([]*shalev1.ShardDescriptor, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := adminOf(t, c).ShardDirectory(ctx, &shalev1.ShardDirectoryRequest{})
	return resp.GetShards(), err
}

func placementStatus(t *testing.T, c *testcluster.Cluster) (*shalev1.PlacementStatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return adminOf(t, c).PlacementStatus(ctx, &shalev1.PlacementStatusRequest{})
}

// load runs writers and readers against the cluster until stop is called,
// which returns the number of acknowledged writes and of failed requests.
func load(t *testing.T, c *testcluster.Cluster) (stop func() (acked map[string]string, failures []string)) {
	cl := newClient(t, c)
	var mu sync.Mutex
	acked := map[string]string{}
	var failures []string
	var done atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load(); i++ {
				key := fmt.Sprintf("%c/w%d/%05d", 'a'+byte(i%12), w, i)
				val := fmt.Sprintf("v%d", i)
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				_, err := cl.Put(ctx, []byte(key), []byte(val))
				if err == nil && i%3 == 0 {
					_, err = cl.Get(ctx, []byte(key))
				}
				cancel()
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s: %v", key, err))
				} else {
					acked[key] = val
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return func() (map[string]string, []string) {
		done.Store(true)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return acked, failures
	}
}

// checkAcked reads back every acknowledged write.
func checkAcked(t *testing.T, c *testcluster.Cluster, acked map[string]string) {
	t.Helper()
	cl := newClient(t, c)
	for k, v := range acked {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		kv, err := cl.Get(ctx, []byte(k))
		cancel()
		if err != nil || kv == nil || string(kv.Value) != v {
			t.Fatalf("acknowledged %s=%s reads back %v, %v", k, v, kv, err)
		}
	}
}

// fullyReplicated reports whether every shard of the directory has
// exactly rf voters, no learner, and no replica on a node of gone.
func fullyReplicated(dir []*shalev1.ShardDescriptor, rf int, gone ...uint64) (bool, string) {
	if len(dir) == 0 {
		return false, "empty directory"
	}
	for _, d := range dir {
		voters := 0
		for _, rd := range d.GetReplicas() {
			for _, g := range gone {
				if rd.GetNodeId() == g {
					return false, fmt.Sprintf("shard %d still has a replica on node %d", d.GetShardId(), g)
				}
			}
			if rd.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED {
				return false, fmt.Sprintf("shard %d has a %v replica", d.GetShardId(), rd.GetRole())
			}
			voters++
		}
		if voters != rf {
			return false, fmt.Sprintf("shard %d has %d voters", d.GetShardId(), voters)
		}
	}
	return true, ""
}

// balancedWithin reports whether placement status shows the live nodes
// within one replica (or 20% of bytes) and one leadership of each other,
// nothing running or stuck.
func balancedWithin(st *shalev1.PlacementStatusResponse, nodes int) (bool, string) {
	live := 0
	for _, n := range st.GetNodes() {
		if n.GetState() == "live" && !n.GetNode().GetDecommissioning() {
			live++
		}
	}
	switch {
	case live != nodes:
		var states []string
		for _, n := range st.GetNodes() {
			states = append(states, fmt.Sprintf("%d:%s", n.GetNode().GetNodeId(), n.GetState()))
		}
		return false, fmt.Sprintf("%d live nodes, want %d: %v", live, nodes, states)
	case st.GetReplicaSpread() > 1 && st.GetBytesSpreadPercent() > 20:
		return false, fmt.Sprintf("replica spread %d, bytes spread %.0f%%", st.GetReplicaSpread(), st.GetBytesSpreadPercent())
	case st.GetLeaderSpread() > 1:
		return false, fmt.Sprintf("leader spread %d", st.GetLeaderSpread())
	case !st.GetBalanced():
		return false, fmt.Sprintf("not balanced: running %v, stuck %v", st.GetRunning(), st.GetStuck())
	}
	return true, ""
}

// TestPlacementHearsJoiningNodeAtOnce: a node heartbeats to the placement
// leader as it starts, not a second later: the placement leader gives a
// node replicas from its first heartbeat on, and in rebalances onto two
// joining nodes the first move came 0.8 s after both had joined while
// their first heartbeats waited out the loop's first second (issue 24).
func TestPlacementHearsJoiningNodeAtOnce(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	waitFor(t, time.Minute, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil {
			return false, err.Error()
		}
		live := 0
		for _, n := range st.GetNodes() {
			if n.GetState() == "live" {
				live++
			}
		}
		return live == 3, fmt.Sprintf("%d live nodes in the placement leader's view", live)
	})
	id := c.AddNode()
	added := time.Now()
	var first time.Time
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range st.GetNodes() {
			if n.GetNode().GetNodeId() == id && n.GetState() == "live" && n.GetLastHeartbeatUnixNanos() != 0 {
				first = time.Unix(0, n.GetLastHeartbeatUnixNanos())
				return true, ""
			}
		}
		return false, fmt.Sprintf("node %d not live in the placement leader's view", id)
	})
	t.Logf("node %d's first heartbeat: %v after AddNode returned", id, first.Sub(added))
	// Without the heartbeat at start it came a second after the start
	// (placementInterval), which is before AddNode returns.
	if gap := first.Sub(added); gap > 500*time.Millisecond {
		t.Fatalf("node %d's first heartbeat reached the placement leader %v after AddNode returned; want it at the node's start", id, gap)
	}
}

// TestPlacementRebalancesAddedNodes is the "add 2 nodes" proof: a
// 3-node cluster with 13 shards gets two more nodes, and placement evens
// replicas and leaderships while clients keep reading and writing.
func TestPlacementRebalancesAddedNodes(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: placementSplits})
	stop := load(t, c)
	time.Sleep(time.Second)
	c.AddNode()
	c.AddNode()
	// The history is the placement leader's and a new leader's starts
	// empty (leader balancing may move the system shard's leadership), so
	// it is read while the rebalance runs: some leader recorded moves.
	recorded := 0
	took := waitFor(t, 90*time.Second, func() (bool, string) {
		hctx, hcancel := context.WithTimeout(context.Background(), 3*time.Second)
		hist, err := adminOf(t, c).PlacementHistory(hctx, &shalev1.PlacementHistoryRequest{})
		hcancel()
		if err == nil {
			recorded = max(recorded, len(hist.GetOperations()))
		}
		st, err := placementStatus(t, c)
		if err != nil {
			return false, err.Error()
		}
		return balancedWithin(st, 5)
	})
	acked, failures := stop()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed during the rebalance, first: %s", len(failures), failures[0])
	}
	st, _ := placementStatus(t, c)
	for _, n := range st.GetNodes() {
		t.Logf("node %d: %d replicas, %d leaders", n.GetNode().GetNodeId(), n.GetReplicas(), n.GetLeaders())
	}
	t.Logf("balanced %v after the nodes joined; %d writes acknowledged during it", took, len(acked))
	dir, err := directory(t, c)
	if ok, why := fullyReplicated(dir, 3); err != nil || !ok {
		t.Fatalf("directory: %s %v", why, err)
	}
	checkAcked(t, c, acked)
	if recorded == 0 {
		t.Fatal("placement history stayed empty while the replicas moved")
	}
}

// TestPlacementRepairsDeadNode is the "kill a node for good" proof: after
// the dead timeout, every shard is back to 3 voters on live nodes.
func TestPlacementRepairsDeadNode(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Splits: placementSplits, Configure: func(cfg *server.Config) {
		cfg.DeadNodeTimeout = 3 * time.Second
	}})
	stop := load(t, c)
	time.Sleep(time.Second)
	victim := uint64(2)
	if c.Leader(server.SystemShardID) == victim {
		victim = 3
	}
	c.Stop(victim)
	took := waitFor(t, 90*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		return fullyReplicated(dir, 3, victim)
	})
	t.Logf("every shard back to 3 voters %v after node %d stopped (dead timeout 3s)", took, victim)
	acked, failures := stop()
	// Requests to shards that lost a replica still succeed (2 of 3 live);
	// none may fail.
	if len(failures) > 0 {
		t.Fatalf("%d requests failed, first: %s", len(failures), failures[0])
	}
	st, err := placementStatus(t, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.GetNodes() {
		if n.GetNode().GetNodeId() == victim && n.GetState() != "dead" {
			t.Fatalf("node %d is %q, want dead", victim, n.GetState())
		}
	}
	checkAcked(t, c, acked)
}

// TestPlacementDecommission drains a node under load, then removes it; a
// drain that cannot finish says why.
func TestPlacementDecommission(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Splits: placementSplits})
	a := adminOf(t, c)
	ctx := context.Background()
	stop := load(t, c)
	time.Sleep(time.Second)
	// Node 4 registers with the placement service by its first heartbeat:
	// on a loaded machine (CI's run of 4613f44) that came after the second
	// above, and the decommission was refused with NotFound.
	waitFor(t, 30*time.Second, func() (bool, string) {
		_, err := a.DecommissionNode(ctx, &shalev1.DecommissionNodeRequest{NodeId: 4})
		if status.Code(err) == codes.NotFound {
			return false, err.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
		return true, ""
	})
	took := waitFor(t, 90*time.Second, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range st.GetNodes() {
			if n.GetNode().GetNodeId() == 4 && (n.GetReplicas() > 0 || n.GetLeaders() > 0) {
				return false, fmt.Sprintf("node 4 holds %d replicas, %d leaderships", n.GetReplicas(), n.GetLeaders())
			}
		}
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		return fullyReplicated(dir, 3, 4)
	})
	t.Logf("node 4 drained in %v", took)
	if _, err := a.RemoveNode(ctx, &shalev1.RemoveNodeRequest{NodeId: 4}); err != nil {
		t.Fatal(err)
	}
	c.Stop(4)
	acked, failures := stop()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed during the drain, first: %s", len(failures), failures[0])
	}
	checkAcked(t, c, acked)

	// Three nodes left, replication factor 3: node 3 cannot drain.
	if _, err := a.DecommissionNode(ctx, &shalev1.DecommissionNodeRequest{NodeId: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range st.GetNodes() {
			if n.GetNode().GetNodeId() != 3 {
				continue
			}
			if n.GetReplicas() == 0 || len(n.GetStuck()) == 0 {
				return false, fmt.Sprintf("node 3: %d replicas, stuck %v", n.GetReplicas(), n.GetStuck())
			}
			for _, s := range n.GetStuck() {
				if !strings.Contains(s.GetReason(), "no eligible node") {
					return false, "reason: " + s.GetReason()
				}
			}
			return n.GetLeaders() == 0, fmt.Sprintf("node 3 still leads %d shards", n.GetLeaders())
		}
		return false, "node 3 missing"
	})
	if _, err := a.RecommissionNode(ctx, &shalev1.RecommissionNodeRequest{NodeId: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil {
			return false, err.Error()
		}
		return len(st.GetStuck()) == 0, fmt.Sprintf("stuck after recommission: %v", st.GetStuck())
	})
}

// TestPlacementZones is the "three zones, five nodes" proof.
func TestPlacementZones(t *testing.T) {
	zones := map[uint64]string{1: "a", 2: "a", 3: "b", 4: "b", 5: "c"}
	c := testcluster.Start(t, testcluster.Options{Nodes: 5, Splits: placementSplits, Configure: func(cfg *server.Config) {
		cfg.Zone = zones[cfg.NodeID]
	}})
	took := waitFor(t, 90*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		if ok, why := fullyReplicated(dir, 3); !ok {
			return false, why
		}
		for _, d := range dir {
			seen := map[string]uint64{}
			for _, rd := range d.GetReplicas() {
				z := zones[rd.GetNodeId()]
				if o, dup := seen[z]; dup {
					return false, fmt.Sprintf("shard %d has replicas on nodes %d and %d, both in zone %s", d.GetShardId(), o, rd.GetNodeId(), z)
				}
				seen[z] = rd.GetNodeId()
			}
		}
		return true, ""
	})
	t.Logf("no shard with two replicas in a zone after %v", took)
}

// TestPlacementManualMove moves a replica by hand; the pin keeps balancing
// from undoing it, and a pinned leadership stays where it was put.
func TestPlacementManualMove(t *testing.T) {
	// A one-second election timeout (50 ticks of 20 ms) rather than the
	// test clusters' 200 ms: the check that a pinned leadership stays put
	// must not trip on an election that a loaded -race run's stalls set
	// off; balancing moves a leadership by a transfer, whatever the timeout.
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Splits: placementSplits,
		Configure: func(cfg *server.Config) { cfg.ElectionTicks = 50 }})
	a := adminOf(t, c)
	ctx := context.Background()
	var shard, from uint64
	waitFor(t, 2*time.Minute, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil || !st.GetBalanced() {
			return false, fmt.Sprintf("%v %v", st, err)
		}
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, d := range dir {
			on := map[uint64]bool{}
			for _, rd := range d.GetReplicas() {
				on[rd.GetNodeId()] = true
			}
			if !d.GetSystem() && on[1] && !on[4] {
				shard, from = d.GetShardId(), 1
				return true, ""
			}
		}
		return false, "no shard on node 1 and not on node 4"
	})
	if _, err := a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: shard, FromNodeId: from, ToNodeId: from}); err == nil {
		t.Fatal("a move to the same node was accepted")
	}
	if _, err := a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: shard, FromNodeId: 4, ToNodeId: 1}); err == nil {
		t.Fatal("a move from a node without a replica was accepted")
	}
	if err := retryUnavailable(time.Minute, func() error {
		_, err := a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: shard, FromNodeId: from, ToNodeId: 4})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	onNode4 := func() (bool, string) { return movedTo(t, c, shard, from, 4) }
	took := waitFor(t, 2*time.Minute, onNode4)
	t.Logf("manual move of shard %d from node %d to node 4 took %v", shard, from, took)
	// A leadership transfer to the node the replica left is refused at once,
	// through the SDK too (which retries Unavailable): chaos/README bug 37,
	// where such a transfer ran out a 2-minute deadline.
	tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
	start := time.Now()
	_, err := newClient(t, c).TransferLeader(tctx, shard, from)
	tcancel()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "holds no voting replica") {
		t.Fatalf("leadership transfer of shard %d to node %d, whose replica moved away: %v, want FailedPrecondition (no voting replica)", shard, from, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the refused transfer took %v", d)
	}
	// A pinned leadership stays put even though it unbalances leaders.
	if err := retryUnavailable(time.Minute, func() error {
		_, err := a.TransferLeader(ctx, &shalev1.TransferLeaderRequest{ShardId: shard, TargetNodeId: 4})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if ok, why := onNode4(); !ok {
		t.Fatalf("the moved replica moved again: %s", why)
	}
	if l := c.Leader(shard); l != 4 {
		t.Fatalf("shard %d is led by node %d after a pinned transfer to node 4", shard, l)
	}
	hist, err := a.PlacementHistory(ctx, &shalev1.PlacementHistoryRequest{})
	if err != nil {
		t.Fatal(err)
	}
	manual := 0
	for _, op := range hist.GetOperations() {
		if op.GetShardId() == shard && strings.Contains(op.GetReason(), "manual move") {
			manual++
		}
	}
	if manual < 2 { // the request, and the learner it added
		t.Fatalf("history of the manual move: %v", hist.GetOperations())
	}
}

// TestPlacementPromotesWithoutSettling: a move's learner is promoted as
// soon as it has caught up (a snapshot of a few KB), not after a fixed
// settle time: its leader heartbeats every 250 ms while the learner catches
// up, a heartbeat reporting it caught up starts a scheduling round, and a
// membership step holds its shard only until the directory and the leader
// show its epoch. Until issue 24 every step held its shard for 2.5 s, so
// the promotion came at least that long after the learner's addition.
// Shards are moved one after the other, each from a node that holds a
// replica without leading the shard, until one promotion comes within
// 2.4 s (one move can take longer on a loaded machine; see timePromotions).
func TestPlacementPromotesWithoutSettling(t *testing.T) {
	timePromotions(t, false)
}

// TestPlacementPromotesLeaderMoveWithoutSettling: a move off the shard's
// leader hands the leadership off first, and the shard is then held only
// until the new leader's report names it (a transfer keeps the epoch), not
// for a fixed 2.5 s: one of up to six such promotions must come within
// 2.4 s of the learner's addition (2.9-3.8 s with the fixed hold, measured
// 2026-11-28).
func TestPlacementPromotesLeaderMoveWithoutSettling(t *testing.T) {
	timePromotions(t, true)
}

// timePromotions moves user shards' replicas onto a fourth node, one
// after the other, each from the shard's leader (fromLeader) or from a
// node that holds a replica without leading the shard, until a promotion
// comes within 2.4 s of its learner's addition, and fails if none of six
// timed moves does. A fixed hold of 2.5 s makes every promotion come
// later than that, however quick the machine; the moves of a loaded
// machine can each take longer too, so the test tries again rather than
// requiring it of the quickest of three (CI saw 2.4 s passed under load).
// It waits for each step with generous deadlines: its only clock is the
// gap the placement history records.
func timePromotions(t *testing.T, fromLeader bool) {
	const (
		maxMoves = 6
		within   = 2400 * time.Millisecond
	)
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Splits: placementSplits})
	a := adminOf(t, c)
	ctx := context.Background()
	waitFor(t, 2*time.Minute, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil || !st.GetBalanced() {
			return false, fmt.Sprintf("%v %v", st, err)
		}
		return true, ""
	})
	// next is a user shard not on node 4 and not tried yet, with the node
	// to move it from: its leader's, or one that holds one of its replicas
	// without leading it. Moving from node 1 alone, a CI run under load
	// picked three shards node 1 led (the initial shards' first replicas
	// campaign at once) and saw every promotion 3.4-3.9 s after its
	// learner's addition, when a leadership transfer held its shard 2.5 s.
	// Once the balanced cluster's shards not on node 4 are moved there,
	// balancing moves others off it (node 4 then holds more than its
	// share), so next waits for one.
	tried := map[uint64]bool{}
	next := func() (shard, from uint64) {
		waitFor(t, 2*time.Minute, func() (bool, string) {
			dir, err := directory(t, c)
			if err != nil {
				return false, err.Error()
			}
			for _, d := range dir {
				if d.GetSystem() || tried[d.GetShardId()] {
					continue
				}
				on4, leader := false, c.Leader(d.GetShardId())
				for _, rd := range d.GetReplicas() {
					on4 = on4 || rd.GetNodeId() == 4
				}
				if on4 || leader == 0 {
					continue
				}
				if fromLeader {
					shard, from = d.GetShardId(), leader
					return true, ""
				}
				for _, rd := range d.GetReplicas() {
					if rd.GetNodeId() != leader {
						shard, from = d.GetShardId(), rd.GetNodeId()
						return true, ""
					}
				}
			}
			return false, fmt.Sprintf("no untried user shard off node 4 with a leader (tried %v)", tried)
		})
		return shard, from
	}
	best, moves := time.Hour, 0
	for tries := 0; moves < maxMoves && best >= within && tries < 2*maxMoves; tries++ {
		shard, from := next()
		tried[shard] = true
		if _, err := a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: shard, FromNodeId: from, ToNodeId: 4}); err != nil {
			t.Logf("move shard %d: %v (balancing moved it meanwhile?)", shard, err)
			continue
		}
		waitFor(t, 2*time.Minute, func() (bool, string) { return movedTo(t, c, shard, from, 4) })
		hist, err := a.PlacementHistory(ctx, &shalev1.PlacementHistoryRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var added, promoted int64 // the learner's addition finished, its promotion started
		for _, op := range hist.GetOperations() {
			if op.GetShardId() != shard || op.GetNodeId() != 4 || op.GetState() != "done" {
				continue
			}
			switch op.GetKind() {
			case "add-learner":
				added = op.GetFinishedUnixNanos()
			case "promote":
				promoted = op.GetStartedUnixNanos()
			}
		}
		if added == 0 || promoted == 0 {
			t.Logf("shard %d: the history lacks the learner's addition or promotion (a new placement leader?): %v", shard, hist.GetOperations())
			continue
		}
		gap := time.Duration(promoted - added)
		t.Logf("shard %d: the learner was promoted %v after it was added", shard, gap)
		best, moves = min(best, gap), moves+1
	}
	if moves == 0 {
		t.Fatal("no move could be timed")
	}
	if best >= within {
		t.Fatalf("the quickest of %d promotions came %v after its learner was added, want < %v", moves, best, within)
	}
}

// quorumWatch records every shard configuration the running nodes hold
// and checks that each kept a majority of its voters (of both halves of a
// joint configuration) on nodes that were running when it was seen.
type quorumWatch struct {
	mu         sync.Mutex
	configs    map[string]bool
	violations []string
}

func (w *quorumWatch) observe(c *testcluster.Cluster, running map[uint64]bool) {
	for id := range running {
		n := c.Node(id)
		if n == nil {
			continue
		}
		for _, r := range n.Store().Replicas() {
			sm := n.Shard(r.ShardID())
			if sm == nil {
				continue
			}
			d := sm.Descriptor()
			if d == nil {
				continue
			}
			key := fmt.Sprintf("%d/%d", d.GetShardId(), d.GetEpoch())
			w.mu.Lock()
			seen := w.configs[key]
			w.configs[key] = true
			w.mu.Unlock()
			if seen {
				continue
			}
			// incoming (new) and outgoing (old) voter sets.
			var in, out, inLive, outLive int
			for _, rd := range d.GetReplicas() {
				live := running[rd.GetNodeId()]
				switch rd.GetRole() {
				case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED:
					in, out = in+1, out+1
					if live {
						inLive, outLive = inLive+1, outLive+1
					}
				case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_INCOMING:
					in++
					if live {
						inLive++
					}
				case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING:
					out++
					if live {
						outLive++
					}
				}
			}
			if inLive <= in/2 || (out > 0 && outLive <= out/2) {
				w.mu.Lock()
				w.violations = append(w.violations, fmt.Sprintf("shard %d epoch %d: %v with nodes %v running", d.GetShardId(), d.GetEpoch(), d.GetReplicas(), running))
				w.mu.Unlock()
			}
		}
	}
}

// TestPlacementLeaderFailover kills the placement leader in the middle of
// a rebalance: another node takes over, replaces the dead node's replicas
// and finishes balancing, and no shard configuration ever seen lacked a
// quorum of running nodes.
func TestPlacementLeaderFailover(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: placementSplits, Configure: func(cfg *server.Config) {
		cfg.DeadNodeTimeout = 3 * time.Second
	}})
	w := &quorumWatch{configs: map[string]bool{}}
	var runMu sync.Mutex
	running := map[uint64]bool{1: true, 2: true, 3: true}
	snapshot := func() map[uint64]bool {
		runMu.Lock()
		defer runMu.Unlock()
		out := map[uint64]bool{}
		for k, v := range running {
			out[k] = v
		}
		return out
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !done.Load() {
			w.observe(c, snapshot())
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { done.Store(true); wg.Wait() }()
	stop := load(t, c)
	for i := 0; i < 2; i++ {
		id := c.AddNode()
		runMu.Lock()
		running[id] = true
		runMu.Unlock()
	}
	// Wait for the rebalance to be under way, then kill the placement leader.
	old := c.Leader(server.SystemShardID)
	waitFor(t, 30*time.Second, func() (bool, string) {
		hist, err := adminOf(t, c).PlacementHistory(context.Background(), &shalev1.PlacementHistoryRequest{})
		if err != nil {
			return false, err.Error()
		}
		moves := 0
		for _, op := range hist.GetOperations() {
			if strings.HasPrefix(op.GetReason(), "rebalance") {
				moves++
			}
		}
		return moves >= 2, fmt.Sprintf("%d rebalance moves so far", moves)
	})
	runMu.Lock()
	delete(running, old)
	runMu.Unlock()
	c.Stop(old)
	t.Logf("stopped node %d, the placement leader, mid-rebalance", old)
	took := waitFor(t, 120*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		if ok, why := fullyReplicated(dir, 3, old); !ok {
			return false, why
		}
		st, err := placementStatus(t, c)
		if err != nil {
			return false, err.Error()
		}
		if st.GetPlacementLeaderNodeId() == old {
			return false, "the old placement leader still answers"
		}
		return balancedWithin(st, 4)
	})
	t.Logf("the new placement leader repaired and balanced the cluster %v after the old one stopped", took)
	acked, failures := stop()
	t.Logf("%d writes acknowledged, %d requests failed (around the leader's death)", len(acked), len(failures))
	checkAcked(t, c, acked)
	done.Store(true)
	wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.violations) > 0 {
		t.Fatalf("configurations without a quorum of running nodes: %v", w.violations)
	}
	t.Logf("%d shard configurations seen, each with a quorum of running nodes", len(w.configs))
}
