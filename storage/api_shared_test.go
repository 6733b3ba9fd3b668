package storage

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"go.uber.org/goleak"
)

// TestAPISharedResources: four DBs share one block cache, table cache,
// worker pool and memtable budget while written concurrently. All data is
// correct afterwards, the shared memtable memory stays near the budget,
// and closing the DBs then the Shared releases everything.
func TestAPISharedResources(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	const (
		numDBs  = 4
		memSize = 64 << 10
		budget  = 256 << 10
	)
	shared := NewShared(&SharedOptions{
		BlockCacheBytes:   256 << 10,
		TableCacheFiles:   8, // far fewer than the DBs' files: evictions
		CompactionWorkers: 2,
		FlushWorkers:      1,
		MemTableBudget:    budget,
	})
	fs := vfs.NewMem()
	dbs := make([]*DB, numDBs)
	for i := range dbs {
		o := apiSmallOptions(fs)
		o.Shared = shared
		o.MemTableSize = memSize
		dbs[i] = apiMustOpen(t, fmt.Sprintf("db%d", i), o)
	}
	if got := shared.MemTableBytes(); got != numDBs*memSize {
		t.Fatalf("after open: shared memtable bytes %d, want %d", got, numDBs*memSize)
	}

	// Sample the shared memtable memory while writing.
	var maxMem atomic.Int64
	stopSampling := make(chan struct{})
	var samplerWG sync.WaitGroup
	samplerWG.Add(1)
	go func() {
		defer samplerWG.Done()
		for {
			if m := shared.MemTableBytes(); m > maxMem.Load() {
				maxMem.Store(m)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()

	models := make([]oracle, numDBs)
	errs := make([]error, numDBs)
	var wg sync.WaitGroup
	for i := range dbs {
		models[i] = oracle{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			d, model := dbs[i], models[i]
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			for n := 0; n < 2500; n++ {
				b := NewBatch()
				for j := 0; j < 4; j++ {
					k := fmt.Appendf(nil, "db%d-k%05d", i, rng.IntN(4000))
					if rng.IntN(10) == 0 {
						b.Delete(k)
					} else {
						b.Set(k, fmt.Appendf(nil, "v%d-%d-%030d", i, n, j))
					}
				}
				if err := d.Apply(b, NoSync); err != nil {
					errs[i] = err
					return
				}
				model.apply(b)
				if n%500 == 0 { // reads through the shared caches meanwhile
					k := fmt.Appendf(nil, "db%d-k%05d", i, rng.IntN(4000))
					v, err := d.Get(k)
					want, ok := model[string(k)]
					if (err == nil) != ok || (ok && string(v) != want) {
						errs[i] = fmt.Errorf("get %s during writes: %q %v, want %q", k, v, err, want)
						return
					}
				}
			}
		}(i)
	}
	wg.Wait()
	close(stopSampling)
	samplerWG.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("db%d: %v", i, err)
		}
	}

	limit := int64(budget + numDBs*memSize)
	t.Logf("max shared memtable bytes %d (budget %d, limit allowed %d)", maxMem.Load(), budget, limit)
	if maxMem.Load() > limit {
		t.Errorf("shared memtable memory reached %d, above budget %d + one %d-byte memtable per DB (%d)",
			maxMem.Load(), budget, memSize, limit)
	}

	var flushes int64
	for i, d := range dbs {
		apiCheckEqual(t, fmt.Sprintf("db%d", i), apiDump(t, d, nil), models[i])
		if err := d.CompactRange(nil, nil); err != nil {
			t.Fatal(err)
		}
		apiCheckEqual(t, fmt.Sprintf("db%d after compaction", i), apiDump(t, d, nil), models[i])
		m := d.Metrics()
		flushes += m.Flushes
		if m.SharedMemTableBytes < int64(m.MemTableBytes) {
			t.Errorf("db%d: SharedMemTableBytes %d below its own %d", i, m.SharedMemTableBytes, m.MemTableBytes)
		}
	}
	m := dbs[0].Metrics()
	if m.TableCacheMisses == 0 || m.BlockCache.Hits+m.BlockCache.Misses == 0 {
		t.Errorf("shared caches unused: table cache misses %d, block cache %+v", m.TableCacheMisses, m.BlockCache)
	}
	if flushes < numDBs {
		t.Errorf("only %d flushes in total", flushes)
	}

	// Close the DBs (one of them reopened first: its cache entries must not
	// be confused with a new DB's), then the shared resources.
	if err := dbs[3].Close(); err != nil {
		t.Fatal(err)
	}
	o := apiSmallOptions(fs)
	o.Shared = shared
	dbs[3] = apiMustOpen(t, "db3", o)
	apiCheckEqual(t, "db3 reopened", apiDump(t, dbs[3], nil), models[3])
	for _, d := range dbs {
		apiMustClose(t, d)
	}
	if got := shared.MemTableBytes(); got != 0 {
		t.Errorf("shared memtable bytes %d after closing every DB, want 0", got)
	}
	if err := shared.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAPISharedWorkerPoolPriorities: flushes run before queued compactions,
// and L0 compactions before other compactions.
func TestAPISharedWorkerPoolPriorities(t *testing.T) {
	p := newWorkerPool(0, 1) // one worker taking every priority
	block := make(chan struct{})
	started := make(chan struct{})
	p.submit(priorityCompaction, func() { close(started); <-block })
	<-started
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	add := func(prio jobPriority, name string) {
		wg.Add(1)
		if !p.submit(prio, func() {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			wg.Done()
		}) {
			t.Fatal("submit refused")
		}
	}
	add(priorityCompaction, "compaction")
	add(priorityL0Compaction, "l0")
	add(priorityFlush, "flush")
	close(block)
	wg.Wait()
	p.close()
	if fmt.Sprint(order) != "[flush l0 compaction]" {
		t.Fatalf("run order %v, want flush, l0, compaction", order)
	}
	if p.submit(priorityFlush, func() {}) {
		t.Fatal("submit to a closed pool accepted")
	}
}
