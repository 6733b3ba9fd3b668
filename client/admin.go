package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// invokeAdmin runs an Admin request on any node (see invokeAnyNode).
func (c *Client) invokeAdmin(ctx context.Context, op string, mutation bool, fn func(ctx context.Context, a shalev1.AdminClient) error) error {
	return c.invokeAnyNode(ctx, op, mutation, func(ctx context.Context, cc grpc.ClientConnInterface) error {
		return fn(ctx, shalev1.NewAdminClient(cc))
	})
}

// invokeAnyNode runs a request any node answers (Admin and Auth calls) on
// the node that answered last, then the endpoints, then every known node.
// NotLeader with a hint sends it to the hinted node at once; Unavailable
// moves to the next node after a backoff, and so does an attempt timeout
// for read-only requests (a mutation that timed out may have applied, so
// its error is returned); ResourceExhausted retries after a backoff
// (unless the request was too large);
// anything else (PermissionDenied, NotFound, ...) is returned.
func (c *Client) invokeAnyNode(ctx context.Context, op string, mutation bool, fn func(ctx context.Context, cc grpc.ClientConnInterface) error) (err error) {
	ctx, sp := c.startCall(ctx, op)
	if sp != nil {
		defer func() { endCall(sp, err) }()
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	if c.rt.age() > c.routingMaxAge {
		// Only KV calls refresh the routing on their errors: a client
		// making Admin calls alone would otherwise keep the nodes it
		// first learned, until every one of them is gone.
		go func() { _ = c.refreshRouting(c.ctx, -1) }()
	}
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
		err = fn(actx, cc)
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
		case overloaded(st):
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
// client's routing follows. The server pins the leadership there for its
// default pin duration, so that leader balancing does not move it back;
// TransferLeaderPinned chooses the pin.
func (c *Client) TransferLeader(ctx context.Context, shardID, targetNodeID uint64) (uint64, error) {
	return c.TransferLeaderPinned(ctx, shardID, targetNodeID, 0)
}

// TransferLeaderPinned is TransferLeader with a pin: leader balancing
// leaves the shard's leadership on targetNodeID for pin (rounded up to
// whole seconds), for the server's default pin duration when pin is 0, or
// may move it at once when pin is negative (no pin). Repair (moving
// leaderships off dead or draining nodes) ignores pins.
func (c *Client) TransferLeaderPinned(ctx context.Context, shardID, targetNodeID uint64, pin time.Duration) (uint64, error) {
	req := &shalev1.TransferLeaderRequest{ShardId: shardID, TargetNodeId: targetNodeID, PinSeconds: pinSeconds(pin)}
	var resp *shalev1.TransferLeaderResponse
	err := c.invokeAdmin(ctx, "transfer-leader", true, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.TransferLeader(ctx, req)
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

// MergeShards merges the shard holding key with its right neighbour: the
// shard keeps its ID and takes the neighbour's keys and range, and the
// neighbour is gone. The node leading the shard must host a replica of the
// neighbour (FailedPrecondition otherwise, and for the last shard, which
// has no neighbour). It returns the merged shard's descriptor and the
// removed shard's ID; the client's routing follows.
func (c *Client) MergeShards(ctx context.Context, key []byte) (merged *shalev1.ShardDescriptor, removed uint64, err error) {
	var resp *shalev1.MergeShardsResponse
	err = c.invokeAdmin(ctx, "merge-shards", true, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.MergeShards(ctx, &shalev1.MergeShardsRequest{Key: key})
		return err
	})
	if err != nil {
		return nil, 0, wrapOp("merge-shards", err)
	}
	c.rt.apply(resp.GetMerged())
	return resp.GetMerged(), resp.GetRemovedShardId(), nil
}

// PlacementStatus reports what the placement leader (the system shard's
// leader) sees: every node with its state,
// last heartbeat, replica, leader and byte counts and decommissioning flag,
// the operations running, every replica that should move but cannot (with
// the reason), the replica, leader and byte spreads and whether the cluster
// is balanced. It is read-only and retried like the other reads.
func (c *Client) PlacementStatus(ctx context.Context) (*shalev1.PlacementStatusResponse, error) {
	var resp *shalev1.PlacementStatusResponse
	err := c.invokeAdmin(ctx, "placement-status", false, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.PlacementStatus(ctx, &shalev1.PlacementStatusRequest{})
		return err
	})
	if err != nil {
		return nil, wrapOp("placement-status", err)
	}
	return resp, nil
}

// PlacementHistory returns the placement leader's recent scheduling
// decisions (running, done and failed operations), oldest first: at most
// limit of them, or every one it keeps when limit is 0. A negative limit
// is an ErrInvalidArgument error, returned without sending a request; a
// limit above math.MaxUint32 is sent as math.MaxUint32.
func (c *Client) PlacementHistory(ctx context.Context, limit int) ([]*shalev1.PlacementOperation, error) {
	if limit < 0 {
		return nil, wrapOp("placement-history", invalidArgf("negative limit %d", limit))
	}
	req := &shalev1.PlacementHistoryRequest{Limit: uint32(min(uint64(limit), math.MaxUint32))}
	var resp *shalev1.PlacementHistoryResponse
	err := c.invokeAdmin(ctx, "placement-history", false, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.PlacementHistory(ctx, req)
		return err
	})
	if err != nil {
		return nil, wrapOp("placement-history", err)
	}
	return resp.GetOperations(), nil
}

// DecommissionNode starts draining the node: the placement service moves
// its replicas and leaderships to other nodes and gives it no new ones. It
// returns once the server recorded the decommission, not when the node is
// drained; follow the drain with PlacementStatus (the node's replica count
// reaches 0), then remove the node with RemoveNode. It is retried only on
// errors that mean it was not applied (Unavailable, NotLeader).
func (c *Client) DecommissionNode(ctx context.Context, nodeID uint64) error {
	err := c.invokeAdmin(ctx, "decommission-node", true, func(ctx context.Context, a shalev1.AdminClient) error {
		_, err := a.DecommissionNode(ctx, &shalev1.DecommissionNodeRequest{NodeId: nodeID})
		return err
	})
	return wrapOp("decommission-node", err)
}

// RecommissionNode stops the node's draining: it may take replicas and
// leaderships again. It returns once the server recorded it, and is
// retried only on errors that mean it was not applied (Unavailable,
// NotLeader).
func (c *Client) RecommissionNode(ctx context.Context, nodeID uint64) error {
	err := c.invokeAdmin(ctx, "recommission-node", true, func(ctx context.Context, a shalev1.AdminClient) error {
		_, err := a.RecommissionNode(ctx, &shalev1.RecommissionNodeRequest{NodeId: nodeID})
		return err
	})
	return wrapOp("recommission-node", err)
}

// MoveReplica asks the placement leader to move shard shardID's replica on
// node fromNode to node toNode (a learner is added on toNode, caught up and
// promoted, then the replica on fromNode is removed) and returns the
// operation as accepted; it does not wait for the move, whose steps follow
// in PlacementStatus and PlacementHistory. The shard is pinned so that
// balancing does not move it back: for pin (rounded up to whole seconds),
// for the server's default pin duration when pin is 0, and when pin is
// negative only for as long as the move itself needs. Repair of replicas
// on dead or draining nodes ignores pins. The call is retried only on
// errors that mean it was not applied (Unavailable, NotLeader).
func (c *Client) MoveReplica(ctx context.Context, shardID, fromNode, toNode uint64, pin time.Duration) (*shalev1.PlacementOperation, error) {
	req := &shalev1.MoveReplicaRequest{ShardId: shardID, FromNodeId: fromNode, ToNodeId: toNode, PinSeconds: pinSeconds(pin)}
	var resp *shalev1.MoveReplicaResponse
	err := c.invokeAdmin(ctx, "move-replica", true, func(ctx context.Context, a shalev1.AdminClient) error {
		var err error
		resp, err = a.MoveReplica(ctx, req)
		return err
	})
	if err != nil {
		return nil, wrapOp("move-replica", err)
	}
	return resp.GetOperation(), nil
}

// pinSeconds converts a pin duration to the requests' pin_seconds: 0 (the
// server's default) for 0, -1 (no pin) for a negative duration, and whole
// seconds rounded up otherwise, so that a short pin is not taken for the
// default.
func pinSeconds(pin time.Duration) int64 {
	switch {
	case pin == 0:
		return 0
	case pin < 0:
		return -1
	}
	s := int64(pin / time.Second)
	if pin%time.Second != 0 {
		s++
	}
	return s
}

// DrainResult is what DrainLeaders did.
type DrainResult struct {
	// NodeID is the drained node.
	NodeID uint64
	// Transferred counts the leaderships handed to other nodes.
	Transferred int
	// Remaining are the shards the node still led when the deadline came
	// (empty: it leads none).
	Remaining []uint64
}

// DrainLeaders asks node nodeID to hand every shard leadership it holds to
// replicas on other nodes (before it stops), and waits until it leads none
// or ctx's deadline is near; the node then keeps refusing leaderships for
// two minutes. nodeID 0 drains the node at the client's first endpoint
// (as a Kubernetes preStop hook does for its own pod). It is not retried:
// a second call continues the drain.
func (c *Client) DrainLeaders(ctx context.Context, nodeID uint64) (*DrainResult, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	addr := c.endpoints[0]
	cc, err := c.conn(addr)
	if err != nil {
		return nil, wrapOp("drain-leaders", err)
	}
	resp, err := shalev1.NewAdminClient(cc).DrainLeaders(ctx, &shalev1.DrainLeadersRequest{NodeId: nodeID})
	if err != nil {
		return nil, wrapOp("drain-leaders", fmt.Errorf("%s: %w", addr, err))
	}
	return &DrainResult{NodeID: resp.GetNodeId(), Transferred: int(resp.GetTransferred()), Remaining: resp.GetRemainingShardIds()}, nil
}

// ReplicaChecksums asks the node of every replica of shard shardID for its
// replica's applied index and a checksum of its data at that index
// (Admin.ReplicaChecksum): replicas at the same applied index must have the
// same checksum. It returns the answers it got, sorted by node, and an
// error naming each node that did not answer. Each replica reads its whole
// data: this is a consistency check, not a routine call.
func (c *Client) ReplicaChecksums(ctx context.Context, shardID uint64) ([]*shalev1.ReplicaChecksumResponse, error) {
	st, err := c.ShardInfo(ctx, shardID)
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	var (
		out  []*shalev1.ReplicaChecksumResponse
		errs []error
	)
	for _, r := range st.GetDescriptor_().GetReplicas() {
		node := r.GetNodeId()
		admin, addr, err := c.adminAt(ctx, node)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp, err := admin.ReplicaChecksum(ctx, &shalev1.ReplicaChecksumRequest{ShardId: shardID})
		if err != nil {
			errs = append(errs, fmt.Errorf("node %d (%s): %w", node, addr, err))
			continue
		}
		out = append(out, resp)
	}
	slices.SortFunc(out, func(a, b *shalev1.ReplicaChecksumResponse) int { return cmp.Compare(a.GetNodeId(), b.GetNodeId()) })
	return out, wrapOp("replica-checksums", errors.Join(errs...))
}

// ChecksumConflicts describes each pair of replicas in sums (as
// ReplicaChecksums returns them) at the same applied index whose checksums
// differ: replicas that applied the same entries must hold the same data.
// Replicas at different indexes are not compared.
func ChecksumConflicts(sums []*shalev1.ReplicaChecksumResponse) []string {
	var bad []string
	for i, a := range sums {
		for _, b := range sums[i+1:] {
			if a.GetAppliedIndex() == b.GetAppliedIndex() && a.GetChecksum() != b.GetChecksum() {
				bad = append(bad, fmt.Sprintf("nodes %d and %d at index %d: %016x != %016x",
					a.GetNodeId(), b.GetNodeId(), a.GetAppliedIndex(), a.GetChecksum(), b.GetChecksum()))
			}
		}
	}
	return bad
}

// BackupShard opens a backup stream of the replica of shard shardID on node
// nodeID (Admin.BackupShard): a checkpoint taken on that node, its header
// first, then the bytes of every file not in skip (same name, size and
// checksum). The caller reads the stream to its end (io.EOF) or cancels
// ctx; the node pins the checkpoint's files until then. It is not retried:
// a backup retries a shard's part as a whole, possibly on another replica.
func (c *Client) BackupShard(ctx context.Context, nodeID, shardID uint64, skip []*shalev1.SnapshotFile) (shalev1.Admin_BackupShardClient, error) {
	admin, addr, err := c.adminAt(ctx, nodeID)
	if err != nil {
		return nil, wrapOp("backup-shard", err)
	}
	stream, err := admin.BackupShard(ctx, &shalev1.BackupShardRequest{ShardId: shardID, SkipFiles: skip})
	if err != nil {
		return nil, wrapOp("backup-shard", fmt.Errorf("node %d (%s): %w", nodeID, addr, err))
	}
	return stream, nil
}

// BackupShardTo calls Admin.BackupShardTo on node nodeID: the node writes
// its checkpoint of the request's shard into the backup location itself.
// The request may carry credentials; the error returned never holds them.
func (c *Client) BackupShardTo(ctx context.Context, nodeID uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error) {
	admin, addr, err := c.adminAt(ctx, nodeID)
	if err != nil {
		return nil, wrapOp("backup-shard-to", err)
	}
	resp, err := admin.BackupShardTo(ctx, req)
	if err != nil {
		return nil, wrapOp("backup-shard-to", fmt.Errorf("node %d (%s): %w", nodeID, addr, err))
	}
	return resp, nil
}

// adminAt is the Admin service of node nodeID (for the RPCs about its own
// replicas), at its address in the routing table, refreshed once when the
// node is not in it; it also returns the address. Another node answering
// at the address refuses its calls.
func (c *Client) adminAt(ctx context.Context, nodeID uint64) (shalev1.AdminClient, string, error) {
	_, addrs := c.rt.snapshot()
	addr := addrs[nodeID]
	if addr == "" {
		if err := c.refreshRouting(ctx, -1); err != nil {
			return nil, "", fmt.Errorf("node %d: no known address: %w", nodeID, err)
		}
		_, addrs = c.rt.snapshot()
		if addr = addrs[nodeID]; addr == "" {
			return nil, "", fmt.Errorf("node %d: no known address", nodeID)
		}
	}
	cc, err := c.conn(addr)
	if err != nil {
		return nil, "", fmt.Errorf("node %d (%s): %w", nodeID, addr, err)
	}
	return shalev1.NewAdminClient(nodeConn{cc, nodeID}), addr, nil
}

// BackupShardLog opens a stream of the entries the replica of shard
// shardID on node nodeID applied after Raft index afterIndex
// (Admin.BackupShardLog), read to its end (io.EOF) or until ctx ends. It is
// not retried; a status error with codes.OutOfRange means the replica's
// log no longer reaches back that far.
func (c *Client) BackupShardLog(ctx context.Context, nodeID, shardID, afterIndex uint64) (shalev1.Admin_BackupShardLogClient, error) {
	admin, addr, err := c.adminAt(ctx, nodeID)
	if err != nil {
		return nil, wrapOp("backup-shard-log", err)
	}
	stream, err := admin.BackupShardLog(ctx, &shalev1.BackupShardLogRequest{ShardId: shardID, AfterIndex: afterIndex})
	if err != nil {
		return nil, wrapOp("backup-shard-log", fmt.Errorf("node %d (%s): %w", nodeID, addr, err))
	}
	return stream, nil
}
