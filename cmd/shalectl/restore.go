package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	"github.com/shale-db/shale/placement"
)

// restore prepares a new founding node's data directory to found a cluster
// from a backup (backup.Prepare): it copies the parts of the shards the
// node will host. It does not contact the cluster.

// restoreFlags are restore's flags.
type restoreFlags struct {
	*clusterFlags
	location          string
	dataDir           string
	asOf              string
	nodeID            uint64
	initialCluster    string
	replicationFactor int
	parallel          int
}

// restoreRecord is the JSON output of restore.
type restoreRecord struct {
	ID string `json:"id"`
	// ClusterID is the backed-up cluster's (the restored one gets a new
	// ID).
	ClusterID string `json:"cluster_id"`
	DataDir   string `json:"data_dir"`
	// AsOf is the time restored as of (null: everything the backup
	// holds).
	AsOf *time.Time `json:"as_of"`
	// NodeID is the founding node prepared; Nodes, every founding node;
	// ReplicationFactor, the replicas per shard.
	NodeID            uint64   `json:"node_id"`
	Nodes             []uint64 `json:"nodes"`
	ReplicationFactor int      `json:"replication_factor"`
	// Shards counts the backup's shards (the system shard included);
	// ShardsHosted, the user shards whose parts were staged: those the
	// node hosts.
	Shards       int `json:"shards"`
	ShardsHosted int `json:"shards_hosted"`
	// Files and Bytes are the staged parts' files, of which FilesReused
	// were staged already by a restore that did not finish.
	Files       int   `json:"files"`
	Bytes       int64 `json:"bytes"`
	FilesReused int   `json:"files_reused"`
}

// Environment variables restore takes its placement from, as shale-server
// does.
const (
	nodeIDEnv            = "SHALE_NODE_ID"
	initialClusterEnv    = "SHALE_INITIAL_CLUSTER"
	replicationFactorEnv = "SHALE_REPLICATION_FACTOR"
)

