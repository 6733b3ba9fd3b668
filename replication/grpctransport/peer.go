package grpctransport

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// peer is the outbound side towards one node: a bounded queue and the one
// goroutine (run) that owns the connection and the SendMessages stream.
type peer struct {
	t     *Transport
	id    uint64
	queue chan *shalev1.RaftMessageBatch

	up       atomic.Bool  // the stream is established
	lastSend atomic.Int64 // unix nanos of the last successful stream Send

	// Owned by run.
	pending *shalev1.RaftMessageBatch // dequeued but left out of the last coalesced batch
}

func newPeer(t *Transport, id uint64) *peer {
	return &peer{t: t, id: id, queue: make(chan *shalev1.RaftMessageBatch, t.opts.QueueLen)}
}

// run connects, streams until the stream breaks, and reconnects with
// jittered exponential backoff, until Close.
func (p *peer) run() {
	t := p.t
	defer t.wg.Done()
	backoff := t.opts.BackoffInitial
	first := true
	failures := 0 // consecutive failed attempts, for logging
	for {
		if t.ctx.Err() != nil {
			return
		}
		conn, stream, cancel, err := p.connect()
		if err != nil {
			t.c.connectFailures.Add(1)
			failures++
			if failures == 1 {
				t.log.Warn("cannot connect to peer; retrying with backoff", "peer", p.id, "err", err)
			} else {
				t.log.Debug("connect to peer failed", "peer", p.id, "err", err, "attempt", failures, "retry_in", backoff)
			}
			// Whatever waited for this attempt is stale by the next one.
			p.discardQueued()
			first = false
			if !t.sleep(jitter(backoff)) {
				return
			}
			backoff = min(2*backoff, t.opts.BackoffMax)
			continue
		}
		t.c.connects.Add(1)
		if !first {
			t.c.reconnects.Add(1)
		}
		if !first {
			t.log.Info("peer stream reconnected", "peer", p.id, "failed_attempts", failures)
		}
		first = false
		failures = 0
		upAt := time.Now()
		err = p.stream(stream)
		p.up.Store(false)
		cancel()
		_ = conn.Close()
		if t.ctx.Err() != nil {
			return
		}
		t.log.Warn("peer stream broke; reconnecting", "peer", p.id, "err", err)
		// A stream that lived long enough was healthy: reconnect quickly.
		// One that broke at once (e.g. a peer rejecting our batches) keeps
		// backing off.
		if time.Since(upAt) >= t.opts.BackoffMax {
			backoff = t.opts.BackoffInitial
		}
		if !t.sleep(jitter(backoff)) {
			return
		}
		backoff = min(2*backoff, t.opts.BackoffMax)
	}
}

// connect resolves the peer's address, dials it and opens the stream. The
// returned cancel ends the stream.
func (p *peer) connect() (*grpc.ClientConn, shalev1.Raft_SendMessagesClient, context.CancelFunc, error) {
	conn, _, err := p.t.dial(p.id)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancel(p.t.ctx)
	// Without WaitForReady, opening the stream waits while the connection
	// is being established and fails as soon as it cannot be.
	stream, err := shalev1.NewRaftClient(conn).SendMessages(ctx)
	if err != nil {
		cancel()
		_ = conn.Close()
		return nil, nil, nil, err
	}
	return conn, stream, cancel, nil
}

// stream sends coalesced batches on s until it breaks or the transport
// closes, and returns why it stopped. The caller cancels
// the stream's context afterwards, which ends the watcher goroutine (tracked
// by the transport's WaitGroup).
func (p *peer) stream(s shalev1.Raft_SendMessagesClient) error {
	t := p.t
	// The server sends nothing until the stream ends; a RecvMsg that
	// returns tells us the stream is gone even while we have nothing to
	// send.
	broken := make(chan error, 1)
	t.wg.Add(1) // run holds a count, so Add cannot race with Wait
	go func() {
		defer t.wg.Done()
		broken <- s.RecvMsg(&shalev1.RaftStreamResponse{})
	}()
	p.up.Store(true)
	for {
		var b *shalev1.RaftMessageBatch
		if p.pending != nil {
			b, p.pending = p.pending, nil
		} else {
			select {
			case <-t.ctx.Done():
				return t.ctx.Err()
			case err := <-broken:
				if err == nil || errors.Is(err, io.EOF) {
					err = errors.New("stream closed by peer")
				}
				return err
			case b = <-p.queue:
			}
		}
		out, n := p.coalesce(b)
		if t.testBeforeSend != nil {
			t.testBeforeSend(p.id, out)
		}
		if err := s.Send(out); err != nil {
			// Send reports io.EOF when the stream ended; the status is
			// what the watcher receives.
			t.c.batchesDropped.Add(int64(n))
			t.c.messagesDropped.Add(int64(len(out.Messages)))
			if errors.Is(err, io.EOF) {
				select {
				case rerr := <-broken:
					if rerr != nil {
						err = rerr
					}
				case <-time.After(time.Second):
				}
			}
			return err
		}
		p.lastSend.Store(time.Now().UnixNano())
		t.c.batchesSent.Add(1)
		t.c.messagesSent.Add(int64(len(out.Messages)))
		if n > 1 {
			t.c.batchesCoalesced.Add(int64(n - 1))
		}
	}
}

