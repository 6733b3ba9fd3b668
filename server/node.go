// Package server is one Shale node: it hosts shard replicas (Raft groups
// whose state machines are storage engines), serves the KV and Admin gRPC
// APIs, carries Raft traffic to and from its peers, and exposes metrics.
package server

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/placement"
	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/replication/grpctransport"
	"github.com/shale-db/shale/replication/hlc"
	"github.com/shale-db/shale/replication/snapshot"
	"github.com/shale-db/shale/security/tlsconfig"
	"github.com/shale-db/shale/server/auth"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

// SystemShardID is the shard holding cluster metadata (the node registry).
const SystemShardID = 1

// Node is a running Shale server.
type Node struct {
	cfg       Config
	log       *slog.Logger
	clusterID string
	// mergeMu serializes the merges this node drives (an Admin call, the
	// automatic merge, the finishing of an interrupted one). Two drivers of
	// one merge restart each other's copy (a MergeAbsorb begin deletes what
	// the other had staged); the attempt in every step keeps that safe
	// across nodes, and this lock keeps one node from doing it to itself.
	mergeMu sync.Mutex
	// mergeStepHook, when set (tests only, through export_test.go), is
	// called after each MergeAbsorb step this node proposes, with the
	// step's kind and outcome.
	mergeStepHook atomic.Pointer[func(step string, err error)]
	// clock is the node's hybrid logical clock, which dates the commands
	// it proposes and moves past its peers' readings.
	clock *hlc.Clock
	// tracer is Config.TracerProvider's (nil: the node traces nothing;
	// see tracing.go).
	tracer trace.Tracer

	shared *storage.Shared
	// records is the record cache of the node's shards (nil: none).
	records *shard.RecordCache
	// snapLimiter paces what the node sends of its checkpoints: Raft
	// snapshots and backups share it. It paces only while fg says the
	// node is busy, unless Config.SnapshotRateAlways.
	snapLimiter *snapshot.Limiter
	fg          *foreground
	logDB       *storage.DB
	store       *replication.Store
	transport   *grpctransport.Transport
	grpc        *grpc.Server
	health      *health.Server
	lis         net.Listener
	// tls is the node's transport security (nil: plaintext); refuser
	// answers plaintext clients of a TLS port that TLS is required.
	tls     *tlsconfig.Server
	refuser *grpc.Server
	// authStore is the node's view of the cluster's auth state (nil until
	// first loaded; see authstate.go), tokens the tokens verified under
	// it, watchAuth the open watches re-checked when it changes.
	authStore atomic.Pointer[auth.Store]
	tokens    tokenCache
	watchAuth authWatches
	authm     *authMetrics
	http      *http.Server
	httpLis   net.Listener
	reg       *prometheus.Registry
	// watchTooSlow counts the watchers cancelled as too slow.
	watchTooSlow prometheus.Counter
	// expiredKeys counts the keys this node's expiry sweep deleted.
	expiredKeys prometheus.Counter
	// strayRemoved counts the stray replicas replica GC removed; strays
	// holds the replicas the last check found stray (shard ID -> local
	// epoch + 1), which the next check removes if they still are.
	strayRemoved prometheus.Counter
	strays       map[uint64]uint64
	// slowDisk is 1 while the node hands its leaderships away because its
	// disk is slow; slowDiskEvents counts the times it started to.
	slowDisk       prometheus.Gauge
	slowDiskEvents prometheus.Counter
	// backupm counts the backup parts this node served.
	backupm *backupMetrics
	// streamCalls counts the calls served over KV.Calls streams.
	streamCalls *callCounters
	// kv is the node's KV service.
	kv *kvService

	mu sync.Mutex
	// remoteReg is the node registry as last read from a peer (nodes
	// without a system shard replica), at remoteRegAt.
	remoteReg   []*shalev1.NodeDescriptor
	remoteRegAt time.Time
	addrs       map[uint64]string
	lastSplit   map[uint64]time.Time // shard → when this node last split it (under mu)
	loads       sync.Map             // shard ID → *shardLoad
	reported    map[uint64]uint64    // shard → epoch last reported to the directory (under mu)
	// removedShards are shards this node merged away whose removal from
	// the directory is still to be reported (under mu).
	removedShards map[uint64]bool
	conns         map[string]*grpc.ClientConn
	place         *placementState
	writeBytes    atomic.Uint64 // bytes of write commands this node proposed
	// drainUntil (unix nanoseconds) ends the node's leadership drain
	// (DrainLeaders); drainKeeper is set while keepDrained runs.
	drainUntil  atomic.Int64
	drainKeeper atomic.Bool
	// slowDiskUntil (unix nanoseconds) ends the leadership drain that a
	// slow disk started (watchDisk).
	slowDiskUntil atomic.Int64
	// drainMu guards drainRefused: nodes that let a drain's leadership
	// transfer time out, and when.
	drainMu      sync.Mutex
	drainRefused map[uint64]time.Time

	// hubMu guards hubs, the change-feed hubs of the shards being watched.
	hubMu sync.Mutex
	hubs  map[uint64]*hubRef

	stopOnce sync.Once
	stop     chan struct{}
	wg       sync.WaitGroup
}

// nodeMeta is the node's identity, kept in DataDir/NODE.
type nodeMeta struct {
	NodeID    uint64            `json:"node_id"`
	ClusterID string            `json:"cluster_id"`
	Addrs     map[string]string `json:"addrs"`
}

