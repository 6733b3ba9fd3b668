package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
)

// restore prepares a new node's data directory to found a cluster from a
// backup (backup.Prepare); it does not contact the cluster.

// restoreFlags are restore's flags.
type restoreFlags struct {
	*clusterFlags
	location string
	dataDir  string
	asOf     string
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
	AsOf   *time.Time `json:"as_of"`
	Files  int        `json:"files"`
	Bytes  int64      `json:"bytes"`
	Shards int        `json:"shards"`
}

func newRestoreCmd(cf *clusterFlags) *cobra.Command {
	f := &restoreFlags{clusterFlags: cf}
	cmd := &cobra.Command{
		Use:   "restore ID --location LOC --data-dir DIR [--as-of TIME]",
		Short: "Prepare a new founding node's data directory to found a cluster from a backup",
		Long: `restore prepares DIR, the data directory of a new founding node (empty or
missing), to found a cluster from backup ID of the location LOC: it copies the
backup into DIR/restore, checking every file's size and CRC-32C as it is copied
(with a progress line on stderr, on a terminal). With --as-of TIME (RFC 3339, such as
2026-11-22T14:05:00Z) the data is restored as of TIME, which every shard of the
backup must reach (see "backup describe", restorable:); it is checked here. It
does not contact the cluster. A restore that fails or is interrupted removes
what it copied.

Then start shale-server with --data-dir DIR as a founding node (with
--initial-cluster, and no --restore-from): it founds the cluster from the
backup, as --restore-from would, and removes DIR/restore. Every founding node
needs its own data directory prepared by restore from the same backup ID, and
the same --initial-cluster.

It prints the backup's ID, the backed-up cluster's ID, its shards, the files
and bytes copied, the time restored as of, and the next step. With -o json:
{id, cluster_id, data_dir, as_of, files, bytes, shards} (as_of null without
--as-of).`,
		Example: `  shalectl restore nightly-1122 --location /mnt/backups/shale --data-dir /var/lib/shale/r1
  shalectl restore stream-20261122T101500.250Z --location s3://backups/shale --data-dir data/r1 --as-of 2026-11-22T10:14:00Z
  shalectl restore nightly-1122 --location 's3://backups/shale?endpoint=http://minio:9000' --data-dir data/r1 -o json`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := f.jsonOutput(cmd)
			if err != nil {
				return err
			}
			if strings.TrimSpace(f.location) == "" {
				return &usageError{cmd: cmd, msg: fmt.Sprintf("%s needs --location LOC (where the backup is)", cmd.CommandPath())}
			}
			if strings.TrimSpace(f.dataDir) == "" {
				return &usageError{cmd: cmd, msg: fmt.Sprintf("%s needs --data-dir DIR (the new node's data directory)", cmd.CommandPath())}
			}
			if err := backup.ValidID(args[0]); err != nil {
				return &usageError{cmd: cmd, msg: "ID: " + err.Error()}
			}
			var asOf time.Time
			if cmd.Flags().Changed("as-of") {
				if asOf, err = time.Parse(time.RFC3339Nano, f.asOf); err != nil {
					return &usageError{cmd: cmd, msg: fmt.Sprintf("--as-of: want an RFC 3339 time such as 2026-11-22T14:05:00Z: %v", err)}
				}
			}
			return f.restore(cmd, args[0], asOf, asJSON)
		},
	}
	cmd.Flags().StringVar(&f.location, "location", "", locationHelp)
	cmd.Flags().StringVar(&f.dataDir, "data-dir", "", "the new founding node's data directory `DIR`, empty or missing (required)")
	cmd.Flags().StringVar(&f.asOf, "as-of", "", "restore the data as of `TIME` (RFC 3339, e.g. 2026-11-22T14:05:00Z; default: everything the backup holds)")
	return cmd
}

// restore runs restore: it stages backup id in --data-dir, until done or
// interrupted (SIGINT or SIGTERM).
func (f *restoreFlags) restore(cmd *cobra.Command, id string, asOf time.Time, asJSON bool) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// What a failed restore leaves is removed only when the data
	// directory was empty or missing before (else backup.Prepare refuses
	// it and touches nothing).
	ents, err := os.ReadDir(f.dataDir)
	fresh := errors.Is(err, fs.ErrNotExist) || (err == nil && len(ents) == 0)
	created := errors.Is(err, fs.ErrNotExist)
	if !fresh {
		if p, ok, perr := backup.ReadPrepared(f.dataDir); perr == nil && ok {
			return fmt.Errorf("restore: %s already holds a prepared restore of backup %s (from %s): start shale-server on it, or remove %s to prepare it again",
				f.dataDir, p.Backup, p.From, p.Location)
		}
	}
	loc, err := backup.Open(ctx, f.location, false)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}

	prog, progress := fileProgress(cmd, asJSON, "copied and checked")
	m, err := backup.Prepare(ctx, loc, id, asOf, f.dataDir, progress)
	prog.done()
	if err != nil {
		if fresh {
			if rerr := os.RemoveAll(filepath.Join(f.dataDir, backup.PreparedDir)); rerr != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "shalectl: restore: remove what was copied: %v\n", rerr)
			} else if created {
				_ = os.Remove(f.dataDir)
			}
		}
		return fmt.Errorf("restore: %w", err)
	}

	rec := restoreRecord{ID: m.ID, ClusterID: m.ClusterID, DataDir: f.dataDir, Shards: len(m.Shards), Bytes: int64(m.Bytes())}
	for _, p := range m.Shards {
		rec.Files += len(p.Files) + len(p.Log)
	}
	if !asOf.IsZero() {
		t := asOf.UTC()
		rec.AsOf = &t
	}
	if asJSON {
		return output.WriteJSON(cmd.OutOrStdout(), rec)
	}
	out := cmd.OutOrStdout()
	tw := newTable(out)
	fmt.Fprintf(tw, "prepared:\tbackup %s (from %s) in %s\n", rec.ID, loc.String(), filepath.Join(rec.DataDir, backup.PreparedDir))
	fmt.Fprintf(tw, "cluster:\t%s (the backed-up cluster; the restored one gets a new ID)\n", rec.ClusterID)
	fmt.Fprintf(tw, "shards:\t%d\n", rec.Shards)
	fmt.Fprintf(tw, "files:\t%d copied, every checksum matches\n", rec.Files)
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
Next: start shale-server on this data directory as a founding node,
  shale-server --data-dir %s --node-id N --listen ADDR --initial-cluster 1=ADDR1,2=ADDR2,...
with the same --initial-cluster on every founding node, each on its own data
directory prepared by "shalectl restore %s" (no --restore-from). The nodes
found the cluster from the backup.
`, rec.DataDir, rec.ID)
	return err
}
