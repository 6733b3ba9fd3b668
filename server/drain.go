package server

import (
	"context"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// drainHold is how long after DrainLeaders a node keeps handing away the
// leaderships it gains (and tells placement to give it none): long enough
// for the stop that follows, short enough that a node drained by hand and
// left running takes leaderships again.
const drainHold = 2 * time.Minute

// drainParallelism bounds the leadership transfers one drain runs at once.
const drainParallelism = 16

// drainingLeaders reports whether the node is handing its leaderships away:
// asked to (DrainLeaders), or because its disk is slow (watchDisk).
func (n *Node) drainingLeaders() bool {
	now := time.Now().UnixNano()
	return now < n.drainUntil.Load() || now < n.slowDiskUntil.Load()
}

// refuseTransfersWhileDraining makes the node refuse leadership transfers
// for as long as either drain holds.
func (n *Node) refuseTransfersWhileDraining() {
	n.store.RefuseLeadershipTransfersUntil(time.Unix(0, max(n.drainUntil.Load(), n.slowDiskUntil.Load())))
}

// drainGiveUpAfter is how long DrainLeaders keeps trying while no shard it
// leads has anywhere to go (every other voter down, draining, or refusing)
// before it stops: when every node of a cluster stops at once there is no
// one to hand leaderships to. Long enough for a peer that just restarted to
// be heard from again.
const drainGiveUpAfter = 2 * time.Second

// DrainLeaders hands every shard leadership this node holds to a voter on
// another live node, and keeps handing away the leaderships it gains for
// two minutes. It returns once the node leads no shard, when ctx ends, or
// when for a few rounds no leadership had anywhere to go (every other
// voter down or draining too): then with the shards it still leads.
func (n *Node) DrainLeaders(ctx context.Context) (transferred int, remaining []uint64) {
	until := time.Now().Add(drainHold)
	n.drainUntil.Store(until.UnixNano())
	n.refuseTransfersWhileDraining()
	// Tell the placement leader at once (it gives this node no more
	// leaderships), and learn which other nodes drain (they take none).
	n.sendHeartbeat(ctx)
	n.keepDrained()
	n.log.Info("draining leaderships", "leading", len(n.ledReplicas()))
	var stuckSince time.Time
	for {
		led := n.ledReplicas()
		if len(led) == 0 {
			n.log.Info("drained leaderships", "transferred", transferred)
			return transferred, nil
		}
		moved, stuck := n.handOffLeaders(ctx, led)
		transferred += moved
		switch {
		case moved > 0 || stuck < len(led):
			stuckSince = time.Time{}
		case stuckSince.IsZero():
			stuckSince = time.Now()
		}
		if !stuckSince.IsZero() && time.Since(stuckSince) >= max(drainGiveUpAfter, 2*time.Duration(n.cfg.ElectionTicks)*n.cfg.TickInterval) {
			remaining = ledShardIDs(n.ledReplicas())
			n.log.Info("drain: every other voter of the shards still led is down, draining or refusing; keeping them",
				"transferred", transferred, "still_leading", len(remaining))
			return transferred, remaining
		}
		select {
		case <-ctx.Done():
			remaining = ledShardIDs(n.ledReplicas())
			n.log.Warn("leadership drain cut short", "transferred", transferred, "still_leading", len(remaining), "err", ctx.Err())
			return transferred, remaining
		case <-time.After(n.cfg.TickInterval):
		}
	}
}

// ledShardIDs returns the shard IDs of led, sorted.
func ledShardIDs(led []*replication.Replica) []uint64 {
	ids := make([]uint64, 0, len(led))
	for _, r := range led {
		ids = append(ids, r.ShardID())
	}
	slices.Sort(ids)
	return ids
}

// keepDrained runs while the node drains: it hands away, every few ticks,
// the leaderships the node gained since (an election it won, a transfer
// that raced the drain). One runs at a time.
func (n *Node) keepDrained() {
	if !n.drainKeeper.CompareAndSwap(false, true) {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer n.drainKeeper.Store(false)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-n.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		t := time.NewTicker(5 * n.cfg.TickInterval)
		defer t.Stop()
		for n.drainingLeaders() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if led := n.ledReplicas(); len(led) > 0 {
				n.handOffLeaders(ctx, led)
			}
		}
	}()
}

// ledReplicas are the local replicas leading their shards.
func (n *Node) ledReplicas() []*replication.Replica {
	var out []*replication.Replica
	for _, r := range n.store.Replicas() {
		if r.IsLeader() {
			out = append(out, r)
		}
	}
	return out
}

