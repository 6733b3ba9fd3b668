package client

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// invokeAdmin runs an Admin request on any node: the node that answered
// last, then the endpoints, then every known node. NotLeader with a hint
// sends it to the hinted node at once; Unavailable moves to the next node
// after a backoff, and so does an attempt timeout for read-only requests
// (a mutation that timed out may have applied, so its error is returned).
func (c *Client) invokeAdmin(ctx context.Context, op string, mutation bool, fn func(ctx context.Context, a shalev1.AdminClient) error) error {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	addrs := c.adminAddrs()
	var (
		last      error
		next      int
		nback     int
		immediate int
		override  string
	)
	retry := func() bool {
		immediate = 0
		nback++
		return sleep(ctx, c.backoff(nback))
	}
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return c.stopped(ctx, op, last)
		}
		if c.opts.maxAttempts > 0 && attempt > c.opts.maxAttempts {
			return &retryError{op: op, reason: errAttempts, last: last}
		}
		addr := override
		override = ""
		if addr == "" {
			addr = addrs[next%len(addrs)]
		}
		cc, err := c.conn(addr)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return err
			}
			last = err
			next++
			if !retry() {
				return c.stopped(ctx, op, last)
			}
			continue
		}
		actx, acancel := c.attemptContext(ctx)
		err = fn(actx, shalev1.NewAdminClient(cc))
		acancel()
		if err == nil {
			c.rt.mu.Lock()
			c.rt.lastGood = addr
			c.rt.mu.Unlock()
			return nil
		}
		if c.isClosed() {
			return ErrClosed
		}
		st := status.Convert(err)
		if callOver(ctx) {
			if last == nil || !ctxCode(st.Code()) {
				last = typed(err)
			}
			return c.stopped(ctx, op, last)
		}
		last = typed(err)
		d := statusDetails(st)
		switch {
		case d.notLeader != nil:
			hint := d.notLeader.GetLeaderAddress()
			if hint == "" {
				hint = c.rt.addr(d.notLeader.GetLeaderNodeId())
			}
			if hint != "" && hint != addr && immediate < maxImmediate {
				immediate++
				override = hint
				continue
			}
			override = hint
			if hint == "" {
				next++
			}
			if !retry() {
				return c.stopped(ctx, op, last)
			}
		case st.Code() == codes.ResourceExhausted:
			if !retry() {
				return c.stopped(ctx, op, last)
			}
		case st.Code() == codes.Unavailable, !mutation && (st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled):
			next++
			if !retry() {
				return c.stopped(ctx, op, last)
			}
		default:
			return last
		}
	}
}

// ClusterStatus reports every node with its liveness and every shard with
// its replicas, leader, applied index and size.
func (c *Client) ClusterStatus(ctx context.Context) (*shalev1.ClusterStatusResponse, error) {
	var resp *shalev1.ClusterStatusResponse
	err := c.invokeAdmin(ctx, "cluster-status", false, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.ClusterStatus(ctx, &shalev1.ClusterStatusRequest{})
		return err
	})
	return resp, wrapOp("cluster-status", err)
}

// ListNodes lists the cluster's nodes with their status.
func (c *Client) ListNodes(ctx context.Context) ([]*shalev1.NodeStatus, error) {
	var resp *shalev1.ListNodesResponse
	err := c.invokeAdmin(ctx, "list-nodes", false, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.ListNodes(ctx, &shalev1.ListNodesRequest{})
		return err
	})
	return resp.GetNodes(), wrapOp("list-nodes", err)
}

// AddNode registers the node at address (its advertised host:port) in zone
// ("" for none) and returns its descriptor, the cluster ID and the
// cluster's nodes. It is retried only on errors that mean it was not
// applied (Unavailable, NotLeader).
func (c *Client) AddNode(ctx context.Context, address, zone string) (*shalev1.AddNodeResponse, error) {
	var resp *shalev1.AddNodeResponse
	err := c.invokeAdmin(ctx, "add-node", true, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.AddNode(ctx, &shalev1.AddNodeRequest{Address: address, Zone: zone})
		return err
	})
	if err != nil {
		return nil, wrapOp("add-node", err)
	}
	return resp, nil
}

