package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// adminFlags are the flags of the cluster, shard, node and leader
// commands.
type adminFlags struct {
	*clusterFlags
	hex bool
}

func (f *adminFlags) keys() keyFormat { return keyFormat{hex: f.hex} }

// newAdminGroup builds a command group of admin commands; withHex adds a
// --hex flag for the shard boundaries they print.
func newAdminGroup(use, short, long string, withHex bool, f *adminFlags, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Long: long, Args: noArgs, RunE: groupHelp}
	if withHex {
		cmd.PersistentFlags().BoolVar(&f.hex, "hex", false, "print shard boundary keys as hexadecimal")
	}
	cmd.AddCommand(subs...)
	return cmd
}

// adminRun returns a RunE that connects and runs fn with the -o choice.
func (f *adminFlags) adminRun(fn func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		asJSON, err := f.jsonOutput(cmd)
		if err != nil {
			return err
		}
		return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
			return fn(ctx, cmd, c, args, asJSON)
		})
	}
}

func newClusterCmd(cf *clusterFlags) *cobra.Command {
	f := &adminFlags{clusterFlags: cf}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes and shards with their health",
		Long: `status prints the cluster ID, a table of the nodes (ID, address, zone,
liveness, replica and leader counts, disk used, last heartbeat) and a table of
the shards (ID, key range, epoch, leader, replicas, size, applied index), as
gathered by the node answering from all live nodes. -o json prints the
ClusterStatusResponse message.`,
		Example: `  shalectl cluster status
  shalectl --endpoints 10.0.0.1:7001 cluster status -o json`,
		Args: noArgs,
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			st, err := c.ClusterStatus(ctx)
			if err != nil {
				return fmt.Errorf("cluster status: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeProtoJSON(out, st)
			}
			live := 0
			for _, n := range st.GetNodes() {
				if n.GetLive() && !n.GetRemoved() {
					live++
				}
			}
			fmt.Fprintf(out, "cluster: %s\n\nnodes: %d (%d live)\n", st.GetClusterId(), len(st.GetNodes()), live)
			if err := writeNodeTable(out, st.GetNodes()); err != nil {
				return err
			}
			fmt.Fprintf(out, "\nshards: %d\n", len(st.GetShards()))
			return f.writeShardTable(out, st.GetShards())
		}),
	}
	return newAdminGroup("cluster", "Show the state of a running cluster", "", false, f, status)
}

