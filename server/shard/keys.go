package shard

import (
	"bytes"
	"encoding/binary"
)

// Engine key layout (see docs/shard-state-machine.md). The first byte of
// every engine key says what it holds.
const (
	// prefixData precedes every user key: 'd' + userKey -> encoded value.
	prefixData = 'd'
	// prefixMeta precedes the shard's own metadata: 'm' + name.
	prefixMeta = 'm'
	// prefixSystem precedes the system shard's cluster metadata.
	prefixSystem = 's'
)

// Metadata keys.
var (
	// keyFormat holds one byte: the layout version (formatVersion).
	keyFormat = []byte("mformat")
	// keyApplied holds the applied state that changes with every Apply
	// (appliedRecord): applied index, term, revision, dedup bounds and the
	// last entry's date. Format 1 engines held only the index and term
	// here, and the rest under keyRevision, keyDedupBounds and keyHLC.
	keyApplied = []byte("mapplied")
	// keyConfState holds the raftpb.ConfState, protobuf-encoded.
	keyConfState = []byte("mconfstate")
	// keyDescriptor holds the shalev1.ShardDescriptor, protobuf-encoded.
	keyDescriptor = []byte("mdescriptor")
	// keyRevision held the shard revision, 8 bytes BE (format 1).
	keyRevision = []byte("mrevision")
	// keyDedupBounds held the dedup table's oldest live and next insertion
	// sequence numbers, 8 bytes BE each (format 1).
	keyDedupBounds = []byte("mdedup-bounds")
	// keyHLC held the date of the last applied entry (format 1).
	keyHLC = []byte("mhlc")
	// keyAbsorbed holds the ranges merges added, with their revisions
	// (encodeAbsorbed).
	keyAbsorbed = []byte("mabsorbed")
	// dedupPrefix + requestID -> insertion seq (uvarint) + CommandResult
	// (format 6; appendDedupEntry). An entry whose seq is below the table's
	// oldest live one is evicted: absent for lookups, and dropped by the
	// engine's compactions. The 0x01 sorts below every named metadata key,
	// so no other record starts with the prefix.
	dedupPrefix = []byte{prefixMeta, 0x01}
	// legacyDedupPrefix + requestID -> insertion seq (8 bytes BE) +
	// CommandResult: the table's entries as formats 1 to 5 wrote them. They
	// are read, evicted and dropped as before, and deleted all at once when
	// the table has evicted the last of them (keyDedupLegacyEnd).
	legacyDedupPrefix = []byte("mdedup-id/")
	// keyDedupLegacyEnd holds, as a uvarint, the table's next insertion
	// sequence when the engine moved to format 6: the entries below it may
	// be under legacyDedupPrefix. Absent when none of those may be live.
	keyDedupLegacyEnd = []byte("mdedup-legacy-end")
	// keyNoTTL, present (empty value), says that no record with an expiry
	// was ever written into the shard's user data since it was bootstrapped
	// empty (format 7): the expiry sweep has nothing to look for. The Apply
	// (or the backup log replayed by BootstrapFrom) that first writes such a
	// record deletes it; a split's right shard and a snapshot's copy
	// inherit it with the data.
	keyNoTTL = []byte("mno-ttl")
	// dedupSeqPrefix + seq (8 bytes BE) -> requestID (format 1: the
	// eviction order; deleted when an engine moves to format 2).
	dedupSeqPrefix = []byte("mdedup-seq/")
)

// System shard keys.
var (
	// nodePrefix + nodeID (8 bytes BE) -> shalev1.NodeDescriptor.
	nodePrefix = []byte("snode/")
	// shardPrefix + shardID (8 bytes BE) -> shalev1.ShardDescriptor.
	shardPrefix = []byte("sshard/")
	// pinPrefix + shardID (8 bytes BE) -> shalev1.ShardPin.
	pinPrefix = []byte("spin/")
	// keyNextShardID holds the lowest shard ID not yet allocated (8 bytes BE).
	keyNextShardID = []byte("snext-shard-id")
	// authPrefix holds keyAuthState alone.
	authPrefix = []byte("sauth/")
	// keyAuthState -> shalev1.AuthState: users, roles, signing keys.
	keyAuthState = []byte("sauth/state")
)

