// Package shard is one shard replica's replicated state: a storage engine
// instance holding the shard's data and metadata, and the deterministic
// apply logic of KV and system commands. A *Shard implements
// replication.StateMachine and serves the reads of the server (Get,
// MultiGet, Scan, and the system shard's Nodes and Shards).
//
// Engine key layout (see docs/shard-state-machine.md):
//
//	'd' + userKey                   -> stored value (format byte, create_revision,
//	                                   mod_revision, version as uvarints,
//	                                   expire_unix_nanos as varint, value bytes)
//	'm' + "format"                  -> layout version (1 byte: 6)
//	'm' + "applied"                 -> applied index, term, revision, oldest live and
//	                                   next dedup sequence, date of the last applied
//	                                   entry (a tag byte, then uvarints)
//	'm' + "confstate"               -> raftpb.ConfState (written when it changes)
//	'm' + "descriptor"              -> shalev1.ShardDescriptor (written when it changes)
//	'm' 0x01 + requestID            -> sequence (uvarint) + shalev1.CommandResult;
//	                                   evicted (absent) below the oldest live sequence
//	                                   (formats 1-5: 'm' "dedup-id/", sequence 8 bytes BE)
//	's' + "node/" + nodeID (8 BE)   -> shalev1.NodeDescriptor   (system shard)
//	's' + "shard/" + shardID (8 BE) -> shalev1.ShardDescriptor  (system shard)
//	's' + "pin/" + shardID (8 BE)   -> shalev1.ShardPin         (system shard)
//	's' + "next-shard-id"           -> lowest unallocated shard ID (system shard)
//
// Every Apply call writes the effects of all its entries and the new
// metadata in one unsynced storage batch: the Raft log is the durable
// record, and a restart replays it from the applied index found here.
package shard
