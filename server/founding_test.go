package server_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/internal/freeport"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// TestFoundingCampaignsAtOnce: a founding cluster's shards get their
// leaders without waiting out an election timeout. The timeout here is
// 10 s (500 ticks of 20 ms; Raft's randomized timeout is 10-20 s), and
// every shard has a leader well before it: the replica first in each shard's
// descriptor campaigns as soon as its node runs. Only that replica
// campaigns, so each shard is led by it after a single election (the
// term one past the bootstrap's, no election storm).
func TestFoundingCampaignsAtOnce(t *testing.T) {
	const ticks = 500
	tick := 20 * time.Millisecond
	start := time.Now()
	c := testcluster.Start(t, testcluster.Options{
		Splits:       [][]byte{[]byte("g"), []byte("p")},
		TickInterval: tick,
		Configure:    func(cfg *server.Config) { cfg.ElectionTicks = ticks },
	})
	took := time.Since(start)
	if timeout := ticks * tick; took >= timeout {
		t.Fatalf("every shard had a leader %v after the founding nodes' start, not before the election timeout %v", took, timeout)
	}
	shards := c.ShardIDs()
	if len(shards) != 4 {
		t.Fatalf("shards %v, want the system shard and 3 user shards", shards)
	}
	for _, id := range shards {
		var first uint64
		for _, nid := range c.NodeIDs() {
			if s := c.Node(nid).Shard(id); s != nil {
				first = s.Descriptor().GetReplicas()[0].GetNodeId()
			}
		}
		leader := c.Leader(id)
		if leader != first {
			t.Errorf("shard %d is led by node %d, not node %d, first in its descriptor", id, leader, first)
		}
		for _, nid := range c.NodeIDs() {
			r := c.Node(nid).Store().Replica(id)
			if r == nil {
				continue
			}
			// A follower may not have heard of the election yet.
			if st := r.Status(); st.Term > replication.InitialTerm+1 || st.Leader && st.Term != replication.InitialTerm+1 {
				t.Errorf("shard %d on node %d: term %d (leader %v), want %d (one election)", id, nid, st.Term, st.Leader, replication.InitialTerm+1)
			}
		}
	}
	t.Logf("leaders of %d shards %v after the founding nodes' start (election timeout %v)", len(shards), took, ticks*tick)
}

// TestFoundingNodeRefusesUntilServing: a founding node accepts no
// connection while it creates its shards (for seconds when it restores them
// from a backup), so a peer asking it whether the cluster already ran (the
// founding check every node makes) is refused at once instead of waiting
// out its 2 s timeout on a listener nobody serves. The node's file system
// holds its first shard write until the test has asked.
func TestFoundingNodeRefusesUntilServing(t *testing.T) {
	ports, err := freeport.Ports(2)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	dir := t.TempDir()
	shards := filepath.Join(dir, "shards") + string(filepath.Separator)
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(_ errorfs.Op, path string) error {
		if strings.HasPrefix(path, shards) {
			once.Do(func() { close(reached) })
			<-release
		}
		return nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type started struct {
		n   *server.Node
		err error
	}
	done := make(chan started, 1)
	go func() {
		// Node 2 never runs: node 1's own founding check is refused at once.
		n, err := server.Start(ctx, server.Config{DataDir: dir, NodeID: 1, ListenAddr: addr, FS: fs,
			InitialCluster: map[uint64]string{1: addr, 2: fmt.Sprintf("127.0.0.1:%d", ports[1])}, Logger: testcluster.Logger()})
		done <- started{n, err}
	}()
	select {
	case <-reached:
	case s := <-done:
		t.Fatalf("the node started (%v) without writing its shards", s.err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 2*time.Second)
	asked := time.Now()
	_, err = shalev1.NewAdminClient(conn).GetRouting(actx, &shalev1.GetRoutingRequest{})
	took := time.Since(asked)
	acancel()
	_ = conn.Close()
	close(release)
	if status.Code(err) != codes.Unavailable || took > time.Second {
		t.Errorf("a peer asking the founding node while it created its shards got %v after %v; want Unavailable (connection refused) at once", err, took)
	}
	s := <-done
	if s.err != nil {
		t.Fatalf("start: %v", s.err)
	}
	s.n.Stop()
}
