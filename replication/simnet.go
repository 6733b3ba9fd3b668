package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// SimNetwork is an in-process network for tests: every node's Transport
// delivers straight to the other nodes' Handlers, through filters that drop,
// delay or cut traffic. Snapshots are copied file by file into a staging
// directory before the receiver's HandleSnapshot.
type SimNetwork struct {
	staging string

	mu        sync.Mutex
	rng       *rand.Rand
	handlers  map[uint64]Handler
	group     map[uint64]int         // partition group per node (absent = 0)
	cut       map[[2]uint64]bool     // one-way cuts from → to
	dropRate  float64                // probability of dropping a batch
	minDelay  time.Duration          // delivery delay range
	maxDelay  time.Duration          //
	sent      map[[2]uint64]int      // batches delivered per link
	snapshots int                    // snapshots delivered
	closed    bool                   //
	pending   sync.WaitGroup         // delayed deliveries
	delayed   map[*time.Timer]func() //
}

// NewSimNetwork returns a network whose random choices follow seed;
// snapshots are staged under stagingDir.
func NewSimNetwork(seed uint64, stagingDir string) *SimNetwork {
	return &SimNetwork{
		staging:  stagingDir,
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		handlers: make(map[uint64]Handler),
		group:    make(map[uint64]int),
		cut:      make(map[[2]uint64]bool),
		sent:     make(map[[2]uint64]int),
		delayed:  make(map[*time.Timer]func()),
	}
}

// Register attaches node's Handler (its Store); traffic to a node without
// one is dropped.
func (n *SimNetwork) Register(nodeID uint64, h Handler) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h == nil {
		delete(n.handlers, nodeID)
		return
	}
	n.handlers[nodeID] = h
}

// Transport returns node's endpoint on the network.
func (n *SimNetwork) Transport(nodeID uint64) Transport {
	return &simTransport{net: n, node: nodeID}
}

// Partition splits the nodes into groups that cannot reach each other;
// nodes not listed form one more group together.
func (n *SimNetwork) Partition(groups ...[]uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.group = make(map[uint64]int)
	for i, g := range groups {
		for _, id := range g {
			n.group[id] = i + 1
		}
	}
}

// Isolate cuts node off from every other node.
func (n *SimNetwork) Isolate(node uint64) { n.Partition([]uint64{node}) }

// Cut drops all traffic from → to (one way).
func (n *SimNetwork) Cut(from, to uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]uint64{from, to}] = true
}

// Heal removes every partition and cut.
func (n *SimNetwork) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.group = make(map[uint64]int)
	n.cut = make(map[[2]uint64]bool)
}

// SetDropRate makes each batch be dropped with probability p.
func (n *SimNetwork) SetDropRate(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dropRate = p
}

// SetDelay delays each batch by a random duration in [min, max].
func (n *SimNetwork) SetDelay(min, max time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.minDelay, n.maxDelay = min, max
}

// Delivered returns how many batches went from → to.
func (n *SimNetwork) Delivered(from, to uint64) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent[[2]uint64{from, to}]
}

// Snapshots returns how many snapshots were delivered.
func (n *SimNetwork) Snapshots() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.snapshots
}

// Close stops delayed deliveries.
func (n *SimNetwork) Close() {
	n.mu.Lock()
	n.closed = true
	for t, done := range n.delayed {
		if t.Stop() {
			done()
		}
	}
	n.delayed = nil
	n.mu.Unlock()
	n.pending.Wait()
}

func (n *SimNetwork) linkUpLocked(from, to uint64) bool {
	if n.closed || n.group[from] != n.group[to] || n.cut[[2]uint64{from, to}] {
		return false
	}
	_, ok := n.handlers[to]
	return ok
}

func (n *SimNetwork) send(from uint64, b *shalev1.RaftMessageBatch) {
	to := b.GetToNodeId()
	n.mu.Lock()
	if !n.linkUpLocked(from, to) || (n.dropRate > 0 && n.rng.Float64() < n.dropRate) {
		n.mu.Unlock()
		return
	}
	h := n.handlers[to]
	var delay time.Duration
	if n.maxDelay > 0 {
		delay = n.minDelay + time.Duration(n.rng.Int64N(int64(n.maxDelay-n.minDelay)+1))
	}
	n.sent[[2]uint64{from, to}]++
	b = proto.Clone(b).(*shalev1.RaftMessageBatch)
	if delay == 0 {
		n.mu.Unlock()
		h.HandleRaftBatch(b)
		return
	}
	n.pending.Add(1)
	var t *time.Timer
	done := func() { n.pending.Done() }
	t = time.AfterFunc(delay, func() {
		n.mu.Lock()
		_, live := n.delayed[t]
		delete(n.delayed, t)
		n.mu.Unlock()
		if live {
			h.HandleRaftBatch(b)
		}
		done()
	})
	n.delayed[t] = done
	n.mu.Unlock()
}

func (n *SimNetwork) sendSnapshot(ctx context.Context, from uint64, header *shalev1.SnapshotHeader, dir string) error {
	to := header.GetToNodeId()
	n.mu.Lock()
	up := n.linkUpLocked(from, to)
	h := n.handlers[to]
	n.mu.Unlock()
	if !up {
		return fmt.Errorf("simnet: node %d unreachable from %d", to, from)
	}
	if err := os.MkdirAll(n.staging, 0o755); err != nil {
		return err
	}
	dst, err := os.MkdirTemp(n.staging, fmt.Sprintf("snap-%d-", header.GetShardId()))
	if err != nil {
		return err
	}
	if err := copyDir(dir, dst); err != nil {
		_ = os.RemoveAll(dst)
		return err
	}
	if err := ctx.Err(); err != nil {
		_ = os.RemoveAll(dst)
		return err
	}
	if err := h.HandleSnapshot(ctx, proto.Clone(header).(*shalev1.SnapshotHeader), dst); err != nil {
		return err
	}
	n.mu.Lock()
	n.snapshots++
	n.mu.Unlock()
	return nil
}

func copyDir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return errors.New("simnet: snapshot holds a non-regular file " + e.Name())
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

type simTransport struct {
	net  *SimNetwork
	node uint64
}

func (t *simTransport) Send(b *shalev1.RaftMessageBatch) { t.net.send(t.node, b) }

func (t *simTransport) SendSnapshot(ctx context.Context, header *shalev1.SnapshotHeader, dir string) error {
	return t.net.sendSnapshot(ctx, t.node, header, dir)
}

func (t *simTransport) Reachable(nodeID uint64) bool {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	return t.net.linkUpLocked(t.node, nodeID)
}

func (t *simTransport) Close() error { return nil }
