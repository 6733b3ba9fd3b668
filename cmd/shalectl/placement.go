package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// The placement commands (placement status and history) and the
// placement-related subcommands of node (status, decommission,
// recommission), shard (move) and leader (transfer's --pin).

func newPlacementCmd(cf *clusterFlags) *cobra.Command {
	f := &adminFlags{clusterFlags: cf}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the placement leader's view: nodes, running operations, stuck replicas",
		Long: `status asks the placement leader (the system shard's leader) what it sees and
prints: the placement leader; whether the cluster is balanced, with the replica,
leader and byte spreads across the live nodes that may hold replicas; a table
of the nodes (ID, address, zone, state: live, suspect, dead or removed; replica
and leader counts, bytes, whether it is decommissioning, time since its last
heartbeat); the running operations (shard, kind, the node losing and the node
gaining a replica or leadership, reason, age); and the stuck replicas, which
should move but cannot, with the reason. -o json prints the
PlacementStatusResponse message.`,
		Example: `  shalectl placement status
  shalectl placement status -o json`,
		Args: noArgs,
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			st, err := c.PlacementStatus(ctx)
			if err != nil {
				return fmt.Errorf("placement status: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), st)
			}
			return writePlacementStatus(cmd.OutOrStdout(), st)
		}),
	}
	var limit int
	history := &cobra.Command{
		Use:   "history",
		Short: "List the placement leader's recent scheduling decisions",
		Long: `history lists the placement leader's recent operations, oldest first, one row
per operation: when it started (UTC), shard, kind (add-learner, promote,
remove-replica, transfer-leader, or move for an accepted "shard move"), the
node losing (FROM) and the node gaining (TO) a replica or the leadership,
state (running, done, failed), reason and, for a failed one, the error.
--limit N lists the N most recent (0: all the placement leader keeps). -o json
prints the PlacementHistoryResponse message.`,
		Example: `  shalectl placement history
  shalectl placement history --limit 20`,
		Args: noArgs,
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			if limit < 0 {
				return &usageError{cmd: cmd, msg: fmt.Sprintf("--limit must not be negative, got %d", limit)}
			}
			ops, err := c.PlacementHistory(ctx, limit)
			if err != nil {
				return fmt.Errorf("placement history: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.PlacementHistoryResponse{Operations: ops})
			}
			return writeHistory(cmd.OutOrStdout(), ops)
		}),
	}
	history.Flags().IntVar(&limit, "limit", 0, "list the `N` most recent operations (0: all the placement leader keeps)")
	return newAdminGroup("placement", "Show what the placement service is doing and why", "", false, f, status, history)
}

// newNodeStatusCmd is "node status ID".
func newNodeStatusCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status ID",
		Short: "Show node ID as the placement leader sees it, with its drain progress",
		Long: `status prints node ID as the placement leader sees it: address, zone, state
(live, suspect, dead or removed), whether it is decommissioning, the replicas,
leaderships and bytes it holds, its last heartbeat, and, while it is
decommissioning, the drain's progress ("draining: N replicas left", then
"drained" once none is left and the node can be removed with "node remove").
Then it lists every replica of the node that should move but cannot, with the
reason. A node the placement leader does not know fails with "not found".
-o json prints the NodePlacement message.`,
		Example: `  shalectl node status 4`,
		Args:    exactArgs("ID"),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			id, err := parseID(cmd, "ID", args[0])
			if err != nil {
				return err
			}
			st, err := c.PlacementStatus(ctx)
			if err != nil {
				return fmt.Errorf("node status %d: %w", id, err)
			}
			n := nodeOf(st, id)
			if n == nil {
				return fmt.Errorf("node status %d: node %d not found (the placement leader, node %s, does not know it)",
					id, id, nodeOrDash(st.GetPlacementLeaderNodeId()))
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), n)
			}
			return writeNodeStatus(cmd.OutOrStdout(), n)
		}),
	}
}