// handOffLeaders transfers the leaderships of led, a few at a time, and
// returns how many moved, and how many had no voter to go to.
func (n *Node) handOffLeaders(ctx context.Context, led []*replication.Replica) (moved, stuck int) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	sem := make(chan struct{}, drainParallelism)
	for _, r := range led {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return moved, stuck
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			gone, noTarget := n.handOffLeader(ctx, r)
			mu.Lock()
			defer mu.Unlock()
			if gone {
				moved++
			}
			if noTarget {
				stuck++
			}
		}()
	}
	wg.Wait()
	return moved, stuck
}

// handOffLeader moves r's leadership to the most caught-up voter on another
// live node, and reports whether r no longer leads, and whether it found
// no voter to move it to (a voter that refused a transfer is excluded from
// the next round, see noteRefused, so a refusal shows as noTarget then).
func (n *Node) handOffLeader(ctx context.Context, r *replication.Replica) (gone, noTarget bool) {
	// A transfer that does not finish within two election timeouts has
	// failed (the target is down or far behind): try again next round.
	tctx, cancel := context.WithTimeout(ctx, max(2*time.Duration(n.cfg.ElectionTicks)*n.cfg.TickInterval, 2*time.Second))
	defer cancel()
	st, err := r.ProgressStatus(tctx)
	if err != nil || !st.Leader {
		return err == nil, false
	}
	// The most caught-up voter on a live node that is not draining too, and
	// that did not just refuse a transfer (a draining node refuses them;
	// placement may not have told this node about it yet).
	var target, best uint64
	for _, p := range st.Progress {
		if p.Learner || p.NodeID == 0 || p.NodeID == n.cfg.NodeID || !n.store.NodeLive(p.NodeID) ||
			n.drainingPeer(p.NodeID) || n.refusedRecently(p.NodeID) {
			continue
		}
		if target == 0 || p.Match > best || (p.Match == best && p.NodeID < target) {
			target, best = p.NodeID, p.Match
		}
	}
	if target == 0 {
		// Expected, and retried, when every node drains (a whole cluster
		// stopping, an overloaded machine's slow disks): DrainLeaders
		// gives up after a few such rounds and says so once.
		n.log.Debug("drain: no live voter on another node (not itself draining) can take the leadership", "shard", r.ShardID())
		return false, true
	}
	if err := r.TransferLeader(tctx, target); err != nil && r.IsLeader() {
		n.log.Debug("drain: leadership transfer failed", "shard", r.ShardID(), "to", target, "err", err)
		if ctx.Err() == nil {
			n.noteRefused(target)
		}
		return false, false
	}
	return !r.IsLeader(), false
}

// DrainLeaders implements the Admin RPC: the receiving node drains itself,
// or forwards the request to the node named.
func (s *adminService) DrainLeaders(ctx context.Context, req *shalev1.DrainLeadersRequest) (*shalev1.DrainLeadersResponse, error) {
	n := s.n
	if id := req.GetNodeId(); id != 0 && id != n.cfg.NodeID {
		if isForwarded(ctx) {
			return nil, status.Errorf(codes.FailedPrecondition, "node %d received a forwarded drain for node %d", n.cfg.NodeID, id)
		}
		addr := n.addressOf(id)
		if addr == "" {
			return nil, status.Errorf(codes.NotFound, "node %d is not known to node %d", id, n.cfg.NodeID)
		}
		return shalev1.NewAdminClient(n.conn(addr)).DrainLeaders(forwarded(ctx), req)
	}
	// Answer before the caller's deadline, with what is left.
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-min(time.Until(dl)/10, time.Second)))
		defer cancel()
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.RequestTimeout)
		defer cancel()
	}
	moved, left := n.DrainLeaders(ctx)
	return &shalev1.DrainLeadersResponse{NodeId: n.cfg.NodeID, Transferred: uint32(moved), RemainingShardIds: left}, nil
}

// refusedFor is how long a drain avoids a node that let a leadership
// transfer time out (it drains too, or is overloaded).
const refusedFor = 10 * time.Second

func (n *Node) noteRefused(node uint64) {
	n.drainMu.Lock()
	defer n.drainMu.Unlock()
	if n.drainRefused == nil {
		n.drainRefused = map[uint64]time.Time{}
	}
	n.drainRefused[node] = time.Now()
}

func (n *Node) refusedRecently(node uint64) bool {
	n.drainMu.Lock()
	defer n.drainMu.Unlock()
	at, ok := n.drainRefused[node]
	return ok && time.Since(at) < refusedFor
}
