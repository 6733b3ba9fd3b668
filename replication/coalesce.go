package replication

import "go.etcd.io/raft/v3/raftpb"

// maxCoalescedAppendBytes bounds the entry data of a MsgApp that
// coalesceMessages builds from several (Raft's own bound, MaxSizePerMsg,
// is 1 MiB per message).
const maxCoalescedAppendBytes = 1 << 20

// coalesceMessages returns the messages of one Ready with the redundant
// appends and acknowledgements merged, as Raft would have sent them had the
// work arrived at once; msgs and the messages in it are left unchanged.
//
// Raft sends a leader's follower one MsgApp per proposal (each Propose
// broadcasts its entry), and an empty MsgApp carrying the new commit index
// each time the commit index moves; a follower answers every MsgApp with a
// MsgAppResp. At 16 clients a node sent as many MsgAppResps again as were
// needed and nearly two MsgApps per entry (docs/BENCHMARKS.md, "Where a
// put's time goes at 16 clients"). So, per destination:
//
//   - a MsgApp that continues the previous MsgApp to the same replica (its
//     Index is the last index the previous one carries, in the same term)
//     is appended to it: one MsgApp with both messages' entries, anchored
//     where the first one was, with the later (higher) commit index. An
//     empty MsgApp merges the same way, either side. A follower appends and
//     answers the merged message as it would the two, and the leader's
//     in-flight tracking is freed by the one answer for the last index.
//   - an accepting MsgAppResp followed, in the same Ready, by another
//     accepting one to the same replica in the same term acknowledging at
//     least as much is dropped: the later one says all it said.
//
// Only messages of one Ready are merged, and only across messages to other
// replicas: any other message to the same replica (a heartbeat, a
// MsgTimeoutNow) ends the run. Raft tolerates a message lost, and the
// merged message is one its leader could have sent, so safety does not
// rest on this; a merged message goes out where the first of its parts was.
func coalesceMessages(msgs []*raftpb.Message) []*raftpb.Message {
	if !mergeable(msgs) {
		return msgs
	}
	out := make([]*raftpb.Message, 0, len(msgs))
	// open[to] is the position in out of the MsgApp to replica to that a
	// later one may extend, and size[to] its entries' bytes.
	var open, size map[uint64]int
	for i, m := range msgs {
		to := m.GetTo()
		switch {
		case m.GetType() == raftpb.MsgAppResp && supersededAck(m, msgs[i+1:]):
			continue
		case m.GetType() == raftpb.MsgApp && plainApp(m):
			if j, ok := open[to]; ok {
				if merged := mergeApps(out[j], m, size[to]); merged != nil {
					out[j] = merged
					size[to] += entryBytes(m)
					continue
				}
			}
			if open == nil {
				open, size = make(map[uint64]int), make(map[uint64]int)
			}
			open[to], size[to] = len(out), entryBytes(m)
		default:
			delete(open, to)
		}
		out = append(out, m)
	}
	return out
}

// mergeable reports whether two appends, or two acknowledgements, go to
// the same replica: without that nothing merges, and coalesceMessages
// returns msgs without allocating (one MsgApp per follower at one client).
func mergeable(msgs []*raftpb.Message) bool {
	for i, m := range msgs {
		t := m.GetType()
		if t != raftpb.MsgApp && t != raftpb.MsgAppResp {
			continue
		}
		for _, o := range msgs[i+1:] {
			if o.GetType() == t && o.GetTo() == m.GetTo() {
				return true
			}
		}
	}
	return false
}

// plainApp reports whether m is an append with nothing but its entries,
// anchor and commit index: the MsgApps Raft sends in the replicate and
// probe states.
func plainApp(m *raftpb.Message) bool {
	return !m.GetReject() && m.Snapshot == nil && len(m.GetContext()) == 0 && len(m.GetResponses()) == 0 && m.Vote == nil
}

// mergeApps returns a MsgApp carrying a's entries then b's, or nil when b
// does not continue a (another term, a gap or overlap, or too many bytes
// with the size bytes a already holds). a and b are not changed.
func mergeApps(a, b *raftpb.Message, size int) *raftpb.Message {
	if a.GetTerm() != b.GetTerm() || a.GetFrom() != b.GetFrom() {
		return nil
	}
	last, lastTerm := a.GetIndex(), a.GetLogTerm()
	if n := len(a.GetEntries()); n > 0 {
		last, lastTerm = a.GetEntries()[n-1].GetIndex(), a.GetEntries()[n-1].GetTerm()
	}
	if b.GetIndex() != last || b.GetLogTerm() != lastTerm {
		return nil
	}
	if len(a.GetEntries()) > 0 && len(b.GetEntries()) > 0 && size+entryBytes(b) > maxCoalescedAppendBytes {
		return nil
	}
	ents := make([]*raftpb.Entry, 0, len(a.GetEntries())+len(b.GetEntries()))
	ents = append(append(ents, a.GetEntries()...), b.GetEntries()...)
	return &raftpb.Message{
		Type:    a.Type,
		To:      a.To,
		From:    a.From,
		Term:    a.Term,
		LogTerm: a.LogTerm,
		Index:   a.Index,
		Entries: ents,
		Commit:  maxCommit(a, b),
	}
}

func maxCommit(a, b *raftpb.Message) *uint64 {
	if b.GetCommit() > a.GetCommit() {
		return b.Commit
	}
	return a.Commit
}

func entryBytes(m *raftpb.Message) int {
	n := 0
	for _, e := range m.GetEntries() {
		n += len(e.GetData())
	}
	return n
}

// supersededAck reports whether m, a MsgAppResp, accepts entries and a
// later message of the same Ready to the same replica, before any other
// kind of message to it, accepts at least as much in the same term.
func supersededAck(m *raftpb.Message, later []*raftpb.Message) bool {
	if m.GetReject() || len(m.GetContext()) > 0 {
		return false
	}
	for _, o := range later {
		if o.GetTo() != m.GetTo() {
			continue
		}
		return o.GetType() == raftpb.MsgAppResp && !o.GetReject() && len(o.GetContext()) == 0 &&
			o.GetTerm() == m.GetTerm() && o.GetFrom() == m.GetFrom() && o.GetIndex() >= m.GetIndex()
	}
	return false
}

// commitOnly reports whether msgs is not empty and holds only appends
// without entries: what a leader sends its followers when the commit index
// moved and nothing new was proposed. A cycle sends such a Ready's
// messages with its followers' messages, after its write, rather than
// before it with the leaders' appends (docs/replication.md, "The Raft
// loop", step 5). A follower then applies later by at most that write; no
// put waits for it (its leader answers), only a follower read waiting for
// the follower to apply up to its leader's commit index.
func commitOnly(msgs []*raftpb.Message) bool {
	if len(msgs) == 0 {
		return false
	}
	for _, m := range msgs {
		if m.GetType() != raftpb.MsgApp || len(m.GetEntries()) > 0 {
			return false
		}
	}
	return true
}
