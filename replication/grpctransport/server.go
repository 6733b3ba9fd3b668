package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/replication/snapshot"
)

// Register registers the Raft service on srv (a *grpc.Server or any other
// registrar); what it receives goes to h. A batch whose cluster ID differs
// from Options.ClusterID, or whose destination is not Options.NodeID, ends
// its stream with codes.FailedPrecondition and is not delivered; the same
// holds for a snapshot header. Incoming snapshots are received with
// snapshot.Receive into Options.SnapshotStagingDir and handed to
// h.HandleSnapshot; a corrupt one fails with codes.DataLoss and never
// reaches h, and its partial directory is removed. If h.HandleSnapshot
// returns an error and dir still exists, it is removed too; the error goes
// back to the sender as a gRPC status (the handler's own code if it returned
// a status error, Internal otherwise). Register must be called at most once per Transport, before srv
// starts serving.
func (t *Transport) Register(srv grpc.ServiceRegistrar, h replication.Handler) {
	shalev1.RegisterRaftServer(srv, &raftServer{t: t, h: h})
}

type raftServer struct {
	shalev1.UnimplementedRaftServer
	t *Transport
	h replication.Handler
}

var errShutdown = status.Error(codes.Unavailable, "grpctransport: node's transport is shutting down")

func (s *raftServer) checkIDs(what string, clusterID string, toNodeID uint64) error {
	t := s.t
	if clusterID != t.opts.ClusterID {
		return status.Errorf(codes.FailedPrecondition,
			"grpctransport: %s from cluster %q, this node (%d) is in cluster %q", what, clusterID, t.opts.NodeID, t.opts.ClusterID)
	}
	if toNodeID != t.opts.NodeID {
		return status.Errorf(codes.FailedPrecondition,
			"grpctransport: %s addressed to node %d reached node %d", what, toNodeID, t.opts.NodeID)
	}
	return nil
}

// SendMessages delivers the batches of one peer's stream to the Handler,
// until the peer ends the stream, a batch is rejected, or Close.
func (s *raftServer) SendMessages(stream shalev1.Raft_SendMessagesServer) error {
	t := s.t
	if !t.enter() {
		return errShutdown
	}
	defer t.wg.Done()
	// Recv and the delivery of what it returns run in their own goroutine,
	// so that Close can end the stream while Recv blocks (returning from the
	// handler cancels the stream, which makes Recv return); delivering there
	// rather than handing each batch to this goroutine saves a goroutine
	// switch per batch on the replication path.
	ended := make(chan error, 1)
	t.wg.Add(1) // we hold a count, so Add cannot race with Wait
	go func() {
		defer t.wg.Done()
		ended <- s.receive(stream)
	}()
	select {
	case <-t.ctx.Done():
		return errShutdown
	case err := <-ended:
		if err == io.EOF {
			return stream.SendAndClose(&shalev1.RaftStreamResponse{})
		}
		return err
	}
}

// receive hands the stream's batches to the Handler until Recv fails (io.EOF
// when the peer ends the stream) or a batch is rejected.
func (s *raftServer) receive(stream shalev1.Raft_SendMessagesServer) error {
	t := s.t
	for {
		b, err := stream.Recv()
		if err != nil {
			return err
		}
		if t.ctx.Err() != nil {
			return errShutdown
		}
		if err := s.checkIDs("raft batch", b.ClusterId, b.ToNodeId); err != nil {
			t.c.batchRejected.Add(1)
			t.log.Warn("rejected raft batch", "from", b.FromNodeId, "err", err)
			return err
		}
		t.c.batchesReceived.Add(1)
		t.c.messagesReceived.Add(int64(len(b.Messages)))
		s.h.HandleRaftBatch(b)
	}
}

// headerCheck receives a snapshot stream's chunks, each's data decoded
// into a buffer of directfile's pool (snapshot.ReceivedChunk), and rejects
// a stream whose header is for another cluster or node before any file is
// written.
type headerCheck struct {
	s    *raftServer
	r    grpc.ServerStream
	seen bool
}

// Recv passes chunks through, failing on a first chunk whose header is for
// another cluster or node.
func (h *headerCheck) Recv() (*shalev1.SnapshotChunk, error) {
	var rc snapshot.ReceivedChunk
	err := h.r.RecvMsg(&rc)
	c := rc.Chunk
	if err == nil && !h.seen {
		h.seen = true
		if hdr := c.GetHeader(); hdr != nil {
			if err := h.s.checkIDs("snapshot", hdr.ClusterId, hdr.ToNodeId); err != nil {
				return nil, err
			}
		}
	}
	return c, err
}

// PooledData marks headerCheck as a snapshot.PooledReceiver: its chunks'
// data are the receiver's, in buffers of directfile's pool.
func (h *headerCheck) PooledData() {}

