package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/shale-db/shale/proto/codec"
)

// Key layout; see the package comment.
const (
	keyPrefix       byte = 'r'
	suffixEntry     byte = 'e'
	suffixHardState byte = 'h'
	suffixTruncated byte = 't'

	shardPrefixLen = 1 + 8
	entryKeyLen    = shardPrefixLen + 1 + 8

	// truncatedStateLen is index, term and the CRC-32C of both.
	truncatedStateLen = 8 + 8 + 4
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is wrapped by every error that reports persisted raft-log state
// failing validation (a bad checksum, an undecodable value, an entry stored
// under the wrong index, a gap in a shard's entries).
var ErrCorrupt = errors.New("corrupt raft log state")

func appendShardPrefix(dst []byte, shardID uint64) []byte {
	dst = append(dst, keyPrefix)
	return binary.BigEndian.AppendUint64(dst, shardID)
}

func shardKey(shardID uint64, suffix byte) []byte {
	k := make([]byte, 0, shardPrefixLen+1)
	return append(appendShardPrefix(k, shardID), suffix)
}

// entryKey is the key of the entry at index.
func entryKey(shardID, index uint64) []byte {
	k := make([]byte, 0, entryKeyLen)
	k = appendShardPrefix(k, shardID)
	k = append(k, suffixEntry)
	return binary.BigEndian.AppendUint64(k, index)
}

// entriesEnd is an exclusive upper bound above every entry key of the shard.
func entriesEnd(shardID uint64) []byte { return shardKey(shardID, suffixEntry+1) }

func hardStateKey(shardID uint64) []byte { return shardKey(shardID, suffixHardState) }

func truncatedStateKey(shardID uint64) []byte { return shardKey(shardID, suffixTruncated) }

// shardStart and shardEnd bound every key of the shard: [start, end).
func shardStart(shardID uint64) []byte {
	return appendShardPrefix(make([]byte, 0, shardPrefixLen), shardID)
}

func shardEnd(shardID uint64) []byte { return shardKey(shardID, 0xff) }

// parseEntryKey returns the index of an entry key of the shard; ok is false
// for any other key.
func parseEntryKey(shardID uint64, key []byte) (index uint64, ok bool) {
	if len(key) != entryKeyLen || key[0] != keyPrefix ||
		binary.BigEndian.Uint64(key[1:9]) != shardID || key[9] != suffixEntry {
		return 0, false
	}
	return binary.BigEndian.Uint64(key[10:]), true
}

// encodeTruncatedState encodes the truncated state (index, term).
func encodeTruncatedState(index, term uint64) []byte {
	b := make([]byte, 16, truncatedStateLen)
	binary.BigEndian.PutUint64(b, index)
	binary.BigEndian.PutUint64(b[8:], term)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// decodeTruncatedState decodes what encodeTruncatedState produced. It
// returns an error wrapping ErrCorrupt (never panics) for any other input.
func decodeTruncatedState(b []byte) (index, term uint64, err error) {
	if len(b) != truncatedStateLen {
		return 0, 0, fmt.Errorf("%w: truncated state is %d bytes, want %d", ErrCorrupt, len(b), truncatedStateLen)
	}
	if got, want := binary.BigEndian.Uint32(b[16:]), crc32.Checksum(b[:16], crcTable); got != want {
		return 0, 0, fmt.Errorf("%w: truncated state checksum %#08x, want %#08x", ErrCorrupt, got, want)
	}
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), nil
}

// decodeEntry decodes the value stored under the key of the entry at index
// and checks that it is that entry.
func decodeEntry(index uint64, value []byte) (*raftpb.Entry, error) {
	e := new(raftpb.Entry)
	if err := codec.Unmarshal(value, e); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if e.Index == nil || e.GetIndex() != index {
		return nil, fmt.Errorf("%w: entry holds index %d", ErrCorrupt, e.GetIndex())
	}
	return e, nil
}

// decodeHardState decodes a stored hard state.
func decodeHardState(value []byte) (*raftpb.HardState, error) {
	hs := new(raftpb.HardState)
	if err := codec.Unmarshal(value, hs); err != nil {
		return nil, fmt.Errorf("%w: hard state: %v", ErrCorrupt, err)
	}
	return hs, nil
}
