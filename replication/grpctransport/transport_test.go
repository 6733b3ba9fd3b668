package grpctransport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/internal/netfault"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication/snapshot"
	"github.com/shale-db/shale/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder is a replication.Handler that records what it receives.
type recorder struct {
	mu        sync.Mutex
	batches   []*shalev1.RaftMessageBatch
	snapshots []receivedSnapshot
	// onSnapshot, if set, decides what HandleSnapshot does with dir
	// (default: keep it for the test to inspect).
	onSnapshot func(hdr *shalev1.SnapshotHeader, dir string) error
}

type receivedSnapshot struct {
	hdr *shalev1.SnapshotHeader
	dir string
}

func (r *recorder) HandleRaftBatch(b *shalev1.RaftMessageBatch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, b)
}

func (r *recorder) HandleSnapshot(_ context.Context, hdr *shalev1.SnapshotHeader, dir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.onSnapshot != nil {
		if err := r.onSnapshot(hdr, dir); err != nil {
			return err
		}
	}
	r.snapshots = append(r.snapshots, receivedSnapshot{hdr, dir})
	return nil
}

// messages returns the payloads received from node from, in order.
func (r *recorder) messages(from uint64) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, b := range r.batches {
		if b.FromNodeId != from {
			continue
		}
		for _, m := range b.Messages {
			out = append(out, string(m.Message))
		}
	}
	return out
}

func (r *recorder) setOnSnapshot(f func(hdr *shalev1.SnapshotHeader, dir string) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onSnapshot = f
}

func (r *recorder) received() []receivedSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snapshots)
}

func (r *recorder) numBatches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.batches)
}

// cluster is a set of test nodes that resolve each other's addresses.
type cluster struct {
	t     *testing.T
	mu    sync.Mutex
	addrs map[uint64]string
	nodes map[uint64]*node
}

type node struct {
	id       uint64
	tr       *Transport
	srv      *grpc.Server
	lis      net.Listener
	h        *recorder
	staging  string
	stopOnce sync.Once
	older    *olderRaftServer // set by TestSnapshotFormats
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, addrs: map[uint64]string{}, nodes: map[uint64]*node{}}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
		}
	})
	return c
}

func (c *cluster) resolve(id uint64) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.addrs[id]
	if !ok {
		return "", fmt.Errorf("unknown node %d", id)
	}
	return a, nil
}

// start starts node id listening on addr ("" = a new port), with opts as
// the base options (NodeID, Resolve, Logger and the staging dir are set
// here; ClusterID defaults to "test").
func (c *cluster) start(id uint64, addr string, opts Options) *node {
	c.t.Helper()
	return c.startOn(id, addr, opts, func(n *node, srv *grpc.Server) { n.tr.Register(srv, n.h) })
}

// startWith starts node id with default options on a new port, its Raft
// service registered on srv by register instead of Transport.Register.
func (c *cluster) startWith(id uint64, register func(n *node, srv *grpc.Server)) *node {
	c.t.Helper()
	return c.startOn(id, "", Options{}, register)
}

