package server

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/replication/grpctransport"
	"github.com/shale-db/shale/security/tlsconfig"
	"github.com/shale-db/shale/server/auth"
	"github.com/shale-db/shale/storage/vfs"
)

// DefaultSnapshotRateBytes is the default Config.SnapshotRateBytes: 128
// MiB/s, about a quarter of a SATA SSD's sequential write and under a
// tenth of an NVMe drive's, for the node's snapshots and backups while it
// serves foreground work.
const DefaultSnapshotRateBytes = 128 << 20

// Config configures a Node. Zero fields take the documented defaults.
type Config struct {
	// DataDir holds the node's data: its identity, Raft log and shard engines.
	DataDir string
	// NodeID is this node's ID in InitialCluster. Zero takes the ID whose
	// InitialCluster address is AdvertiseAddr, if there is one (so every
	// pod of a StatefulSet can share one configuration). A node that joins
	// gets its ID from the cluster; a restarted node reads it from DataDir.
	NodeID uint64
	// ListenAddr is the gRPC address for clients and peers (default
	// 127.0.0.1:7001).
	ListenAddr string
	// AdvertiseAddr is the address other nodes and clients use to reach this
	// node (default ListenAddr).
	AdvertiseAddr string
	// HTTPAddr serves /metrics, /debug/pprof and /healthz; empty disables it.
	HTTPAddr string
	// InitialCluster lists the founding nodes of a new cluster (ID →
	// address). Every founding node is started with the same list. With
	// Join also set, a node listed in it (by NodeID or AdvertiseAddr)
	// founds the cluster and any other node joins it.
	InitialCluster map[uint64]string
	// ClusterName distinguishes clusters started from the same
	// InitialCluster (default "shale").
	ClusterName string
	// Join is the address of any node of a running cluster to join. It is
	// used only by a node with no data that is not a founding node.
	Join string
	// Zone is this node's failure-domain label.
	Zone string
	// InitialSplits are the split keys of the initial user shards: n keys
	// make n+1 shards.
	InitialSplits [][]byte
	// RestoreFrom, with RestoreBackup, founds the new cluster from a backup
	// (package backup): the location, a directory every founding node
	// reads, and the backup's ID. The user shards are the backup's, each
	// founding replica built from its checkpoint (every file's checksum is
	// checked first); the system shard is new (this cluster's nodes and
	// shards), and so is the cluster ID. Only founding nodes use them, and
	// only on their first start.
	RestoreFrom, RestoreBackup string
	// RestoreAsOf, when set, restores the data as of that time: every
	// shard's checkpoint, carried forward by the entries its backup's log
	// holds dated (hybrid logical clock) at or before it. Every shard's
	// checkpoint must be dated before it, and the backup must have read
	// every shard after it. Zero: everything the backup holds.
	RestoreAsOf time.Time
	// preparedRestore is set when the restore comes from a data directory
	// `shalectl restore` prepared (RestoreFrom is its staged copy).
	preparedRestore *backup.Prepared
	// ReplicationFactor is how many replicas each shard gets (default 3).
	ReplicationFactor int
	// Limits on requests.
	MaxKeyBytes   int // default 4 KiB
	MaxValueBytes int // default 1 MiB
	MaxBatchOps   int // default 10,000 operations per Batch or Txn
	MaxBatchBytes int // default 8 MiB per Batch or Txn
	// MaxScanPageKeys and MaxScanPageBytes cap one scan page (defaults 1,000
	// keys, 3 MiB of keys and values, so a page with its encoding overhead
	// stays under gRPC's default 4 MiB message limit).
	MaxScanPageKeys  int
	MaxScanPageBytes int
	// RequestTimeout bounds a request that carries no deadline (default 10s).
	RequestTimeout time.Duration
	// TickInterval and ElectionTicks set Raft's timing (defaults 100ms, 10).
	TickInterval  time.Duration
	ElectionTicks int
	// LeaseReads serves linearizable reads from the leader's lease
	// (shale-server turns it on unless --lease-reads=false).
	LeaseReads bool
	// DisableQuiescence keeps idle Raft groups ticking and heartbeating
	// (by default an idle, fully replicated group goes quiet).
	DisableQuiescence bool
	// DisableCompactCommands makes the node propose every command in the
	// form nodes that predate compact commands read, and stop advertising
	// that it reads them (so no other node proposes them on a shard it
	// hosts), as an older version would; it still applies them. See
	// "Compact commands" in docs/replication.md.
	DisableCompactCommands bool
	// SnapshotRateBytes limits the bandwidth of the node's outgoing
	// snapshots and backups together while it serves foreground work:
	// client requests, or replicated writes (default 128 MiB/s; negative:
	// no limit). A node that saw neither for a second sends unpaced.
	SnapshotRateBytes int64
	// SnapshotRateAlways applies SnapshotRateBytes on an idle node too.
	SnapshotRateAlways bool
	// BlockCacheBytes sizes the block cache shared by the node's engines
	// (default 256 MiB).
	BlockCacheBytes int64
	// RecordCacheBytes sizes the record cache shared by the node's shards:
	// the recently written records of user keys, which spares the apply of
	// the next write to one of them an engine read (default 64 MiB;
	// negative: none).
	RecordCacheBytes int64
	// ShardMemTableBytes is the memtable size of each shard engine (default
	// 16 MiB).
	ShardMemTableBytes int
	// SplitSizeBytes is the size above which a shard's leader splits it in
	// two, at a key chosen from its engine's index metadata (default 128
	// MiB; negative: no automatic splits).
	SplitSizeBytes int64
	// SplitQPS is the request rate (requests per second served by the
	// shard's leader) above which, sustained for five seconds, a shard is
	// split at the median key of its recent requests and the new half's
	// leadership moves to another node (default 2,500; negative: no
	// load-based splits).
	SplitQPS int
	// MergeSizeBytes is the combined size under which a shard's leader
	// merges it with its right neighbour, when the boundary between them was
	// made by an automatic split, both are quiet (their leaders' peak rates
	// over the last ten seconds, each led throughout by the same leader,
	// add up to at most half of SplitQPS) and neither's range changed in the
	// last MergeDelay (default a quarter of SplitSizeBytes; negative: no
	// automatic merges).
	MergeSizeBytes int64
	// MergeDelay is how long after a split of either shard an automatic
	// merge waits, so that load splits outlive their load (default 5m).
	MergeDelay time.Duration
	// GRPCWindowBytes and GRPCConnWindowBytes are the HTTP/2 flow-control
	// windows (per stream, per connection) of the node's gRPC server and of
	// its connections to peers (defaults 2 MiB and 16 MiB; at least 64 KiB
	// less one byte). Fixed windows turn off gRPC's bandwidth estimator,
	// whose PING round trips cost 12–22% of the servers' CPU per small put.
	GRPCWindowBytes     int32
	GRPCConnWindowBytes int32
	// DeadNodeTimeout is how long a node may miss heartbeats before the
	// placement leader replaces its replicas on other nodes (default 5m),
	// and how long shard leaders keep the Raft log tail its replicas need
	// (replication.Config.LogKeepForDownNodes).
	DeadNodeTimeout time.Duration
	// PlacementMaxMovesPerNode caps the replica moves (new replicas
	// catching up by snapshot) a node takes part in at once, as receiver or
	// sender (default 2); PlacementMaxMoves caps them cluster-wide
	// (default 8).
	PlacementMaxMovesPerNode int
	PlacementMaxMoves        int
	// PlacementPinDuration is how long an operator's replica move or
	// leadership transfer keeps balancing away from the shard (default 1h).
	PlacementPinDuration time.Duration
	// TLS is the node's transport security: TLS for clients and mutual TLS
	// for peers on the gRPC port, HTTPS on the HTTP port. Zero:
	// plaintext. See docs/shale-server.md, "TLS".
	TLS tlsconfig.ServerConfig
	// AuthTokenTTL is how long a token from Auth.Authenticate is accepted
	// (default 10m).
	AuthTokenTTL time.Duration
	// PasswordCost is the bcrypt cost of the password hashes this node
	// makes when it leads the system shard (default
	// auth.DefaultPasswordCost, 10; 4 to 31, each step doubling the work of
	// a hash and of a login).
	PasswordCost int
	// Logger receives the node's logs (default slog.Default()).
	Logger *slog.Logger
	// LinkFilter, when set, is asked before any Raft traffic leaves for a
	// peer: false drops it (tests use it to cut links and partition nodes).
	LinkFilter func(from, to uint64) bool
	// WallClock is the node's wall clock (default time.Now): the time of
	// the timestamps it shares with other nodes (a write's time, from which
	// a TTL runs; the time a read checks TTLs at; placement pins and
	// history). Timeouts, leases and liveness use the monotonic clock and
	// do not read it. Tests shift it to model a node whose clock is off.
	WallClock func() time.Time
	// MaxClockOffset is how far ahead of this node's wall clock a peer's
	// hybrid-logical-clock reading may be and still move this node's clock
	// (default 500ms). Farther readings are refused and logged, so that one
	// node's runaway clock does not date every node's writes in the future.
	MaxClockOffset time.Duration
	// WatchProgressInterval is how long a watch stream that asked for
	// progress notifications stays idle before it gets one (default 1s).
	WatchProgressInterval time.Duration
	// FS is the filesystem under every file the node writes: the Raft log
	// engine, the shard engines and their snapshots (default the operating
	// system's). Fault-injection tests wrap it to make the disk slow or
	// failing.
	FS vfs.FS
	// SlowDiskThreshold is how long a Raft-log sync may take before it
	// counts as slow (default 500ms; negative: never). While most of the
	// node's syncs of the last 5 s were slow (at least 3 of them), or one
	// has been running for twice the threshold, the node hands its shard
	// leaderships to other nodes and takes none (a leader on a slow disk
	// delays every write of its shards), until its syncs are fast again
	// for slowDiskHold.
	SlowDiskThreshold time.Duration
	// WatchQueueBytes bounds the changes queued for one watch stream and
	// not yet sent; a stream past it is ended with ResourceExhausted and
	// the revision to resume from (default 8 MiB).
	WatchQueueBytes int
	// HistoryWindow and HistoryWindowBytes bound the history each shard
	// engine keeps (shard.Options.HistoryWindow and HistoryWindowBytes):
	// the values writes replaced or deleted within the last HistoryWindow
	// (default shard.DefaultHistoryWindow, 5m) and the last
	// HistoryWindowBytes of the engine's WAL (default
	// shard.DefaultHistoryWindowBytes), the tighter bound winning; negative:
	// no such bound. A watch with prev_kv reads previous values there, so
	// it can start or resume from revisions within the window and no
	// older; the space of deleted, overwritten and expired values comes
	// back once the window passes them.
	HistoryWindow      time.Duration
	HistoryWindowBytes int64
	// TracerProvider, when set, traces the node's requests with
	// OpenTelemetry: a span per call it serves (joining the caller's trace
	// when the call carries one), per call it makes to another node for
	// one, per Raft proposal, apply and engine write (docs/tracing.md). Its
	// sampler decides which requests without a caller's trace are traced.
	// Nil (the default) traces nothing and installs nothing.
	TracerProvider trace.TracerProvider
}