func newShardCmd(cf *clusterFlags) *cobra.Command {
	f := &adminFlags{clusterFlags: cf}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the shards: key range, epoch, leader, replicas, size",
		Long: `list prints one row per shard: ID, key range [START, END) ((min) and (max)
for the ends of the key space), epoch, leader node, replicas (node IDs; * marks
the leader, (l) a learner, (in)/(out) a joint-consensus voter), size and applied
index. -o json prints the ListShardsResponse message.`,
		Example: `  shalectl shard list
  shalectl shard list --hex -o json`,
		Args: noArgs,
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			shards, err := c.ListShards(ctx)
			if err != nil {
				return fmt.Errorf("shard list: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.ListShardsResponse{Shards: shards})
			}
			return f.writeShardTable(cmd.OutOrStdout(), shards)
		}),
	}
	info := &cobra.Command{
		Use:   "info ID",
		Short: "Show one shard's descriptor, Raft state and replicas",
		Long: `info prints a shard's key range, epoch, leader, Raft term, commit and applied
indexes, revision, size and reporting node, then a table of its replicas
(node, replica ID, role, match index, leader). -o json prints the ShardStatus
message.`,
		Example: `  shalectl shard info 7`,
		Args:    exactArgs("ID"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			id, err := parseID(cmd, "ID", args[0])
			if err != nil {
				return err
			}
			s, err := c.ShardInfo(ctx, id)
			if err != nil {
				return fmt.Errorf("shard info %d: %w", id, err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), s)
			}
			return f.writeShardInfo(cmd.OutOrStdout(), s)
		}),
	}
	split := &cobra.Command{
		Use:   "split KEY",
		Short: "Split the shard holding KEY at KEY",
		Long: `split cuts the shard holding KEY in two at KEY: the shard keeps the keys below
KEY and a new shard, with replicas on the same nodes, takes KEY and the keys
above it. Both shards' epochs bump; clients follow on their next request.
KEY must lie strictly inside its shard (not where it starts). It prints both
shards; -o json prints the SplitShardResponse message. With --hex, KEY is
hexadecimal and the boundaries print as hexadecimal.`,
		Example: `  shalectl shard split user/5000
  shalectl shard split --hex 7f00`,
		Args: exactArgs("KEY"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			key, err := f.keys().codec().Parse(args[0])
			if err != nil {
				return fmt.Errorf("KEY: %w", err)
			}
			left, right, err := c.SplitShard(ctx, key)
			if err != nil {
				return fmt.Errorf("shard split at %s: %w", f.keys().format(key), err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.SplitShardResponse{Left: left, Right: right})
			}
			k := f.keys()
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "shard %d: [%s, %s) epoch %d\nshard %d: [%s, %s) epoch %d (new)\n",
				left.GetShardId(), k.rangeBound(left.GetStartKey(), false), k.rangeBound(left.GetEndKey(), true), left.GetEpoch(),
				right.GetShardId(), k.rangeBound(right.GetStartKey(), false), k.rangeBound(right.GetEndKey(), true), right.GetEpoch())
			return err
		}),
	}
	merge := &cobra.Command{
		Use:   "merge KEY",
		Short: "Merge the shard holding KEY with its right neighbour",
		Long: `merge joins the shard holding KEY and the shard that follows it: the first
keeps its ID and takes the second's keys and range; the second is removed.
Requests to either keep working (clients retry transparently while the
merge completes). The node leading the first shard must host a replica of
the second; the last shard has no neighbour. It prints the merged shard;
-o json prints the MergeShardsResponse message. With --hex, KEY is
hexadecimal.`,
		Example: `  shalectl shard merge user/5000
  shalectl shard merge --hex 7f00`,
		Args: exactArgs("KEY"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			key, err := f.keys().codec().Parse(args[0])
			if err != nil {
				return fmt.Errorf("KEY: %w", err)
			}
			merged, removed, err := c.MergeShards(ctx, key)
			if err != nil {
				return fmt.Errorf("shard merge at %s: %w", f.keys().format(key), err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.MergeShardsResponse{Merged: merged, RemovedShardId: removed})
			}
			k := f.keys()
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "shard %d: [%s, %s) epoch %d (absorbed shard %d)\n",
				merged.GetShardId(), k.rangeBound(merged.GetStartKey(), false), k.rangeBound(merged.GetEndKey(), true), merged.GetEpoch(), removed)
			return err
		}),
	}
	directory := &cobra.Command{
		Use:   "directory",
		Short: "List the shard directory held by the system shard",
		Long: `directory lists every shard's descriptor as the system shard's directory
records it: ID, range, epoch and replicas (node IDs, learners marked "(l)"). It
can trail a split or a membership change by about a second; unlike "shard
list" it needs no answer from the shards' own nodes, so it also lists shards
whose nodes are down. -o json prints the ShardDirectoryResponse message.`,
		Example: `  shalectl shard directory`,
		Args:    noArgs,
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			descs, err := c.ShardDirectory(ctx)
			if err != nil {
				return fmt.Errorf("shard directory: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.ShardDirectoryResponse{Shards: descs})
			}
			k := f.keys()
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "ID\tSTART\tEND\tEPOCH\tREPLICAS")
			for _, d := range descs {
				id := strconv.FormatUint(d.GetShardId(), 10)
				if d.GetSystem() {
					id += " (system)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", id, k.rangeBound(d.GetStartKey(), false), k.rangeBound(d.GetEndKey(), true),
					d.GetEpoch(), replicaList(d, 0))
			}
			return tw.Flush()
		}),
	}
	return newAdminGroup("shard", "Inspect, split, merge and move the cluster's shards", "", true, f, list, info, split, merge, directory,
		newShardMoveCmd(f), newShardChecksumCmd(f))
}

