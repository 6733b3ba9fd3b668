package server

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server/shard"
)

// localShard is this node's replica of shard id for an Admin RPC about it:
// InvalidArgument for no ID, NotFound when the node has none.
func (n *Node) localShard(id uint64) (*shard.Shard, error) {
	if id == 0 {
		return nil, invalidArg("a shard ID is required")
	}
	sm := n.Shard(id)
	if sm == nil {
		return nil, status.Errorf(codes.NotFound, "node %d has no replica of shard %d", n.cfg.NodeID, id)
	}
	return sm, nil
}

// ReplicaChecksum implements the Admin RPC for the receiving node's own
// replica (it is not forwarded: the caller asks each replica's node).
func (s *adminService) ReplicaChecksum(_ context.Context, req *shalev1.ReplicaChecksumRequest) (*shalev1.ReplicaChecksumResponse, error) {
	n := s.n
	sm, err := n.localShard(req.GetShardId())
	if err != nil {
		return nil, err
	}
	applied, sum, err := sm.ChecksumAt()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "node %d: checksum of shard %d: %v", n.cfg.NodeID, req.GetShardId(), err)
	}
	return &shalev1.ReplicaChecksumResponse{NodeId: n.cfg.NodeID, ShardId: req.GetShardId(), AppliedIndex: applied, Checksum: sum}, nil
}