// nodeOf returns node id of a placement status, nil if absent. Its stuck
// replicas are those the node lists and those of the status's own list that
// are on the node, each once.
func nodeOf(st *shalev1.PlacementStatusResponse, id uint64) *shalev1.NodePlacement {
	for _, n := range st.GetNodes() {
		if n.GetNode().GetNodeId() != id {
			continue
		}
		n = proto.Clone(n).(*shalev1.NodePlacement)
		type key struct{ shard, node uint64 }
		seen := map[key]bool{}
		for _, s := range n.GetStuck() {
			seen[key{s.GetShardId(), s.GetNodeId()}] = true
		}
		for _, s := range st.GetStuck() {
			if k := (key{s.GetShardId(), s.GetNodeId()}); s.GetNodeId() == id && !seen[k] {
				seen[k] = true
				n.Stuck = append(n.Stuck, s)
			}
		}
		return n
	}
	return nil
}

// newNodeCommissionCmd is "node decommission ID" or, with decommission
// false, "node recommission ID".
func newNodeCommissionCmd(f *adminFlags, decommission bool) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "decommission ID",
		Short: "Drain node ID: move its replicas and leaderships to other nodes",
		Long: `decommission starts draining node ID: the placement service moves its replicas
and leaderships to other nodes and gives it no new ones. It returns once the
cluster recorded the decommission; follow the drain with "node status ID", and
once it reports the node drained, remove it with "node remove ID".
"node recommission ID" stops the drain. -o json prints
{"node_id": ID, "decommissioning": true}.`,
		Example: `  shalectl node decommission 4
  shalectl node status 4`,
	}
	if !decommission {
		cmd.Use = "recommission ID"
		cmd.Short = "Stop draining node ID: it may take replicas and leaderships again"
		cmd.Long = `recommission stops the drain of a decommissioning node: it may take replicas
and leaderships again. -o json prints {"node_id": ID, "decommissioning": false}.`
		cmd.Example = `  shalectl node recommission 4`
	}
	cmd.Args = exactArgs("ID")
	cmd.RunE = f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
		id, err := parseID(cmd, "ID", args[0])
		if err != nil {
			return err
		}
		verb, call := "decommission", c.DecommissionNode
		msg := fmt.Sprintf("decommissioning (its replicas and leaderships move to other nodes; follow with \"shalectl node status %d\")", id)
		if !decommission {
			verb, call = "recommission", c.RecommissionNode
			msg = "recommissioned (it may take replicas and leaderships again)"
		}
		if err := call(ctx, id); err != nil {
			return fmt.Errorf("node %s %d: %w", verb, id, err)
		}
		if asJSON {
			return output.WriteJSON(cmd.OutOrStdout(), struct {
				NodeID          uint64 `json:"node_id"`
				Decommissioning bool   `json:"decommissioning"`
			}{id, decommission})
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "node %d: %s\n", id, msg)
		return err
	})
	return cmd
}

// pinFlags are the --pin and --no-pin flags of shard move and leader
// transfer.
type pinFlags struct {
	pin   time.Duration
	noPin bool
}

func (p *pinFlags) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&p.pin, "pin", 0,
		"keep balancing from undoing this for `D` (rounded up to seconds; 0: the server's --placement-pin-duration)")
	cmd.Flags().BoolVar(&p.noPin, "no-pin", false, "do not pin: balancing may undo this at once")
}

// duration returns the pin to ask for: 0 for the server's default, -1s for
// none.
func (p *pinFlags) duration(cmd *cobra.Command) (time.Duration, error) {
	switch {
	case p.pin < 0:
		return 0, &usageError{cmd: cmd, msg: fmt.Sprintf("--pin must not be negative, got %v (use --no-pin for no pin)", p.pin)}
	case p.noPin && cmd.Flags().Changed("pin"):
		return 0, &usageError{cmd: cmd, msg: "--pin and --no-pin cannot be combined"}
	case p.noPin:
		return -time.Second, nil
	}
	return p.pin, nil
}

