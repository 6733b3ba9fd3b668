package placement

import (
	"slices"
	"testing"
)

// TestFoundingReplicas: the founding nodes by ID, rotated by the shard's
// position, at most replicationFactor of them; the order the nodes are
// given in does not matter.
func TestFoundingReplicas(t *testing.T) {
	for _, c := range []struct {
		nodes  []uint64
		rf, at int
		want   []uint64
	}{
		{[]uint64{3, 1, 2}, 3, 0, []uint64{1, 2, 3}},
		{[]uint64{3, 1, 2}, 3, 1, []uint64{2, 3, 1}},
		{[]uint64{3, 1, 2}, 2, 2, []uint64{3, 1}},
		{[]uint64{3, 1, 2}, 2, 4, []uint64{2, 3}},
		{[]uint64{5, 9, 7, 1, 3}, 3, 3, []uint64{7, 9, 1}},
		{[]uint64{7}, 3, 5, []uint64{7}},
		{nil, 3, 0, nil},
	} {
		if got := FoundingReplicas(c.nodes, c.rf, c.at); !slices.Equal(got, c.want) {
			t.Errorf("FoundingReplicas(%v, %d, %d) = %v, want %v", c.nodes, c.rf, c.at, got, c.want)
		}
	}
}

func TestParseInitialCluster(t *testing.T) {
	got, err := ParseInitialCluster(" 1=a:1, 2=b:2")
	if err != nil || len(got) != 2 || got[1] != "a:1" || got[2] != "b:2" {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"1", "0=a:1", "x=a:1", "1=a:1,1=b:2", "1="} {
		if _, err := ParseInitialCluster(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
