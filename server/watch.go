package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/server/watch"
)

// hubRef is a shard's change-feed hub with the watch streams using it.
type hubRef struct {
	hub   *watch.Hub
	sm    *shard.Shard
	users int
}

// acquireHub returns the change-feed hub of a shard replica, starting it
// for the first stream; release stops it after the last one.
func (n *Node) acquireHub(id uint64, sm *shard.Shard) (_ *watch.Hub, release func(), _ error) {
	n.hubMu.Lock()
	defer n.hubMu.Unlock()
	select {
	case <-n.stop:
		return nil, nil, status.Errorf(codes.Unavailable, "node %d is stopping", n.cfg.NodeID)
	default:
	}
	ref := n.hubs[id]
	if ref != nil {
		select {
		case <-ref.hub.Stopped():
			ref = nil // its replica closed or restored a snapshot: start anew
		default:
			if ref.sm != sm {
				ref = nil
			}
		}
	}
	if ref == nil {
		h, err := watch.NewHub(sm, id, watch.Options{MaxQueueBytes: n.cfg.WatchQueueBytes, Logger: n.log, TooSlow: n.watchTooSlow.Inc})
		if err != nil {
			if errors.Is(err, shard.ErrClosed) {
				return nil, nil, status.Errorf(codes.Unavailable, "shard %d: the replica on node %d closed; retry", id, n.cfg.NodeID)
			}
			return nil, nil, status.Errorf(codes.Internal, "shard %d: start change feed: %v", id, err)
		}
		if old := n.hubs[id]; old != nil {
			go old.hub.Stop()
		}
		ref = &hubRef{hub: h, sm: sm}
		n.hubs[id] = ref
	}
	ref.users++
	return ref.hub, func() {
		n.hubMu.Lock()
		ref.users--
		last := ref.users == 0 && n.hubs[id] == ref
		if last {
			delete(n.hubs, id)
		}
		n.hubMu.Unlock()
		if last {
			ref.hub.Stop()
		}
	}, nil
}

// stopHubs ends every watch stream (they get Unavailable with the revision
// to resume from).
func (n *Node) stopHubs() {
	n.hubMu.Lock()
	refs := n.hubs
	n.hubs = map[uint64]*hubRef{}
	n.hubMu.Unlock()
	for _, ref := range refs {
		ref.hub.Stop()
	}
}

// stopHub stops a shard's hub (its replica left the node).
func (n *Node) stopHub(id uint64) {
	n.hubMu.Lock()
	ref := n.hubs[id]
	delete(n.hubs, id)
	n.hubMu.Unlock()
	if ref != nil {
		ref.hub.Stop()
	}
}

// watchRange validates a Watch request's range: [start, end), end nil for
// no bound.
func (n *Node) watchRange(req *shalev1.WatchRequest) (start, end []byte, _ error) {
	start, end = req.GetStartKey(), req.GetEndKey()
	if pre := req.GetPrefix(); len(pre) > 0 {
		if len(start) > 0 || len(end) > 0 {
			return nil, nil, invalidArg("prefix excludes start_key and end_key")
		}
		start, end = pre, prefixEnd(pre)
	}
	if len(start) > n.cfg.MaxKeyBytes || len(end) > n.cfg.MaxKeyBytes {
		return nil, nil, invalidArg("watch bound over %d bytes", n.cfg.MaxKeyBytes)
	}
	if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		return nil, nil, invalidArg("watch range [%q, %q) is empty or inverted", start, end)
	}
	if start == nil {
		start = []byte{}
	}
	if len(end) == 0 {
		end = nil
	}
	return start, end, nil
}