// describe says what was asked of the pin, for the confirmations; a move
// is pinned while it runs in any case.
func (p *pinFlags) describe(move bool) string {
	switch {
	case p.noPin && move:
		return "pinned only while it runs"
	case p.noPin:
		return "not pinned"
	case p.pin > 0:
		return "pinned for " + p.pin.String()
	}
	return "pinned for the server's default time"
}

// newShardMoveCmd is "shard move SHARD FROM TO".
func newShardMoveCmd(f *adminFlags) *cobra.Command {
	var pf pinFlags
	cmd := &cobra.Command{
		Use:   "move SHARD FROM TO",
		Short: "Move shard SHARD's replica from node FROM to node TO",
		Long: `move asks the placement leader to move shard SHARD's replica on node FROM to
node TO: a learner is added on TO, caught up and promoted, then the replica on
FROM is removed. It prints the operation as accepted and returns without
waiting for the move; follow its steps with "placement status" and "placement
history". The shard is pinned so that balancing does not move it back: for
--pin D, for the server's default pin duration (--placement-pin-duration)
without --pin, or, with --no-pin, only while the move runs. Repairs (replicas
on dead or draining nodes) ignore pins. -o json prints the MoveReplicaResponse
message.`,
		Example: `  shalectl shard move 7 1 4
  shalectl shard move 7 1 4 --pin 2h
  shalectl shard move 7 1 4 --no-pin`,
		Args: exactArgs("SHARD", "FROM", "TO"),
	}
	pf.add(cmd)
	cmd.RunE = f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
		var ids [3]uint64
		for i, name := range []string{"SHARD", "FROM", "TO"} {
			id, err := parseID(cmd, name, args[i])
			if err != nil {
				return err
			}
			ids[i] = id
		}
		pin, err := pf.duration(cmd)
		if err != nil {
			return err
		}
		op, err := c.MoveReplica(ctx, ids[0], ids[1], ids[2], pin)
		if err != nil {
			return fmt.Errorf("shard move of shard %d from node %d to node %d: %w", ids[0], ids[1], ids[2], err)
		}
		if asJSON {
			return writeProtoJSON(cmd.OutOrStdout(), &shalev1.MoveReplicaResponse{Operation: op})
		}
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "shard %d: moving its replica from node %d to node %d (%s)\n", ids[0], ids[1], ids[2], pf.describe(true))
		fmt.Fprintf(out, "operation: %s\n", describeOp(op))
		_, err = fmt.Fprintln(out, `follow it with "shalectl placement status" and "shalectl placement history"`)
		return err
	})
	return cmd
}