// formatVersion is the version of the engine key layout written in
// keyFormat. Version 2 keeps the per-Apply state in one record (keyApplied)
// and evicts dedup entries without deleting them; version 3 encodes that
// record compactly (appliedRecord); version 4 ends each applied entry's
// records in the WAL with one entry record (its mark and changes,
// appendEntryRecord) instead of a changes record and a mark; version 5 adds
// the revision item (changeRevision) to entry records, which a packed Raft
// entry's record holds (its commands have revisions of their own); version
// 6 keeps the dedup table under a 2-byte prefix with the sequence as a
// uvarint (dedupPrefix), 13 bytes less per entry, and reads the entries
// older versions wrote (legacyDedupPrefix) until they are evicted; version
// 7 adds keyNoTTL, which a version 6 binary would not delete when it writes
// a record with an expiry, so it must refuse the engine; version 8 writes
// change items without the values they replaced (changePutNew,
// changePutOver, changeDeleteOf: the engine, which keeps a history window,
// holds those values), which a version 7 binary could not decode, so it
// must refuse the engine. An engine of an older version is read as it is
// (its WAL's records too) and moves to the current version at its next
// write of metadata, in the batch of the first entry it writes.
const formatVersion = 8

// dedupFormat is the first format whose dedup entries are under
// dedupPrefix.
const dedupFormat = 6

// dataUpper is the exclusive upper bound of every data key.
var dataUpper = []byte{prefixData + 1}

// dataKey returns the engine key of a user key.
func dataKey(userKey []byte) []byte {
	k := make([]byte, 1+len(userKey))
	k[0] = prefixData
	copy(k[1:], userKey)
	return k
}

// dataBound returns the engine key bounding user keys at userKey, or
// dataUpper when userKey is nil (the end of the key space).
func dataBound(userKey []byte) []byte {
	if userKey == nil {
		return dataUpper
	}
	return dataKey(userKey)
}

// isDataKey reports whether an engine key holds a user key.
func isDataKey(k []byte) bool { return len(k) > 0 && k[0] == prefixData }

// u64Key appends id as 8 bytes big-endian to prefix (in a new slice).
func u64Key(prefix []byte, id uint64) []byte {
	k := make([]byte, len(prefix)+8)
	copy(k, prefix)
	binary.BigEndian.PutUint64(k[len(prefix):], id)
	return k
}

// dedupKey returns the dedup table's key of request id.
func dedupKey(id []byte) []byte {
	return append(append(make([]byte, 0, len(dedupPrefix)+len(id)), dedupPrefix...), id...)
}

// legacyDedupKey returns the key formats 1 to 5 stored request id's entry
// under.
func legacyDedupKey(id []byte) []byte {
	return append(bytes.Clone(legacyDedupPrefix), id...)
}

func dedupSeqKey(seq uint64) []byte { return u64Key(dedupSeqPrefix, seq) }

// prefixEnd returns the smallest key greater than every key starting with
// prefix (prefix must not be all 0xff).
func prefixEnd(prefix []byte) []byte {
	e := bytes.Clone(prefix)
	for i := len(e) - 1; i >= 0; i-- {
		if e[i] != 0xff {
			e[i]++
			return e[:i+1]
		}
	}
	return nil
}

// keyRange is a span of user keys [start, end); a nil end is the end of the
// key space.
type keyRange struct {
	start, end []byte
}

// contains reports whether k is in the range.
func (r keyRange) contains(k []byte) bool {
	return bytes.Compare(k, r.start) >= 0 && (r.end == nil || bytes.Compare(k, r.end) < 0)
}

// intersect returns the intersection of r and o and whether it is non-empty.
func (r keyRange) intersect(o keyRange) (keyRange, bool) {
	out := r
	if bytes.Compare(o.start, out.start) > 0 {
		out.start = o.start
	}
	if o.end != nil && (out.end == nil || bytes.Compare(o.end, out.end) < 0) {
		out.end = o.end
	}
	if out.end != nil && bytes.Compare(out.start, out.end) >= 0 {
		return out, false
	}
	return out, true
}

// endOrNil turns the protocol's "empty end key means unbounded" into a nil end.
func endOrNil(end []byte) []byte {
	if len(end) == 0 {
		return nil
	}
	return end
}