func (c *cluster) startOn(id uint64, addr string, opts Options, register func(n *node, srv *grpc.Server)) *node {
	c.t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	var err error
	for i := 0; i < 50; i++ { // a just-closed port can take a moment to free
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	opts.NodeID = id
	if opts.ClusterID == "" {
		opts.ClusterID = "test"
	}
	opts.Resolve = c.resolve
	opts.Logger = quietLogger
	if opts.SnapshotStagingDir == "" {
		opts.SnapshotStagingDir = filepath.Join(c.t.TempDir(), "staging")
	}
	n := &node{id: id, tr: New(opts), srv: grpc.NewServer(ServerOptions()...), lis: lis, h: &recorder{}, staging: opts.SnapshotStagingDir}
	register(n, n.srv)
	go func() { _ = n.srv.Serve(lis) }()
	c.mu.Lock()
	c.addrs[id] = lis.Addr().String()
	c.nodes[id] = n
	c.mu.Unlock()
	return n
}

func (n *node) stop() {
	n.stopOnce.Do(func() {
		_ = n.tr.Close()
		n.srv.Stop()
	})
}

func env(shard uint64, payload string) *shalev1.RaftEnvelope {
	return &shalev1.RaftEnvelope{ShardId: shard, Message: []byte(payload)}
}

func batch(to uint64, payloads ...string) *shalev1.RaftMessageBatch {
	b := &shalev1.RaftMessageBatch{ToNodeId: to}
	for _, p := range payloads {
		b.Messages = append(b.Messages, env(1, p))
	}
	return b
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func TestExchangeTwoNodes(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{})
	n2 := c.start(2, "", Options{})
	const N = 200
	for i := 0; i < N; i++ {
		n1.tr.Send(batch(2, fmt.Sprintf("1to2-%d", i)))
		n2.tr.Send(batch(1, fmt.Sprintf("2to1-%d", i)))
	}
	waitFor(t, "all messages", 10*time.Second, func() bool {
		return len(n2.h.messages(1)) == N && len(n1.h.messages(2)) == N
	})
	if got := n2.h.messages(1); !slices.Equal(got, seq("1to2", N)) {
		t.Fatalf("node 2 got %v", got)
	}
	if got := n1.h.messages(2); !slices.Equal(got, seq("2to1", N)) {
		t.Fatalf("node 1 got %v", got)
	}
	n2.h.mu.Lock()
	for _, b := range n2.h.batches {
		if b.ClusterId != "test" || b.FromNodeId != 1 || b.ToNodeId != 2 {
			t.Fatalf("batch not stamped: cluster %q from %d to %d", b.ClusterId, b.FromNodeId, b.ToNodeId)
		}
	}
	n2.h.mu.Unlock()
	if !n1.tr.Reachable(2) || !n2.tr.Reachable(1) {
		t.Fatal("peers not reachable")
	}
	if n1.tr.Reachable(3) {
		t.Fatal("unknown node reachable")
	}
	s1, s2 := n1.tr.Stats(), n2.tr.Stats()
	if s1.MessagesSent != N || s2.MessagesReceived != N || s1.BatchesDropped != 0 || s1.Connects != 1 {
		t.Fatalf("stats: %+v / %+v", s1, s2)
	}
	if s1.BatchesSent+s1.BatchesCoalesced != N {
		t.Fatalf("sent %d + coalesced %d != %d", s1.BatchesSent, s1.BatchesCoalesced, N)
	}
}

func TestExchangeThreeNodes(t *testing.T) {
	c := newCluster(t)
	nodes := []*node{c.start(1, "", Options{}), c.start(2, "", Options{}), c.start(3, "", Options{})}
	const N = 100
	var wg sync.WaitGroup
	for _, from := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < N; i++ {
				for _, to := range nodes {
					if to != from {
						from.tr.Send(batch(to.id, fmt.Sprintf("%dto%d-%d", from.id, to.id, i)))
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, to := range nodes {
		for _, from := range nodes {
			if to == from {
				continue
			}
			want := seq(fmt.Sprintf("%dto%d", from.id, to.id), N)
			waitFor(t, fmt.Sprintf("%d -> %d", from.id, to.id), 10*time.Second, func() bool {
				return len(to.h.messages(from.id)) == N
			})
			if got := to.h.messages(from.id); !slices.Equal(got, want) {
				t.Fatalf("%d got from %d: %v", to.id, from.id, got)
			}
		}
	}
}

// gate blocks the peer goroutine in testBeforeSend on its first send until
// released, so the test controls what accumulates in the queue.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) hook(uint64, *shalev1.RaftMessageBatch) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.release
	}
}

func TestCoalescing(t *testing.T) {
	c := newCluster(t)
	c.start(2, "", Options{})
	n1 := c.start(1, "", Options{})
	g := newGate()
	n1.tr.testBeforeSend = g.hook
	n1.tr.Send(batch(2, "m-0"))
	<-g.entered
	// While the first batch is held, queue many more.
	const N = 500
	for i := 1; i < N; i++ {
		n1.tr.Send(batch(2, fmt.Sprintf("m-%d", i)))
	}
	close(g.release)
	n2 := c.nodes[2]
	waitFor(t, "all messages", 10*time.Second, func() bool { return len(n2.h.messages(1)) == N })
	if got := n2.h.messages(1); !slices.Equal(got, seq("m", N)) {
		t.Fatalf("order: %v", got)
	}
	// The sender counts a batch once its send returned, which can be
	// after the receiver has it (failed CI under load: BatchesSent 1).
	waitFor(t, "the sender's counts of the second batch", 10*time.Second, func() bool {
		s := n1.tr.Stats()
		return s.BatchesSent >= 2 && s.BatchesCoalesced >= N-2
	})
	s := n1.tr.Stats()
	if s.BatchesSent != 2 || s.BatchesCoalesced != N-2 || n2.h.numBatches() != 2 {
		t.Fatalf("want 2 stream sends (1 + %d coalesced), stats %+v, received %d batches", N-1, s, n2.h.numBatches())
	}
}

func TestCoalesceQuiescedAndSizeCap(t *testing.T) {
	tr := New(Options{NodeID: 1, ClusterID: "c", Logger: quietLogger, QueueLen: 16, MaxBatchBytes: 1000})
	defer tr.Close()
	p := newPeer(tr, 2)
	q := func(b *shalev1.RaftMessageBatch, shards ...uint64) *shalev1.RaftMessageBatch {
		b.QuiescedShards = shards
		return b
	}
	at := func(wall int64) *shalev1.HlcTimestamp { return &shalev1.HlcTimestamp{WallNanos: wall} }
	first := q(&shalev1.RaftMessageBatch{Messages: []*shalev1.RaftEnvelope{env(4, "a")}, Hlc: at(1)}, 5, 6, 6)
	p.queue <- q(&shalev1.RaftMessageBatch{Messages: []*shalev1.RaftEnvelope{env(5, "b")}, Hlc: at(2)}, 7)                      // wakes 5
	p.queue <- q(&shalev1.RaftMessageBatch{Hlc: at(3)}, 6, 5)                                                                   // re-quiesces 5
	p.queue <- q(&shalev1.RaftMessageBatch{Messages: []*shalev1.RaftEnvelope{env(7, "c")}, Features: 1, ApplyingBacklog: true}) // wakes 7; no clock
	p.queue <- &shalev1.RaftMessageBatch{Messages: []*shalev1.RaftEnvelope{env(9, string(make([]byte, 2000)))}}
	p.queue <- batch(2, "after")
	firstMsgs := first.Messages
	out, n := p.coalesce(first)
	if n != 4 {
		t.Fatalf("merged %d batches, want 4 (the big one is held over)", n)
	}
	var payloads []string
	for _, m := range out.Messages {
		payloads = append(payloads, string(m.Message))
	}
	if !slices.Equal(payloads, []string{"a", "b", "c"}) {
		t.Fatalf("messages %v", payloads)
	}
	if !slices.Equal(out.QuiescedShards, []uint64{6, 5}) {
		t.Fatalf("quiesced %v, want [6 5]", out.QuiescedShards)
	}
	if out.ClusterId != "c" || out.FromNodeId != 1 || out.ToNodeId != 2 {
		t.Fatalf("not stamped: %+v", out)
	}
	if out.GetHlc().GetWallNanos() != 3 {
		t.Fatalf("merged batch carries clock reading %v, want the latest, 3", out.GetHlc())
	}
	if out.GetFeatures() != 1 {
		t.Fatalf("merged batch carries features %d, want the latest batch's, 1", out.GetFeatures())
	}
	if !out.GetApplyingBacklog() {
		t.Fatal("merged batch does not say the sender applies a backlog, as its latest batch does")
	}
	if len(first.Messages) != 1 || &first.Messages[0] != &firstMsgs[0] || !slices.Equal(first.QuiescedShards, []uint64{5, 6, 6}) {
		t.Fatal("coalesce modified the caller's batch")
	}
	if p.pending == nil || len(p.pending.Messages[0].Message) != 2000 {
		t.Fatal("oversized batch not held over")
	}
	big := p.pending
	p.pending = nil
	// A batch over the cap on its own is sent alone.
	out, n = p.coalesce(big)
	if n != 1 || len(out.Messages) != 1 || p.pending != nil || len(p.queue) != 1 {
		t.Fatalf("second coalesce: %d batches, %d messages", n, len(out.Messages))
	}
}

// TestCoalesceLoneBatch: a batch alone in the queue goes as it is when it
// is already stamped with this node's and the peer's IDs (no copy of its
// header per send), and as a stamped copy otherwise, the caller's batch
// unmodified either way.
func TestCoalesceLoneBatch(t *testing.T) {
	tr := New(Options{NodeID: 1, ClusterID: "c", Logger: quietLogger, QueueLen: 16, MaxBatchBytes: 1000})
	defer tr.Close()
	p := newPeer(tr, 2)
	stamped := &shalev1.RaftMessageBatch{ClusterId: "c", FromNodeId: 1, ToNodeId: 2, Messages: []*shalev1.RaftEnvelope{env(4, "a")}, Features: 3}
	if out, n := p.coalesce(stamped); out != stamped || n != 1 {
		t.Fatalf("a stamped lone batch: got %p (%d batches), want the batch itself %p", out, n, stamped)
	}
	if allocs := testing.AllocsPerRun(100, func() { p.coalesce(stamped) }); allocs != 0 {
		t.Fatalf("coalescing a stamped lone batch allocates %v times", allocs)
	}
	bare := &shalev1.RaftMessageBatch{Messages: []*shalev1.RaftEnvelope{env(4, "a")}, Features: 3, ApplyingBacklog: true}
	out, n := p.coalesce(bare)
	if out == bare || n != 1 || out.ClusterId != "c" || out.FromNodeId != 1 || out.ToNodeId != 2 || out.Features != 3 || !out.ApplyingBacklog || len(out.Messages) != 1 {
		t.Fatalf("an unstamped lone batch: %+v (%d batches)", out, n)
	}
	if bare.ClusterId != "" || bare.FromNodeId != 0 || bare.ToNodeId != 0 {
		t.Fatal("coalesce modified the caller's batch")
	}
}

func TestSendNeverBlocksWhenQueueFull(t *testing.T) {
	c := newCluster(t)
	c.start(2, "", Options{})
	const queueLen = 4
	n1 := c.start(1, "", Options{QueueLen: queueLen})
	g := newGate()
	n1.tr.testBeforeSend = g.hook
	n1.tr.Send(batch(2, "first"))
	<-g.entered
	const N = 1000
	start := time.Now()
	for i := 0; i < N; i++ {
		n1.tr.Send(batch(2, fmt.Sprintf("m-%d", i)))
	}
	// The peer goroutine is parked, so a blocking Send would hang here
	// for good; the bound only needs to be generous for a loaded machine.
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("%d Sends took %v", N, d)
	}
	if s := n1.tr.Stats(); s.BatchesDropped != N-queueLen || s.MessagesDropped != N-queueLen {
		t.Fatalf("dropped %d batches / %d messages, want %d", s.BatchesDropped, s.MessagesDropped, N-queueLen)
	}
	close(g.release)
	n2 := c.nodes[2]
	want := append([]string{"first"}, seq("m", queueLen)...)
	waitFor(t, "queued messages", 10*time.Second, func() bool { return len(n2.h.messages(1)) == len(want) })
	if got := n2.h.messages(1); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	// A node nobody listens on: Send still returns at once.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	c.mu.Lock()
	c.addrs[9] = dead
	c.mu.Unlock()
	start = time.Now()
	for i := 0; i < 2*DefaultQueueLen; i++ {
		n1.tr.Send(batch(9, "x"))
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Sends to a dead node took %v", d)
	}
	waitFor(t, "failed connects", 5*time.Second, func() bool { return n1.tr.Stats().ConnectFailures > 0 })
	if n1.tr.Reachable(9) {
		t.Fatal("dead node reachable")
	}
}

func TestReconnectAfterPeerRestart(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, ReachableGrace: 50 * time.Millisecond})
	n2 := c.start(2, "", Options{})
	addr := n2.lis.Addr().String()
	n1.tr.Send(batch(2, "before"))
	waitFor(t, "first message", 5*time.Second, func() bool { return len(n2.h.messages(1)) == 1 })

	n2.stop()
	waitFor(t, "peer unreachable", 5*time.Second, func() bool { return !n1.tr.Reachable(2) })
	// Batches sent while the peer is down are dropped or delayed, never
	// block.
	for i := 0; i < 50; i++ {
		n1.tr.Send(batch(2, "while-down"))
	}

	n2b := c.start(2, addr, Options{})
	if n2b.lis.Addr().String() != addr {
		t.Fatalf("restarted on %s, want %s", n2b.lis.Addr(), addr)
	}
	// Keep sending until a batch sent after the restart arrives.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		n1.tr.Send(batch(2, fmt.Sprintf("after-%d", i)))
		if msgs := n2b.h.messages(1); len(msgs) > 0 && bytes.HasPrefix([]byte(msgs[len(msgs)-1]), []byte("after-")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no batch arrived after the restart; stats %+v", n1.tr.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !n1.tr.Reachable(2) {
		t.Fatal("restarted peer not reachable")
	}
	if s := n1.tr.Stats(); s.Reconnects < 1 {
		t.Fatalf("no reconnect counted: %+v", s)
	}
}

