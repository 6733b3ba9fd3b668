package server

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// TestResultErr: the one mapping of command results to statuses gives the
// re-routing details only to commands clients route by epoch.
func TestResultErr(t *testing.T) {
	desc := &shalev1.ShardDescriptor{ShardId: 4, Epoch: 9}
	txn := &shalev1.RaftCommand{Epoch: 7, Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{}}}
	split := &shalev1.RaftCommand{Epoch: 7, Command: &shalev1.RaftCommand_Split{Split: &shalev1.SplitCommand{}}}
	merge := &shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeRetire{MergeRetire: true}}
	result := func(c codes.Code, d *shalev1.ShardDescriptor) *shalev1.CommandResult {
		return &shalev1.CommandResult{ErrorCode: uint32(c), ErrorMessage: "refused", Descriptor_: d}
	}
	for _, tc := range []struct {
		cmd    *shalev1.RaftCommand
		res    *shalev1.CommandResult
		code   codes.Code
		detail string
	}{
		{txn, result(codes.OK, nil), codes.OK, ""},
		{txn, result(codes.FailedPrecondition, desc), codes.FailedPrecondition, "EpochMismatch"},
		{split, result(codes.FailedPrecondition, desc), codes.FailedPrecondition, "EpochMismatch"},
		{txn, result(codes.OutOfRange, desc), codes.OutOfRange, "KeyOutsideShard"},
		{txn, result(codes.InvalidArgument, nil), codes.InvalidArgument, ""},
		{merge, result(codes.FailedPrecondition, desc), codes.FailedPrecondition, ""}, // "already merging": no re-routing
	} {
		name := fmt.Sprintf("%T/%s", tc.cmd.GetCommand(), codes.Code(tc.res.GetErrorCode()))
		err := resultErr(tc.cmd, tc.res, nil)
		if tc.code == codes.OK {
			if err != nil {
				t.Errorf("%s: %v, want nil", name, err)
			}
			continue
		}
		st := status.Convert(err)
		if st.Code() != tc.code {
			t.Errorf("%s: code %s, want %s", name, st.Code(), tc.code)
		}
		detail := ""
		for _, d := range st.Details() {
			switch v := d.(type) {
			case *shalev1.EpochMismatch:
				detail = "EpochMismatch"
				if v.GetRequestedEpoch() != 7 || v.GetCurrent().GetEpoch() != 9 {
					t.Errorf("%s: %v", name, v)
				}
			case *shalev1.KeyOutsideShard:
				detail = "KeyOutsideShard"
			}
		}
		if detail != tc.detail {
			t.Errorf("%s: detail %q, want %q", name, detail, tc.detail)
		}
	}
}

// TestReplicaRemovedStaysVisible: the status a proposal on a removed
// replica fails with is Unavailable for clients and still
// replication.ErrReplicaRemoved for the merge code that expects it.
func TestReplicaRemovedStaysVisible(t *testing.T) {
	n := &Node{}
	err := n.replicationErr(t.Context(), 3, fmt.Errorf("propose: %w", replication.ErrReplicaRemoved))
	if status.Code(err) != codes.Unavailable || !errors.Is(err, replication.ErrReplicaRemoved) {
		t.Errorf("%v (code %s): want Unavailable matching ErrReplicaRemoved", err, status.Code(err))
	}
}

