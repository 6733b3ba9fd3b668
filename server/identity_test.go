package server_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// TestCallForAnotherNodeRefused: a call naming another node in its
// metadata is refused with Unavailable and a WRONG_NODE ErrorInfo; one
// naming the node that gets it, or none, is served; a malformed one is
// InvalidArgument.
func TestCallForAnotherNodeRefused(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	id := c.NodeIDs()[0]
	kv := rawKV(t, c.Node(id).Addr())
	req := &shalev1.GetRequest{Key: []byte("k"), Header: &shalev1.RequestHeader{Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_STALE}}
	call := func(target string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if target != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, shalev1.TargetNodeMetadataKey, target)
		}
		_, err := kv.Get(ctx, req)
		return err
	}
	other := strconv.FormatUint(id+100, 10)
	err := call(other)
	st := status.Convert(err)
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if v, ok := d.(*errdetails.ErrorInfo); ok {
			info = v
		}
	}
	if st.Code() != codes.Unavailable || info.GetReason() != shalev1.ReasonWrongNode || info.GetDomain() != shalev1.ErrorDomain ||
		info.GetMetadata()["target_node_id"] != other || info.GetMetadata()["node_id"] != strconv.FormatUint(id, 10) {
		t.Fatalf("call for node %s on node %d: %v (details %v), want Unavailable with a WRONG_NODE ErrorInfo", other, id, err, info)
	}
	if err := call("x1"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("malformed target: %v, want InvalidArgument", err)
	}
	for _, target := range []string{strconv.FormatUint(id, 10), ""} {
		if err := call(target); status.Code(err) == codes.Unavailable || status.Code(err) == codes.InvalidArgument {
			t.Fatalf("call for node %q on node %d refused: %v", target, id, err)
		}
	}
}

// TestClientRedialsAddressThatReachedAnotherNode is the reused-address
// case (a restarted pod or container given an address another node had):
// the client's connection for the leader's address reaches a follower
// instead, which without the check answers "not the leader; the leader is
// at <that address>" for as long as the connection lives. The follower
// refuses the calls meant for the leader, the client drops the connection
// and dials again, and once the address leads to the leader the writes
// succeed.
func TestClientRedialsAddressThatReachedAnotherNode(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	key := []byte("k")
	sid := shardOf(t, c, key)
	leader := c.Leader(sid)
	var follower uint64
	for _, id := range c.NodeIDs() {
		if id != leader {
			follower = id
			break
		}
	}
	leaderAddr, followerAddr := c.Node(leader).Addr(), c.Node(follower).Addr()

	var (
		mu          sync.Mutex
		misroute    = map[string]string{leaderAddr: followerAddr} // the leader's address reaches the follower
		leaderDials int
	)
	var d net.Dialer
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		to, ok := misroute[addr]
		if addr == leaderAddr {
			leaderDials++
		}
		mu.Unlock()
		if !ok {
			to = addr
		}
		return d.DialContext(ctx, "tcp", to)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := client.New(ctx, []string{followerAddr}, client.WithDialOptions(
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// While the address is wrong the writes fail, and every refusal makes
	// the client dial the address again.
	waitFor(t, 15*time.Second, func() (bool, string) {
		pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := cl.Put(pctx, key, []byte("while misrouted"))
		pcancel()
		mu.Lock()
		defer mu.Unlock()
		return leaderDials >= 2, "leader address dialed " + strconv.Itoa(leaderDials) + " times; last put: " + errString(err)
	})
	mu.Lock()
	delete(misroute, leaderAddr)
	mu.Unlock()
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	if _, err := cl.Put(pctx, key, []byte("v")); err != nil {
		t.Fatalf("put after the address was right again: %v", err)
	}
	kv, err := cl.Get(pctx, key)
	if err != nil || string(kv.Value) != "v" {
		t.Fatalf("get: %+v %v", kv, err)
	}
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