func newRestoreCmd(cf *clusterFlags) *cobra.Command {
	f := &restoreFlags{clusterFlags: cf}
	cmd := &cobra.Command{
		Use:   "restore ID --location LOC --data-dir DIR --node-id N --initial-cluster ID=ADDR,... [--as-of TIME]",
		Short: "Prepare a new founding node's data directory to found a cluster from a backup",
		Long: `restore prepares DIR, the data directory of founding node N of a new cluster
(empty or missing), to found that cluster from backup ID of the location LOC.
The new cluster's shards are the backup's user shards, placed on the founding
nodes (--initial-cluster, the same list shale-server takes, and
--replication-factor, default 3) as every new cluster's initial shards are:
user shard k on the nodes sorted by ID from the k-th on. restore copies into
DIR/restore the backup's manifest and the files of the shards node N hosts
(with 3 nodes and 3 replicas, every shard; with more nodes than replicas,
some), --parallel files at once, each checked against the backup's size and
CRC-32C as it is copied, written through the page cache (the node reads the
files at its start) to a temporary name, synced and renamed into place (a
progress line on stderr, on a terminal).
With --as-of TIME (RFC 3339, such as 2026-11-22T14:05:00Z) the data is
restored as of TIME, which every shard of the backup must reach (see "backup
describe", restorable:); it is checked here. It does not contact the cluster.
--node-id, --initial-cluster and --replication-factor default to
$SHALE_NODE_ID, $SHALE_INITIAL_CLUSTER and $SHALE_REPLICATION_FACTOR, the
variables shale-server reads.

A restore that fails or is interrupted keeps the files it copied and checked
(never one half-written under its name) and no record of a prepared restore,
which a server refuses to start on: run the same command again to finish it,
or remove DIR/restore.

Then start shale-server --data-dir DIR with the same --node-id,
--initial-cluster and --replication-factor (and no --restore-from): it founds
the cluster from the staged parts, hard-linking them into place, and removes
DIR/restore. Every founding node needs its own data directory prepared by
restore from the same backup ID; a node started with another placement than
the one its directory was prepared for stops and says so.

It prints the backup's ID, the backed-up cluster's ID, its shards and those
the node hosts, the files and bytes staged, the time restored as of, and the
next step. With -o json: {id, cluster_id, data_dir, as_of, node_id, nodes,
replication_factor, shards, shards_hosted, files, bytes, files_reused} (as_of
null without --as-of).`,
		Example: `  shalectl restore nightly-1122 --location /mnt/backups/shale --data-dir /var/lib/shale/r1 \
    --node-id 1 --initial-cluster 1=10.0.0.1:7001,2=10.0.0.2:7001,3=10.0.0.3:7001
  shalectl restore stream-20261122T101500.250Z --location s3://backups/shale --data-dir data/r2 \
    --node-id 2 --initial-cluster 1=h1:7001,2=h2:7001,3=h3:7001,4=h4:7001 --as-of 2026-11-22T10:14:00Z
  SHALE_NODE_ID=3 SHALE_INITIAL_CLUSTER=1=h1:7001,2=h2:7001,3=h3:7001 \
    shalectl restore nightly-1122 --location 's3://backups/shale?endpoint=http://minio:9000' --data-dir data/r3 -o json`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := f.jsonOutput(cmd)
			if err != nil {
				return err
			}
			usage := func(format string, a ...any) error {
				return &usageError{cmd: cmd, msg: fmt.Sprintf(format, a...)}
			}
			if strings.TrimSpace(f.location) == "" {
				return usage("%s needs --location LOC (where the backup is)", cmd.CommandPath())
			}
			if strings.TrimSpace(f.dataDir) == "" {
				return usage("%s needs --data-dir DIR (the new node's data directory)", cmd.CommandPath())
			}
			if err := backup.ValidID(args[0]); err != nil {
				return usage("ID: %v", err)
			}
			var asOf time.Time
			if cmd.Flags().Changed("as-of") {
				if asOf, err = time.Parse(time.RFC3339Nano, f.asOf); err != nil {
					return usage("--as-of: want an RFC 3339 time such as 2026-11-22T14:05:00Z: %v", err)
				}
			}
			if !cmd.Flags().Changed("node-id") {
				if env := strings.TrimSpace(os.Getenv(nodeIDEnv)); env != "" {
					if f.nodeID, err = strconv.ParseUint(env, 10, 64); err != nil {
						return usage("$%s: want a node ID: %v", nodeIDEnv, err)
					}
				}
			}
			if f.nodeID == 0 {
				return usage("%s needs --node-id N (or $%s): the founding node whose data directory DIR is", cmd.CommandPath(), nodeIDEnv)
			}
			if !cmd.Flags().Changed("initial-cluster") {
				f.initialCluster = os.Getenv(initialClusterEnv)
			}
			members, err := placement.ParseInitialCluster(f.initialCluster)
			if err != nil {
				return usage("--initial-cluster: %v", err)
			}
			if len(members) == 0 {
				return usage("%s needs --initial-cluster ID=ADDR,... (or $%s): the founding nodes, as shale-server takes them", cmd.CommandPath(), initialClusterEnv)
			}
			if !cmd.Flags().Changed("replication-factor") {
				if env := strings.TrimSpace(os.Getenv(replicationFactorEnv)); env != "" {
					if f.replicationFactor, err = strconv.Atoi(env); err != nil {
						return usage("$%s: want a number: %v", replicationFactorEnv, err)
					}
				}
			}
			if f.replicationFactor < 1 {
				return usage("--replication-factor %d: want 1 or more", f.replicationFactor)
			}
			if f.parallel < 1 {
				return usage("--parallel %d: want 1 or more", f.parallel)
			}
			nodes := make([]uint64, 0, len(members))
			for id := range members {
				nodes = append(nodes, id)
			}
			return f.restore(cmd, args[0], backup.PrepareOptions{AsOf: asOf, NodeID: f.nodeID, Nodes: nodes,
				ReplicationFactor: f.replicationFactor, Parallel: f.parallel}, asJSON)
		},
	}
	cmd.Flags().StringVar(&f.location, "location", "", locationHelp)
	cmd.Flags().StringVar(&f.dataDir, "data-dir", "", "the new founding node's data directory `DIR`, empty or missing (required)")
	cmd.Flags().StringVar(&f.asOf, "as-of", "", "restore the data as of `TIME` (RFC 3339, e.g. 2026-11-22T14:05:00Z; default: everything the backup holds)")
	cmd.Flags().Uint64Var(&f.nodeID, "node-id", 0, "the founding node `N` whose data directory DIR is, its ID in --initial-cluster (required; default $"+nodeIDEnv+")")
	cmd.Flags().StringVar(&f.initialCluster, "initial-cluster", "", "the new cluster's founding nodes, `ID=HOST:PORT,...`, as shale-server takes them (required; default $"+initialClusterEnv+")")
	cmd.Flags().IntVar(&f.replicationFactor, "replication-factor", 3, "replicas per shard in the new cluster, as shale-server takes it (default $"+replicationFactorEnv+", else 3)")
	cmd.Flags().IntVar(&f.parallel, "parallel", backup.DefaultCopyParallel, "files copied at once")
	return cmd
}

