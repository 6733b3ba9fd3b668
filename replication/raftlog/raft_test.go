package raftlog

import (
	"fmt"
	"io"
	"log"
	"slices"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/shale-db/shale/storage"
)

// raftNode is one member of an in-process Raft group whose log is a Log.
type raftNode struct {
	id  uint64
	env *testEnv
	s   *Store
	l   *Log
	rn  *raft.RawNode
	// The state machine: the data of the applied normal entries by index.
	sm      map[uint64]string
	applied uint64
}

func (n *raftNode) start(t *testing.T) {
	t.Helper()
	n.l = mustShard(t, n.s, 1)
	n.l.SetCallbacks(
		func() *raftpb.ConfState { return &raftpb.ConfState{Voters: []uint64{1, 2, 3}} },
		func() (*raftpb.Snapshot, error) {
			term, err := n.l.Term(n.applied)
			if err != nil {
				return nil, err
			}
			return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
				Index: new(n.applied), Term: new(term),
				ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
			}}, nil
		})
	rn, err := raft.NewRawNode(&raft.Config{
		ID: n.id, ElectionTick: 10, HeartbeatTick: 1, Storage: n.l,
		Applied: n.applied, MaxSizePerMsg: 512, MaxInflightMsgs: 16,
		Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)},
	})
	if err != nil {
		t.Fatal(err)
	}
	n.rn = rn
}

// TestRaftGroup runs a three-node Raft group on Logs: elections, proposals,
// log truncation, a follower cut off long enough to need a snapshot, and a
// restart of every node from its engine. All nodes must apply the same
// entries.
func TestRaftGroup(t *testing.T) {
	nodes := make([]*raftNode, 3)
	for i := range nodes {
		n := &raftNode{id: uint64(i + 1), env: newTestEnv(t, Options{EntryCacheBytes: 2 << 10}), sm: map[uint64]string{}}
		n.s = n.env.store()
		l := mustShard(t, n.s, 1)
		b := storage.NewBatch()
		if err := l.ApplySnapshot(b, 1, 1, &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(1))}); err != nil {
			t.Fatal(err)
		}
		mustCommit(t, n.s, b)
		n.applied = 1
		n.start(t)
		nodes[i] = n
	}
	var queue []*raftpb.Message
	isolated := uint64(0)
	leader := func() *raftNode {
		for _, n := range nodes {
			if n.rn.Status().RaftState == raft.StateLeader && n.id != isolated {
				return n
			}
		}
		return nil
	}
	proposed, snapshots := 0, 0
	step := func(round int) {
		if round%3 == 0 {
			for _, n := range nodes {
				n.rn.Tick()
			}
		}
		if l := leader(); l != nil && round%2 == 0 {
			if err := l.rn.Propose([]byte(fmt.Sprintf("cmd-%d-%s", proposed, string(make([]byte, proposed%90))))); err == nil {
				proposed++
			}
		}
		msgs := queue
		queue = nil
		for _, m := range msgs {
			if m.GetTo() == isolated || m.GetFrom() == isolated {
				continue
			}
			to := nodes[m.GetTo()-1]
			if err := to.rn.Step(m); err != nil {
				t.Fatalf("node %d Step: %v", to.id, err)
			}
			if m.GetType() == raftpb.MsgSnap {
				nodes[m.GetFrom()-1].rn.ReportSnapshot(to.id, raft.SnapshotFinish)
				snapshots++
			}
		}
		for _, n := range nodes {
			if !n.rn.HasReady() {
				continue
			}
			rd := n.rn.Ready()
			b := storage.NewBatch()
			if !raft.IsEmptySnap(rd.Snapshot) {
				md := rd.Snapshot.GetMetadata()
				if err := n.l.ApplySnapshot(b, md.GetIndex(), md.GetTerm(), rd.HardState); err != nil {
					t.Fatalf("node %d ApplySnapshot: %v", n.id, err)
				}
				// The data travels out of band: copy a peer that applied it.
				for _, p := range nodes {
					if p.applied >= md.GetIndex() {
						n.sm = map[uint64]string{}
						for i, d := range p.sm {
							if i <= md.GetIndex() {
								n.sm[i] = d
							}
						}
						break
					}
				}
				n.applied = md.GetIndex()
			}
			if err := n.l.Append(b, rd.Entries, rd.HardState); err != nil {
				t.Fatalf("node %d Append: %v", n.id, err)
			}
			mustCommit(t, n.s, b)
			queue = append(queue, rd.Messages...)
			for _, e := range rd.CommittedEntries {
				if e.GetIndex() <= n.applied {
					continue
				}
				if e.GetIndex() != n.applied+1 {
					t.Fatalf("node %d applies %d after %d", n.id, e.GetIndex(), n.applied)
				}
				if e.GetType() == raftpb.EntryNormal && len(e.GetData()) > 0 {
					n.sm[e.GetIndex()] = string(e.GetData())
				}
				n.applied = e.GetIndex()
			}
			n.rn.Advance(rd)
			// Truncate the log behind the applied index now and then.
			if round%7 == 0 && n.applied > n.l.TruncatedIndex()+3 {
				b := storage.NewBatch()
				if err := n.l.Compact(b, n.applied-2); err != nil {
					t.Fatalf("node %d Compact: %v", n.id, err)
				}
				mustCommit(t, n.s, b)
			}
		}
	}
	round := 0
	run := func(rounds int) {
		for end := round + rounds; round < end; round++ {
			step(round)
		}
	}
	run(300)
	isolated = 3
	run(300)
	isolated = 0
	run(300)
	if snapshots == 0 {
		t.Fatalf("the cut-off follower caught up without a snapshot")
	}

	// Restart every node from its engine.
	for _, n := range nodes {
		n.s = n.env.reopen()
		n.start(t)
	}
	queue = nil
	run(400)

	// Let the group settle without new proposals, then compare.
	for l := leader(); l != nil && round < 3000; round++ {
		caughtUp := true
		for _, n := range nodes {
			if n.applied != l.applied {
				caughtUp = false
			}
		}
		if caughtUp && round%2 == 1 {
			break
		}
		step(round | 1) // odd rounds propose nothing
	}
	if proposed < 200 {
		t.Fatalf("only %d proposals accepted", proposed)
	}
	for _, n := range nodes[1:] {
		if n.applied != nodes[0].applied {
			t.Fatalf("node %d applied %d, node 1 %d", n.id, n.applied, nodes[0].applied)
		}
		keys := slices.Sorted(func(yield func(uint64) bool) {
			for k := range n.sm {
				if !yield(k) {
					return
				}
			}
		})
		for _, k := range keys {
			if nodes[0].sm[k] != n.sm[k] {
				t.Fatalf("node %d applied %q at %d, node 1 %q", n.id, n.sm[k], k, nodes[0].sm[k])
			}
		}
		if len(n.sm) != len(nodes[0].sm) {
			t.Fatalf("node %d applied %d commands, node 1 %d", n.id, len(n.sm), len(nodes[0].sm))
		}
	}
	t.Logf("%d proposals, %d snapshots, applied index %d, truncated at %d/%d/%d", proposed, snapshots, nodes[0].applied,
		nodes[0].l.TruncatedIndex(), nodes[1].l.TruncatedIndex(), nodes[2].l.TruncatedIndex())
}
