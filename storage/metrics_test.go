package storage

import (
	"fmt"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// TestMetricsCountFlushAndCompactionBytes checks the byte counters that
// shale-server exports (shale_storage_flush_written_bytes_total,
// shale_storage_compaction_read_bytes_total and _written_bytes_total):
// flushes add the SST bytes they write, and a compaction the bytes of the
// files it reads and of those it writes, with the per-level counters
// adding up to the totals.
func TestMetricsCountFlushAndCompactionBytes(t *testing.T) {
	d := apiMustOpen(t, "db", apiSmallOptions(vfs.NewMem()))
	defer apiMustClose(t, d)
	release := apiHoldCompactions(d)
	// Four overlapping L0 files: every key is written again by each round.
	for round := 0; round < 4; round++ {
		b := NewBatch()
		for i := 0; i < 500; i++ {
			b.Set([]byte(apiKey(i)), fmt.Appendf(nil, "round %d value %d of some length to fill blocks", round, i))
		}
		if err := d.Apply(b, NoSync); err != nil {
			t.Fatal(err)
		}
		if err := d.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	before := d.Metrics()
	if before.Flushes < 4 || before.FlushBytesOut == 0 || before.FlushBytesOut != before.Levels[0].BytesWritten {
		t.Fatalf("after 4 flushes: %d flushes, %d bytes written (L0 counts %d)", before.Flushes, before.FlushBytesOut, before.Levels[0].BytesWritten)
	}
	if before.Compactions != 0 || before.CompactionBytesIn != 0 || before.CompactionBytesOut != 0 {
		t.Fatalf("compaction counters moved while compactions were held: %d, %d in, %d out", before.Compactions, before.CompactionBytesIn, before.CompactionBytesOut)
	}
	l0 := before.Levels[0].Bytes
	if before.Levels[0].Files < 4 || l0 == 0 {
		t.Fatalf("L0 holds %d files of %d bytes, want the 4 flushed", before.Levels[0].Files, l0)
	}

	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	release()
	apiWaitIdle(t, d)
	m := d.Metrics()
	var live, levelIn, levelOut uint64
	for i, l := range m.Levels {
		live += l.Bytes
		levelIn += l.BytesIn
		if i > 0 {
			levelOut += l.BytesWritten
		}
	}
	t.Logf("L0 %d bytes in %d files; after: %d compactions (+%d moves) read %d bytes, wrote %d; %d bytes live",
		l0, before.Levels[0].Files, m.Compactions, m.CompactionMoves, m.CompactionBytesIn, m.CompactionBytesOut, live)
	switch {
	case m.Compactions == 0:
		t.Fatal("CompactRange ran no compaction")
	case m.Levels[0].Files != 0:
		t.Fatalf("%d files left in L0", m.Levels[0].Files)
	case m.CompactionBytesIn < l0:
		// The L0 files overlap: one compaction reads them all.
		t.Fatalf("compactions read %d bytes, less than the %d bytes of L0 they emptied", m.CompactionBytesIn, l0)
	case m.CompactionBytesOut < live:
		// Every live file was written by a compaction (the flushes' are gone).
		t.Fatalf("compactions wrote %d bytes, less than the %d bytes live", m.CompactionBytesOut, live)
	case m.CompactionBytesOut >= m.CompactionBytesIn:
		// Each key's three older versions are dropped.
		t.Fatalf("compactions wrote %d bytes of the %d they read, with 3 of 4 versions shadowed", m.CompactionBytesOut, m.CompactionBytesIn)
	case m.CompactionBytesIn != levelIn || m.CompactionBytesOut != levelOut:
		t.Fatalf("totals %d in, %d out; per level %d in, %d out", m.CompactionBytesIn, m.CompactionBytesOut, levelIn, levelOut)
	case m.FlushBytesOut != before.FlushBytesOut:
		t.Fatalf("flush bytes %d, %d before: CompactRange's flush had nothing to write", m.FlushBytesOut, before.FlushBytesOut)
	}
}
