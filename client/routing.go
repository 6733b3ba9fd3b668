package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// shardRoute is one cached shard: an immutable descriptor and the leader
// last seen (0 when unknown), updated in place.
type shardRoute struct {
	desc   *shalev1.ShardDescriptor
	leader atomic.Uint64
}

func (s *shardRoute) id() uint64    { return s.desc.GetShardId() }
func (s *shardRoute) epoch() uint64 { return s.desc.GetEpoch() }

// contains reports whether key is in the shard's range.
func (s *shardRoute) contains(key []byte) bool {
	return containsKey(s.desc, key)
}

func containsKey(d *shalev1.ShardDescriptor, key []byte) bool {
	return bytes.Compare(d.GetStartKey(), key) <= 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(key, d.GetEndKey()) < 0)
}

// containsBefore reports whether the keys just below end (exclusive; empty
// means the end of the key space) are in the shard.
func containsBefore(d *shalev1.ShardDescriptor, end []byte) bool {
	if len(end) == 0 {
		return len(d.GetEndKey()) == 0
	}
	return bytes.Compare(d.GetStartKey(), end) < 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(end, d.GetEndKey()) <= 0)
}

// isVoter reports whether a replica votes (and so may lead).
func isVoter(r *shalev1.ReplicaDescriptor) bool {
	return r.GetRole() != shalev1.ReplicaRole_REPLICA_ROLE_LEARNER
}

// routing is the client's routing cache: shards sorted by start key (there
// may be gaps, filled by the next refresh) and node addresses.
type routing struct {
	mu        sync.RWMutex
	shards    []*shardRoute // sorted by start key, non-overlapping
	byID      map[uint64]*shardRoute
	nodes     map[uint64]string
	clusterID string
	gen       int64  // bumped by every full refresh
	lastGood  string // the address that answered the last GetRouting
	// refreshed is when the last full refresh was installed.
	refreshed time.Time

	flightMu sync.Mutex
	flight   *flight
}

// flight is one routing refresh in progress, shared by all waiting callers.
type flight struct {
	done chan struct{}
	err  error
}

func (r *routing) init() {
	r.byID = map[uint64]*shardRoute{}
	r.nodes = map[uint64]string{}
}

// generation returns the number of full refreshes so far.
func (r *routing) generation() int64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.gen
}

// target says which shard a request goes to: the one holding key, or
// (before) the one holding the keys just below key, an exclusive end where
// the empty key means the end of the key space.
type target struct {
	key    []byte
	before bool
}

func (t target) in(d *shalev1.ShardDescriptor) bool {
	if t.before {
		return containsBefore(d, t.key)
	}
	return containsKey(d, t.key)
}

// locate returns the cached shard of t (nil when the cache has none) and
// the routing generation it was found in.
func (r *routing) locate(t target) (*shardRoute, int64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var i int
	if t.before {
		if len(t.key) == 0 {
			i = len(r.shards) - 1
		} else {
			// The last shard starting strictly below key.
			i = sort.Search(len(r.shards), func(i int) bool {
				return bytes.Compare(r.shards[i].desc.GetStartKey(), t.key) >= 0
			}) - 1
		}
	} else {
		// The last shard starting at or below key.
		i = sort.Search(len(r.shards), func(i int) bool {
			return bytes.Compare(r.shards[i].desc.GetStartKey(), t.key) > 0
		}) - 1
	}
	if i < 0 || i >= len(r.shards) || !t.in(r.shards[i].desc) {
		return nil, r.gen
	}
	return r.shards[i], r.gen
}

// shard returns the cached shard with an ID, nil if none.
func (r *routing) shard(id uint64) *shardRoute {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byID[id]
}

// addr returns the address of a node, "" if unknown.
func (r *routing) addr(node uint64) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.nodes[node]
}

// setAddr records a node's address learnt from a leader hint.
func (r *routing) setAddr(node uint64, addr string) {
	if node == 0 || addr == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes[node] = addr
}

// setLeader records node as the leader of the shard (if still cached).
func (r *routing) setLeader(shardID, node uint64) {
	r.mu.RLock()
	s := r.byID[shardID]
	r.mu.RUnlock()
	if s != nil {
		s.leader.Store(node)
	}
}

// clearLeader forgets node as the shard's leader (when it failed).
func (r *routing) clearLeader(s *shardRoute, node uint64) {
	s.leader.CompareAndSwap(node, 0)
}

// apply installs a shard descriptor learnt from an EpochMismatch: it
// replaces the cached shard with the same ID, when older, and every cached
// shard overlapping its range. It returns false (and changes nothing) when
// the cache already has that shard at the same or a newer epoch.
func (r *routing) apply(d *shalev1.ShardDescriptor) bool {
	if d == nil || d.GetSystem() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var leader uint64
	if old := r.byID[d.GetShardId()]; old != nil {
		if old.epoch() >= d.GetEpoch() {
			return false
		}
		leader = old.leader.Load()
	}
	ns := &shardRoute{desc: proto.CloneOf(d)}
	for _, rep := range d.GetReplicas() {
		if rep.GetNodeId() == leader && isVoter(rep) {
			ns.leader.Store(leader)
		}
	}
	kept := make([]*shardRoute, 0, len(r.shards)+1)
	for _, s := range r.shards {
		if s.id() == d.GetShardId() || overlaps(s.desc, d) {
			delete(r.byID, s.id())
			continue
		}
		kept = append(kept, s)
	}
	i := sort.Search(len(kept), func(i int) bool {
		return bytes.Compare(kept[i].desc.GetStartKey(), d.GetStartKey()) > 0
	})
	kept = slices.Insert(kept, i, ns)
	r.shards = kept
	r.byID[ns.id()] = ns
	return true
}

