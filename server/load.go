package server

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// Load-based splitting: each node counts the requests it routes to each
// shard and keeps a sample of their keys; a shard this node leads whose
// request rate stays above SplitQPS for loadSplitTicks maintenance ticks is
// split at the median sampled key, and the new half's leadership moves to
// another node, so the load spreads.
const (
	// loadSampleSize is how many recent request keys a shard's sampler keeps.
	loadSampleSize = 512
	// loadSampleEvery samples one request in this many.
	loadSampleEvery = 4
	// loadSplitTicks is how many consecutive one-second ticks a shard's
	// rate must stay above the threshold.
	loadSplitTicks = 5
	// mergeQuietTicks is how many consecutive one-second ticks each of two
	// neighbours' leaders must have led its shard through, in one term,
	// with the peaks of their rates over those ticks together at most half
	// the split threshold, before an automatic merge: the merge's side of
	// the hysteresis (a load split needs loadSplitTicks above the whole
	// threshold), twice as long, so that a second or a few with fewer
	// requests (a stall, a leadership change) do not pass for a quiet shard.
	mergeQuietTicks = 2 * loadSplitTicks
)

// shardLoad is one shard's request counter and key sampler on this node.
type shardLoad struct {
	ops atomic.Uint64

	mu      sync.Mutex
	samples [][]byte // ring of sampled keys
	next    int
	// Maintenance-loop state.
	lastOps  uint64
	lastAt   time.Time
	qps      float64 // over the last tick
	hotTicks int
	// The merge guard's history: the rates of the last ticks this node led
	// the shard through (a ring; next is where the next one goes), how
	// many consecutive ones (up to mergeQuietTicks), and the term they were
	// led in (0: this node did not lead the shard at the last tick).
	ledRates [mergeQuietTicks]float64
	ledNext  int
	ledTicks int
	ledTerm  uint64
}

// loadReport is a shard's sustained load as one node measured it: over
// the last ticks (up to mergeQuietTicks) that node led the shard through in
// one term, how many there were and the highest rate among them.
type loadReport struct {
	ticks int
	peak  float64
}

// tick ends the tracker's maintenance tick at now and returns its request
// rate. term is the shard's Raft term while this node leads it, else 0: a
// tick whose start and end saw the same nonzero term was led throughout,
// and its rate joins the merge guard's history; any other tick clears it
// (the counts before a leadership began are those of a follower, which
// serves few of the shard's requests). A tick led throughout above
// splitQPS adds one to the load split's consecutive hot ticks; any other
// resets them.
func (l *shardLoad) tick(now time.Time, term uint64, splitQPS float64) float64 {
	ops := l.ops.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	qps := 0.0
	if !l.lastAt.IsZero() {
		qps = float64(ops-l.lastOps) / now.Sub(l.lastAt).Seconds()
	}
	l.lastOps, l.lastAt, l.qps = ops, now, qps
	switch {
	case term == 0 || term != l.ledTerm:
		l.ledTicks, l.ledTerm = 0, term
	default:
		l.ledRates[l.ledNext] = qps
		l.ledNext = (l.ledNext + 1) % mergeQuietTicks
		l.ledTicks = min(l.ledTicks+1, mergeQuietTicks)
	}
	if term != 0 && qps > splitQPS {
		l.hotTicks++
	} else {
		l.hotTicks = 0
	}
	return qps
}

// report returns the shard's sustained load by this node's history, given
// the shard's term while this node leads it (else 0): no ticks unless the
// node led the shard through its last tick and still leads it in that term.
func (l *shardLoad) report(term uint64) loadReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term == 0 || term != l.ledTerm {
		return loadReport{}
	}
	rep := loadReport{ticks: l.ledTicks}
	for i := 1; i <= l.ledTicks; i++ {
		rep.peak = max(rep.peak, l.ledRates[(l.ledNext-i+mergeQuietTicks)%mergeQuietTicks])
	}
	return rep
}

// quietForMerge reports whether the loads of two neighbours allow merging
// them: both leaders measured a whole window of mergeQuietTicks, and the
// peaks over it add up to at most half of splitQPS (a split needs the
// whole of it, for loadSplitTicks).
func quietForMerge(left, right loadReport, splitQPS int) bool {
	return left.ticks >= mergeQuietTicks && right.ticks >= mergeQuietTicks &&
		left.peak+right.peak <= float64(splitQPS)/2
}

func (l *shardLoad) record(key []byte) {
	if l.ops.Add(1)%loadSampleEvery != 0 {
		return
	}
	k := bytes.Clone(key)
	l.mu.Lock()
	if len(l.samples) < loadSampleSize {
		l.samples = append(l.samples, k)
	} else {
		l.samples[l.next] = k
		l.next = (l.next + 1) % loadSampleSize
	}
	l.mu.Unlock()
}

// medianKey returns the median sampled key strictly inside (start, end),
// or nil.
func (l *shardLoad) medianKey(start, end []byte) []byte {
	l.mu.Lock()
	keys := slices.Clone(l.samples)
	l.mu.Unlock()
	keys = slices.DeleteFunc(keys, func(k []byte) bool {
		return bytes.Compare(k, start) <= 0 || (len(end) > 0 && bytes.Compare(k, end) >= 0)
	})
	if len(keys) < 2 {
		return nil
	}
	slices.SortFunc(keys, bytes.Compare)
	return keys[len(keys)/2]
}

