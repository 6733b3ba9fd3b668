package replication

import (
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/raft/v3"
)

// Packed entries. When the Raft loop finds several proposals of one
// replica queued in a cycle, it proposes them as one Raft entry (entry
// version 2) instead of one entry each: the Raft log, the messages and the
// state machine's per-entry records are then paid once for all of them.
// Nothing waits for proposals to pack: the loop packs what queued while it
// was busy, and a lone proposal is written as before (version 1).
//
// Encoding of a packed entry: the version byte 2, then for each proposal,
// in proposal order, its ID as a varint (zigzag) of its difference from the
// previous proposal's (from 0 for the first; differences wrap around),
// its payload's length as a uvarint, and the payload. At least two
// proposals; every varint in its shortest form. A node's proposal IDs
// count up from a random start, so each ID after the first takes a byte
// or two.
//
// The Replica hands a packed entry to its state machine as one Entry per
// proposal, all with the entry's Index and Term, in order, with Part and
// Parts set (Entry); each proposal gets its own command's result.
//
// Nodes that predate packed entries cannot decode them, so a leader packs
// only once every node hosting one of its shard's replicas (per the applied
// descriptor) advertised RAFT_FEATURE_PACKED_ENTRIES on its last batch of
// Raft messages to this node: in a cluster being upgraded, nothing is
// packed until every replica's node runs a version that reads them.

const (
	entryVersionSingle = 1
	entryVersionPacked = 2
	// packBytes bounds a packed entry's encoding, well under a Raft
	// message's 1 MiB (MaxSizePerMsg): a larger proposal goes alone.
	packBytes = 256 << 10
)

// packedCommand is one proposal of a packed entry.
type packedCommand struct {
	id      uint64
	payload []byte
}

// appendPackedCommand appends one proposal to a packed entry's encoding
// (which starts with the byte entryVersionPacked); prev is the previous
// proposal's ID (0 for the first).
func appendPackedCommand(b []byte, prev, id uint64, payload []byte) []byte {
	b = binary.AppendVarint(b, int64(id-prev))
	b = binary.AppendUvarint(b, uint64(len(payload)))
	return append(b, payload...)
}

// errMalformedPacked is wrapped by decodePacked's errors.
var errMalformedPacked = errors.New("replication: malformed packed entry")

// decodePacked decodes a packed entry into its proposals, whose payloads
// alias data. Anything but a well-formed packed entry of at least two
// proposals is an error, never a panic.
func decodePacked(data []byte) ([]packedCommand, error) {
	if len(data) == 0 || data[0] != entryVersionPacked {
		return nil, fmt.Errorf("%w: not version %d", errMalformedPacked, entryVersionPacked)
	}
	p := data[1:]
	uvarint := func() (uint64, bool) {
		v, n := binary.Uvarint(p)
		// The shortest form only, so that an entry has one encoding.
		if n <= 0 || n != uvarintLen(v) {
			return 0, false
		}
		p = p[n:]
		return v, true
	}
	var cmds []packedCommand
	var prev uint64
	for len(p) > 0 {
		d, n := binary.Varint(p)
		if n <= 0 || n != uvarintLen(uint64(d<<1)^uint64(d>>63)) {
			return nil, fmt.Errorf("%w: bad proposal ID after %d proposals", errMalformedPacked, len(cmds))
		}
		p = p[n:]
		id := prev + uint64(d)
		prev = id
		size, ok := uvarint()
		if !ok || size > uint64(len(p)) {
			return nil, fmt.Errorf("%w: bad payload length after %d proposals", errMalformedPacked, len(cmds))
		}
		cmds = append(cmds, packedCommand{id: id, payload: p[:size:size]})
		p = p[size:]
	}
	if len(cmds) < 2 {
		return nil, fmt.Errorf("%w: %d proposals", errMalformedPacked, len(cmds))
	}
	return cmds, nil
}

// uvarintLen is the length of v's shortest uvarint encoding.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// packable reports whether p may share a Raft entry with other proposals:
// a command proposed with Propose (not a configuration change, nor one
// proposed with ProposeAlone).
func (p *proposal) packable() bool { return p.cc == nil && !p.alone }

// proposeAll hands queued proposals to Raft in order (loop side), packing
// runs of packable ones into single entries when the shard's nodes all
// read packed entries; bs is Raft's status.
func (r *Replica) proposeAll(props []*proposal, bs *raft.BasicStatus) {
	pack := len(props) > 1 && bs.RaftState == raft.StateLeader && r.store.packingAllowed(r)
	for i := 0; i < len(props); {
		j, size := i+1, 1+len(props[i].data)
		if pack && props[i].packable() {
			for j < len(props) && props[j].packable() && size+len(props[j].data) <= packBytes {
				size += len(props[j].data)
				j++
			}
		}
		if j == i+1 {
			r.propose(props[i], bs)
		} else {
			r.proposePacked(props[i:j], size, bs)
		}
		i = j
	}
}

// proposePacked proposes ps as one packed entry of about size bytes (loop
// side).
func (r *Replica) proposePacked(ps []*proposal, size int, bs *raft.BasicStatus) {
	data := make([]byte, 1, size)
	data[0] = entryVersionPacked
	var prev uint64
	for _, p := range ps {
		data = appendPackedCommand(data, prev, p.id, p.data[entryHeaderLen:])
		prev = p.id
	}
	r.proposed(ps, r.rn.Propose(data), bs)
	if m := r.store.cfg.Metrics; m != nil {
		m.packedProposals.Add(float64(len(ps)))
	}
}

// packingAllowed reports whether r's leader may pack proposals: packing is
// on (Config.DisablePackedEntries unset), and every other node hosting a
// replica of the shard, per the applied descriptor, advertised packed
// entries on its last batch of Raft messages to this node.
func (s *Store) packingAllowed(r *Replica) bool {
	return !s.cfg.DisablePackedEntries && r.NodesRead(FeaturePackedEntries)
}