// Start opens (or creates) the node's data, joins or bootstraps its
// cluster, and serves until Stop.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	started := time.Now()
	cfg.applyDefaults()
	if err := cfg.usePreparedRestore(); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("server: data dir: %w", err)
	}
	n := &Node{
		cfg:           cfg,
		log:           cfg.Logger,
		clock:         hlc.New(cfg.WallClock, cfg.MaxClockOffset),
		addrs:         map[uint64]string{},
		hubs:          map[uint64]*hubRef{},
		lastSplit:     map[uint64]time.Time{},
		reported:      map[uint64]uint64{},
		removedShards: map[uint64]bool{},
		conns:         map[string]*grpc.ClientConn{},
		stop:          make(chan struct{}),
		reg:           prometheus.NewRegistry(),
	}
	n.place = newPlacementState(cfg, n.reg)
	if cfg.TracerProvider != nil {
		n.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	n.watchTooSlow = prometheus.NewCounter(prometheus.CounterOpts{Name: "shale_watch_too_slow_total",
		Help: "Watchers this node cancelled as too slow: their queue passed --watch-queue-bytes. Each client's stream ends with ResourceExhausted after it reads what was queued, and the client resumes."})
	n.expiredKeys = prometheus.NewCounter(prometheus.CounterOpts{Name: "shale_expired_keys_total",
		Help: "Keys whose TTL passed that this node's expiry sweep deleted (as leader of their shard), each a DELETE at a new revision."})
	n.strayRemoved = prometheus.NewCounter(prometheus.CounterOpts{Name: "shale_stray_replicas_removed_total",
		Help: "Replicas this node removed, with their data, because their shard no longer has them (merged away, or moved off this node while it was down)."})
	n.slowDisk = prometheus.NewGauge(prometheus.GaugeOpts{Name: "shale_slow_disk",
		Help: "1 while this node's Raft-log syncs are slow (--slow-disk-threshold) and it hands its shard leaderships to other nodes, else 0."})
	n.slowDiskEvents = prometheus.NewCounter(prometheus.CounterOpts{Name: "shale_slow_disk_events_total",
		Help: "Times this node found its disk slow and started handing its shard leaderships away."})
	n.streamCalls = newCallCounters(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shale_kv_stream_calls_total",
		Help: "KV calls served over KV.Calls streams, by method and gRPC status code (the grpc_server_* metrics count each stream once)."},
		[]string{"method", "code"}))
	n.reg.MustRegister(n.watchTooSlow, n.expiredKeys, n.strayRemoved, n.slowDisk, n.slowDiskEvents, n.streamCalls.vec)
	n.authm = newAuthMetrics(n.reg)
	n.backupm = newBackupMetrics(n.reg)
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if cfg.TLS.Enabled() {
		if n.tls, err = tlsconfig.NewServer(cfg.TLS, cfg.Logger.With("component", "tls")); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	meta, found, err := readMeta(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	bootstrap := false
	switch {
	case found:
		if cfg.NodeID != 0 && cfg.NodeID != meta.NodeID {
			return nil, fmt.Errorf("server: data dir %s belongs to node %d, not %d", cfg.DataDir, meta.NodeID, cfg.NodeID)
		}
	case cfg.foundingID() != 0:
		id, cid := cfg.foundingID(), cfg.newClusterID()
		switch n.priorIncarnation(ctx, id, cid) {
		case priorStarted:
			return nil, fmt.Errorf("server: %s holds no node, but cluster %s says founding node %d already ran: "+
				"its data was lost (a wiped or replaced volume?), and founding again would serve stale or no data. "+
				"Remove the node (shalectl node remove %d); this node then joins as a new node (with --join)", cfg.DataDir, cid, id, id)
		case priorRemoved:
			if cfg.Join == "" {
				return nil, fmt.Errorf("server: founding node %d was removed from cluster %s; start with --join to join it as a new node", id, cid)
			}
			n.cfg.Logger.Info("founding node was removed from the cluster; joining as a new node", "founding_id", id)
			if meta, err = n.join(ctx); err != nil {
				return nil, err
			}
		default:
			meta = nodeMeta{NodeID: id, ClusterID: cid, Addrs: map[string]string{}}
			for id, a := range cfg.InitialCluster {
				meta.Addrs[strconv.FormatUint(id, 10)] = a
			}
			bootstrap = true
		}
	case cfg.Join != "":
		meta, err = n.join(ctx)
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("server: %s holds no node; start with --initial-cluster (new cluster) or --join (existing one)", cfg.DataDir)
	}
	n.cfg.NodeID = meta.NodeID
	n.clusterID = meta.ClusterID
	n.log = cfg.Logger.With("node", meta.NodeID)
	for k, a := range meta.Addrs {
		id, _ := strconv.ParseUint(k, 10, 64)
		n.addrs[id] = a
	}
	n.addrs[meta.NodeID] = cfg.AdvertiseAddr

	n.shared = storage.NewShared(&storage.SharedOptions{BlockCacheBytes: cfg.BlockCacheBytes})
	n.records = shard.NewRecordCache(cfg.RecordCacheBytes)
	n.logDB, err = storage.Open(filepath.Join(cfg.DataDir, "raftlog"), &storage.Options{Shared: n.shared, FS: cfg.FS, Logger: n.log.With("engine", "raftlog")})
	if err != nil {
		return nil, fmt.Errorf("server: open raft log engine: %w", err)
	}
	// Under the raft log's lock: no other process uses this directory.
	if err := n.clearSnapshotStaging(); err != nil {
		return nil, err
	}
	n.fg = &foreground{syncs: func(window time.Duration) int { return n.store.LogSyncs(window, time.Hour).Finished }, log: n.log}
	n.snapLimiter = snapshot.NewIdleAwareLimiter(cfg.SnapshotRateBytes, n.fg.Busy)
	if cfg.SnapshotRateAlways {
		n.snapLimiter = snapshot.NewLimiter(cfg.SnapshotRateBytes)
	}
	n.transport = grpctransport.New(grpctransport.Options{
		NodeID:                meta.NodeID,
		ClusterID:             meta.ClusterID,
		Resolve:               n.resolve,
		SnapshotLimiter:       n.snapLimiter,
		SnapshotStagingDir:    filepath.Join(cfg.DataDir, "snapshots", "in"),
		Logger:                n.log.With("component", "transport"),
		InitialWindowSize:     cfg.GRPCWindowBytes,
		InitialConnWindowSize: cfg.GRPCConnWindowBytes,
		DialOptions:           n.peerDialOptions(),
	})
	var tr replication.Transport = n.transport
	if cfg.LinkFilter != nil {
		tr = &filteredTransport{Transport: n.transport, self: meta.NodeID, allow: cfg.LinkFilter}
	}
	var smFeatures replication.Feature // what this node's shards apply
	if !cfg.DisableCompactCommands {
		smFeatures = replication.FeatureCompactCommands
	}
	n.store, err = replication.NewStore(replication.Config{
		NodeID:               meta.NodeID,
		ClusterID:            meta.ClusterID,
		LogDB:                n.logDB,
		Transport:            tr,
		TickInterval:         cfg.TickInterval,
		ElectionTicks:        cfg.ElectionTicks,
		LeaseReads:           cfg.LeaseReads,
		LogKeepForDownNodes:  cfg.DeadNodeTimeout,
		DisableQuiescence:    cfg.DisableQuiescence,
		StateMachineFeatures: smFeatures,
		SnapshotDir:          filepath.Join(cfg.DataDir, "snapshots", "out"),
		OpenReplica:          n.openEmptyShard,
		ReplicaRemoved:       n.onReplicaRemoved,
		Logger:               n.log.With("component", "replication"),
		Metrics:              replication.NewMetrics(n.reg),
		Clock:                n.clock,
		TracerProvider:       cfg.TracerProvider,
	})
	if err != nil {
		return nil, err
	}
	if err := n.openShards(); err != nil {
		return nil, err
	}
	var founded []*replication.Replica // the replicas to campaign at once
	if bootstrap {
		var restore *restorePlan
		if cfg.RestoreFrom != "" {
			if restore, err = n.planRestore(ctx); err != nil {
				return nil, err
			}
		}
		if founded, err = n.bootstrapShards(ctx, restore); err != nil {
			return nil, err
		}
	}
	if err := writeMeta(cfg.DataDir, n.metaSnapshot()); err != nil {
		return nil, err
	}
	if bootstrap && n.cfg.preparedRestore != nil {
		// The shards hold the data now; the staged copy is no longer
		// needed.
		if err := os.RemoveAll(filepath.Join(cfg.DataDir, backup.PreparedDir)); err != nil {
			n.log.Warn("could not remove the prepared restore", "err", err)
		}
	}

	srvMetrics := newGRPCMetrics()
	n.reg.MustRegister(srvMetrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), &storageCollector{n: n})
	// Every service of the node, the Raft transport's too, encodes with
	// the generated methods (proto/codec).
	srvOpts := append(append(grpctransport.ServerOptions(), n.serverTraceOptions()...),
		codec.ServerOption(),
		grpc.ChainUnaryInterceptor(srvMetrics.unaryInterceptor, n.targetUnaryInterceptor, n.authUnaryInterceptor),
		grpc.ChainStreamInterceptor(srvMetrics.streamInterceptor, n.targetStreamInterceptor, n.authStreamInterceptor),
		grpc.MaxRecvMsgSize(cfg.MaxBatchBytes+(1<<20)),
		grpc.InitialWindowSize(cfg.GRPCWindowBytes),
		grpc.InitialConnWindowSize(cfg.GRPCConnWindowBytes),
	)
	// Listen only now that the node can serve: a founding node's peers
	// ask it whether the cluster already ran (priorIncarnation), and a
	// connection the kernel accepted on a listener nobody serves yet (a
	// node restoring its shards from a backup, for seconds) holds their
	// question until its timeout, where a refused one is answered at once.
	n.lis, err = net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("server: listen on %s: %w", cfg.ListenAddr, err)
	}
	serveLis := n.lis
	if n.tls != nil {
		srvOpts = append(srvOpts, grpc.Creds(n.tls.ServerCredentials()))
		var plainLis net.Listener
		serveLis, plainLis = tlsconfig.SplitListener(n.lis, n.log.With("component", "tls"))
		n.health = health.NewServer()
		n.refuser = newPlaintextRefuser(n.health)
		n.wg.Add(2)
		go func() {
			defer n.wg.Done()
			_ = n.refuser.Serve(plainLis)
		}()
		go func() {
			defer n.wg.Done()
			n.tls.Watch(n.stopContext())
		}()
	}
	n.grpc = grpc.NewServer(srvOpts...)
	n.kv = &kvService{n: n, workers: newCallWorkers(callWorkerIdle, n.stop)}
	shalev1.RegisterKVServer(n.grpc, n.kv)
	shalev1.RegisterAdminServer(n.grpc, &adminService{n: n})
	shalev1.RegisterAuthServer(n.grpc, &authService{n: n})
	n.transport.Register(n.grpc, n.store)
	if n.health == nil {
		n.health = health.NewServer()
	}
	healthpb.RegisterHealthServer(n.grpc, n.health)
	reflection.Register(n.grpc)
	srvMetrics.initialize(n.grpc)

	n.store.Start()
	for _, r := range founded {
		n.store.CampaignFounding(r)
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.grpc.Serve(serveLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("grpc server stopped", "err", err)
		}
	}()
	if cfg.HTTPAddr != "" {
		if err := n.startHTTP(); err != nil {
			return nil, err
		}
	}
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	n.health.SetServingStatus("shale.v1.KV", healthpb.HealthCheckResponse_SERVING)
	n.wg.Add(6)
	go n.watchDisk()
	go n.refreshAuthLoop()
	go n.maintain()
	go n.placementLoop()
	go n.watchStorage()
	go n.expiryLoop()
	n.log.Info("node started", "took", time.Since(started), "cluster", n.clusterID, "listen", n.lis.Addr().String(), "advertise", cfg.AdvertiseAddr, "shards", len(n.store.Replicas()))
	return n, nil
}

