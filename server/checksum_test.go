package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shale-db/shale/internal/testcluster"
)

// TestReplicaChecksums: every replica of a shard reports its applied index
// and checksum; once writes stop they converge to one index and one
// checksum, which changes with the data.
func TestReplicaChecksums(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 30; i++ {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("a%02d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	shard := uint64(0)
	for _, r := range c.ShardIDs() {
		if st, err := cl.ShardInfo(ctx, r); err == nil && string(st.GetDescriptor_().GetStartKey()) == "" && !st.GetDescriptor_().GetSystem() {
			shard = r
		}
	}
	if shard == 0 {
		t.Fatal("no shard holds a00")
	}
	converged := func() (uint64, uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			sums, err := cl.ReplicaChecksums(ctx, shard)
			if err == nil && len(sums) == 3 {
				same := true
				for _, s := range sums[1:] {
					same = same && s.GetAppliedIndex() == sums[0].GetAppliedIndex() && s.GetChecksum() == sums[0].GetChecksum()
				}
				if same {
					return sums[0].GetAppliedIndex(), sums[0].GetChecksum()
				}
				for _, s := range sums[1:] {
					if s.GetAppliedIndex() == sums[0].GetAppliedIndex() && s.GetChecksum() != sums[0].GetChecksum() {
						t.Fatalf("replicas at index %d disagree: %v", s.GetAppliedIndex(), sums)
					}
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("replicas of shard %d did not converge: %v %v", shard, sums, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	idx1, sum1 := converged()
	if _, err := cl.Put(ctx, []byte("a00"), []byte("changed")); err != nil {
		t.Fatal(err)
	}
	idx2, sum2 := converged()
	if idx2 <= idx1 || sum2 == sum1 {
		t.Fatalf("after a write: index %d→%d, checksum %x→%x", idx1, idx2, sum1, sum2)
	}
	// A shard that does not exist has no replicas to ask.
	if _, err := cl.ReplicaChecksums(ctx, 999); err == nil {
		t.Fatal("checksums of a shard that does not exist")
	}
}
