package storage

import (
	"fmt"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// TestUniversalCompactionShape follows a DB with UniversalCompaction through
// the style's rules, flush by flush, and reopens it with the leveled style:
// nothing is compacted below the trigger (4 sorted runs); at the trigger
// every run merges into the last level (the runs are of similar size); three
// more runs of about a third of it merge into the level above it (the last
// level's run is too big to join); CompactRange merges every run into the
// last level; every key reads back throughout and after the reopen.
func TestUniversalCompactionShape(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	opts.Compaction = UniversalCompaction
	opts.L0CompactionTrigger = 4
	opts.L0SlowdownTrigger = 20
	opts.L0StopTrigger = 30
	opts.MemTableSize = 1 << 20 // flushes only when asked
	opts.Universal.MaxSizeAmplificationPercent = 1000
	for i := range opts.Levels {
		opts.Levels[i].TargetFileSize = 1 << 20
	}
	d := apiMustOpen(t, "db", opts)
	want := oracle{}
	next := 0
	flush := func() {
		t.Helper()
		b := NewBatch()
		for i := 0; i < 500; i++ {
			k, v := fmt.Sprintf("k%06d", (next*7919)%1_000_003), fmt.Sprintf("v%d", next)
			b.Set([]byte(k), []byte(v))
			want[k] = v
			next++
		}
		if err := d.Apply(b, NoSync); err != nil {
			t.Fatal(err)
		}
		if err := d.Flush(); err != nil {
			t.Fatal(err)
		}
		apiWaitIdle(t, d)
	}
	shape := func(what string, wantFiles map[int]bool) {
		t.Helper()
		m := d.Metrics()
		for l, lm := range m.Levels {
			if (lm.Files > 0) != wantFiles[l] {
				t.Fatalf("%s: files per level %v, want levels %v non-empty", what, levelFiles(m), wantFiles)
			}
		}
		apiCheckEqual(t, what, apiDump(t, d, nil), want)
	}
	for i := 0; i < 3; i++ {
		flush()
	}
	shape("three runs", map[int]bool{0: true})
	if n := d.Metrics().Compactions; n != 0 {
		t.Fatalf("%d compactions below the trigger", n)
	}
	flush()
	shape("the fourth run", map[int]bool{6: true})
	for i := 0; i < 3; i++ {
		flush()
	}
	// Runs: three L0 files of one flush each, then L6 of four flushes.
	shape("three more runs", map[int]bool{5: true, 6: true})
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	shape("after CompactRange", map[int]bool{6: true})
	flush()
	apiMustClose(t, d)

	opts.Compaction = LeveledCompaction
	d = apiMustOpen(t, "db", opts)
	defer apiMustClose(t, d)
	apiCheckEqual(t, "reopened leveled", apiDump(t, d, nil), want)
}
