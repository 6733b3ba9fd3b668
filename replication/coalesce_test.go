package replication

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// app is a MsgApp from replica 1 in term 2 to replica to, anchored at
// (index, logTerm), carrying entries index+1.. of term 2 and commit.
func app(to, index, logTerm uint64, n int, commit uint64) *raftpb.Message {
	m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), To: proto.Uint64(to), From: proto.Uint64(1), Term: proto.Uint64(2),
		Index: proto.Uint64(index), LogTerm: proto.Uint64(logTerm), Commit: proto.Uint64(commit)}
	for i := range n {
		m.Entries = append(m.Entries, &raftpb.Entry{Index: proto.Uint64(index + 1 + uint64(i)), Term: proto.Uint64(2), Data: []byte{byte(i)}})
	}
	return m
}

// ack is a MsgAppResp from replica 2 to replica 1 in term 2.
func ack(index uint64, reject bool) *raftpb.Message {
	m := &raftpb.Message{Type: raftpb.MsgAppResp.Enum(), To: proto.Uint64(1), From: proto.Uint64(2), Term: proto.Uint64(2), Index: proto.Uint64(index)}
	if reject {
		m.Reject = proto.Bool(true)
	}
	return m
}

func msg(t raftpb.MessageType, to uint64) *raftpb.Message {
	return &raftpb.Message{Type: t.Enum(), To: proto.Uint64(to), From: proto.Uint64(1), Term: proto.Uint64(2)}
}

// describe renders messages as "type>to[index/logTerm:first-last,c=commit]".
func describe(msgs []*raftpb.Message) string {
	var parts []string
	for _, m := range msgs {
		s := fmt.Sprintf("%s>%d", strings.TrimPrefix(m.GetType().String(), "Msg"), m.GetTo())
		switch m.GetType() {
		case raftpb.MsgApp:
			s += fmt.Sprintf("[%d/%d", m.GetIndex(), m.GetLogTerm())
			if n := len(m.GetEntries()); n > 0 {
				s += fmt.Sprintf(":%d-%d", m.GetEntries()[0].GetIndex(), m.GetEntries()[n-1].GetIndex())
			}
			s += fmt.Sprintf(",c=%d]", m.GetCommit())
		case raftpb.MsgAppResp:
			s += fmt.Sprintf("[%d", m.GetIndex())
			if m.GetReject() {
				s += ",reject"
			}
			s += "]"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func TestCoalesceMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []*raftpb.Message
		want string
	}{
		{"one proposal per MsgApp, two followers",
			[]*raftpb.Message{app(2, 10, 2, 1, 9), app(3, 10, 2, 1, 9), app(2, 11, 2, 1, 9), app(3, 11, 2, 1, 9), app(2, 12, 2, 1, 9)},
			"App>2[10/2:11-13,c=9] App>3[10/2:11-12,c=9]"},
		{"commit-only MsgApp then entries",
			[]*raftpb.Message{app(2, 10, 2, 0, 10), app(2, 10, 2, 1, 10)},
			"App>2[10/2:11-11,c=10]"},
		{"entries then commit-only MsgApp: the later commit index",
			[]*raftpb.Message{app(2, 10, 2, 2, 9), app(2, 12, 2, 0, 11)},
			"App>2[10/2:11-12,c=11]"},
		{"a gap is not merged",
			[]*raftpb.Message{app(2, 10, 2, 1, 9), app(2, 12, 2, 1, 9)},
			"App>2[10/2:11-11,c=9] App>2[12/2:13-13,c=9]"},
		{"another anchor term is not merged",
			[]*raftpb.Message{app(2, 10, 2, 1, 9), app(2, 11, 1, 1, 9)},
			"App>2[10/2:11-11,c=9] App>2[11/1:12-12,c=9]"},
		{"another message to the replica ends the run",
			[]*raftpb.Message{app(2, 10, 2, 1, 9), msg(raftpb.MsgTimeoutNow, 2), app(2, 11, 2, 1, 9)},
			"App>2[10/2:11-11,c=9] TimeoutNow>2 App>2[11/2:12-12,c=9]"},
		{"messages to other replicas do not",
			[]*raftpb.Message{app(2, 10, 2, 1, 9), msg(raftpb.MsgHeartbeat, 3), app(2, 11, 2, 1, 9)},
			"App>2[10/2:11-12,c=9] Heartbeat>3"},
		{"earlier acknowledgements dropped",
			[]*raftpb.Message{ack(11, false), ack(12, false), ack(14, false)},
			"AppResp>1[14]"},
		{"a rejection is kept, and keeps what precedes it",
			[]*raftpb.Message{ack(11, false), ack(12, true), ack(14, false)},
			"AppResp>1[11] AppResp>1[12,reject] AppResp>1[14]"},
		{"an acknowledgement of less does not supersede",
			[]*raftpb.Message{ack(14, false), ack(12, false)},
			"AppResp>1[14] AppResp>1[12]"},
		{"nothing to merge", []*raftpb.Message{app(2, 10, 2, 1, 9)}, "App>2[10/2:11-11,c=9]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := make([]*raftpb.Message, len(tc.in))
			for i, m := range tc.in {
				before[i] = proto.Clone(m).(*raftpb.Message)
			}
			got := describe(coalesceMessages(tc.in))
			if got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
			for i := range tc.in {
				if !proto.Equal(before[i], tc.in[i]) {
					t.Errorf("message %d changed: %v, was %v", i, tc.in[i], before[i])
				}
			}
		})
	}
}