func (c *Config) applyDefaults() {
	if c.WallClock == nil {
		c.WallClock = time.Now
	}
	if c.MaxClockOffset == 0 {
		c.MaxClockOffset = 500 * time.Millisecond
	}
	if c.WatchProgressInterval == 0 {
		c.WatchProgressInterval = time.Second
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.SlowDiskThreshold == 0 {
		c.SlowDiskThreshold = 500 * time.Millisecond
	}
	if c.WatchQueueBytes == 0 {
		c.WatchQueueBytes = 8 << 20
	}
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:7001"
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = c.ListenAddr
	}
	if c.ClusterName == "" {
		c.ClusterName = "shale"
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = 3
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = 4 << 10
	}
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = 1 << 20
	}
	if c.MaxBatchOps == 0 {
		c.MaxBatchOps = 10000
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = 8 << 20
	}
	if c.MaxScanPageKeys == 0 {
		c.MaxScanPageKeys = 1000
	}
	if c.MaxScanPageBytes == 0 {
		c.MaxScanPageBytes = 3 << 20
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.SnapshotRateBytes == 0 {
		c.SnapshotRateBytes = DefaultSnapshotRateBytes
	}
	if c.RecordCacheBytes == 0 {
		c.RecordCacheBytes = 64 << 20
	}
	if c.BlockCacheBytes == 0 {
		c.BlockCacheBytes = 256 << 20
	}
	if c.SplitQPS == 0 {
		c.SplitQPS = 2500
	}
	if c.ShardMemTableBytes == 0 {
		c.ShardMemTableBytes = 16 << 20
	}
	if c.SplitSizeBytes == 0 {
		c.SplitSizeBytes = 128 << 20
	}
	if c.MergeDelay == 0 {
		c.MergeDelay = 5 * time.Minute
	}
	if c.MergeSizeBytes == 0 {
		c.MergeSizeBytes = -1
		if c.SplitSizeBytes > 0 {
			c.MergeSizeBytes = c.SplitSizeBytes / 4
		}
	}
	if c.GRPCWindowBytes == 0 {
		c.GRPCWindowBytes = grpctransport.DefaultInitialWindowSize
	}
	if c.GRPCConnWindowBytes == 0 {
		c.GRPCConnWindowBytes = grpctransport.DefaultInitialConnWindowSize
	}
	if c.DeadNodeTimeout == 0 {
		c.DeadNodeTimeout = 5 * time.Minute
	}
	if c.PlacementMaxMovesPerNode == 0 {
		c.PlacementMaxMovesPerNode = 2
	}
	if c.PlacementMaxMoves == 0 {
		c.PlacementMaxMoves = 8
	}
	if c.PlacementPinDuration == 0 {
		c.PlacementPinDuration = time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.AuthTokenTTL == 0 {
		c.AuthTokenTTL = 10 * time.Minute
	}
	if c.PasswordCost == 0 {
		c.PasswordCost = auth.DefaultPasswordCost
	}
}

func (c *Config) validate() error {
	if c.DataDir == "" {
		return errors.New("server: a data directory is required")
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if len(c.InitialCluster) > 0 {
		byAddr := map[string]uint64{}
		for id, a := range c.InitialCluster {
			if other, dup := byAddr[a]; dup {
				return fmt.Errorf("server: the initial cluster gives nodes %d and %d the same address %s", min(id, other), max(id, other), a)
			}
			byAddr[a] = id
		}
		if c.NodeID != 0 {
			if _, ok := c.InitialCluster[c.NodeID]; !ok {
				return fmt.Errorf("server: node %d is not in the initial cluster", c.NodeID)
			}
		} else if c.foundingID() == 0 && c.Join == "" {
			return fmt.Errorf("server: --node-id is required with --initial-cluster unless the advertised address %s is one of its addresses (or give --join for nodes that are not founding nodes)", c.AdvertiseAddr)
		}
	}
	if (c.RestoreFrom == "") != (c.RestoreBackup == "") {
		return errors.New("server: --restore-from and --restore-backup go together")
	}
	if !c.RestoreAsOf.IsZero() && c.RestoreFrom == "" {
		return errors.New("server: --restore-as-of needs --restore-from")
	}
	if c.RestoreFrom != "" {
		if len(c.InitialCluster) == 0 {
			return errors.New("server: a restore founds a new cluster: --restore-from needs --initial-cluster")
		}
		if len(c.InitialSplits) > 0 {
			return errors.New("server: a restore takes its shards from the backup: --restore-from and --initial-splits exclude each other")
		}
	}
	for i := 1; i < len(c.InitialSplits); i++ {
		if string(c.InitialSplits[i-1]) >= string(c.InitialSplits[i]) {
			return fmt.Errorf("server: initial splits must be strictly increasing (%q then %q)", c.InitialSplits[i-1], c.InitialSplits[i])
		}
	}
	for _, s := range c.InitialSplits {
		if len(s) == 0 {
			return errors.New("server: an initial split key is empty")
		}
	}
	if c.PasswordCost < 4 || c.PasswordCost > 31 {
		return fmt.Errorf("server: the password hash cost must be 4 to 31 (got %d)", c.PasswordCost)
	}
	if c.AuthTokenTTL < time.Second {
		return fmt.Errorf("server: the auth token lifetime must be at least 1s (got %v)", c.AuthTokenTTL)
	}
	if c.ReplicationFactor < 1 {
		return errors.New("server: the replication factor must be at least 1")
	}
	if c.DeadNodeTimeout < 2*time.Second {
		return fmt.Errorf("server: the dead node timeout must be at least 2s (got %v)", c.DeadNodeTimeout)
	}
	if c.PlacementMaxMovesPerNode < 1 || c.PlacementMaxMoves < 1 {
		return fmt.Errorf("server: the placement move limits must be at least 1 (got %d per node, %d in the cluster)", c.PlacementMaxMovesPerNode, c.PlacementMaxMoves)
	}
	if c.PlacementPinDuration < 0 {
		return fmt.Errorf("server: the placement pin duration must not be negative (got %v)", c.PlacementPinDuration)
	}
	if c.ShardMemTableBytes < 64<<10 {
		return fmt.Errorf("server: the shard memtable size must be at least 64 KiB (got %d)", c.ShardMemTableBytes)
	}
	if c.GRPCWindowBytes < grpctransport.MinWindowSize || c.GRPCConnWindowBytes < grpctransport.MinWindowSize {
		return fmt.Errorf("server: gRPC window sizes must be at least %d bytes (got %d per stream, %d per connection)",
			grpctransport.MinWindowSize, c.GRPCWindowBytes, c.GRPCConnWindowBytes)
	}
	return nil
}

// foundingID is this node's ID in InitialCluster: NodeID if set, else the
// ID whose address is AdvertiseAddr; 0 when the node is not a founding node.
func (c *Config) foundingID() uint64 {
	if c.NodeID != 0 {
		if _, ok := c.InitialCluster[c.NodeID]; ok {
			return c.NodeID
		}
		return 0
	}
	for id, a := range c.InitialCluster {
		if a == c.AdvertiseAddr {
			return id
		}
	}
	return 0
}

// clusterID derives the cluster's ID from its name and founding nodes, so
// every founding node computes the same one.
// newClusterID is the ID of the cluster the founding nodes make: a restore
// makes a cluster of its own, never the backed-up one's ID again.
func (c *Config) newClusterID() string {
	if c.RestoreFrom != "" {
		return clusterID(c.ClusterName+"/restored from "+c.RestoreBackup, c.InitialCluster)
	}
	return clusterID(c.ClusterName, c.InitialCluster)
}

func clusterID(name string, initial map[uint64]string) string {
	ids := make([]uint64, 0, len(initial))
	for id := range initial {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var sb strings.Builder
	sb.WriteString(name)
	for _, id := range ids {
		fmt.Fprintf(&sb, ",%d=%s", id, initial[id])
	}
	h := uint64(14695981039346656037)
	for _, b := range []byte(sb.String()) {
		h ^= uint64(b)
		h *= 1099511628211
	}
	return fmt.Sprintf("%s-%016x", name, h)
}