func TestResolveCalledOnReconnect(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	n2 := c.start(2, "", Options{})
	n1.tr.Send(batch(2, "one"))
	waitFor(t, "first message", 5*time.Second, func() bool { return len(n2.h.messages(1)) == 1 })
	n2.stop()
	// Node 2 comes back on a different port; the resolver learns it.
	n2b := c.start(2, "", Options{})
	waitFor(t, "message at the new address", 10*time.Second, func() bool {
		n1.tr.Send(batch(2, "two"))
		return len(n2b.h.messages(1)) > 0
	})
}

func TestWrongClusterRejected(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	n2 := c.start(2, "", Options{ClusterID: "other"})
	for i := 0; i < 20; i++ {
		n1.tr.Send(batch(2, "x"))
		time.Sleep(5 * time.Millisecond)
	}
	waitFor(t, "rejections", 5*time.Second, func() bool { return n2.tr.Stats().BatchesRejected > 0 })
	if n := n2.h.numBatches(); n != 0 {
		t.Fatalf("handler got %d batches from another cluster", n)
	}

	// The same through a raw stream, and for a batch addressed to another
	// node: the stream fails with FailedPrecondition.
	conn, err := grpc.NewClient(n2.lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, b := range []*shalev1.RaftMessageBatch{
		{ClusterId: "test", FromNodeId: 1, ToNodeId: 2, Messages: []*shalev1.RaftEnvelope{env(1, "x")}},
		{ClusterId: "other", FromNodeId: 1, ToNodeId: 3, Messages: []*shalev1.RaftEnvelope{env(1, "x")}},
	} {
		stream, err := shalev1.NewRaftClient(conn).SendMessages(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(b)
		_, err = stream.CloseAndRecv()
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("batch %v: err = %v, want FailedPrecondition", b, err)
		}
	}
	// A correctly addressed batch is delivered.
	stream, err := shalev1.NewRaftClient(conn).SendMessages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&shalev1.RaftMessageBatch{ClusterId: "other", FromNodeId: 1, ToNodeId: 2, Messages: []*shalev1.RaftEnvelope{env(1, "ok")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if got := n2.h.messages(1); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("got %v", got)
	}
}

// makeCheckpoint creates a storage engine, writes n keys (some flushed to
// SSTs, some only in the WAL) and checkpoints it.
func makeCheckpoint(t testing.TB, n int) (string, map[string]string) {
	t.Helper()
	root := t.TempDir()
	db, err := storage.Open(filepath.Join(root, "db"), &storage.Options{MemTableSize: 256 << 10, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	kv := make(map[string]string, n)
	for i := 0; i < n; i++ {
		k, v := fmt.Sprintf("key-%08d", i), fmt.Sprintf("value-%d-%s", i, bytes.Repeat([]byte{'v'}, i%100))
		if err := db.Set([]byte(k), []byte(v), storage.NoSync); err != nil {
			t.Fatal(err)
		}
		kv[k] = v
		if i == n/2 {
			if err := db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	ckpt := filepath.Join(root, "ckpt")
	if _, err := db.Checkpoint(ckpt); err != nil {
		t.Fatal(err)
	}
	return ckpt, kv
}

func verifyDB(t testing.TB, dir string, kv map[string]string) {
	t.Helper()
	db, err := storage.Open(dir, &storage.Options{Logger: quietLogger, ErrorIfNotExists: true})
	if err != nil {
		t.Fatalf("open received snapshot: %v", err)
	}
	defer db.Close()
	for k, v := range kv {
		got, err := db.Get([]byte(k))
		if err != nil || string(got) != v {
			t.Fatalf("get %s = %q, %v; want %q", k, got, err, v)
		}
	}
}

func assertEmptyDir(t testing.TB, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("%s not empty: %v", dir, entries)
	}
}

func TestSnapshotDelivered(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{SnapshotLimiter: snapshot.NewLimiter(64 << 20), SnapshotChunkSize: 64 << 10})
	n2 := c.start(2, "", Options{})
	ckpt, kv := makeCheckpoint(t, 4000)
	installed := filepath.Join(t.TempDir(), "installed")
	n2.h.setOnSnapshot(func(hdr *shalev1.SnapshotHeader, dir string) error {
		// Install: take ownership by moving the directory.
		return os.Rename(dir, installed)
	})
	hdr := &shalev1.SnapshotHeader{ShardId: 9, ToNodeId: 2, RaftMessage: []byte("snap")}
	if err := n1.tr.SendSnapshot(context.Background(), hdr, ckpt); err != nil {
		t.Fatal(err)
	}
	if len(hdr.Files) != 0 || hdr.ClusterId != "" {
		t.Fatal("SendSnapshot modified the caller's header")
	}
	if len(n2.h.received()) != 1 {
		t.Fatalf("handler got %d snapshots", len(n2.h.received()))
	}
	got := n2.h.received()[0].hdr
	if got.ShardId != 9 || got.FromNodeId != 1 || got.ToNodeId != 2 || got.ClusterId != "test" || string(got.RaftMessage) != "snap" || len(got.Files) == 0 {
		t.Fatalf("header %v", got)
	}
	verifyDB(t, installed, kv)
	s1, s2 := n1.tr.Stats(), n2.tr.Stats()
	if s1.SnapshotsSent != 1 || s1.SnapshotBytesSent == 0 || s2.SnapshotsReceived != 1 || s2.SnapshotBytesReceived != s1.SnapshotBytesSent {
		t.Fatalf("stats %+v / %+v", s1, s2)
	}
	assertEmptyDir(t, n2.staging)
}

func TestSnapshotCorrupted(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{SnapshotChunkSize: 16 << 10})
	n2 := c.start(2, "", Options{})
	ckpt, _ := makeCheckpoint(t, 2000)
	var mu sync.Mutex
	corrupted := false
	n1.tr.testCorruptChunk = func(ch *shalev1.SnapshotChunk) {
		mu.Lock()
		defer mu.Unlock()
		if !corrupted && len(ch.Data) > 100 && ch.Offset > 0 {
			ch.Data[100] ^= 1
			corrupted = true
		}
	}
	err := n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 2}, ckpt)
	if status.Code(err) != codes.DataLoss {
		t.Fatalf("err = %v, want DataLoss", err)
	}
	if !bytes.Contains([]byte(err.Error()), []byte("checksum")) {
		t.Fatalf("error does not say what was wrong: %v", err)
	}
	if len(n2.h.received()) != 0 {
		t.Fatal("HandleSnapshot called for a corrupt snapshot")
	}
	assertEmptyDir(t, n2.staging)
	if s := n1.tr.Stats(); s.SnapshotsFailed != 1 || s.SnapshotsSent != 0 {
		t.Fatalf("sender stats %+v", s)
	}
	if s := n2.tr.Stats(); s.SnapshotsRejected != 1 || s.SnapshotsReceived != 0 {
		t.Fatalf("receiver stats %+v", s)
	}
}

func TestSnapshotRefused(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{})
	n2 := c.start(2, "", Options{})
	ckpt, _ := makeCheckpoint(t, 100)

	// The handler refuses (and, owning dir, removes it).
	n2.h.setOnSnapshot(func(hdr *shalev1.SnapshotHeader, dir string) error {
		_ = os.RemoveAll(dir)
		return status.Error(codes.Aborted, "stale snapshot")
	})
	err := n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 2}, ckpt)
	if status.Code(err) != codes.Aborted || !bytes.Contains([]byte(err.Error()), []byte("stale snapshot")) {
		t.Fatalf("err = %v", err)
	}
	n2.h.setOnSnapshot(func(_ *shalev1.SnapshotHeader, dir string) error {
		_ = os.RemoveAll(dir)
		return errors.New("disk full")
	})
	err = n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 2}, ckpt)
	if status.Code(err) != codes.Internal || !bytes.Contains([]byte(err.Error()), []byte("disk full")) {
		t.Fatalf("err = %v", err)
	}

	// Addressed to another node, or from another cluster: refused before
	// anything is written.
	n2.h.setOnSnapshot(func(*shalev1.SnapshotHeader, string) error {
		t.Error("handler called")
		return nil
	})
	err = n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 7}, ckpt)
	if err == nil {
		t.Fatal("snapshot for node 7 accepted")
	}
	c.mu.Lock()
	c.addrs[7] = n2.lis.Addr().String() // node 7 "lives" at node 2's address
	c.mu.Unlock()
	err = n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 7}, ckpt)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("err = %v, want FailedPrecondition", err)
	}
	n3 := c.start(3, "", Options{ClusterID: "other"})
	err = n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 3}, ckpt)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("err = %v, want FailedPrecondition", err)
	}
	assertEmptyDir(t, n2.staging)
	assertEmptyDir(t, n3.staging)
}

