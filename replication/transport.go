package replication

import (
	"context"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Transport moves Raft messages and snapshots between nodes.
type Transport interface {
	// Send queues a batch for node b.ToNodeId and returns without waiting on
	// the network. Batches for unreachable nodes may be dropped: Raft
	// retransmits what matters.
	Send(b *shalev1.RaftMessageBatch)
	// SendSnapshot streams the checkpoint in dir (every regular file in it)
	// to node header.ToNodeId, which installs it through its Handler, and
	// returns once the receiver has installed or refused it. It honours ctx.
	SendSnapshot(ctx context.Context, header *shalev1.SnapshotHeader, dir string) error
	// Reachable reports whether messages to the node currently get through
	// (a stream is connected, or was recently).
	Reachable(nodeID uint64) bool
	// Close stops all streams; Send after Close drops the batch.
	Close() error
}

// Handler receives what a Transport delivers. A Store is a Handler.
//
// A Transport delivers only batches and snapshots addressed to this node
// (to_node_id) in this cluster: it refuses the others, so that a sender
// that reached the wrong node (an address another node had before) finds
// out and dials again (grpctransport ends the stream).
type Handler interface {
	// HandleRaftBatch delivers a batch of Raft messages; it must not block
	// for long (the Store queues the messages for its Raft loop). The
	// Handler owns b from then on: the caller neither reads nor modifies
	// it again (the Store's Raft log keeps slices of the messages' bytes).
	HandleRaftBatch(b *shalev1.RaftMessageBatch)
	// HandleSnapshot is called with a completely received, checksum-verified
	// checkpoint in dir, and owns dir from then on in every case: it
	// installs the snapshot (moving or deleting dir), or refuses and deletes
	// dir, now or — when it returns early because ctx ended — once it has
	// finished with it. The caller never touches dir again.
	HandleSnapshot(ctx context.Context, header *shalev1.SnapshotHeader, dir string) error
}