// RemoveNode moves the node's replicas away and removes it from the
// cluster. It returns once the server accepted the removal.
func (c *Client) RemoveNode(ctx context.Context, nodeID uint64) error {
	err := c.invokeAdmin(ctx, "remove-node", true, func(ctx context.Context, a shalev1.AdminClient) error {
		_, err := a.RemoveNode(ctx, &shalev1.RemoveNodeRequest{NodeId: nodeID})
		return err
	})
	return wrapOp("remove-node", err)
}

// ListShards lists the shards with their status.
func (c *Client) ListShards(ctx context.Context) ([]*shalev1.ShardStatus, error) {
	var resp *shalev1.ListShardsResponse
	err := c.invokeAdmin(ctx, "list-shards", false, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.ListShards(ctx, &shalev1.ListShardsRequest{})
		return err
	})
	return resp.GetShards(), wrapOp("list-shards", err)
}

// ShardDirectory returns the shard directory: every shard's descriptor as
// the system shard records it (the system shard first, then by start key).
// It may trail a split or membership change by about a second.
func (c *Client) ShardDirectory(ctx context.Context) ([]*shalev1.ShardDescriptor, error) {
	var resp *shalev1.ShardDirectoryResponse
	err := c.invokeAdmin(ctx, "shard-directory", false, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.ShardDirectory(ctx, &shalev1.ShardDirectoryRequest{})
		return err
	})
	return resp.GetShards(), wrapOp("shard-directory", err)
}

// ShardInfo reports one shard's status. An unknown shard is a gRPC
// NotFound error (status.Code(err) == codes.NotFound).
func (c *Client) ShardInfo(ctx context.Context, shardID uint64) (*shalev1.ShardStatus, error) {
	var resp *shalev1.ShardInfoResponse
	err := c.invokeAdmin(ctx, "shard-info", false, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.ShardInfo(ctx, &shalev1.ShardInfoRequest{ShardId: shardID})
		return err
	})
	if err != nil {
		return nil, wrapOp("shard-info", err)
	}
	return resp.GetShard(), nil
}

// TransferLeader moves the leadership of a shard to its replica on
// targetNodeID and returns the leader the server reports afterwards; the
// client's routing follows.
func (c *Client) TransferLeader(ctx context.Context, shardID, targetNodeID uint64) (uint64, error) {
	var resp *shalev1.TransferLeaderResponse
	err := c.invokeAdmin(ctx, "transfer-leader", true, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.TransferLeader(ctx, &shalev1.TransferLeaderRequest{ShardId: shardID, TargetNodeId: targetNodeID})
		return err
	})
	if err != nil {
		return 0, wrapOp("transfer-leader", err)
	}
	if l := resp.GetLeaderNodeId(); l != 0 {
		c.rt.setLeader(shardID, l)
	}
	return resp.GetLeaderNodeId(), nil
}

// SplitShard splits the shard holding splitKey at splitKey: that shard keeps
// the keys below it and a new shard, on the same nodes, takes the rest. It
// returns both descriptors (left, then right); the client's routing
// follows. Splitting at a key where a shard already starts is an
// InvalidArgument error.
func (c *Client) SplitShard(ctx context.Context, splitKey []byte) (left, right *shalev1.ShardDescriptor, err error) {
	var resp *shalev1.SplitShardResponse
	err = c.invokeAdmin(ctx, "split-shard", true, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.SplitShard(ctx, &shalev1.SplitShardRequest{SplitKey: splitKey})
		return err
	})
	if err != nil {
		return nil, nil, wrapOp("split-shard", err)
	}
	c.rt.apply(resp.GetLeft())
	c.rt.apply(resp.GetRight())
	return resp.GetLeft(), resp.GetRight(), nil
}
