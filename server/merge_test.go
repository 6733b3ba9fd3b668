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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// twoUserShards returns the descriptors of a cluster's two user shards, the
// one starting at the beginning of the key space (left) and the other,
// once the directory lists both.
func twoUserShards(t *testing.T, c *testcluster.Cluster) (left, right *shalev1.ShardDescriptor) {
	t.Helper()
	waitFor(t, 10*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, d := range dir {
			switch {
			case d.GetSystem():
			case len(d.GetStartKey()) == 0:
				left = d
			default:
				right = d
			}
		}
		return left != nil && right != nil, fmt.Sprintf("directory %v", dir)
	})
	return left, right
}

// mergeRetrying calls Admin.MergeShards until it succeeds, retrying its
// Unavailable answers (a leadership that moved under the forwarded call) as
// the SDK does, for up to 30 s (retryUnavailable).
func mergeRetrying(t *testing.T, a shalev1.AdminClient, req *shalev1.MergeShardsRequest) *shalev1.MergeShardsResponse {
	t.Helper()
	var resp *shalev1.MergeShardsResponse
	err := retryUnavailable(30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		resp, err = a.MergeShards(ctx, req)
		return err
	})
	if err != nil {
		t.Fatalf("merge %v: %v", req, err)
	}
	return resp
}

// TestMergeShards merges two shards by hand while clients write, and
// checks every record, the revision order, the directory, and that the
// merged-away shard stays gone after every node restarts.
func TestMergeShards(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	a := adminOf(t, c)
	ctx := context.Background()
	want := map[string]string{}
	var lastRev uint64
	for i := 0; i < 200; i++ {
		k := fmt.Sprintf("%c%03d", "am"[i%2], i)
		res, err := cl.Put(ctx, []byte(k), []byte("v"+k))
		if err != nil {
			t.Fatal(err)
		}
		want[k] = "v" + k
		lastRev = max(lastRev, res.Revision)
	}
	left, right := twoUserShards(t, c)
	stop := load(t, c)
	time.Sleep(300 * time.Millisecond)
	if _, err := a.MergeShards(ctx, &shalev1.MergeShardsRequest{Key: []byte("z")}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("merging the last shard: %v", err)
	}
	if _, err := a.MergeShards(ctx, &shalev1.MergeShardsRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("merge without a key: %v", err)
	}
	resp := mergeRetrying(t, a, &shalev1.MergeShardsRequest{Key: []byte("a"), ShardId: left.GetShardId()})
	time.Sleep(300 * time.Millisecond)
	acked, failures := stop()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed during the merge, first: %s", len(failures), failures[0])
	}
	m := resp.GetMerged()
	if m.GetShardId() != left.GetShardId() || len(m.GetStartKey()) != 0 || len(m.GetEndKey()) != 0 || resp.GetRemovedShardId() != right.GetShardId() ||
		m.GetEpoch() <= max(left.GetEpoch(), right.GetEpoch()) {
		t.Fatalf("merged %v, removed %d; left %v, right %v", m, resp.GetRemovedShardId(), left, right)
	}
	for k, v := range acked {
		want[k] = v
	}
	check := func() {
		t.Helper()
		waitFor(t, 30*time.Second, func() (bool, string) {
			for _, id := range c.NodeIDs() {
				if c.Node(id).Store().Replica(right.GetShardId()) != nil {
					return false, fmt.Sprintf("node %d still hosts shard %d", id, right.GetShardId())
				}
			}
			dir, err := directory(t, c)
			if err != nil {
				return false, err.Error()
			}
			users := 0
			for _, d := range dir {
				if !d.GetSystem() {
					users++
				}
			}
			return users == 1, fmt.Sprintf("directory: %v", dir)
		})
		cl := newClient(t, c)
		for k, v := range want {
			kv, err := cl.Get(ctx, []byte(k))
			if err != nil || kv == nil || string(kv.Value) != v {
				t.Fatalf("%s: %v, %v; want %s", k, kv, err, v)
			}
		}
		n := 0
		it := cl.Scan(ctx, nil, nil)
		for it.Next() {
			n++
		}
		if it.Err() != nil || n != len(want) {
			t.Fatalf("scan: %d keys, %v; want %d", n, it.Err(), len(want))
		}
	}
	check()
	// Revisions keep increasing across the merge.
	res, err := cl.Put(ctx, []byte("zz-after"), []byte("x"))
	if err != nil || res.Revision <= lastRev {
		t.Fatalf("put after the merge: revision %v (before: %d), %v", res, lastRev, err)
	}
	want["zz-after"] = "x"
	// Restart every node: the merged-away shard does not come back.
	for _, id := range c.NodeIDs() {
		c.Stop(id)
	}
	for _, id := range []uint64{1, 2, 3} {
		c.Restart(id)
	}
	c.WaitLeaders(30 * time.Second)
	check()
}

