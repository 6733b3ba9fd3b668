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