// SendSnapshot receives one snapshot in the ordered format, verifies it and
// hands it to the Handler; it replies applied=true once the Handler has
// installed it.
func (s *raftServer) SendSnapshot(stream shalev1.Raft_SendSnapshotServer) error {
	return s.receiveSnapshot(stream, snapshot.Receive, false)
}

// StreamSnapshot is SendSnapshot for the interleaved format. It first sends
// the response headers, with SnapshotFormatHeader, so that the sender knows
// the format is understood before it streams any data.
func (s *raftServer) StreamSnapshot(stream shalev1.Raft_StreamSnapshotServer) error {
	return s.receiveSnapshot(stream, snapshot.ReceiveInterleaved, true)
}

func (s *raftServer) receiveSnapshot(stream grpc.ClientStreamingServer[shalev1.SnapshotChunk, shalev1.SnapshotResponse],
	receive func(context.Context, snapshot.ChunkReceiver, string) (*shalev1.SnapshotHeader, string, error), announce bool) error {
	t := s.t
	if !t.enter() {
		return errShutdown
	}
	defer t.wg.Done()
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()
	if announce {
		if err := stream.SendHeader(metadata.Pairs(SnapshotFormatHeader, "interleaved")); err != nil {
			return err
		}
	}

	start := time.Now()
	hdr, dir, err := receive(ctx, &headerCheck{s: s, r: stream}, t.opts.SnapshotStagingDir)
	if err != nil {
		t.c.snapRejected.Add(1)
		t.log.Warn("snapshot receive failed", "err", err)
		return toStatus(err, codes.Internal)
	}
	var bytes uint64
	for _, f := range hdr.Files {
		bytes += f.Size
	}
	received := time.Since(start)
	if t.ctx.Err() != nil {
		_ = os.RemoveAll(dir)
		t.c.snapRejected.Add(1)
		return errShutdown
	}
	if err := s.h.HandleSnapshot(ctx, hdr, dir); err != nil {
		// The handler owns dir even when it refuses: it may still be
		// installing it (a Store whose caller went away finishes the
		// install), so dir is not ours to delete.
		t.c.snapRejected.Add(1)
		t.log.Warn("snapshot refused by handler", "shard", hdr.ShardId, "from", hdr.FromNodeId, "err", err)
		return toStatus(fmt.Errorf("install snapshot of shard %d: %w", hdr.ShardId, err), codes.Internal)
	}
	t.c.snapReceived.Add(1)
	t.c.snapBytesReceived.Add(int64(bytes))
	t.log.Info("snapshot received", "shard", hdr.ShardId, "from", hdr.FromNodeId, "files", len(hdr.Files), "bytes", bytes,
		"interleaved", announce, "received_in", received, "installed_in", time.Since(start)-received)
	return stream.SendAndClose(&shalev1.SnapshotResponse{Applied: true})
}