// Failed is closed when the node's storage failed with an I/O error (a
// full disk, a failing device): it acknowledges nothing more, reports
// NOT_SERVING on gRPC health and an error on /healthz, and must be stopped
// and restarted once the cause is fixed; it then recovers what it made
// durable. Err says what failed.
func (n *Node) Failed() <-chan struct{} { return n.store.Failed() }

// Err returns the storage failure that closed Failed, or nil.
func (n *Node) Err() error { return n.store.Err() }

// watchStorage marks the node unhealthy when its storage fails.
func (n *Node) watchStorage() {
	defer n.wg.Done()
	select {
	case <-n.stop:
	case <-n.store.Failed():
		n.log.Error("storage failed: this node acknowledges nothing more; restart it once the cause is fixed", "err", n.store.Err())
		n.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		n.health.SetServingStatus("shale.v1.KV", healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// Addr is the address the gRPC server listens on.
func (n *Node) Addr() string { return n.lis.Addr().String() }

// Metrics gathers the node's metrics: what its /metrics endpoint serves.
func (n *Node) Metrics() prometheus.Gatherer { return n.reg }

// HTTPAddr is the address of the metrics and pprof server, or "".
func (n *Node) HTTPAddr() string {
	if n.httpLis == nil {
		return ""
	}
	return n.httpLis.Addr().String()
}

// ID is the node's ID.
func (n *Node) ID() uint64 { return n.cfg.NodeID }

// ClusterID is the node's cluster's ID.
func (n *Node) ClusterID() string { return n.clusterID }

// Store exposes the node's replication store (for tests and tools).
func (n *Node) Store() *replication.Store { return n.store }

// Shard returns the local state machine of a shard, or nil.
func (n *Node) Shard(id uint64) *shard.Shard {
	if n.store == nil {
		return nil
	}
	r := n.store.Replica(id)
	if r == nil {
		return nil
	}
	s, _ := r.StateMachine().(*shard.Shard)
	return s
}

// Stop stops serving and closes every engine. Writes acknowledged before
// Stop are durable.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		close(n.stop)
		if n.health != nil {
			n.health.Shutdown()
		}
		if n.http != nil {
			_ = n.http.Close()
		}
		// Watch streams end first (Unavailable, with the revision to
		// resume from elsewhere): the gRPC server waits for every stream.
		n.stopHubs()
		// Stop Raft first (in-flight requests fail with Unavailable), then
		// the peer streams, then the gRPC server, which now only waits for
		// client calls already answered.
		if n.store != nil {
			n.store.Stop()
		}
		if n.transport != nil {
			_ = n.transport.Close()
		}
		if n.refuser != nil {
			n.refuser.Stop()
		}
		if n.grpc != nil {
			done := make(chan struct{})
			go func() { n.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				n.grpc.Stop()
			}
		} else if n.lis != nil {
			_ = n.lis.Close()
		}
		n.wg.Wait()
		if n.store != nil {
			for _, r := range n.store.Replicas() {
				if err := r.StateMachine().Close(); err != nil {
					n.log.Warn("close shard", "shard", r.ShardID(), "err", err)
				}
			}
		}
		n.mu.Lock()
		for _, c := range n.conns {
			_ = c.Close()
		}
		n.mu.Unlock()
		if n.logDB != nil {
			if err := n.logDB.Close(); err != nil {
				n.log.Warn("close raft log engine", "err", err)
			}
		}
		if n.shared != nil {
			_ = n.shared.Close()
		}
	})
}

