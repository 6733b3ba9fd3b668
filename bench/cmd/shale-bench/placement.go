package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/bench/cluster"
)

// Sizes of the full (default) and --quick placement runs.
const (
	fullPlacementBytes  = 1 << 30
	quickPlacementBytes = 128 << 20
	fullDiskTestBytes   = 1 << 30
	quickDiskTestBytes  = 256 << 20
	fullIdleShards      = 10_000
	quickIdleShards     = 1_000
	fullSnapshotBytes   = 512 << 20
	quickSnapshotBytes  = 128 << 20
)

func placementCmd() *cobra.Command {
	var (
		dir, shaleServer, serverArgs, joinArgs, idleServerArgs string
		dataBytes, diskBytes, minMem, snapshotBytes            int64
		snapshotProfile                                        string
		snapshotProfileSeconds                                 int
		skipSnapshot                                           bool
		shards, valueSize, writers, idleShards                 int
		timeout, poll, idleSettle, idleWindow                  time.Duration
		quick, skipIdle, skipRebalance, keep, asJSON           bool
		idleForce                                              bool
		seed                                                   uint64
		fgRate, fgValueSize                                    int
		fgBefore                                               time.Duration
		fgTrace                                                string
	)
	cmd := &cobra.Command{
		Use:   "placement",
		Short: "Placement service: one replica move, rebalance after adding 2 nodes to a loaded 3-node cluster, and the CPU of idle shards",
		Long: `Three measurements of the placement service, on local shale-server processes
(default settings unless --server-args):

Snapshot. Measures the disk as below (--disk-bytes), starts a 3-node cluster
with one user shard, loads --snapshot-bytes of random --value-size values into
it, starts a fourth node, and moves the shard's replica on a follower's node
onto it (Admin MoveReplica): the shard's leader streams it one Raft snapshot.
It reports the snapshot's time as the sender logs it ("snapshot sent ...
took", from the checkpoint to the receiver's install), the shard's size over
that time against the disk's sequential write speed, the
whole move's time, and the CPU time of the sending and the receiving process
over the move per GB moved. --snapshot-profile DIR saves CPU profiles and
execution traces of both (sender.pprof, receiver.pprof, sender.trace,
receiver.trace) over the first --snapshot-profile-seconds of the move.

Rebalance. Writes --disk-bytes sequentially (1 MiB writes, then fsync) to a
file under --dir to measure the disk. Starts a 3-node cluster whose
--initial-splits make --shards user shards of equal key ranges, loads
--data-bytes of random (incompressible) --value-size values under keys spread
uniformly over them (--writers concurrent writers), then starts 2 nodes that
--join the cluster. From the moment the cluster lists both as live, it polls
ClusterStatus every --poll until the placement is balanced for 3 polls in a
row: every shard has a leader and 3 replicas, all voters (no learner or joint
configuration left); the replica counts per node differ by at most 1 (or their
shards' bytes by at most 20%); the leader counts differ by at most 1. It
reports the time that took, the data moved (the new nodes' data directories
on disk, and the moved replicas' shard sizes), MB/s moved against the disk's
sequential write speed, and the replicas, leaders and bytes per node. A
placement not balanced within --timeout is reported as a failure, with the
last counts.

Idle. The same as 'shale-bench idle --shards N' (N = --idle-shards, 10,000;
1,000 with --quick): a fresh 3-node cluster with N user shards, left alone,
and each process's CPU over --idle-window. Each shard engine keeps one file
open (its WAL): the open-file limit the servers inherit is raised (to 2 per
shard) where the process may, and if it stays below 1 per shard plus 2,048 the
case is reported as not run (--idle-force runs it anyway). A memory guard stops the servers if
the machine's available memory falls below --min-available-memory, so a case
too big for the machine fails instead of waking the OOM killer.

--quick: 128 MiB of data (also for the snapshot), a 256 MiB disk test and
1,000 idle shards (settle 10s, window 20s); a few minutes. Linux only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ch := cmd.Flags().Changed
			if quick {
				if !ch("data-bytes") {
					dataBytes = quickPlacementBytes
				}
				if !ch("disk-bytes") {
					diskBytes = quickDiskTestBytes
				}
				if !ch("idle-shards") {
					idleShards = quickIdleShards
				}
				if !ch("snapshot-bytes") {
					snapshotBytes = quickSnapshotBytes
				}
				if !ch("idle-settle") {
					idleSettle = 10 * time.Second
				}
				if !ch("idle-window") {
					idleWindow = 20 * time.Second
				}
			}
			if dataBytes < 0 || diskBytes < 0 || shards < 1 || valueSize < 1 || writers < 1 || timeout <= 0 || poll <= 0 || idleShards < 1 || idleSettle < 0 || idleWindow <= 0 {
				return errors.New("need --data-bytes >= 0, --disk-bytes >= 0, --shards >= 1, --value-size >= 1, --writers >= 1, --timeout > 0, --poll > 0, --idle-shards >= 1, --idle-settle >= 0, --idle-window > 0")
			}
			if fgRate < 0 || fgValueSize < 1 || fgBefore < 0 {
				return errors.New("need --foreground-rate >= 0, --foreground-value-size >= 1, --foreground-before >= 0")
			}
			extra := strings.Fields(serverArgs)
			// Keep the load from splitting the shards (default split size
			// 128 MiB): the shards' sizes are what moves.
			if per := dataBytes / int64(shards); per > 96<<20 && !strings.Contains(serverArgs, "--split-size-bytes") {
				extra = append(extra, "--split-size-bytes", fmt.Sprint(2*per))
			}
			cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, ExtraArgs: extra})
			defer cluster.CleanupShaleServer()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			failed := 0
			if !skipSnapshot {
				// One shard holds everything: no size or load splits.
				snapArgs := append(strings.Fields(serverArgs), "--split-qps", "-1")
				if !strings.Contains(serverArgs, "--split-size-bytes") {
					snapArgs = append(snapArgs, "--split-size-bytes", fmt.Sprint(max(2*snapshotBytes, 128<<20)))
				}
				cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, ExtraArgs: snapArgs})
				if !asJSON {
					fmt.Fprintf(out, "shale-bench placement: snapshot: 3 nodes + 1 joining; 1 user shard; %d MiB of %d-byte random values; server args %q\n",
						snapshotBytes>>20, valueSize, strings.Join(snapArgs, " "))
				}
				r := cluster.RunSnapshot(ctx, cluster.SnapshotConfig{
					DataBytes:      snapshotBytes,
					ValueSize:      valueSize,
					Writers:        writers,
					DiskTestBytes:  diskBytes,
					ProfileDir:     snapshotProfile,
					ProfileSeconds: snapshotProfileSeconds,
					Seed:           seed,
					Dir:            dir,
					Keep:           keep,
					Log:            os.Stderr,
				})
				if ctx.Err() != nil {
					return errors.New("interrupted")
				}
				failed += emitResult("placement/snapshot", r.Err, asJSON, func() { _ = cluster.WriteSnapshotJSONLine(out, r) }, func() { cluster.WriteSnapshotReport(out, r) })
				cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, ExtraArgs: extra})
			}
			if !skipRebalance {
				if !asJSON {
					fmt.Fprintf(out, "shale-bench placement: rebalance: 3 nodes + 2 joining; %d user shards; %d MiB of %d-byte random values; timeout %s; server args %q; joining nodes' args %q\n",
						shards, dataBytes>>20, valueSize, timeout, strings.Join(extra, " "), joinArgs)
				}
				r := cluster.RunPlacement(ctx, cluster.PlacementConfig{
					Members:       3,
					Join:          2,
					Shards:        shards,
					DataBytes:     dataBytes,
					ValueSize:     valueSize,
					Writers:       writers,
					JoinArgs:      strings.Fields(joinArgs),
					Timeout:       timeout,
					Poll:          poll,
					Stable:        3,
					DiskTestBytes: diskBytes,
					Seed:          seed,
					Dir:           dir,
					Keep:          keep,
					Log:           os.Stderr,

					ForegroundRate:      fgRate,
					ForegroundValueSize: fgValueSize,
					ForegroundBefore:    fgBefore,
					ForegroundTrace:     fgTrace,
				})
				if ctx.Err() != nil {
					return errors.New("interrupted")
				}
				failed += emitResult("placement/rebalance", r.Err, asJSON, func() { _ = cluster.WritePlacementJSONLine(out, r) }, func() { cluster.WritePlacementReport(out, r) })
			}
			if !skipIdle {
				cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, ExtraArgs: strings.Fields(idleServerArgs)})
				// Every shard engine keeps its WAL open: raise the limit
				// the servers inherit.
				want := uint64(idleShards)*2 + 4096
				got, err := cluster.RaiseFileLimit(want)
				if got < want {
					fmt.Fprintf(os.Stderr, "placement: open-file limit %d, below the %d wanted for %d shards (%v)\n", got, want, idleShards, err)
				}
				// Below one per shard, plus the table cache (1,000 SSTs)
				// and connections, the servers die while bootstrapping the
				// shards ("too many open files"), and the idle run would
				// wait for them until its start timeout: fail now.
				if need := uint64(idleShards+1) + 2048; got < need && !idleForce {
					r := cluster.IdleResult{Shards: idleShards, Nodes: 3, ServerArgs: idleServerArgs,
						Err: fmt.Errorf("not run: the open-file limit the servers would inherit is %d, and each node needs about %d for %d shard engines (one WAL each, plus the table cache and connections); raise it (ulimit -n) or give --idle-force", got, need, idleShards+1)}
					r.Error = r.Err.Error()
					failed++
					fmt.Fprintf(os.Stderr, "placement/idle %d shards: ERROR: %v\n", r.Shards, r.Err)
					if asJSON {
						_ = cluster.WriteIdleJSONLine(out, r)
					} else {
						fmt.Fprintf(out, "shale-bench placement: idle: %d user shards: ERROR: %v\n", idleShards, r.Err)
					}
					skipIdle = true
				}
			}
			if !skipIdle {
				if !asJSON {
					fmt.Fprintf(out, "shale-bench placement: idle: 3 nodes; %d user shards; settle %s; window %s; server args %q (the same as shale-bench idle --shards %d)\n",
						idleShards, idleSettle, idleWindow, idleServerArgs, idleShards)
				}
				failed += reportIdle(out, asJSON, "placement/idle", func(emit func(cluster.IdleResult)) []cluster.IdleResult {
					return cluster.IdleWithGuard(ctx, cluster.IdleConfig{
						Shards:  []int{idleShards},
						Members: 3,
						Settle:  idleSettle,
						Window:  idleWindow,
						Dir:     dir,
						Keep:    keep,
						Log:     os.Stderr,
					}, minMem, emit)
				})
				if ctx.Err() != nil {
					return errors.New("interrupted")
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d measurement(s) failed", failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "small run: 128 MiB of data, 256 MiB disk test, 1,000 idle shards (settle 10s, window 20s) unless given")
	f.Int64Var(&dataBytes, "data-bytes", fullPlacementBytes, "bytes of values loaded before the nodes join")
	f.IntVar(&shards, "shards", 16, "user shards of the loaded cluster (equal key ranges)")
	f.IntVar(&valueSize, "value-size", 16<<10, "value size in bytes")
	f.IntVar(&writers, "writers", 32, "concurrent writers of the load")
	f.DurationVar(&timeout, "timeout", 20*time.Minute, "longest wait for a balanced placement after the join")
	f.DurationVar(&poll, "poll", 500*time.Millisecond, "interval between placement checks")
	f.Int64Var(&diskBytes, "disk-bytes", fullDiskTestBytes, "size of the sequential-write disk test (0: skip it)")
	f.IntVar(&idleShards, "idle-shards", fullIdleShards, "user shards of the idle measurement")
	f.DurationVar(&idleSettle, "idle-settle", 20*time.Second, "idle time after every shard has a leader, before measuring")
	f.DurationVar(&idleWindow, "idle-window", 30*time.Second, "length of the idle CPU measurement")
	f.StringVar(&idleServerArgs, "idle-server-args", "", "extra shale-server flags of the idle measurement, space-separated (--server-args is for the rebalance only)")
	f.Int64Var(&minMem, "min-available-memory", 1<<30, "stop the idle measurement's servers when the machine's available memory falls below this many bytes")
	f.BoolVar(&skipIdle, "skip-idle", false, "skip the idle measurement")
	f.BoolVar(&idleForce, "idle-force", false, "run the idle measurement even when the open-file limit looks too low for --idle-shards")
	f.BoolVar(&skipRebalance, "skip-rebalance", false, "skip the rebalance measurement")
	f.BoolVar(&skipSnapshot, "skip-snapshot", false, "skip the single-snapshot measurement")
	f.Int64Var(&snapshotBytes, "snapshot-bytes", fullSnapshotBytes, "bytes of values loaded into the one shard of the single-snapshot measurement")
	f.StringVar(&snapshotProfile, "snapshot-profile", "", "directory for CPU profiles and execution traces of the snapshot's sender and receiver (empty: none)")
	f.IntVar(&snapshotProfileSeconds, "snapshot-profile-seconds", 10, "length of the snapshot's CPU profiles")
	f.Uint64Var(&seed, "seed", 1, "random seed of the values")
	f.StringVar(&dir, "dir", "./data/bench-placement", "parent directory of the cluster directories")
	f.BoolVar(&keep, "keep", false, "keep the cluster directories (data and logs); always kept when a measurement fails")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per measurement instead of the report")
	f.StringVar(&shaleServer, "shale-server", "", "shale-server binary (default: go build it once, else bin/shale-server)")
	f.StringVar(&serverArgs, "server-args", "", "extra shale-server flags of every rebalance node, space-separated (e.g. \"--snapshot-rate-bytes 134217728\")")
	f.IntVar(&fgRate, "foreground-rate", 200, "foreground puts a second during the rebalance (and --foreground-before before it); 0: none")
	f.IntVar(&fgValueSize, "foreground-value-size", 256, "value size of the foreground puts")
	f.DurationVar(&fgBefore, "foreground-before", 10*time.Second, "how long the foreground load runs alone before the join (its latency then is the baseline)")
	f.StringVar(&fgTrace, "foreground-trace", "", "file for every foreground put: its due time (ms from the join), latency (ms) and whether it failed")
	f.StringVar(&joinArgs, "join-args", "", "extra shale-server flags of the joining nodes only")
	return cmd
}

// emitResult prints one measurement's result, as JSON or as a report, and
// its error (if any) on stderr under name; it returns 1 for a failed
// measurement, 0 otherwise.
func emitResult(name string, err error, asJSON bool, writeJSON, writeReport func()) int {
	if asJSON {
		writeJSON()
	} else {
		writeReport()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: ERROR: %v\n", name, err)
		return 1
	}
	return 0
}