// describeOp prints an operation on one line: kind, shard, nodes and
// reason, and the state and error of a failed one.
func describeOp(op *shalev1.PlacementOperation) string {
	s := fmt.Sprintf("%s of shard %d, node %s -> node %s", orDash(op.GetKind()), op.GetShardId(),
		nodeOrDash(op.GetFromNodeId()), nodeOrDash(op.GetNodeId()))
	if r := op.GetReason(); r != "" {
		s += " (" + r + ")"
	}
	if op.GetState() == "failed" || op.GetError() != "" {
		s += ", " + orDash(op.GetState()) + ": " + orDash(op.GetError())
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// since prints the time elapsed since unixNanos, rounded to the second,
// "-" for 0.
func since(unixNanos int64) string {
	if unixNanos == 0 {
		return "-"
	}
	return max(time.Since(time.Unix(0, unixNanos)), 0).Round(time.Second).String()
}

// utcTime prints a time as RFC 3339 in UTC, to the second; "-" for 0.
func utcTime(unixNanos int64) string {
	if unixNanos == 0 {
		return "-"
	}
	return time.Unix(0, unixNanos).UTC().Format(time.RFC3339)
}

// writePlacementStatus prints a placement status for people.
func writePlacementStatus(w io.Writer, st *shalev1.PlacementStatusResponse) error {
	fmt.Fprintf(w, "placement leader: node %s\n", nodeOrDash(st.GetPlacementLeaderNodeId()))
	fmt.Fprintf(w, "balanced: %s (replica spread %d, leader spread %d, bytes spread %.1f%%)\n",
		yesNo(st.GetBalanced()), st.GetReplicaSpread(), st.GetLeaderSpread(), st.GetBytesSpreadPercent())

	fmt.Fprintf(w, "\nnodes: %d\n", len(st.GetNodes()))
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tADDRESS\tZONE\tSTATE\tREPLICAS\tLEADERS\tBYTES\tDECOMMISSIONING\tLAST HEARTBEAT")
	for _, n := range st.GetNodes() {
		d := n.GetNode()
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.GetNodeId(), orDash(d.GetAddress()), orDash(d.GetZone()),
			orDash(n.GetState()), n.GetReplicas(), n.GetLeaders(), output.Bytes(n.GetBytes()),
			yesNo(d.GetDecommissioning()), ago(n.GetLastHeartbeatUnixNanos()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(st.GetRunning()) == 0 {
		fmt.Fprintln(w, "\nrunning operations: none")
	} else {
		fmt.Fprintf(w, "\nrunning operations: %d\n", len(st.GetRunning()))
		tw = newTable(w)
		fmt.Fprintln(tw, "SHARD\tKIND\tFROM\tTO\tREASON\tAGE")
		for _, op := range st.GetRunning() {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", op.GetShardId(), orDash(op.GetKind()), nodeOrDash(op.GetFromNodeId()),
				nodeOrDash(op.GetNodeId()), orDash(op.GetReason()), since(op.GetStartedUnixNanos()))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(st.GetStuck()) == 0 {
		_, err := fmt.Fprintln(w, "\nstuck replicas: none")
		return err
	}
	fmt.Fprintf(w, "\nstuck replicas: %d\n", len(st.GetStuck()))
	return writeStuck(w, "", st.GetStuck())
}

// writeStuck prints stuck replicas as a table, each line prefixed.
func writeStuck(w io.Writer, prefix string, stuck []*shalev1.StuckReplica) error {
	tw := newTable(w)
	fmt.Fprintln(tw, prefix+"SHARD\tNODE\tREASON")
	for _, s := range stuck {
		fmt.Fprintf(tw, "%s%d\t%d\t%s\n", prefix, s.GetShardId(), s.GetNodeId(), orDash(s.GetReason()))
	}
	return tw.Flush()
}

// writeHistory prints placement operations as a table.
func writeHistory(w io.Writer, ops []*shalev1.PlacementOperation) error {
	if len(ops) == 0 {
		_, err := fmt.Fprintln(w, "no operations")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "STARTED\tSHARD\tKIND\tFROM\tTO\tSTATE\tREASON\tERROR")
	for _, op := range ops {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", utcTime(op.GetStartedUnixNanos()), op.GetShardId(),
			orDash(op.GetKind()), nodeOrDash(op.GetFromNodeId()), nodeOrDash(op.GetNodeId()), orDash(op.GetState()),
			orDash(op.GetReason()), orDash(op.GetError()))
	}
	return tw.Flush()
}

// writeNodeStatus prints one node's placement for people.
func writeNodeStatus(w io.Writer, n *shalev1.NodePlacement) error {
	d := n.GetNode()
	tw := newTable(w)
	fmt.Fprintf(tw, "node:\t%d\n", d.GetNodeId())
	fmt.Fprintf(tw, "address:\t%s\n", orDash(d.GetAddress()))
	fmt.Fprintf(tw, "zone:\t%s\n", orDash(d.GetZone()))
	fmt.Fprintf(tw, "state:\t%s\n", orDash(n.GetState()))
	fmt.Fprintf(tw, "decommissioning:\t%s\n", yesNo(d.GetDecommissioning()))
	fmt.Fprintf(tw, "replicas:\t%d\n", n.GetReplicas())
	fmt.Fprintf(tw, "leaders:\t%d\n", n.GetLeaders())
	fmt.Fprintf(tw, "bytes:\t%s (%d bytes)\n", output.Bytes(n.GetBytes()), n.GetBytes())
	if s := n.GetStats(); s.GetCapacityBytes() > 0 {
		fmt.Fprintf(tw, "disk:\t%s available of %s\n", output.Bytes(s.GetAvailableBytes()), output.Bytes(s.GetCapacityBytes()))
	}
	fmt.Fprintf(tw, "last heartbeat:\t%s\n", ago(n.GetLastHeartbeatUnixNanos()))
	if d.GetDecommissioning() {
		fmt.Fprintf(tw, "progress:\t%s\n", drainProgress(n))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(n.GetStuck()) == 0 {
		_, err := fmt.Fprintln(w, "\nstuck replicas: none")
		return err
	}
	fmt.Fprintf(w, "\nstuck replicas: %d\n", len(n.GetStuck()))
	return writeStuck(w, "  ", n.GetStuck())
}

// drainProgress describes a decommissioning node's drain.
func drainProgress(n *shalev1.NodePlacement) string {
	id := n.GetNode().GetNodeId()
	switch r := n.GetReplicas(); r {
	case 0:
		return fmt.Sprintf("drained: 0 replicas, safe to remove with `shalectl node remove %d`", id)
	case 1:
		return "draining: 1 replica left"
	default:
		return fmt.Sprintf("draining: %d replicas left", r)
	}
}

// newNodeDrainLeadersCmd is "node drain-leaders [ID]".
func newNodeDrainLeadersCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "drain-leaders [ID]",
		Short: "Hand every leadership of a node to other nodes, before stopping it",
		Long: `drain-leaders asks node ID, or without ID the node at the first --endpoints
address, to hand every shard leadership it holds to replicas on other nodes,
and waits until it leads none or --timeout is near. For two minutes after, the
node hands away any leadership it gains and placement gives it none, so a stop
that follows (a Kubernetes preStop hook, a rolling restart) interrupts no
leader. Its replicas stay. It prints "node N: leads no shard (K leaderships
transferred)"; if shards are still led when time runs out, it names them and
exits with an error (run it again to continue). -o json prints {"node_id": N,
"transferred": K, "remaining_shard_ids": [...]}.`,
		Example: `  # In a pod's preStop hook, for the pod's own node:
  shalectl --endpoints 127.0.0.1:7001 --timeout 50s node drain-leaders
  shalectl node drain-leaders 3`,
		Args: cobra.RangeArgs(0, 1),
		RunE: f.adminRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			var id uint64
			if len(args) == 1 {
				var err error
				if id, err = parseID(cmd, "ID", args[0]); err != nil {
					return err
				}
			}
			res, err := c.DrainLeaders(ctx, id)
			if err != nil {
				return fmt.Errorf("node drain-leaders: %w", err)
			}
			if asJSON {
				if err := output.WriteJSON(cmd.OutOrStdout(), struct {
					NodeID      uint64   `json:"node_id"`
					Transferred int      `json:"transferred"`
					Remaining   []uint64 `json:"remaining_shard_ids"`
				}{res.NodeID, res.Transferred, append([]uint64{}, res.Remaining...)}); err != nil {
					return err
				}
			} else if len(res.Remaining) == 0 {
				if _, err := fmt.Fprintf(cmd.OutOrStdout(), "node %d: leads no shard (%d leaderships transferred)\n", res.NodeID, res.Transferred); err != nil {
					return err
				}
			}
			if len(res.Remaining) > 0 {
				return fmt.Errorf("node drain-leaders: node %d still leads shards %v (%d leaderships transferred); run it again to continue", res.NodeID, res.Remaining, res.Transferred)
			}
			return nil
		}),
	}
}
