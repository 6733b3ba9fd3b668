package backup

import (
	"slices"
	"testing"
)

// TestNodeLoadSpreadsCopies: a shard's copy comes from a follower before
// the leader before a learner, and among followers from the node sending
// the fewest copies; a node that failed is not picked again for the shard.
func TestNodeLoadSpreadsCopies(t *testing.T) {
	l := &nodeLoad{streams: map[uint64]int{}}
	shard := func(leader uint64, replicas ...uint64) []candidate {
		var cs []candidate
		for _, n := range replicas {
			rank := 0
			if n == leader {
				rank = 1
			}
			cs = append(cs, candidate{node: n, rank: rank})
		}
		return cs
	}
	// Three shards whose followers are nodes 2 and 3, copied at once: the
	// copies alternate between the two followers, never the leader.
	var got []uint64
	for range 3 {
		n, _ := l.acquire(shard(1, 1, 2, 3))
		got = append(got, n)
	}
	if want := []uint64{2, 3, 2}; !slices.Equal(got, want) {
		t.Fatalf("picked %v, want %v", got, want)
	}
	// A shard led by node 2: its followers are 1 (idle) and 3 (busy).
	if n, _ := l.acquire(shard(2, 1, 2, 3)); n != 1 {
		t.Fatalf("picked node %d, want the idle follower 1", n)
	}
	// The copies from node 2 end: it is the least loaded follower again.
	l.release(2)
	l.release(2)
	if n, _ := l.acquire(shard(1, 1, 2, 3)); n != 2 {
		t.Fatalf("picked node %d, want 2", n)
	}
	// A learner comes last even when idle; a failed node is not retried.
	cands := []candidate{{node: 4, rank: 2}, {node: 3, rank: 1}}
	n, rest := l.acquire(cands)
	if n != 3 || len(rest) != 1 || rest[0].node != 4 {
		t.Fatalf("picked %d, left %v; want the leader 3, then the learner 4", n, rest)
	}
	if n, rest = l.acquire(rest); n != 4 || len(rest) != 0 {
		t.Fatalf("picked %d, left %v", n, rest)
	}
}