func newNodeCmd(cf *clusterFlags) *cobra.Command {
	f := &adminFlags{clusterFlags: cf}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the nodes with their liveness and load",
		Long: `list prints one row per node: ID, address, zone, liveness (yes, no, or removed),
replica and leader counts, disk used and time since its last heartbeat. -o json
prints the ListNodesResponse message.`,
		Example: `  shalectl node list`,
		Args:    noArgs,
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			nodes, err := c.ListNodes(ctx)
			if err != nil {
				return fmt.Errorf("node list: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.ListNodesResponse{Nodes: nodes})
			}
			return writeNodeTable(cmd.OutOrStdout(), nodes)
		}),
	}
	var zone string
	add := &cobra.Command{
		Use:   "add ADDR",
		Short: "Register the node at ADDR (host:port) in the cluster",
		Long: `add registers a node by its advertised address and prints the ID the cluster
gave it. (A server started with --join registers itself; add is for
registering one by hand.) -o json prints the AddNodeResponse message.`,
		Example: `  shalectl node add 10.0.0.4:7001 --zone eu-west-1c`,
		Args:    exactArgs("ADDR"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			r, err := c.AddNode(ctx, args[0], zone)
			if err != nil {
				return fmt.Errorf("node add %s: %w", args[0], err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), r)
			}
			z := r.GetNode().GetZone()
			if z == "" {
				z = "-"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "added node %d (%s, zone %s) to cluster %s (%d nodes)\n",
				r.GetNode().GetNodeId(), r.GetNode().GetAddress(), z, r.GetClusterId(), len(r.GetPeers()))
			return err
		}),
	}
	add.Flags().StringVar(&zone, "zone", "", "the node's zone label (replicas are spread across zones)")
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Move node ID's replicas away and remove it from the cluster",
		Long: `remove asks the cluster to move the node's replicas to other nodes and then
remove it. It returns once the cluster accepted the request; follow the
progress with "node list" and "shard list". -o json prints
{"node_id": ID, "removed": true}.`,
		Example: `  shalectl node remove 4`,
		Args:    exactArgs("ID"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			id, err := parseID(cmd, "ID", args[0])
			if err != nil {
				return err
			}
			if err := c.RemoveNode(ctx, id); err != nil {
				return fmt.Errorf("node remove %d: %w", id, err)
			}
			if asJSON {
				return output.WriteJSON(cmd.OutOrStdout(), struct {
					NodeID  uint64 `json:"node_id"`
					Removed bool   `json:"removed"`
				}{id, true})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "node %d: removal accepted (its replicas move to other nodes)\n", id)
			return err
		}),
	}
	return newAdminGroup("node", "List, add, drain and remove the cluster's nodes", "", false, f, list, add, remove,
		newNodeStatusCmd(f), newNodeCommissionCmd(f, true), newNodeCommissionCmd(f, false),
		newNodeDrainLeadersCmd(f))
}

func newLeaderCmd(cf *clusterFlags) *cobra.Command {
	f := &adminFlags{clusterFlags: cf}
	var pf pinFlags
	transfer := &cobra.Command{
		Use:   "transfer SHARD NODE",
		Short: "Move the leadership of shard SHARD to its replica on node NODE",
		Long: `transfer asks shard SHARD's leader to hand its leadership to the replica on
node NODE and prints the leader afterwards. The leadership is pinned there so
that leader balancing does not move it back: for --pin D, for the server's
default pin duration (--placement-pin-duration) without --pin, or not at all
with --no-pin. A node that holds no voting replica of the shard (none, a
learner, or one removed since) is refused at once (FailedPrecondition), the
leadership unmoved. -o json prints {"shard_id": SHARD, "leader_node_id": N}.`,
		Example: `  shalectl leader transfer 7 2
  shalectl leader transfer 7 2 --pin 1h
  shalectl leader transfer 7 2 --no-pin`,
		Args: exactArgs("SHARD", "NODE"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			shard, err := parseID(cmd, "SHARD", args[0])
			if err != nil {
				return err
			}
			node, err := parseID(cmd, "NODE", args[1])
			if err != nil {
				return err
			}
			pin, err := pf.duration(cmd)
			if err != nil {
				return err
			}
			leader, err := c.TransferLeaderPinned(ctx, shard, node, pin)
			if err != nil {
				return fmt.Errorf("leader transfer of shard %d to node %d: %w", shard, node, err)
			}
			if asJSON {
				return output.WriteJSON(cmd.OutOrStdout(), struct {
					ShardID      uint64 `json:"shard_id"`
					LeaderNodeID uint64 `json:"leader_node_id"`
				}{shard, leader})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "shard %d: leader is now node %d\n", shard, leader)
			return err
		}),
	}
	pf.add(transfer)
	return newAdminGroup("leader", "Move shard leadership", "", false, f, transfer)
}

