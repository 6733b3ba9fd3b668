package storage

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// expiryFilter drops values "exp=<unix seconds>,..." whose time has passed
// on clock, as a TTL compaction filter does.
type expiryFilter struct{ clock *atomic.Int64 }

func (expiryFilter) Name() string { return "test.expiry" }

func (f expiryFilter) Filter(level int, key, value []byte) (FilterDecision, []byte) {
	rest, ok := strings.CutPrefix(string(value), "exp=")
	if !ok {
		return FilterKeep, nil
	}
	at, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
	if err == nil && at <= f.clock.Load() {
		return FilterRemove, nil
	}
	return FilterKeep, nil
}

// TestPeriodicCompaction: with PeriodicCompaction, files written longer
// ago than the period are compacted though nothing else is due, so that a
// TTL compaction filter removes expired data from cold files: before the
// period the expired keys stay stored (no compaction runs), after it they
// are gone and their bytes with them; files written since are left alone.
func TestPeriodicCompaction(t *testing.T) {
	var clock atomic.Int64
	t0 := int64(1_800_000_000)
	clock.Store(t0)
	opts := apiSmallOptions(vfs.NewMem())
	opts.now = func() time.Time { return time.Unix(clock.Load(), 0) }
	opts.CompactionFilter = expiryFilter{&clock}
	opts.PeriodicCompaction = time.Hour
	d := apiMustOpen(t, "db", opts)
	defer d.Close()

	const n = 4000
	for i := range n {
		v := fmt.Sprintf("exp=%d,value%05d-%s", t0+10*60, i, strings.Repeat("x", 60)) // expires in 10 minutes
		if i%2 == 0 {
			v = fmt.Sprintf("keep,value%05d-%s", i, strings.Repeat("x", 60))
		}
		if err := d.Set(fmt.Appendf(nil, "key%05d", i), []byte(v), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.CompactRange(nil, nil); err != nil { // everything into SSTs, filtered at t0
		t.Fatal(err)
	}
	apiWaitIdle(t, d)
	full, _ := apiTotalSize(t, d)
	schedule := func() {
		d.mu.Lock()
		d.maybeScheduleCompactionLocked()
		d.mu.Unlock()
		apiWaitIdle(t, d)
	}

	// Expired, but the files are younger than the period: nothing runs,
	// and the expired keys are still stored.
	clock.Store(t0 + 30*60)
	schedule()
	if m := d.Metrics(); m.PeriodicCompactions != 0 {
		t.Fatalf("%d periodic compactions of files younger than the period", m.PeriodicCompactions)
	}
	if _, err := d.Get([]byte("key00001")); err != nil {
		t.Fatalf("an expired key was removed before any compaction: %v", err)
	}

	// A file written now, past the period of the others.
	clock.Store(t0 + 2*60*60)
	if err := d.Set([]byte("zz-new"), []byte("keep,new"), NoSync); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	apiWaitIdle(t, d)
	schedule()
	m := d.Metrics()
	if m.PeriodicCompactions == 0 {
		t.Fatal("no periodic compaction of files older than the period")
	}
	for i := range n {
		_, err := d.Get(fmt.Appendf(nil, "key%05d", i))
		switch {
		case i%2 == 0 && err != nil:
			t.Fatalf("key%05d (no expiry): %v", i, err)
		case i%2 == 1 && !errors.Is(err, ErrNotFound):
			t.Fatalf("key%05d expired at t0+10min is still stored after the periodic compaction: %v", i, err)
		}
	}
	after, _ := apiTotalSize(t, d)
	t.Logf("SST bytes %d before, %d after; %d periodic compactions", full, after, m.PeriodicCompactions)
	if after > full*3/4 {
		t.Fatalf("SST bytes %d of %d after dropping half the values", after, full)
	}
	cutoff := t0 + 60*60
	d.mu.Lock()
	for level, files := range d.vers.Levels {
		for _, f := range files {
			if f.CreationTime <= cutoff {
				t.Errorf("L%d file %s (created %d) is still older than the period", level, f.FileNum, f.CreationTime)
			}
		}
	}
	d.mu.Unlock()
	// Nothing is due now: scheduling again compacts nothing.
	schedule()
	if again := d.Metrics().PeriodicCompactions; again != m.PeriodicCompactions {
		t.Fatalf("%d more periodic compactions with every file younger than the period", again-m.PeriodicCompactions)
	}
}

// TestPeriodicCompactionWithoutWrites: on the real clock, a DB that is
// never written again still compacts its files once they are older than
// the period: the DB's own check schedules it.
func TestPeriodicCompactionWithoutWrites(t *testing.T) {
	opts := apiSmallOptions(vfs.NewMem())
	opts.PeriodicCompaction = 2 * time.Second
	d := apiMustOpen(t, "db", opts)
	defer d.Close()
	for i := range 100 {
		if err := d.Set(fmt.Appendf(nil, "key%03d", i), []byte("v"), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for d.Metrics().PeriodicCompactions == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no periodic compaction within 20 s of a 2 s period")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