// TestSnapshotUnanswered: a receiver that takes every chunk but never
// answers does not hold the sender for good (chaos/README bug 12): the send
// fails once Options.SnapshotAnswerTimeout has passed after the last chunk.
func TestSnapshotUnanswered(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{SnapshotAnswerTimeout: 300 * time.Millisecond})
	n2 := c.start(2, "", Options{})
	ckpt, _ := makeCheckpoint(t, 100)
	release := make(chan struct{})
	n2.h.setOnSnapshot(func(_ *shalev1.SnapshotHeader, dir string) error {
		<-release
		_ = os.RemoveAll(dir)
		return errors.New("released")
	})
	defer close(release)
	start := time.Now()
	err := n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 2}, ckpt)
	if err == nil || !strings.Contains(err.Error(), "no answer within 300ms") {
		t.Fatalf("err = %v, want no answer within 300ms", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the send took %v", took)
	}
	if s := n1.tr.Stats(); s.SnapshotsFailed != 1 {
		t.Fatalf("sender stats %+v", s)
	}
}

func TestSnapshotCancel(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{SnapshotLimiter: snapshot.NewLimiter(64 << 10), SnapshotChunkSize: 16 << 10})
	n2 := c.start(2, "", Options{})
	// 2 MiB: about 30s at 64 KiB/s.
	ckpt := t.TempDir()
	if err := os.WriteFile(filepath.Join(ckpt, "000001.sst"), bytes.Repeat([]byte("snapshot"), 256<<10), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	err := n1.tr.SendSnapshot(ctx, &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 2}, ckpt)
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("cancelled SendSnapshot returned %v after %v", err, time.Since(start))
	}
	// Close cancels a snapshot in progress.
	errc := make(chan error, 1)
	go func() {
		errc <- n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 2}, ckpt)
	}()
	time.Sleep(100 * time.Millisecond)
	n1.stop()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not cancel SendSnapshot")
	}
	if err := n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ToNodeId: 2}, ckpt); !errors.Is(err, ErrClosed) {
		t.Fatalf("SendSnapshot after Close: %v", err)
	}
	waitFor(t, "receiver cleanup", 5*time.Second, func() bool {
		entries, _ := os.ReadDir(n2.staging)
		return len(entries) == 0
	})
	if len(n2.h.received()) != 0 {
		t.Fatal("handler got a cancelled snapshot")
	}
}