// envelopeOverhead bounds the bytes a message adds to a batch beyond its
// own size (field tag and length).
const envelopeOverhead = 16

// coalesce merges first with every batch already queued, in order, while the
// result stays under MaxBatchBytes; a batch that would overflow it is kept
// in p.pending for the next send. A first batch over MaxBatchBytes is cut
// instead: the messages that fit go now, the rest (with the quiesced
// shards, which come after every message) waits in p.pending, so that the
// receiver's message size limit never refuses a batch (a Raft cycle can
// hold many large appends for a node catching up). A single message over
// the limit goes alone. It returns the batch to send, stamped with this
// node's cluster and node IDs and the latest clock reading among the
// merged batches, and how many queued batches it holds.
//
// Quiesced shards: a later batch's messages for a shard cancel an earlier
// batch's quiescence of it (the message would have woken the follower), so
// a shard is listed as quiesced only if its last quiescence comes at or
// after its last messages in the merged sequence.
func (p *peer) coalesce(first *shalev1.RaftMessageBatch) (*shalev1.RaftMessageBatch, int) {
	t := p.t
	size := codec.Size(first)
	split := size > t.opts.MaxBatchBytes && len(first.Messages) > 1
	if !split && len(p.queue) == 0 && first.ClusterId == t.opts.ClusterID && first.FromNodeId == t.opts.NodeID && first.ToNodeId == p.id {
		// A lone batch already stamped (as the Store's are) goes as it
		// is, unmodified, without a copy of its header.
		return first, 1
	}
	out := &shalev1.RaftMessageBatch{
		ClusterId:      t.opts.ClusterID,
		FromNodeId:     t.opts.NodeID,
		ToNodeId:       p.id,
		Messages:       first.Messages,
		QuiescedShards: first.QuiescedShards,
		Hlc:            first.Hlc,
		Features:       first.Features,
		// What the batches tell of their sender, as of the last.
		ApplyingBacklog: first.ApplyingBacklog,
	}
	n := 1
	if split {
		k, part := 0, 0
		for k < len(first.Messages) {
			ms := codec.Size(first.Messages[k]) + envelopeOverhead
			if k > 0 && part+ms > t.opts.MaxBatchBytes {
				break
			}
			part += ms
			k++
		}
		if k < len(first.Messages) {
			out.Messages, out.QuiescedShards = first.Messages[:k], nil
			p.pending = &shalev1.RaftMessageBatch{Messages: first.Messages[k:], QuiescedShards: first.QuiescedShards, Hlc: first.Hlc,
				Features: first.Features, ApplyingBacklog: first.ApplyingBacklog}
			return out, n
		}
	}
	if len(p.queue) == 0 {
		return out, n
	}
	// Merging: build new slices so that the callers' batches are not
	// modified.
	out.Messages = append([]*shalev1.RaftEnvelope(nil), first.Messages...)
	out.QuiescedShards = nil
	quiesced := make(map[uint64]bool)
	addQuiesced := func(shards []uint64) {
		for _, s := range shards {
			if !quiesced[s] {
				quiesced[s] = true
				out.QuiescedShards = append(out.QuiescedShards, s)
			}
		}
	}
	addQuiesced(first.QuiescedShards)
	for size < t.opts.MaxBatchBytes {
		var b *shalev1.RaftMessageBatch
		select {
		case b = <-p.queue:
		default:
		}
		if b == nil {
			break
		}
		bs := codec.Size(b)
		if size+bs > t.opts.MaxBatchBytes {
			p.pending = b
			break
		}
		size += bs
		n++
		if len(quiesced) > 0 {
			removed := false
			for _, m := range b.Messages {
				if quiesced[m.GetShardId()] {
					delete(quiesced, m.GetShardId())
					removed = true
				}
			}
			if removed {
				kept := out.QuiescedShards[:0]
				for _, s := range out.QuiescedShards {
					if quiesced[s] {
						kept = append(kept, s)
					}
				}
				out.QuiescedShards = kept
			}
		}
		out.Messages = append(out.Messages, b.Messages...)
		addQuiesced(b.QuiescedShards)
		if b.Hlc != nil {
			// Queued in order: the later clock reading.
			out.Hlc = b.Hlc
		}
		// The sender's features and apply backlog as of its latest batch.
		out.Features, out.ApplyingBacklog = b.Features, b.ApplyingBacklog
	}
	return out, n
}

// discardQueued drops everything queued (counted as dropped).
func (p *peer) discardQueued() {
	if p.pending != nil {
		p.t.drop(p.pending)
		p.pending = nil
	}
	for {
		select {
		case b := <-p.queue:
			p.t.drop(b)
		default:
			return
		}
	}
}
