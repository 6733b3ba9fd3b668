// Command shale-server runs one Shale node.
//
// Every flag can also be set through the environment: --data-dir is
// SHALE_DATA_DIR, --initial-cluster is SHALE_INITIAL_CLUSTER, and so on (a
// flag given on the command line wins). See docs/shale-server.md.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shale-db/shale/placement"
	"github.com/shale-db/shale/security/tlsconfig"
	"github.com/shale-db/shale/server"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/storage/vfs"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "shale-server:", err)
		os.Exit(1)
	}
}

type flags struct {
	dataDir, listen, advertise, httpAddr      string
	initialCluster, clusterName, join, zone   string
	initialSplits                             string
	restoreFrom, restoreBackup, restoreAsOf   string
	nodeID                                    uint64
	replicationFactor                         int
	maxKey, maxValue, maxBatchOps, maxBatch   int
	requestTimeout, tickInterval              time.Duration
	shutdownDrain, maxClockOffset             time.Duration
	slowDiskThreshold                         time.Duration
	diskLatencyFile                           string
	watchProgressInterval                     time.Duration
	watchQueueBytes                           int
	historyWindow                             time.Duration
	historyWindowBytes                        int64
	electionTicks                             int
	leaseReads, noQuiesce, snapshotRateAlways bool
	snapshotRate, blockCache, recordCache     int64
	grpcWindow, grpcConnWindow                int32
	deadNodeTimeout, pinDuration              time.Duration
	mergeSize                                 int64
	mergeDelay                                time.Duration
	maxMovesPerNode, maxMoves                 int
	splitSize                                 int64
	shardMemTable, splitQPS                   int
	logLevel, logFormat, clockOffsetFile      string
	tls                                       tlsFlags
	tracing                                   tracingFlags
	authTokenTTL                              time.Duration
	passwordCost                              int
}

// tlsFlags are the transport security flags (docs/shale-server.md, "TLS").
type tlsFlags struct {
	certFile, keyFile, trustedCAFile             string
	peerCertFile, peerKeyFile, peerTrustedCAFile string
	peerAllowedCN                                []string
	clientCertAuth                               bool
	minVersion                                   string
	reloadInterval                               time.Duration
}

