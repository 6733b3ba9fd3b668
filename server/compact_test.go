package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server"
)

// TestNoCompactCommandsUntilEveryNodeReadsThem: while a node hosting one
// of a shard's replicas does not advertise compact commands (a node of an
// older version, here one with DisableCompactCommands), the shard's leader
// encodes a put as before (a Txn and a timestamp); once that node runs a
// version that reads them, as a put command without a timestamp. Puts
// before and after apply alike on every replica.
func TestNoCompactCommandsUntilEveryNodeReadsThem(t *testing.T) {
	var old atomic.Bool
	old.Store(true)
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.DisableCompactCommands = cfg.NodeID == 3 && old.Load()
	}})
	c.WaitLeaders(20 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := client.New(ctx, c.Endpoints(), client.WithDefaultTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(ctx, []byte("k0"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	var id uint64 // the one user shard
	for _, s := range c.ShardIDs() {
		if s != server.SystemShardID {
			id = s
		}
	}
	// encoded is the leader's encoding of a put on shard id.
	encoded := func() *shalev1.RaftCommand {
		t.Helper()
		cmd := &shalev1.RaftCommand{Epoch: 1, Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{Success: []*shalev1.RequestOp{
			{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte("k"), Value: []byte("v")}}}}}}}
		b, err := server.EncodeCommand(c.Node(c.Leader(id)), id, cmd)
		if err != nil {
			t.Fatal(err)
		}
		if cmd.GetTxn() == nil {
			t.Fatal("encodeCommand changed its command")
		}
		var got shalev1.RaftCommand
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		// cmd is left as the apply decodes the encoding (it goes to
		// ProposeFunc as the payload's decoded form): the wall clock in
		// full, no offset, the same transaction.
		wall := got.GetTimestampUnixNanos()
		if wall == 0 {
			wall = got.GetHlc().GetWallNanos() + got.GetWallOffsetNanos()
		}
		if cmd.GetTimestampUnixNanos() != wall || cmd.GetWallOffsetNanos() != 0 || !proto.Equal(cmd.GetHlc(), got.GetHlc()) {
			t.Fatalf("encodeCommand left its command dated %d (offset %d, hlc %v); its encoding's clock is %d (hlc %v)",
				cmd.GetTimestampUnixNanos(), cmd.GetWallOffsetNanos(), cmd.GetHlc(), wall, got.GetHlc())
		}
		if p := got.GetPut(); p != nil && !proto.Equal(p, cmd.GetTxn().GetSuccess()[0].GetPut()) {
			t.Fatalf("encodeCommand's put command %v is not its transaction's put %v", p, cmd.GetTxn())
		}
		return &got
	}
	put := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := cl.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v"), client.WithTTL(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // batches from every node arrived
	if cmd := encoded(); cmd.GetTxn() == nil || cmd.GetTimestampUnixNanos() == 0 {
		t.Fatalf("with node 3 not reading compact commands, a put was encoded as %v", cmd)
	}
	put(1, 20)

	// Node 3 is upgraded.
	old.Store(false)
	c.Stop(3)
	c.Restart(3)
	deadline := time.Now().Add(10 * time.Second)
	for {
		cmd := encoded()
		if cmd.GetPut() != nil && cmd.GetTimestampUnixNanos() == 0 && cmd.GetHlc() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with every node reading compact commands, a put is still encoded as %v", cmd)
		}
		time.Sleep(50 * time.Millisecond)
	}
	put(20, 40)

	// Every replica holds every key, alike.
	deadline = time.Now().Add(10 * time.Second)
	for i := 0; i < 40; i++ {
		k := fmt.Appendf(nil, "k%d", i)
		for {
			var kvs []*shalev1.KeyValue
			for _, n := range c.NodeIDs() {
				kv, _, err := c.Node(n).Shard(id).Get(k, time.Now().UnixNano())
				if err != nil {
					t.Fatal(err)
				}
				kvs = append(kvs, kv)
			}
			if kvs[0] != nil && proto.Equal(kvs[0], kvs[1]) && proto.Equal(kvs[0], kvs[2]) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %s on nodes %v: %v", k, c.NodeIDs(), kvs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