// writeNodeTable prints nodes as a table.
func writeNodeTable(w io.Writer, nodes []*shalev1.NodeStatus) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tADDRESS\tZONE\tLIVE\tREPLICAS\tLEADERS\tUSED\tLAST SEEN")
	for _, n := range nodes {
		live := "no"
		switch {
		case n.GetRemoved():
			live = "removed"
		case n.GetLive():
			live = "yes"
		}
		zone := n.GetNode().GetZone()
		if zone == "" {
			zone = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", n.GetNode().GetNodeId(), n.GetNode().GetAddress(), zone, live,
			n.GetReplicaCount(), n.GetLeaderCount(), output.Bytes(n.GetUsedBytes()), ago(n.GetLastSeenUnixNanos()))
	}
	return tw.Flush()
}

// replicaList prints a shard's replicas: node IDs, * on the leader, (l)
// on learners and (in)/(out) on joint-consensus voters.
func replicaList(d *shalev1.ShardDescriptor, leader uint64) string {
	var parts []string
	for _, r := range d.GetReplicas() {
		s := strconv.FormatUint(r.GetNodeId(), 10)
		if r.GetNodeId() == leader {
			s += "*"
		}
		switch r.GetRole() {
		case shalev1.ReplicaRole_REPLICA_ROLE_LEARNER:
			s += "(l)"
		case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_INCOMING:
			s += "(in)"
		case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING:
			s += "(out)"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func nodeOrDash(id uint64) string {
	if id == 0 {
		return "-"
	}
	return strconv.FormatUint(id, 10)
}

// writeShardTable prints shards as a table.
func (f *adminFlags) writeShardTable(w io.Writer, shards []*shalev1.ShardStatus) error {
	k := f.keys()
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTART\tEND\tEPOCH\tLEADER\tREPLICAS\tSIZE\tAPPLIED")
	for _, s := range shards {
		d := s.GetDescriptor_()
		id := strconv.FormatUint(d.GetShardId(), 10)
		if d.GetSystem() {
			id += " (system)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", id, k.rangeBound(d.GetStartKey(), false),
			k.rangeBound(d.GetEndKey(), true), d.GetEpoch(), nodeOrDash(s.GetLeaderNodeId()),
			replicaList(d, s.GetLeaderNodeId()), output.Bytes(s.GetSizeBytes()), s.GetAppliedIndex())
	}
	return tw.Flush()
}

// writeShardInfo prints one shard in detail.
func (f *adminFlags) writeShardInfo(w io.Writer, s *shalev1.ShardStatus) error {
	k := f.keys()
	d := s.GetDescriptor_()
	tw := newTable(w)
	fmt.Fprintf(tw, "shard:\t%d\n", d.GetShardId())
	if d.GetSystem() {
		fmt.Fprintf(tw, "system:\tyes (cluster metadata, no user keys)\n")
	}
	fmt.Fprintf(tw, "range:\t[%s, %s)\n", k.rangeBound(d.GetStartKey(), false), k.rangeBound(d.GetEndKey(), true))
	fmt.Fprintf(tw, "epoch:\t%d\n", d.GetEpoch())
	fmt.Fprintf(tw, "leader:\t%s\n", nodeOrDash(s.GetLeaderNodeId()))
	fmt.Fprintf(tw, "term:\t%d\n", s.GetTerm())
	fmt.Fprintf(tw, "commit index:\t%d\n", s.GetCommitIndex())
	fmt.Fprintf(tw, "applied index:\t%d\n", s.GetAppliedIndex())
	fmt.Fprintf(tw, "revision:\t%d\n", s.GetRevision())
	fmt.Fprintf(tw, "size:\t%s (%d bytes)\n", output.Bytes(s.GetSizeBytes()), s.GetSizeBytes())
	fmt.Fprintf(tw, "reported by:\tnode %s\n", nodeOrDash(s.GetReportedBy()))
	if s.GetQuiesced() {
		fmt.Fprintf(tw, "quiesced:\tyes (idle, not ticking)\n")
	}
	if s.GetStopped() != "" {
		fmt.Fprintf(tw, "stopped:\t%s\n", s.GetStopped())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nreplicas:")
	tw = newTable(w)
	fmt.Fprintln(tw, "  NODE\tREPLICA\tROLE\tMATCH\tLEADER")
	reps := s.GetReplicas()
	if len(reps) == 0 {
		// No Raft progress reported: fall back on the descriptor.
		for _, r := range d.GetReplicas() {
			reps = append(reps, &shalev1.ReplicaStatus{NodeId: r.GetNodeId(), ReplicaId: r.GetReplicaId(),
				Role: r.GetRole(), Leader: r.GetNodeId() == s.GetLeaderNodeId()})
		}
	}
	for _, r := range reps {
		leader := ""
		if r.GetLeader() {
			leader = "*"
		}
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%d\t%s\n", r.GetNodeId(), r.GetReplicaId(), roleName(r.GetRole()), r.GetMatchIndex(), leader)
	}
	return tw.Flush()
}

// roleName prints a replica role.
func roleName(r shalev1.ReplicaRole) string {
	switch r {
	case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED:
		return "voter"
	case shalev1.ReplicaRole_REPLICA_ROLE_LEARNER:
		return "learner"
	case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_INCOMING:
		return "voter-incoming"
	case shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING:
		return "voter-outgoing"
	}
	return r.String()
}

// newShardChecksumCmd is "shard checksum ID".
func newShardChecksumCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "checksum ID",
		Short: "Compare the checksums of a shard's replicas",
		Long: `checksum asks the node of every replica of shard ID for the replica's applied
index and a checksum of its data at that index, and prints one row per
replica (NODE, APPLIED index, CHECKSUM). Replicas at the same applied index
must have the same checksum: if two disagree, it says so and exits with an
error. Replicas at different indexes cannot be compared; under writes that is
normal, so run it again. Each replica reads all its data. -o json prints
{"shard_id": ID, "replicas": [ReplicaChecksumResponse, ...], "consistent": B}.`,
		Example: `  shalectl shard checksum 7`,
		Args:    exactArgs("ID"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			id, err := parseID(cmd, "ID", args[0])
			if err != nil {
				return err
			}
			sums, err := c.ReplicaChecksums(ctx, id)
			if len(sums) == 0 && err != nil {
				return fmt.Errorf("shard checksum %d: %w", id, err)
			}
			bad := client.ChecksumConflicts(sums)
			if asJSON {
				type out struct {
					ShardID    uint64            `json:"shard_id"`
					Replicas   []json.RawMessage `json:"replicas"`
					Consistent bool              `json:"consistent"`
				}
				o := out{ShardID: id, Consistent: len(bad) == 0}
				for _, s := range sums {
					b, merr := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(s)
					if merr != nil {
						return merr
					}
					o.Replicas = append(o.Replicas, b)
				}
				if werr := output.WriteJSON(cmd.OutOrStdout(), o); werr != nil {
					return werr
				}
			} else {
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "NODE\tAPPLIED\tCHECKSUM")
				for _, s := range sums {
					fmt.Fprintf(tw, "%d\t%d\t%016x\n", s.GetNodeId(), s.GetAppliedIndex(), s.GetChecksum())
				}
				if werr := tw.Flush(); werr != nil {
					return werr
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("shard checksum %d: replicas disagree: %s", id, strings.Join(bad, "; "))
			}
			if err != nil {
				return fmt.Errorf("shard checksum %d: %w", id, err)
			}
			return nil
		}),
	}
}