func (l *shardLoad) reset() {
	l.mu.Lock()
	l.samples, l.next, l.hotTicks = nil, 0, 0
	l.mu.Unlock()
}

// loadOf returns the load tracker of a shard, creating it.
func (n *Node) loadOf(shardID uint64) *shardLoad {
	if l, ok := n.loads.Load(shardID); ok {
		return l.(*shardLoad)
	}
	l, _ := n.loads.LoadOrStore(shardID, &shardLoad{})
	return l.(*shardLoad)
}

// splitHotShards splits, at most one per call, a shard this node leads
// whose request rate stayed above SplitQPS for loadSplitTicks ticks; the
// new half is first led by the replica node leading the fewest shards
// here (it campaigns as it applies the split: no leadership transfer, and
// no requests bounced by one, after the split).
func (n *Node) splitHotShards(ctx context.Context) {
	if n.cfg.SplitQPS < 0 {
		return
	}
	now := time.Now()
	var hot *shalev1.ShardDescriptor
	var hotLoad *shardLoad
	var hotQPS float64
	for _, r := range n.store.Replicas() {
		sm := n.Shard(r.ShardID())
		if sm == nil {
			continue
		}
		l := n.loadOf(r.ShardID())
		qps := l.tick(now, leaderTerm(r), float64(n.cfg.SplitQPS))
		l.mu.Lock()
		ready := l.hotTicks >= loadSplitTicks
		l.mu.Unlock()
		desc := sm.Descriptor()
		if ready && hot == nil && desc != nil && !desc.GetSystem() && !n.splitWithin(desc.GetShardId(), now, splitCooldown) {
			hot, hotLoad, hotQPS = desc, l, qps
		}
	}
	if hot == nil {
		return
	}
	key := hotLoad.medianKey(hot.GetStartKey(), hot.GetEndKey())
	if key == nil {
		return
	}
	n.noteSplit(hot.GetShardId(), now)
	hotLoad.reset()
	resp, err := (&adminService{n: n}).SplitShard(ctx, &shalev1.SplitShardRequest{
		SplitKey: key, ShardId: hot.GetShardId(), Automatic: true, RightLeaderNodeId: n.leastLeadingPeer(hot),
	})
	if err != nil {
		n.log.Warn("load-based split failed", "shard", hot.GetShardId(), "qps", hotQPS, "split_key", fmt.Sprintf("%q", key), "err", err)
		return
	}
	right := resp.GetRight()
	n.log.Info("split a shard over the load threshold", "shard", hot.GetShardId(), "qps", int(hotQPS), "threshold", n.cfg.SplitQPS,
		"split_key", fmt.Sprintf("%q", key), "right_shard", right.GetShardId())
	n.noteSplit(right.GetShardId(), now)
}

// leastLeadingPeer returns the live node, other than this one, with a
// voting replica of desc that leads the fewest of the shards this node
// hosts, or 0.
func (n *Node) leastLeadingPeer(desc *shalev1.ShardDescriptor) uint64 {
	leads := map[uint64]int{}
	for _, r := range n.store.Replicas() {
		if st := r.Status(); st.LeaderNodeID != 0 {
			leads[st.LeaderNodeID]++
		}
	}
	var best uint64
	for _, rd := range desc.GetReplicas() {
		id := rd.GetNodeId()
		if id == n.cfg.NodeID || rd.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_LEARNER || !n.store.NodeLive(id) {
			continue
		}
		if best == 0 || leads[id] < leads[best] || (leads[id] == leads[best] && id < best) {
			best = id
		}
	}
	return best
}

// splitCooldown is how long a shard this node split (or made by a split)
// waits before it splits again, while its moved-away half is compacted.
const splitCooldown = 10 * time.Second

// splitWithin reports whether this node split the shard (or created it by
// a split) in the last d.
func (n *Node) splitWithin(shardID uint64, now time.Time, d time.Duration) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	t, ok := n.lastSplit[shardID]
	return ok && now.Sub(t) < d
}

// recentQPS is the shard's request rate over the last maintenance tick, as
// routed through this node.
func (n *Node) recentQPS(shardID uint64) float64 {
	v, ok := n.loads.Load(shardID)
	if !ok {
		return 0
	}
	l := v.(*shardLoad)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.qps
}

// loadReport returns r's shard's sustained load by this node's history: no
// ticks unless this node leads it, in the term of that history.
func (n *Node) loadReport(r *replication.Replica) loadReport {
	v, ok := n.loads.Load(r.ShardID())
	if !ok {
		return loadReport{}
	}
	return v.(*shardLoad).report(leaderTerm(r))
}

// leaderTerm is r's Raft term while this node leads it, else 0.
func leaderTerm(r *replication.Replica) uint64 {
	if leader, term := r.Leadership(); leader {
		return term
	}
	return 0
}

func (n *Node) noteSplit(shardID uint64, now time.Time) {
	n.mu.Lock()
	n.lastSplit[shardID] = now
	n.mu.Unlock()
}