func newRootCmd() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "shale-server",
		Short: "Run a Shale node",
		Long: `shale-server runs one node of a Shale cluster: a replicated, range-sharded
key-value store. Start a new cluster by giving every founding node the same
--initial-cluster and its own --node-id (or an --advertise address listed in
it); add a node to a running cluster with
--join. A restarted node needs only --data-dir (and its addresses).

Every flag can also be set with an environment variable named SHALE_ and the
flag's name in upper case with dashes as underscores (SHALE_DATA_DIR, ...).`,
		Example: `  # A 3-node cluster on one machine:
  shale-server --node-id 1 --data-dir data/n1 --listen 127.0.0.1:7001 \
    --initial-cluster 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003
  # Join a fourth node:
  shale-server --data-dir data/n4 --listen 127.0.0.1:7004 --join 127.0.0.1:7001`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd.Flags()); err != nil {
				return err
			}
			return run(cmd.Context(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", "data/shale", "directory for the node's data (identity, Raft log, shard engines)")
	fl.Uint64Var(&f.nodeID, "node-id", 0, "this node's ID in --initial-cluster (a joining node gets one from the cluster)")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:7001", "gRPC listen address for clients and peers")
	fl.StringVar(&f.advertise, "advertise", "", "address other nodes and clients use to reach this node (default: --listen)")
	fl.StringVar(&f.httpAddr, "http", "", "listen address for /metrics, /debug/pprof and /healthz (empty: off)")
	fl.StringVar(&f.initialCluster, "initial-cluster", "", "founding nodes of a new cluster: ID=HOST:PORT,... (same on every founding node)")
	fl.StringVar(&f.clusterName, "cluster-name", "shale", "name that, with --initial-cluster, identifies a new cluster")
	fl.StringVar(&f.join, "join", "", "address of any node of a running cluster to join")
	fl.StringVar(&f.zone, "zone", "", "failure-domain label of this node (rack, zone)")
	fl.StringVar(&f.initialSplits, "initial-splits", "", "split keys for a new cluster's initial shards, comma-separated (hex:ABCD for binary keys); n keys make n+1 shards")
	fl.StringVar(&f.restoreFrom, "restore-from", "", "found the new cluster (--initial-cluster) from a backup in this location, which every founding node reads: a directory, or s3://BUCKET/PREFIX[?endpoint=URL] with credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or use shalectl restore to prepare the data directory instead; see shalectl backup)")
	fl.StringVar(&f.restoreBackup, "restore-backup", "", "ID of the backup in --restore-from to found the new cluster from")
	fl.StringVar(&f.restoreAsOf, "restore-as-of", "", "with --restore-from: restore the data as of this time (RFC 3339, e.g. 2026-11-22T14:05:00Z), replaying the backup's log up to it (default: everything the backup holds)")
	fl.IntVar(&f.replicationFactor, "replication-factor", 3, "replicas per shard")
	fl.IntVar(&f.maxKey, "max-key-bytes", 4<<10, "largest key accepted")
	fl.IntVar(&f.maxValue, "max-value-bytes", 1<<20, "largest value accepted")
	fl.IntVar(&f.maxBatchOps, "max-batch-ops", 10000, "most operations in one Batch, Txn or MultiGet")
	fl.IntVar(&f.maxBatch, "max-batch-bytes", 8<<20, "largest Batch or Txn request, in bytes")
	fl.DurationVar(&f.requestTimeout, "request-timeout", 10*time.Second, "deadline of requests that carry none")
	fl.DurationVar(&f.tickInterval, "tick-interval", 100*time.Millisecond, "Raft tick")
	fl.IntVar(&f.electionTicks, "election-ticks", 10, "Raft election timeout, in ticks")
	fl.BoolVar(&f.leaseReads, "lease-reads", true, "serve linearizable reads from the leader's lease, confirmed by a ReadIndex round at most every election timeout less two ticks, instead of a round per batch of reads (relies on the nodes' monotonic clocks running at nearly the same rate; --lease-reads=false for a round each)")
	fl.BoolVar(&f.noQuiesce, "disable-quiescence", false, "keep idle Raft groups ticking and heartbeating instead of letting them go quiet")
	fl.Int64Var(&f.snapshotRate, "snapshot-rate-bytes", server.DefaultSnapshotRateBytes, "bandwidth limit of the node's outgoing snapshots and backups together, bytes per second, while it serves client requests or replicated writes (negative: no limit)")
	fl.BoolVar(&f.snapshotRateAlways, "snapshot-rate-always", false, "apply --snapshot-rate-bytes on an idle node too (by default a node that served no client request and few replicated writes in the last second sends unpaced)")
	fl.Int64Var(&f.blockCache, "block-cache-bytes", 256<<20, "block cache shared by the node's engines")
	fl.Int64Var(&f.recordCache, "record-cache-bytes", 64<<20, "record cache shared by the node's shards: recently written records, so that the next write to the key reads no engine (-1: none)")
	fl.IntVar(&f.splitQPS, "split-qps", 2500, "requests per second above which (for 5 s) a shard splits at its median requested key (negative: no load-based splits)")
	fl.IntVar(&f.shardMemTable, "shard-memtable-bytes", 16<<20, "memtable size of each shard's storage engine")
	fl.Int64Var(&f.splitSize, "split-size-bytes", 128<<20, "size (SST bytes of its own range) above which a shard splits in two (negative: no automatic splits)")
	fl.Int64Var(&f.mergeSize, "merge-size-bytes", 0, "combined size under which two adjacent shards split automatically merge again (0: a quarter of --split-size-bytes; negative: no automatic merges)")
	fl.DurationVar(&f.mergeDelay, "merge-delay", 5*time.Minute, "how long after a split an automatic merge of its shards waits")
	fl.Int32Var(&f.grpcWindow, "grpc-window-bytes", 2<<20, "HTTP/2 flow-control window per gRPC stream, for clients and peers (at least 65535)")
	fl.Int32Var(&f.grpcConnWindow, "grpc-conn-window-bytes", 16<<20, "HTTP/2 flow-control window per gRPC connection, for clients and peers (at least 65535)")
	fl.DurationVar(&f.deadNodeTimeout, "dead-node-timeout", 5*time.Minute, "how long a node may miss heartbeats before its replicas are replaced on other nodes (and how long shard leaders keep the Raft log its replicas need)")
	fl.IntVar(&f.maxMovesPerNode, "placement-max-moves-per-node", 2, "replica moves (snapshots in flight) a node takes part in at once")
	fl.IntVar(&f.maxMoves, "placement-max-moves", 8, "replica moves running at once in the cluster")
	fl.DurationVar(&f.pinDuration, "placement-pin-duration", time.Hour, "how long a manual replica move or leader transfer keeps balancing away from its shard")
	fl.DurationVar(&f.shutdownDrain, "shutdown-drain-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long to hand the node's shard leaderships to other nodes before stopping (negative: stop at once; a second signal stops at once)")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fl.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fl.DurationVar(&f.watchProgressInterval, "watch-progress-interval", time.Second, "how long a watch stream that asked for progress notifications stays idle before it gets one")
	fl.IntVar(&f.watchQueueBytes, "watch-queue-bytes", 8<<20, "bytes of changes queued for one watch stream before it is ended as too slow (the client resumes from the revision in the error)")
	fl.DurationVar(&f.historyWindow, "history-window", shard.DefaultHistoryWindow, "how long each shard engine keeps the values writes replaced or deleted: watches with prev_kv start or resume within it, and deleted, overwritten and expired data's space comes back after it (negative: no time bound)")
	fl.Int64Var(&f.historyWindowBytes, "history-window-bytes", shard.DefaultHistoryWindowBytes, "bound of the same history in bytes of each shard engine's WAL, the tighter of the two winning (negative: no bytes bound)")
	fl.DurationVar(&f.maxClockOffset, "max-clock-offset", 500*time.Millisecond, "how far ahead of this node's clock a peer's hybrid-logical-clock reading may be and still advance it; farther readings are refused and logged")
	fl.StringVar(&f.tls.certFile, "cert-file", "", "TLS: certificate (PEM) the node presents to clients and on the HTTP port; TLS is on when any TLS flag is given, and then --cert-file, --key-file and the three --peer-* files are required")
	fl.StringVar(&f.tls.keyFile, "key-file", "", "TLS: private key (PEM) of --cert-file")
	fl.StringVar(&f.tls.trustedCAFile, "trusted-ca-file", "", "TLS: CA bundle (PEM) client certificates are verified against (without it clients cannot authenticate with certificates)")
	fl.BoolVar(&f.tls.clientCertAuth, "client-cert-auth", false, "TLS: require every client to present a certificate signed by --trusted-ca-file (also for /metrics and /debug/pprof; /healthz stays open)")
	fl.StringVar(&f.tls.peerCertFile, "peer-cert-file", "", "TLS: certificate (PEM) the node presents to other nodes, as server and as client (it may be the same file as --cert-file)")
	fl.StringVar(&f.tls.peerKeyFile, "peer-key-file", "", "TLS: private key (PEM) of --peer-cert-file")
	fl.StringVar(&f.tls.peerTrustedCAFile, "peer-trusted-ca-file", "", "TLS: CA bundle (PEM) other nodes' certificates must be signed by")
	fl.StringSliceVar(&f.tls.peerAllowedCN, "peer-allowed-cn", nil, "TLS: accept only peers whose certificate's common name or a DNS name matches one of these patterns (comma-separated; * and ? wildcards, e.g. 'node-*.shale.svc'); default: any certificate of --peer-trusted-ca-file")
	fl.StringVar(&f.tls.minVersion, "tls-min-version", "1.3", "TLS: oldest TLS version accepted, 1.2 or 1.3")
	fl.DurationVar(&f.tls.reloadInterval, "tls-reload-interval", 5*time.Second, "TLS: how often to look for changed certificate and CA files (SIGHUP reloads them at once); new connections use new files, open ones continue")
	fl.IntVar(&f.passwordCost, "auth-password-cost", 10, "bcrypt cost of the password hashes this node makes (4 to 31; each step doubles the work of a hash and of a login)")
	fl.DurationVar(&f.authTokenTTL, "auth-token-ttl", 10*time.Minute, "how long a token from a login (Auth.Authenticate) is accepted; clients log in again before it ends")
	fl.StringVar(&f.diskLatencyFile, "testing-disk-latency-file", "", "TESTING ONLY: make every write and sync of this node's files take a random time in the range in this file (e.g. 100ms-2s; empty or 0 for none), re-read while running; for fault-injection tests")
	fl.DurationVar(&f.slowDiskThreshold, "slow-disk-threshold", 500*time.Millisecond, "a Raft-log sync that takes this long or longer is slow; while most recent syncs are slow (or one has run for twice this), the node hands its shard leaderships to other nodes; negative: never")
	fl.StringVar(&f.tracing.endpoint, "tracing-endpoint", "", "OpenTelemetry tracing: the OTLP/gRPC collector to send spans to (host:port, or an http:// or https:// URL); empty: tracing off")
	fl.Float64Var(&f.tracing.sampleRatio, "tracing-sample-ratio", defaultSampleRatio, "OpenTelemetry tracing: the share of requests traced, 0 to 1, among those whose caller sent no trace context (a caller's sampling decision is followed)")
	fl.BoolVar(&f.tracing.insecure, "tracing-insecure", true, "OpenTelemetry tracing: plaintext to a host:port --tracing-endpoint (a collector on the node's machine or network); false: TLS, with the system's trusted CAs")
	fl.StringVar(&f.clockOffsetFile, "testing-clock-offset-file", "", "TESTING ONLY: shift this node's wall clock by the duration in this file (e.g. 90s, -2m), re-read while running; for fault-injection tests")
	return cmd
}

// bindEnv sets every flag not given on the command line from SHALE_<NAME>.
func bindEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Changed || err != nil {
			return
		}
		name := "SHALE_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(fl.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

func parseSplits(s string) ([][]byte, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out [][]byte
	for _, p := range strings.Split(s, ",") {
		if rest, ok := strings.CutPrefix(p, "hex:"); ok {
			b, err := hex.DecodeString(rest)
			if err != nil {
				return nil, fmt.Errorf("initial split %q: %w", p, err)
			}
			out = append(out, b)
			continue
		}
		out = append(out, []byte(p))
	}
	return out, nil
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func run(ctx context.Context, f flags) error {
	log, err := newLogger(f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	initial, err := placement.ParseInitialCluster(f.initialCluster)
	if err != nil {
		return err
	}
	splits, err := parseSplits(f.initialSplits)
	if err != nil {
		return err
	}
	var asOf time.Time
	if f.restoreAsOf != "" {
		if asOf, err = time.Parse(time.RFC3339Nano, f.restoreAsOf); err != nil {
			return fmt.Errorf("--restore-as-of: want an RFC 3339 time such as 2026-11-22T14:05:00Z: %w", err)
		}
	}
	minTLS, err := tlsconfig.ParseMinVersion(f.tls.minVersion)
	if err != nil {
		return fmt.Errorf("--tls-min-version: %w", err)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	wallClock := time.Now
	if f.clockOffsetFile != "" {
		clockCtx, stopClock := context.WithCancel(context.Background())
		defer stopClock()
		oc, err := newOffsetClock(clockCtx, f.clockOffsetFile, log)
		if err != nil {
			return fmt.Errorf("--testing-clock-offset-file: %w", err)
		}
		log.Warn("TESTING: the wall clock follows an offset file", "file", f.clockOffsetFile)
		wallClock = oc.Now
	}
	var diskFS vfs.FS
	if f.diskLatencyFile != "" {
		diskCtx, stopDisk := context.WithCancel(context.Background())
		defer stopDisk()
		if diskFS, err = newDiskLatencyFS(diskCtx, vfs.Default, f.diskLatencyFile, log); err != nil {
			return fmt.Errorf("--testing-disk-latency-file: %w", err)
		}
		log.Warn("TESTING: disk writes and syncs follow a latency file", "file", f.diskLatencyFile)
	}
	instance := f.advertise
	if instance == "" {
		instance = f.listen
	}
	tracerProvider, stopTracing, err := f.tracing.tracerProvider(ctx, instance, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	node, err := server.Start(ctx, server.Config{
		DataDir:                  f.dataDir,
		NodeID:                   f.nodeID,
		ListenAddr:               f.listen,
		AdvertiseAddr:            f.advertise,
		HTTPAddr:                 f.httpAddr,
		InitialCluster:           initial,
		ClusterName:              f.clusterName,
		Join:                     f.join,
		RestoreFrom:              f.restoreFrom,
		RestoreBackup:            f.restoreBackup,
		RestoreAsOf:              asOf,
		Zone:                     f.zone,
		InitialSplits:            splits,
		ReplicationFactor:        f.replicationFactor,
		MaxKeyBytes:              f.maxKey,
		MaxValueBytes:            f.maxValue,
		MaxBatchOps:              f.maxBatchOps,
		MaxBatchBytes:            f.maxBatch,
		RequestTimeout:           f.requestTimeout,
		TickInterval:             f.tickInterval,
		ElectionTicks:            f.electionTicks,
		LeaseReads:               f.leaseReads,
		DisableQuiescence:        f.noQuiesce,
		SnapshotRateBytes:        f.snapshotRate,
		SnapshotRateAlways:       f.snapshotRateAlways,
		BlockCacheBytes:          f.blockCache,
		RecordCacheBytes:         f.recordCache,
		SplitSizeBytes:           f.splitSize,
		ShardMemTableBytes:       f.shardMemTable,
		SplitQPS:                 f.splitQPS,
		GRPCWindowBytes:          f.grpcWindow,
		GRPCConnWindowBytes:      f.grpcConnWindow,
		MergeSizeBytes:           f.mergeSize,
		MergeDelay:               f.mergeDelay,
		DeadNodeTimeout:          f.deadNodeTimeout,
		PlacementMaxMovesPerNode: f.maxMovesPerNode,
		PlacementMaxMoves:        f.maxMoves,
		PlacementPinDuration:     f.pinDuration,
		Logger:                   log,
		WallClock:                wallClock,
		FS:                       diskFS,
		SlowDiskThreshold:        f.slowDiskThreshold,
		MaxClockOffset:           f.maxClockOffset,
		WatchProgressInterval:    f.watchProgressInterval,
		WatchQueueBytes:          f.watchQueueBytes,
		HistoryWindow:            f.historyWindow,
		HistoryWindowBytes:       f.historyWindowBytes,
		AuthTokenTTL:             f.authTokenTTL,
		PasswordCost:             f.passwordCost,
		TracerProvider:           tracerProvider,
		TLS: tlsconfig.ServerConfig{
			CertFile:          f.tls.certFile,
			KeyFile:           f.tls.keyFile,
			TrustedCAFile:     f.tls.trustedCAFile,
			ClientCertAuth:    f.tls.clientCertAuth,
			PeerCertFile:      f.tls.peerCertFile,
			PeerKeyFile:       f.tls.peerKeyFile,
			PeerTrustedCAFile: f.tls.peerTrustedCAFile,
			PeerAllowedNames:  f.tls.peerAllowedCN,
			MinVersion:        minTLS,
			ReloadInterval:    f.tls.reloadInterval,
		},
	})
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if err := node.ReloadTLS(); err != nil {
				log.Warn("SIGHUP: TLS files not reloaded", "err", err)
			} else if node.TLSEnabled() {
				log.Info("SIGHUP: TLS files re-read")
			}
		}
	}()
	select {
	case <-ctx.Done():
	case <-node.Failed():
		// Fail-stop: a node that cannot write acknowledges nothing more;
		// its supervisor restarts it, and it recovers what it made durable.
		stop()
		node.Stop()
		return fmt.Errorf("node %d stopped: storage failed: %w (restart it once the cause, such as a full disk, is fixed)", node.ID(), node.Err())
	}
	stop() // a second signal ends the process at once
	log.Info("shutting down", "node", node.ID())
	drainBeforeStop(node, f.shutdownDrain)
	node.Stop()
	log.Info("stopped", "node", node.ID())
	return nil
}

// drainBeforeStop hands the node's leaderships to other nodes, for at most
// timeout (0: 10s; negative: not at all), so that stopping it interrupts no
// shard for an election timeout.
func drainBeforeStop(node *server.Node, timeout time.Duration) {
	if timeout < 0 {
		return
	}
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	node.DrainLeaders(ctx)
}
