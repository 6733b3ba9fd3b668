package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shale-db/shale/storage"
)

// storageCollector exports per-engine storage metrics of the node's shard
// engines and its Raft-log engine at scrape time.
type storageCollector struct {
	n *Node
}

var (
	descEngineBytes = prometheus.NewDesc("shale_storage_sst_bytes",
		"Bytes of live SST files of a storage engine.", []string{"engine"}, nil)
	descLevelBytes = prometheus.NewDesc("shale_storage_level_bytes",
		"Bytes of live SST files per LSM level.", []string{"engine", "level"}, nil)
	descFlushes = prometheus.NewDesc("shale_storage_flushes_total",
		"Memtable flushes.", []string{"engine"}, nil)
	descCompactions = prometheus.NewDesc("shale_storage_compactions_total",
		"Compactions that rewrote files (moves, which only relink a file into the next level, not included).", []string{"engine"}, nil)
	descFlushWritten = prometheus.NewDesc("shale_storage_flush_written_bytes_total",
		"Bytes of the SST files memtable flushes wrote.", []string{"engine"}, nil)
	descCompactionRead = prometheus.NewDesc("shale_storage_compaction_read_bytes_total",
		"Bytes of the SST files compactions read (their inputs; moves not included).", []string{"engine"}, nil)
	descCompactionWritten = prometheus.NewDesc("shale_storage_compaction_written_bytes_total",
		"Bytes of the SST files compactions wrote.", []string{"engine"}, nil)
	descPending = prometheus.NewDesc("shale_storage_pending_compaction_bytes",
		"Estimated bytes compaction must rewrite to settle the tree.", []string{"engine"}, nil)
	descStalls = prometheus.NewDesc("shale_storage_stall_seconds_total",
		"Time writes were stalled by the write controller.", []string{"engine"}, nil)
	descPacing = prometheus.NewDesc("shale_storage_pacing_delay_seconds_total",
		"Time writes were delayed by write pacing (before the hard stall limits).", []string{"engine"}, nil)
	descMemtable = prometheus.NewDesc("shale_storage_memtable_bytes",
		"Bytes held in memtables.", []string{"engine"}, nil)
	descWALBytes = prometheus.NewDesc("shale_storage_wal_bytes_total",
		"Bytes written to the write-ahead log of a storage engine since it was opened.", []string{"engine"}, nil)
	descWALSyncs = prometheus.NewDesc("shale_storage_wal_syncs_total",
		"Syncs of the write-ahead log of a storage engine since it was opened.", []string{"engine"}, nil)
	descShardApplied = prometheus.NewDesc("shale_shard_applied_index",
		"Last Raft index applied by the local replica of a shard.", []string{"shard"}, nil)
	descShardLeader = prometheus.NewDesc("shale_shard_is_leader",
		"1 if the local replica leads its shard.", []string{"shard"}, nil)
	descShardQuiesced = prometheus.NewDesc("shale_shard_quiesced",
		"1 if the local replica's Raft group is quiesced (idle, not ticking).", []string{"shard"}, nil)
	descRecordCacheBytes = prometheus.NewDesc("shale_record_cache_bytes",
		"Bytes held by the node's record cache (--record-cache-bytes).", nil, nil)
	descRecordCacheHits = prometheus.NewDesc("shale_record_cache_hits_total",
		"Applies of a write that found the key's previous record in the record cache.", nil, nil)
	descRecordCacheMisses = prometheus.NewDesc("shale_record_cache_misses_total",
		"Applies of a write that did not find the key's previous record in the record cache, and read the engine.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *storageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descEngineBytes
	ch <- descLevelBytes
	ch <- descFlushes
	ch <- descCompactions
	ch <- descFlushWritten
	ch <- descCompactionRead
	ch <- descCompactionWritten
	ch <- descPending
	ch <- descStalls
	ch <- descPacing
	ch <- descMemtable
	ch <- descWALBytes
	ch <- descWALSyncs
	ch <- descShardApplied
	ch <- descShardLeader
	ch <- descShardQuiesced
	ch <- descRecordCacheBytes
	ch <- descRecordCacheHits
	ch <- descRecordCacheMisses
}

// Collect implements prometheus.Collector.
func (c *storageCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	if n.logDB != nil {
		engineMetrics(ch, "raftlog", n.logDB.Metrics())
	}
	if n.records != nil {
		rm := n.records.Metrics()
		ch <- prometheus.MustNewConstMetric(descRecordCacheBytes, prometheus.GaugeValue, float64(rm.Bytes))
		ch <- prometheus.MustNewConstMetric(descRecordCacheHits, prometheus.CounterValue, float64(rm.Hits))
		ch <- prometheus.MustNewConstMetric(descRecordCacheMisses, prometheus.CounterValue, float64(rm.Misses))
	}
	for _, r := range n.store.Replicas() {
		id := strconv.FormatUint(r.ShardID(), 10)
		if sm := n.Shard(r.ShardID()); sm != nil {
			if m := sm.EngineMetrics(); m != nil {
				engineMetrics(ch, "shard-"+id, m)
			}
		}
		st := r.Status()
		ch <- prometheus.MustNewConstMetric(descShardApplied, prometheus.GaugeValue, float64(st.Applied), id)
		ch <- prometheus.MustNewConstMetric(descShardLeader, prometheus.GaugeValue, b2f(st.Leader), id)
		ch <- prometheus.MustNewConstMetric(descShardQuiesced, prometheus.GaugeValue, b2f(st.Quiesced), id)
	}
}

func engineMetrics(ch chan<- prometheus.Metric, engine string, m *storage.Metrics) {
	var total uint64
	for i, l := range m.Levels {
		total += l.Bytes
		ch <- prometheus.MustNewConstMetric(descLevelBytes, prometheus.GaugeValue, float64(l.Bytes), engine, strconv.Itoa(i))
	}
	ch <- prometheus.MustNewConstMetric(descEngineBytes, prometheus.GaugeValue, float64(total), engine)
	ch <- prometheus.MustNewConstMetric(descFlushes, prometheus.CounterValue, float64(m.Flushes), engine)
	ch <- prometheus.MustNewConstMetric(descCompactions, prometheus.CounterValue, float64(m.Compactions), engine)
	ch <- prometheus.MustNewConstMetric(descFlushWritten, prometheus.CounterValue, float64(m.FlushBytesOut), engine)
	ch <- prometheus.MustNewConstMetric(descCompactionRead, prometheus.CounterValue, float64(m.CompactionBytesIn), engine)
	ch <- prometheus.MustNewConstMetric(descCompactionWritten, prometheus.CounterValue, float64(m.CompactionBytesOut), engine)
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(m.PendingCompactionBytes), engine)
	ch <- prometheus.MustNewConstMetric(descStalls, prometheus.CounterValue, m.StallTime.Seconds(), engine)
	ch <- prometheus.MustNewConstMetric(descPacing, prometheus.CounterValue, m.PacingDelay.Seconds(), engine)
	ch <- prometheus.MustNewConstMetric(descMemtable, prometheus.GaugeValue, float64(m.MemTableBytes), engine)
	ch <- prometheus.MustNewConstMetric(descWALBytes, prometheus.CounterValue, float64(m.WALBytes), engine)
	ch <- prometheus.MustNewConstMetric(descWALSyncs, prometheus.CounterValue, float64(m.WALSyncs), engine)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
