package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// CheckConvergence waits, after the faults are healed and the writes have
// stopped, until the replicas of every shard report the same applied index
// and the same checksum of their data at it (Admin.ReplicaChecksum). It
// returns a description of each shard whose replicas disagree at one
// index, or did not reach one index within timeout.
func CheckConvergence(ctx context.Context, cl *client.Client, timeout time.Duration) ([]string, error) {
	shards, err := cl.ListShards(ctx)
	if err != nil {
		return nil, fmt.Errorf("list shards: %w", err)
	}
	deadline := time.Now().Add(timeout)
	var problems []string
	for _, sh := range shards {
		id := sh.GetDescriptor_().GetShardId()
		want := len(sh.GetDescriptor_().GetReplicas())
		var (
			last []*shalev1.ReplicaChecksumResponse
			lerr error
		)
		for {
			last, lerr = cl.ReplicaChecksums(ctx, id)
			if bad := client.ChecksumConflicts(last); len(bad) > 0 {
				problems = append(problems, fmt.Sprintf("shard %d: replicas differ at one applied index: %s", id, strings.Join(bad, "; ")))
				break
			}
			if lerr == nil && len(last) == want && sameIndex(last) {
				break
			}
			if time.Now().After(deadline) {
				problems = append(problems, fmt.Sprintf("shard %d: replicas did not reach one applied index within %v: %s (%v)", id, timeout, describe(last), lerr))
				break
			}
			select {
			case <-ctx.Done():
				return problems, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return problems, nil
}

func sameIndex(sums []*shalev1.ReplicaChecksumResponse) bool {
	for _, s := range sums[1:] {
		if s.GetAppliedIndex() != sums[0].GetAppliedIndex() {
			return false
		}
	}
	return true
}

func describe(sums []*shalev1.ReplicaChecksumResponse) string {
	s := ""
	for _, r := range sums {
		s += fmt.Sprintf("node %d at %d (%016x); ", r.GetNodeId(), r.GetAppliedIndex(), r.GetChecksum())
	}
	return s
}
