package shard

import (
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Compact commands (RAFT_FEATURE_COMPACT_COMMANDS in raft.proto). A
// proposer whose shard's nodes all read them (replication.NodesRead with
// replication.FeatureCompactCommands) encodes a command in fewer bytes:
//
//   - no timestamp_unix_nanos: the command's clock (TTL expiries, the
//     liveness of records it reads), the proposer's wall clock, is carried
//     as its offset from the wall time of the hlc reading the command
//     carries anyway (wall_offset_nanos), which is 0 and takes no bytes
//     while the hybrid logical clock follows the wall clock;
//   - a transaction of one put and nothing else as the put command, a
//     PutOp directly in the RaftCommand, without the TxnRequest and
//     RequestOp around it.
//
// Apply expands a compact command into the form an older proposer would
// have written (expandCommand) before anything reads it, so both forms
// take one apply path and apply identically.

// CompactPut returns the put of txn when txn is a transaction of that one
// put and nothing else (no compares, no failure ops), which a compact
// command carries as its put command; nil otherwise.
func CompactPut(txn *shalev1.TxnRequest) *shalev1.PutOp {
	if len(txn.GetCompares()) != 0 || len(txn.GetFailure()) != 0 || len(txn.GetSuccess()) != 1 {
		return nil
	}
	return txn.GetSuccess()[0].GetPut()
}

// putTxn is the transaction expandCommand makes of a put command, its
// messages allocated together.
type putTxn struct {
	cmd shalev1.RaftCommand_Txn
	txn shalev1.TxnRequest
	ops [1]*shalev1.RequestOp
	op  shalev1.RequestOp
	put shalev1.RequestOp_Put
}

// expandCommand turns a decoded command's compact forms into the forms
// apply reads: a put command into the transaction of that one put, and a
// command with an hlc reading but no timestamp_unix_nanos gets the
// reading's wall time plus wall_offset_nanos as its timestamp (and the
// offset is cleared). A command in neither form (every command of a
// proposer that predates them) is left as it is.
func expandCommand(cmd *shalev1.RaftCommand) {
	if p, ok := cmd.GetCommand().(*shalev1.RaftCommand_Put); ok {
		t := &putTxn{}
		t.put.Put = p.Put
		t.op.Op = &t.put
		t.ops[0] = &t.op
		t.txn.Success = t.ops[:]
		t.cmd.Txn = &t.txn
		cmd.Command = &t.cmd
	}
	if cmd.GetTimestampUnixNanos() == 0 && cmd.GetHlc() != nil {
		cmd.TimestampUnixNanos = cmd.GetHlc().GetWallNanos() + cmd.GetWallOffsetNanos()
		cmd.WallOffsetNanos = 0
	}
}
