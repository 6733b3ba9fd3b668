package grpctransport

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// olderRaftServer serves the Raft service as a node from before
// Raft.StreamSnapshot: that method answers Unimplemented (and is counted).
type olderRaftServer struct {
	shalev1.UnimplementedRaftServer
	s       *raftServer
	refused atomic.Int64
}

func (o *olderRaftServer) SendMessages(stream shalev1.Raft_SendMessagesServer) error {
	return o.s.SendMessages(stream)
}

func (o *olderRaftServer) SendSnapshot(stream shalev1.Raft_SendSnapshotServer) error {
	return o.s.SendSnapshot(stream)
}

func (o *olderRaftServer) StreamSnapshot(stream shalev1.Raft_StreamSnapshotServer) error {
	o.refused.Add(1)
	return o.UnimplementedRaftServer.StreamSnapshot(stream)
}

// formatRecorder records, through the testCorruptChunk hook, which format
// the chunks of each send were in.
type formatRecorder struct {
	mu                   sync.Mutex
	ordered, interleaved int
}

func (f *formatRecorder) hook(c *shalev1.SnapshotChunk) {
	if c.Header != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case c.Crc32C != 0 && c.RunningCrc32C == 0:
		f.ordered++
	case c.Crc32C == 0 && c.RunningCrc32C != 0:
		f.interleaved++
	}
}

func (f *formatRecorder) take() (ordered, interleaved int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ordered, interleaved = f.ordered, f.interleaved
	f.ordered, f.interleaved = 0, 0
	return ordered, interleaved
}

// TestSnapshotFormats: between two current nodes a snapshot goes in the
// interleaved format; to a node that predates it (StreamSnapshot answers
// Unimplemented before any data is sent) the same SendSnapshot falls back
// to the ordered format at once, and keeps to it for that node without
// asking again; a current receiver still takes the ordered format from an
// older sender.
func TestSnapshotFormats(t *testing.T) {
	c := newCluster(t)
	var formats formatRecorder
	n1 := c.start(1, "", Options{SnapshotChunkSize: 4 << 10})
	n1.tr.testCorruptChunk = formats.hook
	n2 := c.start(2, "", Options{})
	ckpt, kv := makeCheckpoint(t, 3000)

	send := func(to uint64) {
		t.Helper()
		if err := n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 9, ToNodeId: to}, ckpt); err != nil {
			t.Fatal(err)
		}
	}
	send(2)
	if o, i := formats.take(); o != 0 || i == 0 {
		t.Fatalf("to a current node: %d ordered and %d interleaved chunks", o, i)
	}
	got := n2.h.received()
	verifyDB(t, got[len(got)-1].dir, kv)

	// Node 3 predates the interleaved format.
	older := c.startWith(3, func(n *node, srv *grpc.Server) {
		o := &olderRaftServer{s: &raftServer{t: n.tr, h: n.h}}
		shalev1.RegisterRaftServer(srv, o)
		n.older = o
	})
	for round := 1; round <= 2; round++ {
		send(3)
		if o, i := formats.take(); o == 0 || i != 0 {
			t.Fatalf("to an older node, send %d: %d ordered and %d interleaved chunks", round, o, i)
		}
		if r := older.older.refused.Load(); r != 1 {
			t.Fatalf("after send %d the older node refused %d interleaved streams, want 1 (the first)", round, r)
		}
		got := older.h.received()
		verifyDB(t, got[len(got)-1].dir, kv)
	}

	// A current node takes the ordered format (from an older sender).
	n1.tr.markLegacyPeer(2)
	send(2)
	if o, i := formats.take(); o == 0 || i != 0 {
		t.Fatalf("ordered to a current node: %d ordered and %d interleaved chunks", o, i)
	}
	got = n2.h.received()
	verifyDB(t, got[len(got)-1].dir, kv)
	if s := n1.tr.Stats(); s.SnapshotsSent != 4 || s.SnapshotsFailed != 0 {
		t.Fatalf("sender stats %+v", s)
	}
}
