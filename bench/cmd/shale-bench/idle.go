package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/bench/cluster"
)

func idleCmd() *cobra.Command {
	var (
		shards, dir, shaleServer, serverArgs string
		settle, window                       time.Duration
		keep, asJSON                         bool
	)
	cmd := &cobra.Command{
		Use:   "idle",
		Short: "CPU cost of idle shards on a local 3-node Shale cluster",
		Long: `For each count in --shards, starts a fresh 3-node Shale cluster (three
shale-server processes, default settings) whose --initial-splits make that
many user shards (split keys k0001, k0002, ...), waits until every shard has
a leader, leaves the cluster alone for --settle, then measures each process's
CPU time (user + system, from /proc/<pid>/stat) over --window and reports it as
a percentage of one core, per node and in total, with each node's resident
memory and how many of its replicas are quiesced. No client traffic is sent
during the settle period or the window. Linux only.

Shale quiesces idle Raft groups by default; --server-args=--disable-quiescence
measures idle groups that keep ticking and heartbeating instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			counts, err := parseClients(shards)
			if err != nil {
				return fmt.Errorf("--shards: %w", err)
			}
			if settle < 0 || window <= 0 {
				return errors.New("need --settle >= 0 and --window > 0")
			}
			cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, ExtraArgs: strings.Fields(serverArgs)})
			defer cluster.CleanupShaleServer()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			if !asJSON {
				fmt.Fprintf(out, "shale-bench idle: 3 nodes; user shards %s; settle %s; window %s; server args %q\n", shards, settle, window, serverArgs)
			}
			failed := reportIdle(out, asJSON, "idle", func(emit func(cluster.IdleResult)) []cluster.IdleResult {
				return cluster.RunIdle(ctx, cluster.IdleConfig{
					Shards:  counts,
					Members: 3,
					Settle:  settle,
					Window:  window,
					Dir:     dir,
					Keep:    keep,
					Log:     os.Stderr,
				}, emit)
			})
			if ctx.Err() != nil {
				return errors.New("interrupted")
			}
			if failed > 0 {
				return fmt.Errorf("%d case(s) failed", failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&shards, "shards", "1000,1", "comma-separated numbers of user shards, one cluster each (1: the baseline)")
	f.DurationVar(&settle, "settle", 20*time.Second, "idle time after every shard has a leader, before measuring")
	f.DurationVar(&window, "window", 30*time.Second, "length of the CPU measurement")
	f.StringVar(&dir, "dir", "./data/bench-idle", "parent directory of the per-case cluster directories")
	f.BoolVar(&keep, "keep", false, "keep each cluster's directory (data and logs); always kept when a case fails")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per case instead of the table")
	f.StringVar(&shaleServer, "shale-server", "", "shale-server binary (default: go build it once, else bin/shale-server)")
	f.StringVar(&serverArgs, "server-args", "", "extra shale-server flags, space-separated (e.g. \"--disable-quiescence\")")
	return cmd
}

// reportIdle runs idle measurements through run, reporting each result as
// it comes (errors on stderr, a JSON line with asJSON) and the table at the
// end (without asJSON); it returns how many failed.
func reportIdle(out io.Writer, asJSON bool, label string, run func(emit func(cluster.IdleResult)) []cluster.IdleResult) int {
	failed := 0
	results := run(func(r cluster.IdleResult) {
		if r.Err != nil {
			failed++
			fmt.Fprintf(os.Stderr, "%s/%d shards: ERROR: %v\n", label, r.Shards, r.Err)
		}
		if asJSON {
			_ = cluster.WriteIdleJSONLine(out, r)
		}
	})
	if !asJSON {
		cluster.WriteIdleTable(out, results)
	}
	return failed
}