// TestAutomaticMerge: two shards made by an automatic split merge back once
// they are small and quiet; a manual split's boundary stays.
func TestAutomaticMerge(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.MergeSizeBytes = 64 << 20
		cfg.MergeDelay = time.Second
		cfg.SplitSizeBytes = -1
	}})
	a := adminOf(t, c)
	ctx := context.Background()
	cl := newClient(t, c)
	for _, k := range []string{"a", "h", "p", "x"} {
		if _, err := cl.Put(ctx, []byte(k), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for _, req := range []*shalev1.SplitShardRequest{{SplitKey: []byte("g")}, {SplitKey: []byte("n"), Automatic: true}} {
		waitFor(t, 10*time.Second, func() (bool, string) {
			_, err := a.SplitShard(ctx, req)
			return err == nil, fmt.Sprint(err)
		})
	}
	// The automatic boundary at "n" goes; the manual one at "g" stays.
	waitFor(t, 60*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		var starts []string
		for _, d := range dir {
			if !d.GetSystem() {
				starts = append(starts, string(d.GetStartKey()))
			}
		}
		return fmt.Sprint(starts) == "[ g]", fmt.Sprintf("shard starts %q", starts)
	})
	for _, k := range []string{"a", "h", "p", "x"} {
		if kv, err := cl.Get(ctx, []byte(k)); err != nil || kv == nil {
			shards, _ := cl.Routing()
			var routes []string
			for _, r := range shards {
				d := r.GetDescriptor_()
				routes = append(routes, fmt.Sprintf("%d [%q, %q) leader %d", d.GetShardId(), d.GetStartKey(), d.GetEndKey(), r.GetLeaderNodeId()))
			}
			t.Fatalf("%s after the merge: %v, %v (the client's routing: %s)", k, kv, err, strings.Join(routes, "; "))
		}
	}
}