func TestCloseEndsEverything(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{})
	n2 := c.start(2, "", Options{})
	n3 := c.start(3, "", Options{})
	for _, n := range []*node{n1, n2, n3} {
		for _, to := range []uint64{1, 2, 3} {
			if to != n.id {
				n.tr.Send(batch(to, "x"))
			}
		}
	}
	waitFor(t, "streams up", 5*time.Second, func() bool {
		return n1.h.numBatches() == 2 && n2.h.numBatches() == 2 && n3.h.numBatches() == 2
	})
	// Closing node 2's transport ends the inbound streams, so GracefulStop
	// of its server returns although nodes 1 and 3 keep theirs open.
	if err := n2.tr.Close(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { n2.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop blocked after Close")
	}
	before := n2.tr.Stats().BatchesDropped
	n2.tr.Send(batch(1, "after close"))
	if n2.tr.Stats().BatchesDropped != before+1 {
		t.Fatal("Send after Close not dropped")
	}
	if err := n2.tr.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	n1.stop()
	n3.stop()
	goleak.VerifyNone(t)
}

// TestSnapshotDirOwnedByHandler: a handler that returns early (its caller's
// context ended) while it still installs the snapshot keeps dir — the
// transport must not delete it. Found when a sender died mid-install: the
// receiving replica then failed to restore a checkpoint deleted under it.
func TestSnapshotDirOwnedByHandler(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{})
	n2 := c.start(2, "", Options{})
	ckpt, _ := makeCheckpoint(t, 100)
	var kept string
	n2.h.setOnSnapshot(func(_ *shalev1.SnapshotHeader, dir string) error {
		kept = dir
		return context.Canceled // still installing, as a Store does
	})
	if err := n1.tr.SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 3, ToNodeId: 2}, ckpt); err == nil {
		t.Fatal("refused snapshot reported as sent")
	}
	if _, err := os.Stat(filepath.Join(kept, "CURRENT")); err != nil {
		t.Fatalf("the transport deleted the handler's snapshot dir: %v", err)
	}
	_ = os.RemoveAll(kept)
}

