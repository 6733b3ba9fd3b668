package server

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

// engineOnly collects the metrics of one storage engine as
// storageCollector does for each of a node's engines.
type engineOnly struct{ db *storage.DB }

func (e engineOnly) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(e, ch) }
func (e engineOnly) Collect(ch chan<- prometheus.Metric) {
	engineMetrics(ch, "shard-7", e.db.Metrics())
}

// TestEngineMetricsExportFlushAndCompactionBytes: after an engine has
// flushed and compacted, the node's /metrics counters of flush and
// compaction bytes hold the engine's own counts, labelled with the engine.
func TestEngineMetricsExportFlushAndCompactionBytes(t *testing.T) {
	db, err := storage.Open("db", &storage.Options{FS: vfs.NewMem(), MemTableSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for round := 0; round < 3; round++ {
		for i := 0; i < 300; i++ {
			if err := db.Set(fmt.Appendf(nil, "k%04d", i), fmt.Appendf(nil, "value %d of round %d", i, round), storage.NoSync); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(engineOnly{db})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetName() == "engine" && m.GetLabel()[0].GetValue() == "shard-7" && m.GetCounter() != nil {
				got[f.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	em := db.Metrics()
	for name, want := range map[string]uint64{
		"shale_storage_flush_written_bytes_total":      em.FlushBytesOut,
		"shale_storage_compaction_read_bytes_total":    em.CompactionBytesIn,
		"shale_storage_compaction_written_bytes_total": em.CompactionBytesOut,
		"shale_storage_compactions_total":              uint64(em.Compactions),
	} {
		v, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s{engine=\"shard-7\"} not exported (counters: %v)", name, got)
		case want == 0:
			t.Errorf("the engine's count behind %s is 0 after 3 flushes and a compaction", name)
		case v != float64(want):
			t.Errorf("%s = %v, the engine counts %d", name, v, want)
		}
	}
}
