package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/bench/cluster"
)

func clusterCmd() *cobra.Command {
	var (
		engines, workloads, clients, dir  string
		shaleServer, shaleSplits          string
		shaleArgs, cpuProfile, profileDir string
		quick, keep, asJSON               bool
		useTLS, useAuth                   bool
		keys, valueSize, conns, rounds    int
		duration, hang, slowOps           time.Duration
		seed                              uint64
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Replicated KV benchmark on a local 3-node cluster: Shale vs etcd",
		Long: `Runs put, get and YCSB-style workloads against a local 3-member cluster of
each engine, at several numbers of concurrent clients, and reports ops/s and
latency percentiles. Each (workload, engine) gets a fresh cluster under --dir;
within a workload the engines run back to back. The etcd peer is three
shale-bench etcd-member processes embedding etcd with its default settings
(fsync on). The Shale peer is three shale-server processes with their default
settings (Raft log synced) and --initial-splits --shale-splits; shale-server
is built once per run (go build in the bench module) unless --shale-server
names a binary.

--tls (and --auth) run the Shale peer both ways in the same invocation:
plaintext ("shale") and secured ("shale+tls", or "shale+tls+auth" with
--auth), side by side on fresh clusters, and add a table of the secured
runs' ratios to the plaintext ones (ops/s, p50, p99, p99.9, servers' CPU per
operation). Secured clusters get a CA, a node certificate and a client
certificate made in their directory; with --auth the bench adds the users
root and bench (readwrite on every key), enables auth, and its clients log
in as bench. Naming a variant in --engines (e.g. --engines shale+tls+auth)
runs it alone. Use --rounds 2 or more to alternate the order.

Keys are 16 bytes, values --value-size (256) bytes. Workloads:
` + cluster.WorkloadHelp(),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			engs, err := cluster.ParseEngines(engines)
			if err != nil {
				return err
			}
			if engs, err = addSecuredShale(engs, useTLS, useAuth); err != nil {
				return err
			}
			wls, err := cluster.ParseWorkloads(workloads)
			if err != nil {
				return err
			}
			levels, err := parseClients(clients)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("duration") && quick {
				duration = cluster.QuickDuration
			}
			if !cmd.Flags().Changed("keys") && quick {
				keys = cluster.QuickKeys
			}
			if keys <= 0 || valueSize <= 0 || duration <= 0 || conns < 0 || rounds < 1 {
				return fmt.Errorf("need --keys > 0, --value-size > 0, --duration > 0, --conns >= 0, --rounds >= 1")
			}
			cluster.SetShaleOptions(cluster.ShaleOptions{
				ServerPath: shaleServer,
				Splits:     shaleSplits,
				ExtraArgs:  strings.Fields(shaleArgs),
			})
			defer cluster.CleanupShaleServer()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			cfg := cluster.Config{
				Engines:     engs,
				Workloads:   wls,
				Clients:     levels,
				Conns:       conns,
				Duration:    duration,
				Keys:        keys,
				ValueSize:   valueSize,
				Members:     3,
				Dir:         dir,
				Keep:        keep,
				Seed:        seed,
				HangTimeout: hang,
				SlowOps:     slowOps,
				Rounds:      rounds,
				ProfileDir:  profileDir,
				Log:         os.Stderr,
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				c := "one connection per client"
				if conns > 0 {
					c = fmt.Sprintf("at most %d connections", conns)
				}
				r := ""
				if rounds > 1 {
					r = fmt.Sprintf("; median of %d rounds in alternating engine order", rounds)
				}
				fmt.Fprintf(out, "shale-bench cluster: engines %s; 3 members each; clients %s (%s); %s per cell; %d keys (16-byte keys, %d-byte values); seed %d%s\n",
					strings.Join(engs, ","), clients, c, duration, keys, valueSize, seed, r)
			}
			failed := 0
			results := cluster.Run(ctx, cfg, func(r cluster.Result) {
				if r.Err != nil {
					failed++
					fmt.Fprintf(os.Stderr, "%s/%s/%d clients: ERROR: %v\n", r.Workload, r.Engine, r.Clients, r.Err)
				}
				if asJSON {
					_ = cluster.WriteJSONLine(out, r)
				}
			})
			if !asJSON {
				cluster.WriteTable(out, results, cluster.BaseEngine(engs))
			}
			if ctx.Err() != nil {
				return errors.New("interrupted")
			}
			if failed > 0 {
				return fmt.Errorf("%d cell(s) failed", failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&engines, "engines", strings.Join(cluster.EngineNames(), ","), "comma-separated engines to compare (shale, etcd; variants: "+strings.Join(cluster.VariantNames(), ", ")+")")
	f.StringVar(&workloads, "workloads", strings.Join(cluster.WorkloadNames(), ","), "comma-separated workloads")
	f.StringVar(&clients, "clients", "1,16,256", "comma-separated numbers of concurrent clients")
	f.IntVar(&conns, "conns", 0, "client connections per cell, shared round robin by the clients (0: one per client)")
	f.DurationVar(&duration, "duration", cluster.DefaultDuration, fmt.Sprintf("timed length of every (workload, engine, clients) cell (%s with --quick)", cluster.QuickDuration))
	f.BoolVar(&quick, "quick", false, fmt.Sprintf("short run: %s per cell and %d keys unless --duration/--keys", cluster.QuickDuration, cluster.QuickKeys))
	f.IntVar(&keys, "keys", cluster.DefaultKeys, "keyspace: records preloaded before the read workloads, and the keys put draws from")
	f.IntVar(&valueSize, "value-size", cluster.DefaultValueSize, "value size in bytes")
	f.StringVar(&dir, "dir", "./data/bench-cluster", "parent directory of the per-(workload, engine) cluster directories")
	f.BoolVar(&keep, "keep", false, "keep each cluster's directory (data and logs); always kept when a run fails")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per (engine, workload, clients) instead of the table")
	f.Uint64Var(&seed, "seed", 1, "random seed")
	f.IntVar(&rounds, "rounds", 1, "run every (workload, engine) this many times on fresh clusters, alternating the engines' order, and report each cell's median round (tames a machine whose speed drifts)")
	f.DurationVar(&slowOps, "slow-ops", 0, "log each cell's operations that took at least this long (count and the 20 slowest with their start times, to match the servers' logs); 0: off")
	f.DurationVar(&hang, "hang-timeout", time.Minute, "fail a cell still running this long after its --duration")
	f.StringVar(&shaleServer, "shale-server", "", "shale-server binary for the Shale peer (default: go build it once per run, else bin/shale-server)")
	f.StringVar(&shaleSplits, "shale-splits", cluster.DefaultShaleSplits, "shale-server --initial-splits of the Shale peer: the default cuts the 16-hex-digit keys into 6 equal shards, 2 leaders per node; \"none\" starts with one user shard, which load splits cut")
	f.BoolVar(&useTLS, "tls", false, "also run the Shale peer with TLS (\"shale+tls\"), next to plaintext \"shale\", and report the ratios")
	f.BoolVar(&useAuth, "auth", false, "with --tls: the secured Shale peer also has auth enabled, its clients logged in as user bench (\"shale+tls+auth\")")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the clients of every cell, and the benchmark's own work) to this file")
	f.StringVar(&profileDir, "profile-dir", "", "write CPU profiles of every cell's timed phase to this directory: <workload>.<engine>.<clients>.client.pprof (the clients: this process) and .node<i>.pprof (each Shale server, the phase less its last second)")
	f.StringVar(&shaleArgs, "shale-server-args", "", "extra shale-server flags, space-separated (e.g. \"--lease-reads=false\"); the default is shale-server's defaults")
	return cmd
}

// addSecuredShale puts the secured Shale variant that --tls and --auth ask
// for right after "shale" in engs (so that the two alternate from round to
// round).
func addSecuredShale(engs []string, useTLS, useAuth bool) ([]string, error) {
	if useAuth && !useTLS {
		return nil, errors.New("--auth needs --tls: Shale enables authentication only on a TLS cluster (add --tls)")
	}
	if !useTLS {
		return engs, nil
	}
	secured := cluster.ShaleEngineName(cluster.ShaleSecurity{TLS: true, Auth: useAuth})
	i := slices.Index(engs, "shale")
	if i < 0 {
		return nil, fmt.Errorf("--tls compares the secured Shale peer with plaintext \"shale\": add shale to --engines (or name %s there to run it alone)", secured)
	}
	if slices.Contains(engs, secured) {
		return engs, nil
	}
	return slices.Insert(slices.Clone(engs), i+1, secured), nil
}

// parseClients parses a comma-separated list of positive client counts.
func parseClients(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--clients: %q is not a positive number", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("--clients: no levels given")
	}
	return out, nil
}

// etcdMemberCmd is the hidden subcommand that runs one etcd member of the
// cluster benchmark's etcd peer, until SIGTERM or SIGINT.
func etcdMemberCmd() *cobra.Command {
	var m cluster.MemberConfig
	cmd := &cobra.Command{
		Use:    cluster.EtcdMemberCommand,
		Short:  "Run one etcd member (started by shale-bench cluster)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if m.Name == "" || m.DataDir == "" || m.ListenPeer == "" || m.ListenClient == "" || m.InitialCluster == "" {
				return errors.New("need --name, --data-dir, --listen-peer, --listen-client and --initial-cluster")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return cluster.RunEtcdMember(ctx, m)
		},
	}
	f := cmd.Flags()
	f.StringVar(&m.Name, "name", "", "member name")
	f.StringVar(&m.DataDir, "data-dir", "", "etcd data directory")
	f.StringVar(&m.ListenPeer, "listen-peer", "", "peer URL (listened on and advertised), e.g. http://127.0.0.1:2380")
	f.StringVar(&m.ListenClient, "listen-client", "", "client URL (listened on and advertised), e.g. http://127.0.0.1:2379")
	f.StringVar(&m.InitialCluster, "initial-cluster", "", "name=peerURL,... of every member")
	f.StringVar(&m.Token, "initial-cluster-token", "shale-bench", "initial cluster token")
	f.StringVar(&m.LogFile, "log-file", "", "file for etcd's log (default: stderr)")
	return cmd
}
