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
		shalectl                   string
		restores                   []string
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
new 3-node cluster in each way --restore names, one after the other, and
waits each time until the last key loaded reads back: "server" starts the
founding nodes with --restore-from (each copies the parts of the shards it
hosts); "shalectl" runs shalectl restore for the three nodes' data
directories at once, as three machines would, then starts the nodes on
them (the time counts both). Before each restore the backup's files are
dropped from the page cache, so every restore reads them from the disk.
Finally it writes as many bytes as the full backup holds to one file in the
same directory and syncs it: the disk's sequential write speed. It reports
MB/s of each step and their ratio to the disk's.

A restore's MB/s count every copy written: the bytes all the restored
replicas need from the backup (each node's hosted parts, checkpoint files
and log segments: 3 copies of every user part with 3 nodes and 3 replicas)
over the whole restore, from its start until the last key reads back. The
bytes a restore actually wrote from the backup (shalectl's staged files
plus what the nodes copied) are reported beside, over the copying alone; a
build that copies more than the replicas need does not get credit for it.
A node sends a backup's checkpoint files paced by --snapshot-rate-bytes
while it serves client requests (128 MiB/s by default, shared with Raft
snapshots) and unpaced once it has been idle for a second: each backup here
starts 1.5 s after the load, so the nodes send unpaced; --shale-arg changes
the rate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, Splits: shaleSplits, ExtraArgs: shaleArgs})
			defer cluster.CleanupShaleServer()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			r, err := cluster.RunBackup(ctx, cluster.BackupConfig{
				Dir: dir, Location: location, Keep: keep, DataBytes: int64(dataMB) << 20, IncrementalBytes: int64(incMB) << 20,
				ValueSize: valueSize, Restores: restores, Shalectl: shalectl, Log: os.Stderr,
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			disk := cluster.MBps(r.FullBytes, r.DiskWriteSeconds)
			full := cluster.MBps(r.FullBytes, r.FullSeconds)
			inc := cluster.MBps(r.IncrementalBytes, r.IncrementalSeconds)
			if asJSON {
				restores := []map[string]any{}
				for _, x := range r.Restores {
					// Counting every copy written: every replica's bytes
					// over the whole restore, and the bytes written over
					// the copying alone.
					restores = append(restores, map[string]any{
						"method": x.Method, "seconds": x.Seconds, "replica_bytes": x.ReplicaBytes, "written_bytes": x.WrittenBytes,
						"copy_seconds": x.CopySeconds, "started_seconds": x.StartedSeconds, "server_cpu_seconds": x.ServerCPUSeconds,
						"mbps": cluster.MBps(x.ReplicaBytes, x.Seconds), "vs_disk": cluster.MBps(x.ReplicaBytes, x.Seconds) / disk,
						"copy_mbps": cluster.MBps(x.WrittenBytes, x.CopySeconds),
					})
				}
				return json.NewEncoder(out).Encode(map[string]any{
					"loaded_bytes": r.Loaded, "full_bytes": r.FullBytes, "full_seconds": r.FullSeconds, "full_mbps": full,
					"incremental_bytes": r.IncrementalBytes, "incremental_seconds": r.IncrementalSeconds, "incremental_mbps": inc,
					"restores":           restores,
					"disk_write_seconds": r.DiskWriteSeconds, "disk_write_mbps": disk,
				})
			}
			fmt.Fprintf(out, "shale-bench backup: 3 nodes; %d MB loaded (%d-byte values), then %d MB more\n", r.Loaded/1e6, valueSize, int64(incMB)<<20/1e6)
			fmt.Fprintf(out, "%-30s %10s %9s %9s %12s\n", "step", "bytes", "seconds", "MB/s", "vs disk")
			row := func(name string, bytes int64, secs float64) {
				mbps := cluster.MBps(bytes, secs)
				fmt.Fprintf(out, "%-30s %10d %9.2f %9.1f %11.2fx\n", name, bytes, secs, mbps, mbps/disk)
			}
			row("full backup", r.FullBytes, r.FullSeconds)
			row("incremental backup", r.IncrementalBytes, r.IncrementalSeconds)
			for _, x := range r.Restores {
				row("restore ("+x.Method+"), every copy", x.ReplicaBytes, x.Seconds)
				row("  bytes written, copying", x.WrittenBytes, x.CopySeconds)
			}
			row("disk sequential write", r.FullBytes, r.DiskWriteSeconds)
			for _, x := range r.Restores {
				fmt.Fprintf(out, "restore (%s): the nodes served %.2f s after their start; the restore took %.2f s in all; the nodes used %.2f CPU-s\n", x.Method, x.StartedSeconds, x.Seconds, x.ServerCPUSeconds)
			}
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
	f.StringSliceVar(&restores, "restore", []string{cluster.RestoreServer, cluster.RestoreShalectl}, "how the incremental backup is restored, each a new 3-node cluster in turn: server (shale-server --restore-from on every node), shalectl (shalectl restore for the three data directories at once, then shale-server on them)")
	f.StringVar(&shalectl, "shalectl", "", "shalectl binary for --restore shalectl (default: build it)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
