package server

import (
	"context"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// checkTarget refuses a call that names, in its metadata, a node other
// than this one: the caller's connection reached an address another node
// used to have.
func (n *Node) checkTarget(ctx context.Context) error {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return nil
	}
	v := md.Get(shalev1.TargetNodeMetadataKey)
	if len(v) == 0 {
		return nil
	}
	want, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "metadata %s: %q is not a node ID", shalev1.TargetNodeMetadataKey, v[0])
	}
	if want == 0 || want == n.cfg.NodeID {
		return nil
	}
	st := status.Newf(codes.Unavailable, "this is node %d, not node %d: the address the call used now belongs to node %d; connect to node %d's current address",
		n.cfg.NodeID, want, n.cfg.NodeID, want)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: shalev1.ReasonWrongNode, Domain: shalev1.ErrorDomain,
		Metadata: map[string]string{"target_node_id": v[0], "node_id": strconv.FormatUint(n.cfg.NodeID, 10)}}); err == nil {
		st = d
	}
	return st.Err()
}

// targetUnaryInterceptor applies checkTarget to unary calls.
func (n *Node) targetUnaryInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := n.checkTarget(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// targetStreamInterceptor applies checkTarget to streams.
func (n *Node) targetStreamInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := n.checkTarget(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}