// TestShardHoldingSkipsStaleReplicas: a replica of a shard merged away,
// not yet removed, still reports its old range; the split's target is the
// shard that absorbed it (the higher epoch), not the stale one (a load
// split was refused with "key is in shard 14, not shard 2" three minutes
// after shard 14 merged into shard 2).
func TestShardHoldingSkipsStaleReplicas(t *testing.T) {
	st := func(id, epoch, leader uint64, start, end string, frozen ...bool) *shalev1.ShardStatus {
		d := &shalev1.ShardDescriptor{ShardId: id, Epoch: epoch, StartKey: []byte(start), EndKey: []byte(end)}
		if len(frozen) > 0 && frozen[0] {
			d.MergingInto = 2
		}
		return &shalev1.ShardStatus{Descriptor_: d, LeaderNodeId: leader}
	}
	sys := &shalev1.ShardStatus{Descriptor_: &shalev1.ShardDescriptor{ShardId: 1, System: true}}
	for _, tc := range []struct {
		name     string
		statuses []*shalev1.ShardStatus
		key      string
		want     uint64
	}{
		{"stale replica listed after the merged shard", []*shalev1.ShardStatus{sys, st(2, 7, 1, "", ""), st(14, 5, 3, "m", "")}, "x", 2},
		{"frozen right shard", []*shalev1.ShardStatus{sys, st(2, 6, 1, "", "m"), st(14, 5, 3, "m", "", true)}, "x", 0},
		{"plain", []*shalev1.ShardStatus{sys, st(2, 3, 1, "", "m"), st(14, 3, 2, "m", "")}, "x", 14},
	} {
		target, _, maxID := shardHolding(tc.statuses, []byte(tc.key))
		if target.GetShardId() != tc.want || maxID != 14 {
			t.Errorf("%s: shard %d (max ID %d), want shard %d (14)", tc.name, target.GetShardId(), maxID, tc.want)
		}
	}
}

// TestCallBudget: a KV.Calls call with a timeout runs in one context that
// ends requestMargin before the caller's deadline, which requestCtx uses
// as both of its contexts; a proposal that runs out of that budget is
// Unavailable (no quorum within the deadline), as with a unary call's
// two contexts, and DeadlineExceeded once the caller's own deadline has
// passed.
func TestCallBudget(t *testing.T) {
	n := &Node{cfg: Config{RequestTimeout: 10 * time.Second}}
	dl := time.Now().Add(2 * time.Second)
	ctx, cancel := callBudget(t.Context(), dl)
	defer cancel()
	got, ok := ctx.Deadline()
	if !ok || !got.Before(dl.Add(-190*time.Millisecond)) || got.Before(dl.Add(-210*time.Millisecond)) {
		t.Fatalf("budget's deadline %v, want 200 ms before %v", got, dl)
	}
	outer, inner, release := n.requestCtx(ctx)
	release()
	if outer != ctx || inner != ctx || ctx.Err() != nil {
		t.Fatalf("requestCtx made new contexts from a budget (or canceled it): %v, %v", outer, inner)
	}

	// Unary: the caller's deadline is the context's own; requestCtx makes
	// the earlier one.
	uctx, ucancel := context.WithDeadline(t.Context(), dl)
	defer ucancel()
	outer, inner, release = n.requestCtx(uctx)
	defer release()
	if idl, _ := inner.Deadline(); outer != uctx || !idl.Equal(got) && idl.Sub(got).Abs() > 5*time.Millisecond {
		t.Fatalf("unary: inner deadline %v, want about %v", idl, got)
	}

	expired := func(caller time.Duration) context.Context {
		ctx, cancel := callBudget(t.Context(), time.Now().Add(caller))
		t.Cleanup(cancel)
		<-ctx.Done()
		return ctx
	}
	noQuorum := fmt.Errorf("propose: %w", context.DeadlineExceeded)
	if err := n.replicationErr(expired(100*time.Millisecond), 4, noQuorum); status.Code(err) != codes.Unavailable {
		t.Errorf("budget over, caller's deadline not: %v, want Unavailable", err)
	}
	// A deadline of 1 ms leaves less than the 5-ms margin: the budget is
	// over at once and the caller's deadline soon after.
	late := expired(time.Millisecond)
	time.Sleep(2 * time.Millisecond)
	if err := n.replicationErr(late, 4, noQuorum); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("caller's deadline over: %v, want DeadlineExceeded", err)
	}
	if err := n.replicationErr(expired(-time.Second), 4, noQuorum); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("caller's deadline long over: %v, want DeadlineExceeded", err)
	}
}
