// Package raftlog is the node-level Raft log store: one storage engine (the
// node's raft-log engine, opened by the caller with a synced WAL) holds the
// Raft logs of every shard (Raft group) replicated on the node.
//
// A Store owns the engine's raft keys and hands out one Log per shard. A Log
// implements raft.Storage (go.etcd.io/raft/v3) for its shard. Writes are
// staged into a caller-provided storage.Batch (Log.Append, Log.ApplySnapshot,
// Log.Compact, Log.Destroy) and made durable by Store.Commit, so that the
// writes of every shard handled in one Raft cycle share a single fsync.
// In-memory state (last index, truncated state, hard state, entry cache) is
// updated as soon as a change is staged.
//
// # Key layout
//
// Every key of a shard starts with the 9-byte shard prefix: the byte 'r'
// followed by the shard ID as 8 bytes big-endian. A suffix byte follows:
//
//	'r' | shardID (8, BE) | 'e' | index (8, BE)  -> raftpb.Entry, protobuf-encoded
//	'r' | shardID (8, BE) | 'h'                  -> raftpb.HardState, protobuf-encoded
//	'r' | shardID (8, BE) | 't'                  -> truncated state (20 bytes)
//
// The truncated state is the index and term of the last entry removed from
// the log (the entry before the first one kept): index (8 bytes BE), term
// (8 bytes BE), then the CRC-32C (Castagnoli) of those 16 bytes (4 bytes
// BE). A shard without a truncated-state key has truncated state (0, 0).
//
// Entries of a shard are sorted by index, its hard state and truncated
// state follow them, and shards are sorted by ID, so a shard's keys form the
// contiguous span ['r'|shardID, 'r'|shardID|0xff). The persisted entries of a
// shard are always exactly the indices (truncated index, last index], without
// gaps; Store.Shard verifies this when it loads a log.
//
// Anything read from the engine is validated as it is decoded (checksums,
// lengths, the index stored in an entry against the index in its key);
// damage is reported as an error naming the shard and, for an entry, its
// index. Decoding never panics.
package raftlog