// toStatus turns err into a gRPC status error: a status it wraps keeps its
// code, a corrupt snapshot is DataLoss, a context error Canceled or
// DeadlineExceeded, anything else def. The message is err's full text.
func toStatus(err error, def codes.Code) error {
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	code := def
	switch {
	case errors.Is(err, snapshot.ErrCorrupt):
		code = codes.DataLoss
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}

// heldStream is a snapshot stream that sends data chunks without copying
// their bytes (snapshot.HeldChunk, encoded by codec.Codec, which every
// connection of the transport uses).
type heldStream struct {
	grpc.ClientStreamingClient[shalev1.SnapshotChunk, shalev1.SnapshotResponse]
}

// SendHeld sends c, whose Data gRPC writes from its buffer and then calls
// release.
func (h heldStream) SendHeld(c *shalev1.SnapshotChunk, release func()) error {
	return h.SendMsg(&snapshot.HeldChunk{Chunk: c, Release: release})
}

// corruptingSender applies a test hook to every chunk before sending it.
type corruptingSender struct {
	s      snapshot.ChunkSender
	mutate func(*shalev1.SnapshotChunk)
}

// Send sends a mutated copy of ch.
func (c corruptingSender) Send(ch *shalev1.SnapshotChunk) error {
	ch = proto.Clone(ch).(*shalev1.SnapshotChunk)
	c.mutate(ch)
	return c.s.Send(ch)
}

// SendSnapshot streams the checkpoint in dir (every regular file in it) to
// node header.ToNodeId over a connection of its own, paced by
// Options.SnapshotLimiter, and returns once the receiver's Handler has
// installed it (nil) or the transfer or installation failed (an error that
// carries the receiver's gRPC status, e.g. codes.DataLoss for a snapshot
// that arrived corrupted). It streams in the interleaved format
// (Raft.StreamSnapshot: Options.SnapshotParallel files at once); a receiver
// that does not know that format (an older node: Unimplemented, before any
// data is sent) gets the ordered one (Raft.SendSnapshot) instead, and so
// does that node for the next LegacyRetry. The header is copied and stamped
// with this node's cluster and node IDs; its Files are filled in from dir.
// SendSnapshot honours ctx and is cancelled by Close; it returns ErrClosed
// after Close.
func (t *Transport) SendSnapshot(ctx context.Context, header *shalev1.SnapshotHeader, dir string) (err error) {
	if header == nil {
		return errors.New("grpctransport: SendSnapshot: nil header")
	}
	if !t.enter() {
		return ErrClosed
	}
	defer t.wg.Done()
	to := header.ToNodeId
	defer func() {
		if err != nil {
			t.c.snapFailed.Add(1)
			if t.ctx.Err() != nil && !errors.Is(err, ErrClosed) {
				err = fmt.Errorf("%w (%v)", ErrClosed, err)
			}
			err = fmt.Errorf("grpctransport: snapshot of shard %d to node %d: %w", header.ShardId, to, err)
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()

	conn, _, err := t.dial(to, t.snapshotDialOpts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	hdr := proto.Clone(header).(*shalev1.SnapshotHeader)
	hdr.ClusterId = t.opts.ClusterID
	hdr.FromNodeId = t.opts.NodeID
	if !t.legacyPeer(to) {
		err := t.sendSnapshotOn(ctx, cancel, conn, hdr, dir, true)
		if !errors.Is(err, errNoInterleaved) {
			return err
		}
		t.markLegacyPeer(to)
		t.log.Info("peer takes only ordered snapshots (an older version); sending ordered", "to_node", to, "for", LegacyRetry)
	}
	return t.sendSnapshotOn(ctx, cancel, conn, hdr, dir, false)
}

// errNoInterleaved is sendSnapshotOn's answer when the receiver does not
// implement Raft.StreamSnapshot.
var errNoInterleaved = errors.New("receiver does not take interleaved snapshots")

// sendSnapshotOn streams one snapshot on conn, interleaved or ordered, and
// waits for the receiver's answer; cancel ends the stream.
func (t *Transport) sendSnapshotOn(ctx context.Context, cancel context.CancelFunc, conn *grpc.ClientConn, hdr *shalev1.SnapshotHeader, dir string, interleaved bool) error {
	cli := shalev1.NewRaftClient(conn)
	var stream grpc.ClientStreamingClient[shalev1.SnapshotChunk, shalev1.SnapshotResponse]
	var err error
	send := snapshot.Send
	if interleaved {
		send = snapshot.SendInterleaved
		if stream, err = cli.StreamSnapshot(ctx); err != nil {
			return err
		}
		// A receiver that knows the format answers with headers before it
		// reads anything; an older one, without the method, ends the
		// stream with Unimplemented.
		md, herr := stream.Header()
		if herr != nil || len(md.Get(SnapshotFormatHeader)) == 0 {
			_, rerr := stream.CloseAndRecv()
			switch {
			case status.Code(rerr) == codes.Unimplemented:
				return errNoInterleaved
			case rerr != nil:
				return rerr
			case herr != nil:
				return herr
			}
			return errors.New("the receiver answered without the snapshot format header")
		}
	} else if stream, err = cli.SendSnapshot(ctx); err != nil {
		return err
	}
	var sender snapshot.ChunkSender = heldStream{stream}
	if t.testCorruptChunk != nil {
		sender = corruptingSender{s: stream, mutate: t.testCorruptChunk}
	}
	n, err := send(ctx, sender, hdr, dir, snapshot.Options{
		ChunkSize: t.opts.SnapshotChunkSize,
		Limiter:   t.opts.SnapshotLimiter,
		Parallel:  t.opts.SnapshotParallel,
	})
	t.c.snapBytesSent.Add(n)
	if err != nil {
		if t.ctx.Err() != nil {
			return err
		}
		if errors.Is(err, io.EOF) {
			// The receiver ended the stream early; its status says why.
			if _, rerr := stream.CloseAndRecv(); rerr != nil {
				return rerr
			}
		}
		return err
	}
	// Every chunk is sent: the receiver answers once it has installed or
	// refused the snapshot, which takes a few file renames, not a transfer.
	answerBy := time.AfterFunc(t.opts.SnapshotAnswerTimeout, cancel)
	defer answerBy.Stop()
	resp, err := stream.CloseAndRecv()
	if err != nil {
		if !answerBy.Stop() {
			return fmt.Errorf("no answer within %v of the last chunk: %w", t.opts.SnapshotAnswerTimeout, err)
		}
		return err
	}
	if !resp.Applied {
		return errors.New("receiver did not apply the snapshot")
	}
	t.c.snapSent.Add(1)
	return nil
}

// legacyPeer reports whether node answered Unimplemented to an interleaved
// snapshot within the last LegacyRetry.
func (t *Transport) legacyPeer(node uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.legacy[node]
	return ok && time.Since(at) < LegacyRetry
}

func (t *Transport) markLegacyPeer(node uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.legacy == nil {
		t.legacy = map[uint64]time.Time{}
	}
	t.legacy[node] = time.Now()
}
