package server

import (
	"context"
	"encoding/hex"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// forwardedKey marks an Admin request one node forwarded to another, so a
// request is forwarded at most once (no loops while leadership moves).
const forwardedKey = "x-shale-forwarded"

func forwarded(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, forwardedKey, "1")
}

func isForwarded(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(forwardedKey)) > 0
}

// incomingRequestID returns the request ID a call carries (nil for none),
// or InvalidArgument when it is malformed.
func incomingRequestID(ctx context.Context) ([]byte, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(shalev1.RequestIDMetadataKey)
	if len(vals) == 0 {
		return nil, nil
	}
	id, err := hex.DecodeString(vals[0])
	if err != nil || len(vals) > 1 || len(id) < 8 || len(id) > 32 {
		return nil, status.Errorf(codes.InvalidArgument, "metadata %s: want one ID of 8 to 32 bytes in hex, got %q", shalev1.RequestIDMetadataKey, vals)
	}
	return id, nil
}

// withRequestID passes the request ID id (none if nil) on in a call made
// with ctx.
func withRequestID(ctx context.Context, id []byte) context.Context {
	if id == nil {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, shalev1.RequestIDMetadataKey, hex.EncodeToString(id))
}

// filteredTransport drops Raft traffic on links its filter refuses.
type filteredTransport struct {
	replication.Transport
	self  uint64
	allow func(from, to uint64) bool
}

func (t *filteredTransport) Send(b *shalev1.RaftMessageBatch) {
	if t.allow(t.self, b.GetToNodeId()) {
		t.Transport.Send(b)
	}
}

func (t *filteredTransport) SendSnapshot(ctx context.Context, h *shalev1.SnapshotHeader, dir string) error {
	if !t.allow(t.self, h.GetToNodeId()) {
		return fmt.Errorf("link %d→%d is cut", t.self, h.GetToNodeId())
	}
	return t.Transport.SendSnapshot(ctx, h, dir)
}

func (t *filteredTransport) Reachable(id uint64) bool {
	return t.allow(t.self, id) && t.Transport.Reachable(id)
}