// overlaps reports whether two shard ranges intersect.
func overlaps(a, b *shalev1.ShardDescriptor) bool {
	aBeforeBEnd := len(b.GetEndKey()) == 0 || bytes.Compare(a.GetStartKey(), b.GetEndKey()) < 0
	bBeforeAEnd := len(a.GetEndKey()) == 0 || bytes.Compare(b.GetStartKey(), a.GetEndKey()) < 0
	return aBeforeBEnd && bBeforeAEnd
}

// replace installs a full routing table from GetRouting.
func (r *routing) replace(resp *shalev1.GetRoutingResponse, from string) {
	shards := make([]*shardRoute, 0, len(resp.GetShards()))
	for _, rs := range resp.GetShards() {
		d := rs.GetDescriptor_()
		if d == nil || d.GetSystem() {
			continue
		}
		s := &shardRoute{desc: proto.CloneOf(d)}
		s.leader.Store(rs.GetLeaderNodeId())
		shards = append(shards, s)
	}
	sort.SliceStable(shards, func(i, j int) bool {
		return bytes.Compare(shards[i].desc.GetStartKey(), shards[j].desc.GetStartKey()) < 0
	})
	nodes := make(map[uint64]string, len(resp.GetNodes()))
	for _, n := range resp.GetNodes() {
		if n.GetAddress() != "" {
			nodes[n.GetNodeId()] = n.GetAddress()
		}
	}
	byID := make(map[uint64]*shardRoute, len(shards))
	for _, s := range shards {
		byID[s.id()] = s
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shards = shards
	r.byID = byID
	r.nodes = nodes
	r.clusterID = resp.GetClusterId()
	r.gen++
	r.lastGood = from
	r.refreshed = time.Now()
}

// age is how long ago the last full refresh was installed.
func (r *routing) age() time.Duration {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return time.Since(r.refreshed)
}

// nodeAddrs copies the node addresses by node ID.
func (r *routing) nodeAddrs() map[uint64]string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return maps.Clone(r.nodes)
}

// snapshot copies the routing table for Client.Routing.
func (r *routing) snapshot() ([]*shalev1.RoutedShard, map[uint64]string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	shards := make([]*shalev1.RoutedShard, len(r.shards))
	for i, s := range r.shards {
		shards[i] = &shalev1.RoutedShard{Descriptor_: proto.CloneOf(s.desc), LeaderNodeId: s.leader.Load()}
	}
	nodes := make(map[uint64]string, len(r.nodes))
	for id, a := range r.nodes {
		nodes[id] = a
	}
	return shards, nodes
}

// adminAddrs lists the addresses to ask for cluster-level requests: the
// last that answered, then the configured endpoints, then every known node.
func (c *Client) adminAddrs() []string {
	c.rt.mu.RLock()
	addrs := make([]string, 0, 1+len(c.endpoints)+len(c.rt.nodes))
	if c.rt.lastGood != "" {
		addrs = append(addrs, c.rt.lastGood)
	}
	addrs = append(addrs, c.endpoints...)
	ids := make([]uint64, 0, len(c.rt.nodes))
	for id := range c.rt.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		addrs = append(addrs, c.rt.nodes[id])
	}
	c.rt.mu.RUnlock()
	seen := make(map[string]bool, len(addrs))
	out := addrs[:0]
	for _, a := range addrs {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// refreshRouting reloads the routing table. Concurrent callers share one
// refresh (a singleflight); a caller that saw generation seen returns at
// once if a refresh completed since (seen < 0 always refreshes). The shared
// refresh is bound to the client's lifetime, not to any caller's context:
// a caller whose context ends stops waiting but does not cancel it for the
// others.
func (c *Client) refreshRouting(ctx context.Context, seen int64) error {
	c.rt.flightMu.Lock()
	if seen >= 0 && c.rt.generation() > seen {
		c.rt.flightMu.Unlock()
		return nil
	}
	f := c.rt.flight
	if f == nil {
		f = &flight{done: make(chan struct{})}
		c.rt.flight = f
		go func() {
			f.err = c.fetchRouting()
			c.rt.flightMu.Lock()
			c.rt.flight = nil
			c.rt.flightMu.Unlock()
			close(f.done)
		}()
	}
	c.rt.flightMu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fetchRouting asks the admin addresses in turn for the routing table and
// installs the first answer.
func (c *Client) fetchRouting() error {
	var errs []error
	for _, addr := range c.adminAddrs() {
		if c.ctx.Err() != nil {
			return ErrClosed
		}
		cc, err := c.conn(addr)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return err
			}
			errs = append(errs, err)
			continue
		}
		timeout := c.opts.attemptTimeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		actx, cancel := context.WithTimeout(c.ctx, timeout)
		start := time.Now()
		resp, err := shalev1.NewAdminClient(cc).GetRouting(actx, &shalev1.GetRoutingRequest{})
		cancel()
		if err != nil {
			c.log.Debug("shale client: GetRouting failed", "address", addr, "error", err)
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		c.rt.replace(resp, addr)
		c.warmConns()
		c.log.Debug("shale client: routing refreshed", "address", addr, "shards", len(resp.GetShards()),
			"nodes", len(resp.GetNodes()), "took", time.Since(start))
		return nil
	}
	if len(errs) == 0 {
		return errors.New("shale: no address to fetch the routing from")
	}
	return fmt.Errorf("shale: no node answered GetRouting: %w", errors.Join(errs...))
}
