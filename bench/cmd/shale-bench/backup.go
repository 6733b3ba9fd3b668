package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/bench/cluster"
)

func backupCmd() *cobra.Command {
	var (
		dir, location, shaleServer string
		shaleSplits                string
		dataMB, incMB, valueSize   int
		keep, asJSON               bool
		shaleArgs                  []string
	)
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Backup and restore speed of a local 3-node Shale cluster vs the disk's sequential write speed",
		Long: `Starts a local 3-node Shale cluster, loads --data-mb MB of incompressible
values (--value-size bytes each), takes a full backup into --location (a
directory or an S3 URL, as shalectl backup takes it; by default a directory
under --dir) with what shalectl backup create runs, loads --incremental-mb MB more and takes an
incremental backup on top of it, then restores the incremental backup as a
new 3-node cluster (shale-server --restore-from) and waits until the last
key loaded reads back. Finally it writes as many bytes as the full backup
holds to one file in the same directory and syncs it: the disk's sequential
write speed. It reports MB/s of each step and their ratio to the disk's.
A restore writes every shard three times (one copy per node): the report
gives the restore's MB/s of the backup, of every copy written (over the
whole restore, and over the nodes' copying alone, from their logs), and
when the restored nodes served. A node sends a backup's checkpoint files
paced by --snapshot-rate-bytes while it serves client requests (128 MiB/s
by default, shared with Raft snapshots) and unpaced once it has been idle
for a second: each backup here starts 1.5 s after the load, so the nodes
send unpaced; --shale-arg changes the rate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, Splits: shaleSplits, ExtraArgs: shaleArgs})
			defer cluster.CleanupShaleServer()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			r, err := cluster.RunBackup(ctx, cluster.BackupConfig{
				Dir: dir, Location: location, Keep: keep, DataBytes: int64(dataMB) << 20, IncrementalBytes: int64(incMB) << 20,
				ValueSize: valueSize, Log: os.Stderr,
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			disk := cluster.MBps(r.FullBytes, r.DiskWriteSeconds)
			full := cluster.MBps(r.FullBytes, r.FullSeconds)
			inc := cluster.MBps(r.IncrementalBytes, r.IncrementalSeconds)
			restore := cluster.MBps(r.FullBytes, r.RestoreSeconds)
			// Counting every copy written: what all the founding nodes
			// copied, over the whole restore and over its copying alone.
			restoreAll := cluster.MBps(r.RestoreCopyBytes, r.RestoreSeconds)
			restoreCopy := cluster.MBps(r.RestoreCopyBytes, r.RestoreCopySeconds)
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{
					"loaded_bytes": r.Loaded, "full_bytes": r.FullBytes, "full_seconds": r.FullSeconds, "full_mbps": full,
					"incremental_bytes": r.IncrementalBytes, "incremental_seconds": r.IncrementalSeconds, "incremental_mbps": inc,
					"restore_seconds": r.RestoreSeconds, "restore_mbps": restore,
					"restore_copy_bytes": r.RestoreCopyBytes, "restore_copy_seconds": r.RestoreCopySeconds, "restore_started_seconds": r.RestoreStartedSeconds,
					"restore_all_copies_mbps": restoreAll, "restore_copy_mbps": restoreCopy,
					"disk_write_seconds": r.DiskWriteSeconds, "disk_write_mbps": disk,
				})
			}
			fmt.Fprintf(out, "shale-bench backup: 3 nodes; %d MB loaded (%d-byte values), then %d MB more\n", r.Loaded/1e6, valueSize, int64(incMB)<<20/1e6)
			fmt.Fprintf(out, "%-22s %10s %9s %9s %12s\n", "step", "bytes", "seconds", "MB/s", "vs disk")
			row := func(name string, bytes int64, secs, mbps float64) {
				fmt.Fprintf(out, "%-22s %10d %9.2f %9.1f %11.2fx\n", name, bytes, secs, mbps, mbps/disk)
			}
			row("full backup", r.FullBytes, r.FullSeconds, full)
			row("incremental backup", r.IncrementalBytes, r.IncrementalSeconds, inc)
			row("restore (3 copies)", r.FullBytes, r.RestoreSeconds, restore)
			row("restore, every copy", r.RestoreCopyBytes, r.RestoreSeconds, restoreAll)
			row("  its copying alone", r.RestoreCopyBytes, r.RestoreCopySeconds, restoreCopy)
			row("disk sequential write", r.FullBytes, r.DiskWriteSeconds, disk)
			fmt.Fprintf(out, "the restored nodes served %.2f s after their start (copies and shard opening done); the rest of the restore's %.2f s is elections and finding the leaders\n",
				r.RestoreStartedSeconds, r.RestoreSeconds)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "data/bench-backup", "directory of the clusters, the backups and the disk test (removed at the end unless --keep)")
	f.StringVar(&location, "location", "", "where the backups go: a directory or s3://BUCKET[/PREFIX][?endpoint=URL] (credentials from the AWS environment; default: --dir/backups; backups made at an S3 location are deleted at the end unless --keep)")
	f.BoolVar(&keep, "keep", false, "keep --dir and the backups")
	f.IntVar(&dataMB, "data-mb", 256, "MB of values loaded before the full backup")
	f.IntVar(&incMB, "incremental-mb", 16, "MB of values loaded before the incremental backup")
	f.IntVar(&valueSize, "value-size", 4096, "bytes per value")
	f.StringVar(&shaleServer, "shale-server", "", "shale-server binary (default: build it)")
	f.StringVar(&shaleSplits, "shale-splits", cluster.DefaultShaleSplits, "--initial-splits of the Shale cluster")
	f.StringArrayVar(&shaleArgs, "shale-arg", nil, "extra shale-server flag for every node, repeatable (e.g. --shale-arg=--snapshot-rate-bytes=-1: backups share the snapshot pacing, 128 MiB/s on a busy node by default)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
