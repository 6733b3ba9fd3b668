package server

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
