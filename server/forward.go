package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc/metadata"

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