func (n *Node) startHTTP() error {
	lis, err := net.Listen("tcp", n.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("server: listen on %s: %w", n.cfg.HTTPAddr, err)
	}
	n.httpLis = lis
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := n.store.Err(); err != nil {
			http.Error(w, fmt.Sprintf("storage failed: %v", err), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	n.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	serve := func() error { return n.http.Serve(lis) }
	if n.tls != nil {
		n.http.Handler = n.httpClientCertGate(mux)
		n.http.TLSConfig = n.tls.HTTPConfig()
		n.http.ErrorLog = slog.NewLogLogger(n.log.With("component", "http").Handler(), slog.LevelWarn)
		serve = func() error { return n.http.ServeTLS(lis, "", "") }
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// httpClientCertGate serves /healthz to anyone (probes present no
// certificate) and the rest of the HTTP port (metrics, profiles) only to
// requests the TLS configuration allows: with --client-cert-auth, those
// with a verified client certificate.
func (n *Node) httpClientCertGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && !n.tls.HTTPAllowed(r.TLS) {
			http.Error(w, "a client certificate signed by the trusted CA (--trusted-ca-file) is required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// --- shards ---

// shardsDir holds the node's shard engines, each in shard.Dir(shardsDir, ID).
// clearSnapshotStaging removes what a previous run of the node left in
// snapshots/: snapshots it was receiving (snapshots/in, half-written if it
// was killed) and checkpoints it was sending (snapshots/out, which pin old
// SSTs through their hard links). Nothing there outlives a run: a transfer
// cut short by a restart is retried from scratch, and only a snapshot that
// arrived whole and verified is ever installed.
func (n *Node) clearSnapshotStaging() error {
	for _, sub := range []string{"in", "out"} {
		dir := filepath.Join(n.cfg.DataDir, "snapshots", sub)
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("server: clear %s: %w", dir, err)
		}
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("server: clear %s: %w", dir, err)
			}
		}
		if len(ents) > 0 {
			n.log.Info("removed what an earlier run left of snapshot transfers", "dir", dir, "entries", len(ents))
		}
	}
	return nil
}

func (n *Node) shardsDir() string { return filepath.Join(n.cfg.DataDir, "shards") }

func (n *Node) shardDir(id uint64) string { return shard.Dir(n.shardsDir(), id) }

func (n *Node) shardOptions() shard.Options {
	return shard.Options{
		// Shard engines sync their WAL only before a Raft log truncation:
		// preallocating it would only reserve space on every shard. Their
		// writes are in the Raft log too (a restart re-applies what a
		// crash lost), so they reach the WAL file in 64 KiB pieces (or a
		// second after the last write) rather than a write system call per
		// applied batch. They take no LOCK
		// file each: the raft log engine's LOCK, taken before any shard
		// opens, keeps other processes out of the whole data directory,
		// and a node hosting 10,000 shards cannot spare a descriptor per
		// shard for it. For the same reason a shard's first memtable is
		// the smallest there is (64 KiB), doubling with every flush up to
		// --shard-memtable-bytes: most shards of a large cluster are idle.
		// A shard engine keeps the memtable it replays at open: an engine
		// installed from a snapshot then has its sender's levels, where a
		// flush at open added an L0 file and, on a loaded shard, a
		// compaction of the whole shard right after the install.
		Storage: &storage.Options{
			KeepRecoveredMemTable: true,
			Shared:                n.shared,
			FS:                    n.cfg.FS,
			SkipLockFile:          true,
			MemTableSize:          uint64(n.cfg.ShardMemTableBytes),
			MemTableInitialSize:   64 << 10,
			WALPreallocateSize:    -1,
			WALFlushThreshold:     64 << 10,
		},
		Logger:             n.log,
		ShardsDir:          n.shardsDir(),
		RecordCache:        n.records,
		HistoryWindow:      n.cfg.HistoryWindow,
		HistoryWindowBytes: n.cfg.HistoryWindowBytes,
	}
}

// openShards opens every shard engine in the data dir and hosts it.
func (n *Node) openShards() error {
	ents, err := os.ReadDir(filepath.Join(n.cfg.DataDir, "shards"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("server: list shards: %w", err)
	}
	opened := map[uint64]bool{}
	for _, e := range ents {
		id, ok := shard.DirShardID(e.Name())
		if !ok || !e.IsDir() || opened[id] {
			continue
		}
		opened[id] = true
		s, err := shard.Open(n.shardDir(id), n.shardOptions())
		if errors.Is(err, shard.ErrUnfinishedSplit) {
			// The split that was making it had not applied durably: it
			// makes the copy again when it applies.
			n.log.Warn("discarding an unfinished split's copy", "shard", id)
			if err := os.RemoveAll(n.shardDir(id)); err != nil {
				return fmt.Errorf("server: remove unfinished shard %d: %w", id, err)
			}
			continue
		}
		if errors.Is(err, shard.ErrUnfinishedRestore) {
			// A founding node stopped while it restored the shard from a
			// backup: founding again restores it again.
			n.log.Warn("discarding an unfinished restore's copy", "shard", id)
			if err := os.RemoveAll(n.shardDir(id)); err != nil {
				return fmt.Errorf("server: remove unfinished shard %d: %w", id, err)
			}
			continue
		}
		empty := false
		if errors.Is(err, shard.ErrNoMetadata) {
			s, err = shard.OpenEmpty(n.shardDir(id), n.shardOptions())
			empty = true
		}
		if err != nil {
			return fmt.Errorf("server: open shard %d: %w", id, err)
		}
		if empty {
			_, err = n.store.AddEmptyReplica(id, s)
		} else {
			_, err = n.store.AddReplica(s)
		}
		if errors.Is(err, replication.ErrReplicaRemoved) {
			continue // a shard merged away; its replica removed itself
		}
		if err != nil {
			_ = s.Close()
			if empty {
				// An uninitialized replica whose creation never became durable.
				n.log.Warn("discarding uninitialized shard replica", "shard", id, "err", err)
				_ = os.RemoveAll(n.shardDir(id))
				continue
			}
			return fmt.Errorf("server: host shard %d: %w", id, err)
		}
	}
	return nil
}

// initialDescriptors are the shards of a new cluster: the system shard and
// the user shards cut at the initial splits, each with up to
// ReplicationFactor founding nodes, spread round-robin.
func (n *Node) initialDescriptors() []*shalev1.ShardDescriptor {
	ids := make([]uint64, 0, len(n.cfg.InitialCluster))
	for id := range n.cfg.InitialCluster {
		ids = append(ids, id)
	}
	mk := func(shardID uint64, start, end []byte, system bool, offset int) *shalev1.ShardDescriptor {
		d := &shalev1.ShardDescriptor{ShardId: shardID, StartKey: start, EndKey: end, Epoch: 1, System: system}
		for i, id := range placement.FoundingReplicas(ids, n.cfg.ReplicationFactor, offset) {
			d.Replicas = append(d.Replicas, &shalev1.ReplicaDescriptor{NodeId: id, ReplicaId: uint64(i + 1)})
		}
		d.NextReplicaId = uint64(len(d.Replicas) + 1)
		return d
	}
	descs := []*shalev1.ShardDescriptor{mk(SystemShardID, nil, nil, true, 0)}
	bounds := append([][]byte{nil}, n.cfg.InitialSplits...)
	for i, start := range bounds {
		var end []byte
		if i+1 < len(bounds) {
			end = bounds[i+1]
		}
		descs = append(descs, mk(uint64(SystemShardID+1+i), start, end, false, i))
	}
	return descs
}

// bootstrapShards creates this founding node's replicas of the initial
// shards (restored from the plan's backup when restore is set) and
// returns those it should campaign for at once: the replicas first in
// their shard's descriptor. Every founding node computes the same
// descriptors, so exactly one replica of each shard campaigns without
// waiting out an election timeout (the round-robin spreads them over the
// nodes), and none competes with it.
func (n *Node) bootstrapShards(ctx context.Context, restore *restorePlan) ([]*replication.Replica, error) {
	var mine, restored []*shalev1.ShardDescriptor
	for _, d := range n.initialDescriptors() {
		here := false
		for _, r := range d.GetReplicas() {
			here = here || r.GetNodeId() == n.cfg.NodeID
		}
		if !here || n.Shard(d.GetShardId()) != nil {
			continue
		}
		mine = append(mine, d)
		if restore != nil && !d.GetSystem() {
			restored = append(restored, d)
		}
	}
	var from map[uint64]*shard.Shard
	if len(restored) > 0 {
		var err error
		if from, err = n.restoreShards(ctx, restore, restored); err != nil {
			return nil, err
		}
	}
	var first []*replication.Replica
	for _, d := range mine {
		s := from[d.GetShardId()]
		if s == nil {
			var err error
			if s, err = shard.Bootstrap(n.shardDir(d.GetShardId()), replication.BootstrapState(d), n.shardOptions()); err != nil {
				return nil, fmt.Errorf("server: bootstrap shard %d: %w", d.GetShardId(), err)
			}
		}
		r, err := n.store.AddReplica(s)
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("server: host shard %d: %w", d.GetShardId(), err)
		}
		if d.GetReplicas()[0].GetNodeId() == n.cfg.NodeID {
			first = append(first, r)
		}
	}
	return first, nil
}

// openEmptyShard creates the state machine of a replica this node was just
// added to (the Store calls it, off its Raft loop; a snapshot fills it). It
// claims the shard's directory at once (emptied: what a crash left there),
// while no replica applies: a split that applies after it finds the
// directory and leaves the shard to this replica. The engine is created
// in it by the function returned, while the node's replicas apply.
func (n *Node) openEmptyShard(id uint64) (func() (replication.StateMachine, error), error) {
	dir := n.shardDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return func() (replication.StateMachine, error) {
		s, err := shard.OpenEmpty(dir, n.shardOptions())
		if err != nil {
			return nil, err
		}
		return s, nil
	}, nil
}

func (n *Node) onReplicaRemoved(id uint64) {
	n.stopHub(id)
	n.loads.Delete(id)
	if err := os.RemoveAll(n.shardDir(id)); err != nil {
		n.log.Warn("delete removed replica's data", "shard", id, "err", err)
	}
}

// --- identity and addresses ---

func (n *Node) metaSnapshot() nodeMeta {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := nodeMeta{NodeID: n.cfg.NodeID, ClusterID: n.clusterID, Addrs: map[string]string{}}
	for id, a := range n.addrs {
		m.Addrs[strconv.FormatUint(id, 10)] = a
	}
	return m
}

// readMeta reads DataDir/NODE; found is false when there is none.
func readMeta(dir string) (nodeMeta, bool, error) {
	var m nodeMeta
	b, err := os.ReadFile(filepath.Join(dir, "NODE"))
	if errors.Is(err, os.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, fmt.Errorf("server: read node identity: %w", err)
	}
	if len(b) < 4 {
		return m, false, fmt.Errorf("server: node identity file %s is truncated", filepath.Join(dir, "NODE"))
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)) != sum {
		return m, false, fmt.Errorf("server: node identity file %s is corrupt (checksum mismatch)", filepath.Join(dir, "NODE"))
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return m, false, fmt.Errorf("server: node identity file: %w", err)
	}
	if m.NodeID == 0 || m.ClusterID == "" {
		return m, false, errors.New("server: node identity file lacks node or cluster ID")
	}
	return m, true, nil
}

// writeMeta replaces DataDir/NODE atomically and durably.
func writeMeta(dir string, m nodeMeta) error {
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	b := binary.BigEndian.AppendUint32(body, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
	tmp := filepath.Join(dir, "NODE.tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("server: write node identity: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("server: write node identity: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("server: write node identity: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "NODE")); err != nil {
		return fmt.Errorf("server: write node identity: %w", err)
	}
	return vfs.SyncDir(vfs.Default, dir)
}

// resolve returns a node's address for the transport.
func (n *Node) resolve(id uint64) (string, error) {
	if a := n.addressOf(id); a != "" {
		return a, nil
	}
	n.refreshAddrs(context.Background())
	if a := n.addressOf(id); a != "" {
		return a, nil
	}
	return "", fmt.Errorf("server: no address known for node %d", id)
}

// wallNanos is the node's wall-clock time (Config.WallClock) in Unix
// nanoseconds.
func (n *Node) wallNanos() int64 { return n.cfg.WallClock().UnixNano() }

// encodeCommand dates a command this node proposes on r, with its wall
// clock (TTLs) and its hybrid logical clock (the entry's date in the
// change log), and encodes it. While a node of r's shard may not read
// compact commands (replication.FeatureCompactCommands; see server/shard's
// compact.go), it is encoded as it is; once they all do, the wall clock is
// carried as its offset from the hybrid logical clock's reading (0, and no
// bytes, while that follows the wall clock) and a transaction of one put as
// a put command. cmd is left as it was given, dated, with the wall clock in
// full (timestamp_unix_nanos): as the shard's apply decodes the encoding,
// so that it can go to ProposeFunc as the payload's decoded form
// (shard.Shard.Apply's Entry.Decoded).
func (n *Node) encodeCommand(r *replication.Replica, cmd *shalev1.RaftCommand) ([]byte, error) {
	ts, wall := n.clock.NowWall()
	cmd.Hlc = replication.HLCToProto(ts)
	// cmd is left as the apply decodes the encoding: the timestamp in
	// full, the command a transaction.
	defer func() { cmd.TimestampUnixNanos, cmd.WallOffsetNanos = wall, 0 }()
	if n.cfg.DisableCompactCommands || !r.NodesRead(replication.FeatureCompactCommands) {
		cmd.TimestampUnixNanos, cmd.WallOffsetNanos = wall, 0
		return codec.Marshal(cmd)
	}
	cmd.TimestampUnixNanos, cmd.WallOffsetNanos = 0, wall-ts.WallNanos
	txn, ok := cmd.GetCommand().(*shalev1.RaftCommand_Txn)
	if !ok {
		return codec.Marshal(cmd)
	}
	put := shard.CompactPut(txn.Txn)
	if put == nil {
		return codec.Marshal(cmd)
	}
	cmd.Command = &shalev1.RaftCommand_Put{Put: put}
	b, err := codec.Marshal(cmd)
	cmd.Command = txn
	return b, err
}

func (n *Node) addressOf(id uint64) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addrs[id]
}

func (n *Node) setAddr(id uint64, addr string) bool {
	if id == 0 || addr == "" {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.addrs[id] == addr {
		return false
	}
	n.addrs[id] = addr
	return true
}

// refreshAddrs learns node addresses from the node registry: from the local
// system shard replica if there is one, else from a peer.
func (n *Node) refreshAddrs(ctx context.Context) {
	nodes, err := n.registry(ctx)
	if err != nil {
		return
	}
	changed := false
	for _, d := range nodes {
		if d.GetNodeId() != n.cfg.NodeID && n.setAddr(d.GetNodeId(), d.GetAddress()) {
			changed = true
		}
	}
	if changed {
		if err := writeMeta(n.cfg.DataDir, n.metaSnapshot()); err != nil {
			n.log.Warn("persist node addresses", "err", err)
		}
	}
}

// registry returns the node registry (a possibly slightly stale read).
func (n *Node) registry(ctx context.Context) ([]*shalev1.NodeDescriptor, error) {
	if s := n.Shard(SystemShardID); s != nil && s.Descriptor() != nil {
		return s.Nodes()
	}
	n.mu.Lock()
	if time.Since(n.remoteRegAt) < 5*time.Second && n.remoteReg != nil {
		reg := n.remoteReg
		n.mu.Unlock()
		return reg, nil
	}
	n.mu.Unlock()
	for _, addr := range n.peerAddrs() {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := shalev1.NewAdminClient(n.conn(addr)).ListNodes(cctx, &shalev1.ListNodesRequest{})
		cancel()
		if err != nil {
			continue
		}
		out := make([]*shalev1.NodeDescriptor, 0, len(resp.GetNodes()))
		for _, s := range resp.GetNodes() {
			out = append(out, s.GetNode())
		}
		n.mu.Lock()
		n.remoteReg, n.remoteRegAt = out, time.Now()
		n.mu.Unlock()
		return out, nil
	}
	return nil, errors.New("server: node registry unreachable")
}

func (n *Node) peerAddrs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]uint64, 0, len(n.addrs))
	for id := range n.addrs {
		if id != n.cfg.NodeID {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		out = append(out, n.addrs[id])
	}
	return out
}

// dialPeer returns a (lazily dialed) client connection to another node.
// Keepalive pings find a connection gone silent (the peer moved to another
// address) and replace it, as the Raft transport's are: without them,
// every call on it would time out until TCP gave up, many minutes later.
// Reconnects wait at most 5 s (gRPC's default grows to 120 s): a peer back
// from a long outage is reached again within seconds.
func (n *Node) dialPeer(addr string) (*grpc.ClientConn, error) {
	reconnect := backoff.DefaultConfig
	reconnect.BaseDelay, reconnect.MaxDelay = 100*time.Millisecond, 5*time.Second
	return grpc.NewClient(addr, append(append(n.peerDialOptions(), n.peerTraceOptions()...), grpctransport.KeepaliveDialOption(), codec.DialOption(),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnect, MinConnectTimeout: 20 * time.Second}))...)
}

