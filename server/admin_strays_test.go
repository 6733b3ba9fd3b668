package server

import (
	"slices"
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// TestDropStrays: what routing leaves out of the nodes' reports: a replica
// frozen for a merge, and a leaderless one the directory no longer lists
// whose range a listed shard covers (a follower left behind by a merge,
// which routed a key to a shard that no longer exists: TestAutomaticMerge's
// flake); a shard just split off, or one no listed shard covers, stays.
func TestDropStrays(t *testing.T) {
	st := func(id uint64, start, end string, leader uint64, mergingInto uint64) *shalev1.ShardStatus {
		d := &shalev1.ShardDescriptor{ShardId: id, StartKey: []byte(start), EndKey: []byte(end), MergingInto: mergingInto}
		return &shalev1.ShardStatus{Descriptor_: d, LeaderNodeId: leader}
	}
	out := []*shalev1.ShardStatus{
		st(1, "", "", 1, 0),   // the system shard, listed
		st(2, "", "g", 1, 0),  // listed
		st(4, "g", "", 2, 0),  // listed: took [n, "") over from 5
		st(5, "n", "", 0, 0),  // a left-behind follower of the merged shard
		st(6, "h", "", 0, 4),  // frozen for a merge
		st(7, "x", "", 3, 0),  // just split off 4 (4's report is stale)
		st(8, "zz", "", 0, 0), // leaderless, unlisted, but covered by 4
	}
	out[0].Descriptor_.System = true
	listed := map[uint64]bool{1: true, 2: true, 4: true}
	var ids []uint64
	for _, ss := range dropStrays(out, listed) {
		ids = append(ids, ss.GetDescriptor_().GetShardId())
	}
	if want := []uint64{1, 2, 4, 7}; !slices.Equal(ids, want) {
		t.Fatalf("kept %v, want %v", ids, want)
	}
	// With nothing listed overlapping it, a leaderless shard stays (its
	// election may be under way).
	ids = ids[:0]
	for _, ss := range dropStrays([]*shalev1.ShardStatus{st(2, "", "m", 1, 0), st(3, "m", "", 0, 0)}, map[uint64]bool{2: true}) {
		ids = append(ids, ss.GetDescriptor_().GetShardId())
	}
	if want := []uint64{2, 3}; !slices.Equal(ids, want) {
		t.Fatalf("kept %v, want %v", ids, want)
	}
}