// Watch implements the KV service's Watch stream.
func (s *kvService) Watch(req *shalev1.WatchRequest, stream shalev1.KV_WatchServer) error {
	n := s.n
	ctx := stream.Context()
	start, end, err := n.watchRange(req)
	if err != nil {
		return err
	}
	h := req.GetHeader()
	var t target
	if h.GetShardId() != 0 {
		t, err = n.route(ctx, h, nil)
	} else {
		t, err = n.route(ctx, h, start)
	}
	if err != nil {
		return err
	}
	d := t.desc
	epoch := d.GetEpoch()
	if re := req.GetRangeEpoch(); re != 0 && re < epoch && req.GetStartRevision() != 0 {
		// A resumption: range changes after the client's epoch end the
		// stream, even if the shard holds the range again since.
		epoch = re
	} else {
		if bytes.Compare(start, d.GetStartKey()) < 0 {
			return keyOutsideErr(start, d)
		}
		if len(d.GetEndKey()) > 0 && (end == nil || bytes.Compare(end, d.GetEndKey()) > 0) {
			return keyOutsideErr(end, d)
		}
	}
	switch h.GetConsistency() {
	case shalev1.ReadConsistency_READ_CONSISTENCY_STALE, shalev1.ReadConsistency_READ_CONSISTENCY_FOLLOWER:
	default:
		if !t.r.IsLeader() {
			return n.notLeaderErr(d.GetShardId(), t.r.Status().LeaderNodeID)
		}
	}
	id := d.GetShardId()
	hub, release, err := n.acquireHub(id, t.sm)
	if err != nil {
		return err
	}
	defer release()
	w, after, err := hub.Watch(ctx, watch.Request{Start: start, End: end, StartRevision: req.GetStartRevision(),
		PrevKV: req.GetPrevKv(), Epoch: epoch, RevisionShard: req.GetRevisionShardId()})
	if err != nil {
		return n.watchErr(id, err)
	}
	defer w.Close()
	header := func(rev uint64) *shalev1.ResponseHeader {
		return &shalev1.ResponseHeader{ShardId: id, Revision: rev, NodeId: n.cfg.NodeID, Epoch: d.GetEpoch()}
	}
	if err := stream.Send(&shalev1.WatchResponse{Header: header(after)}); err != nil {
		return err
	}
	var idle *time.Timer
	var idleC <-chan time.Time
	if req.GetProgressNotify() {
		idle = time.NewTimer(n.cfg.WatchProgressInterval)
		defer idle.Stop()
		idleC = idle.C
	}
	const maxMessageBytes = 1 << 20
	for {
		u, err := w.Next(ctx, idleC)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return n.watchErr(id, err)
		}
		var msgs []*shalev1.WatchResponse
		// Split the events into messages of at most about maxMessageBytes;
		// a message ending inside a revision's events is current only up
		// to the revision before.
		for i := 0; i < len(u.Events); {
			j, size := i, 0
			for j < len(u.Events) {
				n := codec.Size(u.Events[j])
				if j > i && size+n > maxMessageBytes {
					break
				}
				size += n
				j++
			}
			rev := u.Through
			if j < len(u.Events) {
				rev = u.Revisions[j-1]
				if u.Revisions[j] == rev {
					rev--
				}
			}
			msgs = append(msgs, &shalev1.WatchResponse{Header: header(rev), Events: u.Events[i:j]})
			i = j
		}
		if u.RangeChange != nil {
			msgs = append(msgs, &shalev1.WatchResponse{Header: header(u.Through), RangeChange: u.RangeChange})
		}
		if len(msgs) == 0 && req.GetProgressNotify() {
			msgs = append(msgs, &shalev1.WatchResponse{Header: header(u.Through)})
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
		if u.RangeChange != nil {
			return nil
		}
		if idle != nil {
			idle.Reset(n.cfg.WatchProgressInterval)
		}
	}
}

// watchErr maps the end of a watcher to a status with its
// WatchInterrupted detail.
func (n *Node) watchErr(shardID uint64, err error) error {
	var ie *watch.InterruptedError
	if !errors.As(err, &ie) {
		if _, ok := status.FromError(err); ok {
			return err
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return status.FromContextError(err).Err()
		}
		return status.Errorf(codes.Internal, "shard %d: watch: %v", shardID, err)
	}
	d := &shalev1.WatchInterrupted{ShardId: shardID, ResumeRevision: ie.Resume, CompactRevision: ie.Compact}
	msg := fmt.Sprintf("shard %d on node %d: %v", shardID, n.cfg.NodeID, ie)
	switch {
	case errors.Is(err, watch.ErrTooSlow):
		return withDetail(codes.ResourceExhausted, msg, d)
	case errors.Is(err, watch.ErrCompacted):
		return withDetail(codes.OutOfRange, msg, d)
	default:
		return withDetail(codes.Unavailable, msg, d)
	}
}
