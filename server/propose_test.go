package server

import (
	"errors"
	"fmt"
	"testing"

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
		err := resultErr(tc.cmd, tc.res)
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
