package storage

import (
	"fmt"
	"sync"
	"testing"
)

// TestMemTableRangeDelCacheComplete: the fragmented tombstone list a
// memtable caches once immutable holds every tombstone written to it. A
// reader that started building the list while the memtable still took
// writes, and found it immutable when done, used to cache its incomplete
// list: every later Get through that memtable then missed the tombstones
// written meanwhile and returned deleted values (found by
// TestConcurrentSnapshotConsistency in a loaded CI run: "snapshot
// Get(w0-k076) = ...; scan had no such key").
func TestMemTableRangeDelCacheComplete(t *testing.T) {
	shared := NewShared(&SharedOptions{})
	rounds := 500
	if testing.Short() {
		rounds = 100
	}
	for round := 0; round < rounds; round++ {
		m := newMemTable(1<<20, 0, shared, false, SkiplistMemTable)
		const tombs = 40
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // the commit leader: writes, then rotates
			defer wg.Done()
			for i := 0; i < tombs; i++ {
				b := NewBatch()
				b.DeleteRange([]byte(fmt.Sprintf("k%03d", i)), []byte(fmt.Sprintf("k%03da", i)))
				if err := m.apply(b, SeqNum(i+1)); err != nil {
					t.Error(err)
					return
				}
			}
			m.immutable.Store(true)
		}()
		go func() { // a reader's Gets
			defer wg.Done()
			for m.cachedDels.Load() == nil {
				m.rangeDelList()
			}
		}()
		wg.Wait()
		if got := len(m.rangeDelList().Spans()); got != tombs {
			t.Fatalf("round %d: the cached tombstone list of an immutable memtable has %d tombstones, the memtable %d", round, got, tombs)
		}
		m.release()
		m.unref()
	}
}
