// Command shale-bench benchmarks Shale. Its storage subcommand is a
// db_bench-style benchmark of Shale's storage engine against Pebble and
// goleveldb, cluster compares a local 3-node Shale cluster with etcd, idle
// measures the CPU cost of idle shards, and placement times the rebalancing
// after two nodes join a loaded cluster (and runs idle with 10,000 shards);
// see docs/BENCHMARKS.md.
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/bench/storagebench"
)

// Sizes of the full (default) and --quick runs.
const (
	fullNum  = 2_000_000
	quickNum = 500_000
)

func main() {
	root := &cobra.Command{
		Use:           "shale-bench",
		Short:         "Benchmarks for Shale",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(storageCmd(), clusterCmd(), idleCmd(), placementCmd(), watchCmd(), backupCmd(), etcdMemberCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "shale-bench:", err)
		os.Exit(1)
	}
}

func storageCmd() *cobra.Command {
	var (
		engines, workloads, dir, cpuprofile string
		quick, keep, asJSON                 bool
		num, reads, valueSize, keySize      int
		seed                                uint64
		settle, hang                        time.Duration
		pebbleCache                         int64
	)
	cmd := &cobra.Command{
		Use:   "storage",
		Short: "db_bench-style storage engine benchmark: Shale vs Pebble vs goleveldb",
		Long: `Runs db_bench-style workloads against each engine in this process, engines
interleaved per workload, each (engine, workload) in a fresh directory under
--dir. All engines use 64 MiB memtables, a 64 MiB block cache, snappy, 10
bits/key bloom filters, and the WAL without per-write sync (fillbatch-sync
syncs every batch).

Workloads: ` + strings.Join(storagebench.WorkloadNames(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			engs, err := storagebench.ParseEngines(engines)
			if err != nil {
				return err
			}
			wls, err := storagebench.ParseWorkloads(workloads)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("num") {
				num = fullNum
				if quick {
					num = quickNum
				}
			}
			if num <= 0 || reads < 0 || valueSize <= 0 || keySize < 8 {
				return fmt.Errorf("need --num > 0, --reads >= 0, --value-size > 0, --key-size >= 8")
			}
			if !cmd.Flags().Changed("settle-timeout") && quick {
				settle = 30 * time.Second
			}
			settings := storagebench.DefaultSettings()
			settings.PebbleCacheBytes = pebbleCache
			cfg := storagebench.Config{
				Engines:       engs,
				Workloads:     wls,
				Dir:           dir,
				Keep:          keep,
				Num:           num,
				Reads:         reads,
				KeySize:       keySize,
				ValueSize:     valueSize,
				Seed:          seed,
				Settings:      settings,
				SettleTimeout: settle,
				HangTimeout:   hang,
				CPUProfile:    cpuprofile,
				Log:           os.Stderr,
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				r := reads
				if r == 0 {
					r = num
				}
				fmt.Fprintf(out, "shale-bench storage: engines %s; %d keys (%d-byte keys, %d-byte values, half compressible); %d reads/seeks; seed %d\n",
					strings.Join(engs, ","), num, keySize, valueSize, r, seed)
			}
			failed := 0
			results := storagebench.Run(cfg, func(r storagebench.Result) {
				if r.Err != nil {
					failed++
					fmt.Fprintf(os.Stderr, "%s/%s: ERROR: %v\n", r.Workload, r.Engine, r.Err)
				}
				if asJSON {
					_ = storagebench.WriteJSONLine(out, r)
				}
			})
			if !asJSON {
				base := engs[0]
				for _, e := range engs {
					if e == "shale" {
						base = e
					}
				}
				storagebench.WriteTable(out, results, base)
			}
			if failed > 0 {
				return fmt.Errorf("%d run(s) failed", failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&engines, "engines", strings.Join(storagebench.EngineNames(), ","), "comma-separated engines to compare")
	f.StringVar(&workloads, "workloads", strings.Join(storagebench.WorkloadNames(), ","), "comma-separated workloads")
	f.StringVar(&dir, "dir", "./data/bench", "parent directory of the per-run data directories")
	f.BoolVar(&keep, "keep", false, "keep each run's data directory")
	f.BoolVar(&quick, "quick", false, fmt.Sprintf("small run (%d keys unless --num) that finishes in a few minutes", quickNum))
	f.IntVar(&num, "num", fullNum, "number of keys")
	f.IntVar(&reads, "reads", 0, "lookups/seeks in the read workloads (0: --num)")
	f.IntVar(&valueSize, "value-size", 100, "value size in bytes")
	f.IntVar(&keySize, "key-size", 16, "key size in bytes (at least 8)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per (engine, workload) instead of the table")
	f.Uint64Var(&seed, "seed", 1, "random seed")
	f.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of each timed phase to PREFIX.<engine>.<workload>.pprof")
	f.DurationVar(&settle, "settle-timeout", 2*time.Minute, "longest wait for compactions to settle (30s with --quick)")
	f.DurationVar(&hang, "hang-timeout", 5*time.Minute, "report (goroutine dump) and exit when a run makes no progress this long; 0 disables")
	f.Int64Var(&pebbleCache, "pebble-cache-bytes", 0, "size of Pebble's cache, which also holds its memtable reservations (0: 64 MiB + 2 x 64 MiB memtables = 192 MiB, about 64 MiB for blocks)")
	return cmd
}
