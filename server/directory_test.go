package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// TestShardDirectory checks that the system shard's directory follows the
// shards: the bootstrapped ones, then both halves of a split with their
// new epochs, readable through any node.
func TestShardDirectory(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// directory renders the directory as read through node id.
	directory := func(id uint64) (string, error) {
		conn, err := grpc.NewClient(c.Node(id).Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		resp, err := shalev1.NewAdminClient(conn).ShardDirectory(ctx, &shalev1.ShardDirectoryRequest{})
		if err != nil {
			return "", err
		}
		var parts []string
		for _, d := range resp.GetShards() {
			parts = append(parts, fmt.Sprintf("%d[%s,%s)e%d/%d", d.GetShardId(), d.GetStartKey(), d.GetEndKey(), d.GetEpoch(), len(d.GetReplicas())))
		}
		return strings.Join(parts, " "), nil
	}
	waitFor := func(want string) {
		t.Helper()
		var got string
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			ok := true
			for _, id := range c.NodeIDs() {
				got, err = directory(id)
				ok = ok && err == nil && got == want
			}
			if ok {
				return
			}
		}
		t.Fatalf("directory: %q (%v), want %q", got, err, want)
	}
	waitFor("1[,)e1/3 2[,m)e1/3 3[m,)e1/3")
	_, right, err := cl.SplitShard(ctx, []byte("t"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(fmt.Sprintf("1[,)e1/3 2[,m)e1/3 3[m,t)e2/3 %d[t,)e2/3", right.GetShardId()))
}

// TestListingsIncludeDirectoryShards checks that a shard no live node
// reports (its only replica is down) still appears in ListShards and in
// the clients' routing, from the shard directory, with no leader.
func TestListingsIncludeDirectoryShards(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}, Configure: func(cfg *server.Config) {
		cfg.ReplicationFactor = 1 // shard 3, [m, max), lives on node 2 alone
	}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listed := func() map[uint64]uint64 { // shard → leader node
		t.Helper()
		shards, err := cl.ListShards(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint64]uint64{}
		for _, s := range shards {
			out[s.GetDescriptor_().GetShardId()] = s.GetLeaderNodeId()
		}
		return out
	}
	// Wait until the directory has shard 3 (its leader reports it within a
	// second or so).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		conn, err := grpc.NewClient(c.Node(1).Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := shalev1.NewAdminClient(conn).ShardDirectory(ctx, &shalev1.ShardDirectoryRequest{})
		conn.Close()
		if err == nil && len(resp.GetShards()) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("directory never listed 3 shards: %v %v", resp, err)
		}
	}
	c.Stop(2)
	got := listed()
	if leader, ok := got[3]; !ok || leader != 0 {
		t.Fatalf("with node 2 down, ListShards = %v; want shard 3 listed without a leader", got)
	}
	if got[1] == 0 || got[2] == 0 {
		t.Fatalf("shards 1 and 2 lost their leaders: %v", got)
	}
}