// restore runs restore: it stages the parts of backup id the node hosts in
// --data-dir, until done or interrupted (SIGINT or SIGTERM).
func (f *restoreFlags) restore(cmd *cobra.Command, id string, o backup.PrepareOptions, asJSON bool) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	loc, err := backup.Open(ctx, f.location, false)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}

	prog, progress := fileProgress(cmd, asJSON, "copied and checked")
	o.Progress = progress
	res, err := backup.Prepare(ctx, loc, id, f.dataDir, o)
	prog.done()
	if err != nil {
		stage := filepath.Join(f.dataDir, backup.PreparedDir)
		if _, ok, perr := backup.ReadPrepared(f.dataDir); !ok && perr != nil {
			if ents, _ := os.ReadDir(f.dataDir); len(ents) == 1 {
				return fmt.Errorf("restore: %w\n%s keeps the files copied and checked so far: run the same restore again to finish it, or remove %s", err, stage, stage)
			}
		}
		return fmt.Errorf("restore: %w", err)
	}

	m, p := res.Manifest, res.Prepared
	rec := restoreRecord{ID: m.ID, ClusterID: m.ClusterID, DataDir: f.dataDir, NodeID: p.NodeID, Nodes: p.Nodes, ReplicationFactor: p.ReplicationFactor,
		Shards: len(m.Shards), ShardsHosted: len(p.Parts), Files: res.Staged.Files, Bytes: res.Staged.Bytes, FilesReused: res.Reused.Files}
	if !o.AsOf.IsZero() {
		t := o.AsOf.UTC()
		rec.AsOf = &t
	}
	if asJSON {
		return output.WriteJSON(cmd.OutOrStdout(), rec)
	}
	users := 0
	for _, part := range m.Shards {
		if !part.System {
			users++
		}
	}
	out := cmd.OutOrStdout()
	tw := newTable(out)
	fmt.Fprintf(tw, "prepared:\tbackup %s (from %s) in %s\n", rec.ID, loc.String(), p.Location)
	fmt.Fprintf(tw, "node:\t%d of the founding nodes %s, %d replicas per shard\n", rec.NodeID, joinIDs(rec.Nodes), rec.ReplicationFactor)
	fmt.Fprintf(tw, "cluster:\t%s (the backed-up cluster; the restored one gets a new ID)\n", rec.ClusterID)
	fmt.Fprintf(tw, "shards:\t%d (this node hosts %d of the %d user shards; the system shard is made new)\n", rec.Shards, rec.ShardsHosted, users)
	if rec.FilesReused > 0 {
		fmt.Fprintf(tw, "files:\t%d staged, every checksum matches (%d of them by an earlier restore that did not finish)\n", rec.Files, rec.FilesReused)
	} else {
		fmt.Fprintf(tw, "files:\t%d copied, every checksum matches\n", rec.Files)
	}
	fmt.Fprintf(tw, "bytes:\t%s\n", bytesAndSize(rec.Bytes))
	if rec.AsOf != nil {
		fmt.Fprintf(tw, "as of:\t%s\n", rec.AsOf.Format(time.RFC3339Nano))
	} else {
		fmt.Fprintf(tw, "as of:\t- (everything the backup holds)\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, `
Next: start shale-server on this data directory as founding node %d,
  shale-server --data-dir %s --node-id %d --listen ADDR --initial-cluster %s --replication-factor %d
with the same --initial-cluster and --replication-factor on every founding
node, each on its own data directory prepared by "shalectl restore %s
--node-id ID" (no --restore-from). The nodes found the cluster from the backup.
`, rec.NodeID, rec.DataDir, rec.NodeID, f.initialCluster, rec.ReplicationFactor, rec.ID)
	return err
}

// joinIDs writes node IDs as "1, 2, 3".
func joinIDs(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ", ")
}
