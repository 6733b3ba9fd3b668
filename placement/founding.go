package placement

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// FoundingReplicas returns the nodes that host a new cluster's initial
// shard at position i, in replica order (the first campaigns at once):
// min(replicationFactor, len(nodes)) nodes, taken from the founding nodes
// sorted by ID starting at position i (mod their count). Position 0 is
// the system shard and also the first user shard; user shard k (0-based,
// in key order) is at position k. So every founding node computes the
// same descriptors, and the user shards' first replicas go round-robin
// over the nodes. A restore founds its cluster the same way, with the
// backup's user shards as the initial shards: this decides which of them
// a founding node hosts (and so which parts `shalectl restore` copies to
// it).
func FoundingReplicas(nodes []uint64, replicationFactor, i int) []uint64 {
	ids := slices.Sorted(slices.Values(nodes))
	if len(ids) == 0 {
		return nil
	}
	out := make([]uint64, 0, min(max(replicationFactor, 1), len(ids)))
	for k := range cap(out) {
		out = append(out, ids[(i+k)%len(ids)])
	}
	return out
}

// ParseInitialCluster parses a founding cluster's members as
// `shale-server --initial-cluster` takes them: "1=host:port,2=host:port".
func ParseInitialCluster(s string) (map[uint64]string, error) {
	out := map[uint64]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || addr == "" {
			return nil, fmt.Errorf("initial cluster entry %q: want ID=HOST:PORT", part)
		}
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("initial cluster entry %q: node ID must be a positive integer", part)
		}
		if _, dup := out[n]; dup {
			return nil, fmt.Errorf("initial cluster: node %d listed twice", n)
		}
		out[n] = addr
	}
	return out, nil
}