// TestCoalesceMessagesBoundsBytes: merged appends stay within
// maxCoalescedAppendBytes of entry data.
func TestCoalesceMessagesBoundsBytes(t *testing.T) {
	var in []*raftpb.Message
	big := make([]byte, maxCoalescedAppendBytes/3+1)
	for i := range 5 {
		m := app(2, uint64(10+i), 2, 1, 9)
		m.Entries[0].Data = big
		in = append(in, m)
	}
	got := coalesceMessages(in)
	if d := describe(got); d != "App>2[10/2:11-12,c=9] App>2[12/2:13-14,c=9] App>2[14/2:15-15,c=9]" {
		t.Fatalf("got %s", d)
	}
	for _, m := range got {
		if n := entryBytes(m); n > maxCoalescedAppendBytes {
			t.Errorf("a merged MsgApp carries %d bytes of entries", n)
		}
	}
}

// TestCoalesceMessagesNothingToMerge: a Ready with one append per follower
// (one client) is returned as it is, without an allocation.
func TestCoalesceMessagesNothingToMerge(t *testing.T) {
	in := []*raftpb.Message{app(2, 10, 2, 1, 9), app(3, 10, 2, 1, 9), msg(raftpb.MsgHeartbeat, 2)}
	if allocs := testing.AllocsPerRun(100, func() {
		if got := coalesceMessages(in); &got[0] != &in[0] || len(got) != len(in) {
			t.Fatal("a new slice")
		}
	}); allocs != 0 {
		t.Errorf("%v allocations", allocs)
	}
}

func TestCommitOnly(t *testing.T) {
	hb := &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), To: proto.Uint64(2)}
	for _, tc := range []struct {
		name string
		msgs []*raftpb.Message
		want bool
	}{
		{"none", nil, false},
		{"empty appends", []*raftpb.Message{app(2, 5, 2, 0, 5), app(3, 5, 2, 0, 5)}, true},
		{"an append with entries", []*raftpb.Message{app(2, 5, 2, 0, 5), app(3, 5, 2, 1, 5)}, false},
		{"a heartbeat", []*raftpb.Message{app(2, 5, 2, 0, 5), hb}, false},
	} {
		if got := commitOnly(tc.msgs); got != tc.want {
			t.Errorf("%s: commitOnly = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestCommitOnlyAppendsSentLate: a leader's Ready that only moves its
// followers' commit indexes (empty appends) is not sent before the cycle's
// write with the leaders' appends but after it, with the followers'
// messages; the followers still learn every commit. Node 1 leads shard 1
// and follows shard 2, so its cycles mix both kinds.
func TestCommitOnlyAppendsSentLate(t *testing.T) {
	var early, bad atomic.Int64
	var mu sync.Mutex
	var example string
	c := newTestCluster(t, func(cfg *Config) {
		if cfg.NodeID != 1 {
			return
		}
		cfg.earlySendHook = func(b *shalev1.RaftMessageBatch) {
			early.Add(1)
			msgs := make([]*raftpb.Message, 0, len(b.GetMessages()))
			for _, env := range b.GetMessages() {
				m := &raftpb.Message{}
				if err := codec.Unmarshal(env.GetMessage(), m); err != nil {
					t.Errorf("early batch: %v", err)
					return
				}
				msgs = append(msgs, m)
			}
			if commitOnly(msgs) {
				bad.Add(1)
				mu.Lock()
				example = fmt.Sprint(msgs)
				mu.Unlock()
			}
		}
	})
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	c.bootstrap(1, 1, 2, 3)
	c.bootstrap(2, 1, 2, 3)
	if err := c.get(1).store.Replica(1).Campaign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.get(2).store.Replica(2).Campaign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lead := c.leader(1); lead != 1 {
		t.Fatalf("shard 1 led by node %d, want 1", lead)
	}
	if lead := c.leader(2); lead != 2 {
		t.Fatalf("shard 2 led by node %d, want 2", lead)
	}
	var wg sync.WaitGroup
	for shard, node := range map[uint64]uint64{1: 1, 2: 2} {
		wg.Go(func() {
			for i := range 40 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := c.get(node).store.Replica(shard).Propose(ctx, []byte(fmt.Sprintf("k%02d=%d", i, shard)))
				cancel()
				if err != nil {
					t.Errorf("shard %d put %d: %v", shard, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	c.converged(1, 1, 2, 3)
	c.converged(2, 1, 2, 3)
	if early.Load() == 0 {
		t.Fatal("node 1 sent nothing before a cycle's write")
	}
	if n := bad.Load(); n > 0 {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("node 1 sent %d of %d early batches with only commit-index appends, e.g. %s", n, early.Load(), example)
	}
}