// TestSilentConnectionReplaced: a connection to a peer that goes silent
// without an error is found dead by keepalive pings and replaced, so the
// batches sent after it reach the peer within seconds rather than once TCP
// gives up, many minutes later.
func TestSilentConnectionReplaced(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	n2 := c.start(2, "", Options{})
	relay := netfault.NewRelay(t, n2.lis.Addr().String())
	c.mu.Lock()
	c.addrs[2] = relay.Addr()
	c.mu.Unlock()
	n1.tr.Send(batch(2, "before"))
	waitFor(t, "first message", 5*time.Second, func() bool { return len(n2.h.messages(1)) == 1 })

	relay.Silence()
	start := time.Now()
	deadline := start.Add(DefaultKeepaliveTime + DefaultKeepaliveTimeout + 10*time.Second)
	for i := 0; ; i++ {
		n1.tr.Send(batch(2, fmt.Sprintf("after-%d", i)))
		if msgs := n2.h.messages(1); len(msgs) > 1 && bytes.HasPrefix([]byte(msgs[len(msgs)-1]), []byte("after-")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no batch arrived in %v after the connection went silent; stats %+v", time.Since(start), n1.tr.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a batch arrived %v after the connection went silent", time.Since(start).Round(time.Second))
	if s := n1.tr.Stats(); s.Reconnects < 1 {
		t.Fatalf("no reconnect counted: %+v", s)
	}
}

// TestOversizedBatchSplit: a batch far larger than the receiver's message
// limit (gRPC's default 4 MiB here) is sent as several batches under
// MaxBatchBytes, and every message arrives, in order. Before, it went as
// one message that the receiver refused on every retry (chaos/README bug
// 10: a node catching up was sent 20-78 MB batches).
func TestOversizedBatchSplit(t *testing.T) {
	c := newCluster(t)
	n1 := c.start(1, "", Options{MaxBatchBytes: 2 << 20})
	n2 := c.start(2, "", Options{})
	b := &shalev1.RaftMessageBatch{ToNodeId: 2, QuiescedShards: []uint64{9}}
	want := make([]string, 20)
	for i := range want {
		want[i] = fmt.Sprintf("m%02d-%s", i, strings.Repeat("x", 1<<20))
		b.Messages = append(b.Messages, env(1, want[i]))
	}
	n1.tr.Send(b)
	waitFor(t, "every message of the 20 MiB batch", 20*time.Second, func() bool { return len(n2.h.messages(1)) == len(want) })
	if got := n2.h.messages(1); !slices.Equal(got, want) {
		t.Fatalf("messages arrived out of order or changed")
	}
	if n := n2.h.numBatches(); n < 10 {
		t.Fatalf("%d batches received for 20 MiB under a 2 MiB cap", n)
	}
}