// peerDialOptions are the transport credentials of every connection to
// another node: the node's peer certificate under TLS.
func (n *Node) peerDialOptions() []grpc.DialOption {
	if n.tls == nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(n.tls.PeerDialCredentials())}
}

// conn returns a (lazily dialed) client connection to a peer.
func (n *Node) conn(addr string) *grpc.ClientConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.conns[addr]; ok {
		return c
	}
	c, err := n.dialPeer(addr)
	if err != nil {
		// NewClient only fails on a malformed target; calls on the nil-safe
		// fallback fail with a clear error.
		c, _ = grpc.NewClient("passthrough:///invalid-address", grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	n.conns[addr] = c
	return c
}

// join asks a running cluster to admit this node.
func (n *Node) join(ctx context.Context) (nodeMeta, error) {
	c, err := n.dialPeer(n.cfg.Join)
	if err != nil {
		return nodeMeta{}, fmt.Errorf("server: join %s: %w", n.cfg.Join, err)
	}
	defer c.Close()
	var resp *shalev1.AddNodeResponse
	backoff := 100 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err = shalev1.NewAdminClient(c).AddNode(cctx, &shalev1.AddNodeRequest{Address: n.cfg.AdvertiseAddr, Zone: n.cfg.Zone})
		cancel()
		if err == nil {
			break
		}
		n.cfg.Logger.Warn("join: cluster not ready, retrying", "join", n.cfg.Join, "err", err)
		select {
		case <-ctx.Done():
			return nodeMeta{}, fmt.Errorf("server: join %s: %w", n.cfg.Join, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	m := nodeMeta{NodeID: resp.GetNode().GetNodeId(), ClusterID: resp.GetClusterId(), Addrs: map[string]string{}}
	for _, p := range resp.GetPeers() {
		m.Addrs[strconv.FormatUint(p.GetNodeId(), 10)] = p.GetAddress()
	}
	n.cfg.Logger.Info("joined cluster", "cluster", m.ClusterID, "node", m.NodeID)
	return m, nil
}

// requestIDFor derives a stable request ID from parts (for internal
// proposals that must be idempotent across retries).
func requestIDFor(parts ...string) []byte {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum(nil)[:16]
}

// proposeSystem proposes a system command on the local system shard leader.
func (n *Node) proposeSystem(ctx context.Context, reqID []byte, cmd *shalev1.SystemCommand) (*shalev1.CommandResult, error) {
	r := n.store.Replica(SystemShardID)
	if r == nil {
		return nil, n.shardNotFoundErr(SystemShardID)
	}
	return n.proposeCmd(ctx, ctx, r, &shalev1.RaftCommand{RequestId: reqID, Command: &shalev1.RaftCommand_System{System: cmd}})
}

// What a cluster's registry says of a founding node about to bootstrap.
const (
	priorUnknown = iota // no answer, or nothing recorded: found
	priorStarted        // it ran before: its data is lost
	priorRemoved        // it was removed: join as a new node
)

// priorIncarnation asks the cluster (the join address, then the other
// founding nodes, for at most 5 seconds in all) whether founding node id of
// cluster cid ran before or was removed. A cluster being founded answers
// nothing conclusive, so founding goes ahead.
func (n *Node) priorIncarnation(ctx context.Context, id uint64, cid string) int {
	var addrs []string
	if n.cfg.Join != "" {
		addrs = append(addrs, n.cfg.Join)
	}
	for nid, a := range n.cfg.InitialCluster {
		if nid != id {
			addrs = append(addrs, a)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, addr := range addrs {
		if ctx.Err() != nil {
			break
		}
		c, err := grpc.NewClient(addr, append(n.peerDialOptions(), codec.DialOption())...)
		if err != nil {
			continue
		}
		prior, ok := askPrior(ctx, shalev1.NewAdminClient(c), id, cid)
		_ = c.Close()
		if ok {
			return prior
		}
	}
	return priorUnknown
}

// askPrior asks one node; ok is false when it could not tell.
func askPrior(ctx context.Context, a shalev1.AdminClient, id uint64, cid string) (int, bool) {
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rt, err := a.GetRouting(actx, &shalev1.GetRoutingRequest{})
	if err != nil || rt.GetClusterId() != cid {
		return priorUnknown, false
	}
	nodes, err := a.ListNodes(actx, &shalev1.ListNodesRequest{})
	if err != nil {
		return priorUnknown, false
	}
	for _, ns := range nodes.GetNodes() {
		d := ns.GetNode()
		if d.GetNodeId() != id {
			continue
		}
		switch {
		case d.GetRemoved():
			return priorRemoved, true
		case d.GetStarted():
			return priorStarted, true
		}
	}
	return priorUnknown, true
}
