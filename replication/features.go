package replication

import (
	"maps"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Feature is a set of bits of RaftMessageBatch.features: what a node reads
// beyond what every version of Shale did. Every batch of Raft messages a
// node sends advertises its features; a node that predates them sends
// none. A proposer uses a replicated format only once every node hosting
// one of its shard's replicas advertised reading it (Replica.NodesRead), so
// that during a rolling upgrade no node meets an entry it would apply
// differently.
type Feature uint64

const (
	// FeaturePackedEntries: the node's Raft layer decodes packed entries
	// (packed.go).
	FeaturePackedEntries = Feature(shalev1.RaftFeature_RAFT_FEATURE_PACKED_ENTRIES)
	// FeatureCompactCommands: the node's state machine applies the compact
	// forms of the server's RaftCommand (see RAFT_FEATURE_COMPACT_COMMANDS
	// in raft.proto). The Raft layer only advertises it
	// (Config.StateMachineFeatures).
	FeatureCompactCommands = Feature(shalev1.RaftFeature_RAFT_FEATURE_COMPACT_COMMANDS)
)

// features is the bit set this node advertises on its batches.
func (s *Store) features() uint64 {
	f := s.cfg.StateMachineFeatures
	if !s.cfg.DisablePackedEntries {
		f |= FeaturePackedEntries
	}
	return uint64(f)
}

// notePeerFeatures records the features node advertised on a batch (under
// s.mu).
func (s *Store) notePeerFeatures(node uint64, f Feature) {
	cur := *s.peerFeatures.Load()
	if had, ok := cur[node]; ok && had == f {
		return
	}
	next := maps.Clone(cur)
	next[node] = f
	s.peerFeatures.Store(&next)
}

// NodesRead reports whether every other node hosting a replica of r's
// shard, per its applied descriptor, advertised all of f on its last batch
// of Raft messages to this node. It is false for a node not heard from
// since this node started. It takes no lock: a proposer may ask it for
// every command.
func (r *Replica) NodesRead(f Feature) bool {
	s := r.store
	peers := *s.peerFeatures.Load()
	for _, rd := range r.sm.AppliedDescriptor().GetReplicas() {
		if n := rd.GetNodeId(); n != s.cfg.NodeID && peers[n]&f != f {
			return false
		}
	}
	return true
}
