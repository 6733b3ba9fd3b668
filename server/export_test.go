package server

import (
	"context"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// SetMergeStepHook makes the node call hook after each MergeAbsorb step it
// proposes while driving a merge, with the step's kind ("begin", "records"
// or "commit") and its outcome; nil removes it. Tests use it to pause one
// driver of a merge while another runs.
func (n *Node) SetMergeStepHook(hook func(step string, err error)) {
	if hook == nil {
		n.mergeStepHook.Store(nil)
		return
	}
	n.mergeStepHook.Store(&hook)
}

// MergeShardsHere drives the merge of shard leftID with its right
// neighbour (or finishes one into it) from this node, as an Admin
// MergeShards or the maintenance loop on the left's leader would.
var MergeShardsHere = (*Node).mergeShards

// FreezeForMerge freezes shard rightID for a merge into shard leftID, from
// this node (which must host rightID), as a merge's first step does, and
// drives the merge no further: what is left is for the nodes' maintenance
// to finish, as after a driver that crashed.
func FreezeForMerge(n *Node, ctx context.Context, rightID, leftID uint64) error {
	r, sm := n.store.Replica(rightID), n.Shard(rightID)
	if r == nil || sm == nil {
		return n.shardNotFoundErr(rightID)
	}
	ctx, inner, cancel := n.requestCtx(ctx)
	defer cancel()
	_, err := n.proposeLed(ctx, inner, r, sm.Descriptor().GetEpoch(), freezeCommand(leftID))
	return err
}

// SweepScans runs one expiry-sweep round on n as a node that has just
// begun to lead its shards (no progress kept from earlier rounds), and
// reports whether it scanned shard id.
func SweepScans(n *Node, id uint64) bool {
	states := map[uint64]*sweepState{}
	n.sweepExpired(states)
	st := states[id]
	return st != nil && (st.idle || st.passTTL || st.cursor != nil)
}

// CallsWritesDirect is how many writes of KV.Calls streams n proposed from
// their stream's goroutine, without a call worker.
func CallsWritesDirect(n *Node) int64 { return n.kv.direct.Load() }

// EncodeCommand encodes cmd as n proposes it on its replica of shard id
// (encodeCommand: the compact form once every node of the shard reads it).
func EncodeCommand(n *Node, id uint64, cmd *shalev1.RaftCommand) ([]byte, error) {
	r := n.store.Replica(id)
	if r == nil {
		return nil, n.shardNotFoundErr(id)
	}
	return n.encodeCommand(r, cmd)
}

// ScanPageRoutedBy reads one page of [start, end) (reverse: from end down)
// on n's replica of shard id as a Scan routed by desc would, desc being
// perhaps a descriptor from before a split, and returns the page's keys,
// the key the rest of the scan resumes at, and whether the scan is done.
func ScanPageRoutedBy(n *Node, ctx context.Context, id uint64, desc *shalev1.ShardDescriptor, start, end []byte, reverse bool) (keys []string, resume []byte, done bool, err error) {
	r, sm := n.store.Replica(id), n.Shard(id)
	if r == nil || sm == nil {
		return nil, nil, false, n.shardNotFoundErr(id)
	}
	kvs, _, rest, done, _, err := n.scanPage(ctx, target{r: r, sm: sm, desc: desc}, scanPlan{start: start, end: end, reverse: reverse})
	for _, kv := range kvs {
		keys = append(keys, string(kv.GetKey()))
	}
	return keys, rest.resumeKey(), done, err
}
