package storage

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/internal/compact"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// TestConcurrentCompactionsOnDisjointRanges shows that the engine runs at
// least two compactions at once, on disjoint key ranges: with slow SST writes
// (so compactions last) and small levels, random writes keep several levels
// over their targets. Every compaction that ran passed the picker's rule that
// concurrent compactions writing one level have disjoint ranges (asserted in
// storage/internal/compact's tests); here the data stays correct throughout.
func TestConcurrentCompactionsOnDisjointRanges(t *testing.T) {
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.Latency(errorfs.And(errorfs.Ops(errorfs.OpCreate), errorfs.PathSuffix(".sst")), 2*time.Millisecond))
	opts := &Options{
		FS:                       fs,
		MemTableSize:             64 << 10,
		L0CompactionTrigger:      2,
		L0SlowdownTrigger:        16,
		L0StopTrigger:            32,
		LBaseMaxBytes:            128 << 10,
		MaxConcurrentCompactions: 3,
		Shared:                   NewShared(&SharedOptions{CompactionWorkers: 3}),
	}
	defer opts.Shared.Close()
	opts.Shared.arenas.scribble = true
	for i := range opts.Levels {
		opts.Levels[i].TargetFileSize = 16 << 10
	}
	d, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Watch the running compactions: any two share no input file, and two
	// writing the same level have disjoint key ranges.
	stop := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		defer close(watchErr)
		for {
			select {
			case <-stop:
				return
			default:
			}
			d.mu.Lock()
			cs := append([]*compact.Compaction(nil), d.compactions...)
			d.mu.Unlock()
			for i := range cs {
				for j := i + 1; j < len(cs); j++ {
					if err := checkDisjoint(cs[i], cs[j]); err != nil {
						watchErr <- err
						return
					}
				}
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	rng := rand.New(rand.NewPCG(7, 7))
	want := map[string]string{}
	val := make([]byte, 100)
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; d.Metrics().PeakConcurrentCompactions < 2; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("no two compactions ran at once after %d writes: %s", i, d.Metrics())
		}
		k := fmt.Sprintf("k%06d", rng.IntN(50000))
		for j := range val {
			val[j] = byte('a' + rng.IntN(26))
		}
		if err := d.Set([]byte(k), val, NoSync); err != nil {
			t.Fatal(err)
		}
		want[k] = string(val)
	}
	close(stop)
	if err := <-watchErr; err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		got, err := d.Get([]byte(k))
		if err != nil || string(got) != v {
			t.Fatalf("Get(%s) = %q, %v; want %q", k, got, err, v)
		}
	}
	t.Logf("peak concurrent compactions %d", d.Metrics().PeakConcurrentCompactions)
}

// checkDisjoint reports two running compactions that share an input file, or
// that write one level with overlapping key ranges.
func checkDisjoint(a, b *compact.Compaction) error {
	files := map[manifest.FileNum]bool{}
	for _, in := range a.Inputs {
		for _, f := range in.Files {
			files[f.FileNum] = true
		}
	}
	for _, in := range b.Inputs {
		for _, f := range in.Files {
			if files[f.FileNum] {
				return fmt.Errorf("compactions %s and %s share input %s", a, b, f.FileNum)
			}
		}
	}
	if a.OutputLevel == b.OutputLevel && boundsOverlap(a.Smallest, a.Largest, b.Smallest, b.Largest) {
		return fmt.Errorf("compactions %s and %s write L%d with overlapping ranges", a, b, a.OutputLevel)
	}
	return nil
}
