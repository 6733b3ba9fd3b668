package replication

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the Raft metrics of a Store, registered with Prometheus.
type Metrics struct {
	proposals        prometheus.Counter
	packedProposals  prometheus.Counter
	commitLatency    prometheus.Histogram
	leaderChanges    prometheus.Counter
	snapshotsSent    prometheus.Counter
	snapshotsFailed  prometheus.Counter
	snapshotsApplied prometheus.Counter
	logSync          prometheus.Histogram
}

// NewMetrics creates the Raft metrics and registers them with reg (which
// may be nil for unregistered metrics, as in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		proposals: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "shale", Subsystem: "raft", Name: "proposals_total",
			Help: "Commands proposed by leader replicas on this node.",
		}),
		packedProposals: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "shale", Subsystem: "raft", Name: "proposals_packed_total",
			Help: "Commands proposed by leader replicas on this node that shared their Raft entry with others (packed entries).",
		}),
		commitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "shale", Subsystem: "raft", Name: "commit_latency_seconds",
			Help:    "Time from proposal to application on the proposing replica.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "shale", Subsystem: "raft", Name: "leader_changes_total",
			Help: "Times a replica on this node became its shard's leader.",
		}),
		snapshotsSent: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "shale", Subsystem: "raft", Name: "snapshots_sent_total",
			Help: "Snapshots streamed to other nodes and installed there.",
		}),
		snapshotsFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "shale", Subsystem: "raft", Name: "snapshots_failed_total",
			Help: "Outgoing snapshots that failed.",
		}),
		snapshotsApplied: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "shale", Subsystem: "raft", Name: "snapshots_applied_total",
			Help: "Snapshots received and installed by replicas on this node.",
		}),
		logSync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "shale", Subsystem: "raft", Name: "log_sync_seconds",
			Help:    "Duration of the per-cycle synced write of the Raft-log engine (cycles that only move commit indexes write without a sync and are not counted).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.proposals, m.packedProposals, m.commitLatency, m.leaderChanges, m.snapshotsSent, m.snapshotsFailed, m.snapshotsApplied, m.logSync)
	}
	return m
}