// TestMergeWhileLeadershipMoves merges two shards while the right shard's
// leadership is moved from node to node: every merge step takes the
// leadership back and retries a proposal refused for want of it.
func TestMergeWhileLeadershipMoves(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	a := adminOf(t, c)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "m", "x"} {
		if _, err := cl.Put(ctx, []byte(k), []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
	}
	var rightID uint64
	waitFor(t, 10*time.Second, func() (bool, string) {
		dir, err := directory(t, c)
		if err != nil {
			return false, err.Error()
		}
		for _, d := range dir {
			if !d.GetSystem() && string(d.GetStartKey()) == "m" {
				rightID = d.GetShardId()
			}
		}
		return rightID != 0, fmt.Sprintf("directory %v", dir)
	})
	done := make(chan struct{})
	moved := make(chan int)
	go func() {
		n := 0
		defer func() { moved <- n }()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := a.TransferLeader(tctx, &shalev1.TransferLeaderRequest{ShardId: rightID, TargetNodeId: uint64(i%3 + 1)})
			cancel()
			if err == nil {
				n++
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	resp, err := a.MergeShards(ctx, &shalev1.MergeShardsRequest{Key: []byte("a")})
	close(done)
	n := <-moved
	if err != nil {
		t.Fatalf("merge while the right shard's leadership moved %d times: %v", n, err)
	}
	t.Logf("moved %d times", n)
	if n == 0 || resp.GetRemovedShardId() != rightID || len(resp.GetMerged().GetEndKey()) != 0 {
		t.Fatalf("merged %v, removed %d (want %d); the leadership moved %d times", resp.GetMerged(), resp.GetRemovedShardId(), rightID, n)
	}
	for _, k := range []string{"a", "b", "m", "x"} {
		if kv, err := cl.Get(ctx, []byte(k)); err != nil || kv == nil || string(kv.Value) != "v"+k {
			t.Fatalf("%s after the merge: %v, %v", k, kv, err)
		}
	}
}

// TestRequestIDAcrossLeaderChangeAndMerge sends writes with the
// application's own request ID (client.WithRequestID), then sends each
// again as an application does after a timeout: once after the shard's
// leadership moved, once after the shard was merged into its left
// neighbour. Each applies once: the repeat returns the first revision and
// the key keeps version 1.
func TestRequestIDAcrossLeaderChangeAndMerge(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	a := adminOf(t, c)
	ctx := context.Background()
	sendTwice := func(key string, id []byte, between func()) {
		t.Helper()
		first, err := cl.Put(ctx, []byte(key), []byte("v"), client.WithRequestID(id))
		if err != nil {
			t.Fatal(err)
		}
		between()
		again, err := cl.Put(ctx, []byte(key), []byte("v"), client.WithRequestID(id))
		if err != nil {
			t.Fatal(err)
		}
		kv, err := cl.Get(ctx, []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if again.Revision != first.Revision || kv.Version != 1 || kv.ModRevision != first.Revision {
			t.Fatalf("%s sent twice with one request ID: revisions %d then %d, key at version %d revision %d; want it applied once",
				key, first.Revision, again.Revision, kv.Version, kv.ModRevision)
		}
	}
	left, right := twoUserShards(t, c)

	sendTwice("n-leader", []byte("app-request-0001"), func() {
		from := c.Leader(right.GetShardId())
		to := from%3 + 1
		c.MoveLeader(right.GetShardId(), to, 20*time.Second)
	})
	sendTwice("n-merge", []byte("app-request-0002"), func() {
		mergeRetrying(t, a, &shalev1.MergeShardsRequest{Key: []byte("a"), ShardId: left.GetShardId()})
	})
	// The first write, whose ID the right shard's table held before the
	// merge, is still known to the merged shard.
	sendTwice("n-leader", []byte("app-request-0001"), func() {})
}

// TestAutomaticMergeWaitsAfterAnySplit: the wait between an automatic split
// and an automatic merge of its halves holds on every node, not only the
// one that split: here both halves are then led by another node, which has
// no record of the split but for the date the split replicated in the
// descriptors. (Before, that node merged them back within a second.)
func TestAutomaticMergeWaitsAfterAnySplit(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.MergeSizeBytes = 64 << 20
		cfg.MergeDelay = time.Minute
		cfg.SplitSizeBytes = -1
		cfg.SplitQPS = -1
	}})
	a := adminOf(t, c)
	ctx := context.Background()
	cl := newClient(t, c)
	for _, k := range []string{"a", "x"} {
		if _, err := cl.Put(ctx, []byte(k), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	before := time.Now()
	var resp *shalev1.SplitShardResponse
	waitFor(t, 10*time.Second, func() (bool, string) {
		var err error
		resp, err = a.SplitShard(ctx, &shalev1.SplitShardRequest{SplitKey: []byte("n"), Automatic: true})
		return err == nil, fmt.Sprint(err)
	})
	for _, d := range []*shalev1.ShardDescriptor{resp.GetLeft(), resp.GetRight()} {
		if at := time.Unix(0, d.GetRangeChangedUnixNanos()); at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
			t.Errorf("shard %d: range changed at %v, not at the split (%v)", d.GetShardId(), at, before)
		}
	}
	splitter := c.Leader(resp.GetLeft().GetShardId())
	other := splitter%3 + 1
	for _, id := range []uint64{resp.GetLeft().GetShardId(), resp.GetRight().GetShardId()} {
		c.MoveLeader(id, other, 20*time.Second)
	}
	// Several maintenance rounds (one a second) of the node leading both.
	time.Sleep(5 * time.Second)
	dir, err := directory(t, c)
	if err != nil {
		t.Fatal(err)
	}
	user := 0
	for _, d := range dir {
		if !d.GetSystem() {
			user++
		}
	}
	if user != 2 {
		t.Errorf("%d user shards 5 s after an automatic split (merge delay 1 min), want the split's 2", user)
	}
}

// TestAutomaticMergeCountsLoadLedElsewhere: the load guard of automatic
// merges counts the right shard's requests as its leader measures them,
// also when another node leads it (before, it counted as quiet there, and
// the halves of a load split merged back under load); once the load stops
// the halves merge.
func TestAutomaticMergeCountsLoadLedElsewhere(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.MergeSizeBytes = 64 << 20
		cfg.MergeDelay = 4 * time.Second // passes while the load runs
		cfg.SplitSizeBytes = -1
		cfg.SplitQPS = 60 // the writers' 45/s: above half, below a load split
	}})
	a := adminOf(t, c)
	ctx := context.Background()
	cl := newClient(t, c)
	var resp *shalev1.SplitShardResponse
	waitFor(t, 10*time.Second, func() (bool, string) {
		var err error
		resp, err = a.SplitShard(ctx, &shalev1.SplitShardRequest{SplitKey: []byte("n"), Automatic: true})
		return err == nil, fmt.Sprint(err)
	})
	splitAt := time.Now()
	left, right := resp.GetLeft().GetShardId(), resp.GetRight().GetShardId()
	// 45 writes a second to the right shard from now on, started on a
	// ticker so that slow puts (the race detector, a loaded machine) do
	// not lower the rate.
	wctx, stop := context.WithCancel(ctx)
	// The ticker goroutine counts in writers too, so that its Adds never
	// race the Wait (the race detector reported it), and nothing outlives
	// the test on a failure.
	var writers sync.WaitGroup
	defer writers.Wait()
	defer stop()
	var writeErr atomic.Value
	writers.Add(1)
	go func() {
		defer writers.Done()
		tick := time.NewTicker(time.Second / 45)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			writers.Add(1)
			go func() {
				defer writers.Done()
				if _, err := cl.Put(wctx, []byte(fmt.Sprintf("x%04d", i)), []byte("v")); err != nil && wctx.Err() == nil {
					writeErr.Store(err)
				}
			}()
		}
	}()
	other := c.Leader(left)%3 + 1
	c.MoveLeader(right, other, 20*time.Second)
	// merged reports whether the directory shows the left shard past the
	// split's epoch and reaching the end of the key space: it absorbed the
	// right. (Just after the split the directory may still list the
	// pre-split shard, at the split's epoch or below.)
	merged := func() bool {
		dir, err := directory(t, c)
		if err != nil {
			return false
		}
		for _, d := range dir {
			if d.GetShardId() == left && d.GetEpoch() > resp.GetLeft().GetEpoch() && len(d.GetEndKey()) == 0 {
				return true
			}
		}
		return false
	}
	// Until 10 s after the split (the merge delay passed 6 s ago), with
	// the right shard led by another node than the left's: no merge.
	for time.Since(splitAt) < 10*time.Second {
		if merged() {
			t.Fatalf("the shards merged %v after the split while the right one served 45 requests a second (merge guard: 30)",
				time.Since(splitAt).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	writers.Wait()
	if err, _ := writeErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	// Quiet now: they merge.
	waitFor(t, 30*time.Second, func() (bool, string) {
		return merged(), "the shards did not merge after the load stopped"
	})
}

// TestMergeDrivenByTwoNodesAtOnce: one node's copy of a merge is paused
// after its first chunk while another node, taking the left shard's
// leadership, begins its own copy of the same merge (as the left's new
// leader finishes a merge it finds interrupted). When the first resumes,
// its later chunks and commit are refused (Aborted) and it waits for the
// other to finish: every record of the right shard is in the merged one.
// Before merge attempts (chaos/README bug 28), the first driver's commit
// took the range with only the chunks sent after the other's begin had
// cleared it, and the keys of the first chunk read as absent.
func TestMergeDrivenByTwoNodesAtOnce(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx := context.Background()
	left, _ := twoUserShards(t, c)
	// 1.5 MB on the right: three chunks of up to 512 KiB.
	const keys = 48
	value := func(i int) []byte { return []byte(strings.Repeat(fmt.Sprintf("%05d", i), 32<<10/5)) }
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < keys; i += 4 {
				if _, err := cl.Put(ctx, []byte(fmt.Sprintf("r/%05d", i)), value(i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	idA := c.Leader(left.GetShardId())
	idB := idA%3 + 1
	nodeA, nodeB := c.Node(idA), c.Node(idB)

	aPaused, bBegan, aStepped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var aCalls atomic.Int32
	var aAfterB error // the outcome of A's first step after B's begin
	nodeA.SetMergeStepHook(func(step string, err error) {
		switch aCalls.Add(1) {
		case 2: // A's first chunk of records
			if step != "records" || err != nil {
				t.Errorf("node %d's second merge step: %s, %v; want records applied", idA, step, err)
			}
			close(aPaused)
			select {
			case <-bBegan:
			case <-time.After(30 * time.Second):
				t.Errorf("node %d never began its copy", idB)
			}
		case 3:
			aAfterB = err
			close(aStepped)
		}
	})
	var bCalls atomic.Int32
	nodeB.SetMergeStepHook(func(step string, err error) {
		if bCalls.Add(1) != 1 {
			return
		}
		if step != "begin" || err != nil {
			t.Errorf("node %d's first merge step: %s, %v; want begin applied", idB, step, err)
		}
		close(bBegan)
		select {
		case <-aStepped:
		case <-time.After(30 * time.Second):
			t.Errorf("node %d's copy never resumed", idA)
		}
	})

	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errs := make(chan error, 2)
	go func() {
		_, err := server.MergeShardsHere(nodeA, mctx, left.GetShardId())
		errs <- err
	}()
	select {
	case <-aPaused:
	case <-mctx.Done():
		t.Fatalf("node %d's copy never reached its first chunk", idA)
	}
	go func() {
		_, err := server.MergeShardsHere(nodeB, mctx, left.GetShardId())
		errs <- err
	}()
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Errorf("a driver of the merge: %v", err)
		}
	}
	if status.Code(aAfterB) != codes.Aborted {
		t.Errorf("node %d's step after node %d's begin: %v; want Aborted", idA, idB, aAfterB)
	}
	var lost []string
	for i := 0; i < keys; i++ {
		k := fmt.Sprintf("r/%05d", i)
		kv, err := cl.Get(ctx, []byte(k))
		switch {
		case err != nil && !errors.Is(err, client.ErrNotFound):
			t.Fatalf("get %s: %v", k, err)
		case kv == nil || string(kv.Value) != string(value(i)):
			lost = append(lost, k)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d keys of the right shard lost by the merge: %v", len(lost), keys, lost)
	}
}

// TestMergeFinishedWhenTheLeftLeaderLacksTheRight: a merge whose driver
// stopped after freezing the right shard is finished by the nodes'
// maintenance, also when the left shard's leader hosts no replica of the
// right one (the left moved a replica, and its leadership with it, before
// the freeze): a node hosting both takes the left's leadership and
// finishes it. Before, only the left's leader looked for frozen shards to
// finish, and it could not copy from a shard it did not host: the right
// shard stayed frozen, refusing writes, for good (chaos/README bug 29).
func TestMergeFinishedWhenTheLeftLeaderLacksTheRight(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx := context.Background()
	for _, k := range []string{"a", "m", "x"} {
		if _, err := cl.Put(ctx, []byte(k), []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
	}
	var left, right *shalev1.ShardDescriptor
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := placementStatus(t, c)
		if err != nil || !st.GetBalanced() {
			return false, fmt.Sprintf("%v %v", st, err)
		}
		left, right = twoUserShards(t, c)
		return true, ""
	})
	hosts := func(d *shalev1.ShardDescriptor, id uint64) bool {
		for _, rd := range d.GetReplicas() {
			if rd.GetNodeId() == id {
				return true
			}
		}
		return false
	}
	// to: a node with a replica of the left and none of the right, made
	// by moving a left replica there when the two share their nodes.
	var to uint64
	for _, id := range c.NodeIDs() {
		if hosts(left, id) && !hosts(right, id) {
			to = id
		}
	}
	if to == 0 {
		var from uint64
		for _, id := range c.NodeIDs() {
			if hosts(left, id) {
				from = id
			} else {
				to = id
			}
		}
		a := adminOf(t, c)
		// The new node is live for placement once its heartbeats arrive.
		waitFor(t, 30*time.Second, func() (bool, string) {
			_, err := a.MoveReplica(ctx, &shalev1.MoveReplicaRequest{ShardId: left.GetShardId(), FromNodeId: from, ToNodeId: to, PinSeconds: 600})
			return err == nil, fmt.Sprint(err)
		})
		waitFor(t, 30*time.Second, func() (bool, string) { return movedTo(t, c, left.GetShardId(), from, to) })
	}
	if _, err := cl.TransferLeader(ctx, left.GetShardId(), to); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() (bool, string) {
		l := c.Leader(left.GetShardId())
		return l == to, fmt.Sprintf("shard %d led by node %d, want %d", left.GetShardId(), l, to)
	})
	if c.Node(to).Shard(right.GetShardId()) != nil {
		t.Fatalf("node %d hosts shard %d; the test needs a left leader without it", to, right.GetShardId())
	}
	var withRight uint64
	for _, rd := range right.GetReplicas() {
		withRight = rd.GetNodeId()
	}
	if err := server.FreezeForMerge(c.Node(withRight), ctx, right.GetShardId(), left.GetShardId()); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 30*time.Second, func() (bool, string) {
		// The finishing node takes the left's leadership: no leader for a moment.
		s := c.LeaderShard(left.GetShardId())
		if s == nil {
			return false, fmt.Sprintf("shard %d has no leader", left.GetShardId())
		}
		d := s.Descriptor()
		return len(d.GetEndKey()) == 0, fmt.Sprintf("shard %d is %v", left.GetShardId(), d)
	})
	t.Logf("the frozen shard was absorbed %v after the freeze", took)
	for _, k := range []string{"a", "m", "x"} {
		if kv, err := cl.Get(ctx, []byte(k)); err != nil || kv == nil || string(kv.Value) != "v"+k {
			t.Fatalf("%s after the merge: %v, %v", k, kv, err)
		}
	}
	if _, err := cl.Put(ctx, []byte("y"), []byte("vy")); err != nil {
		t.Fatalf("a write to the right shard's range after the merge: %v", err)
	}
}
