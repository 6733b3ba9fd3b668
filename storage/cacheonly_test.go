package storage

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// ioCounter counts the opens and reads of files through an errorfs-wrapped
// FS, failing none.
type ioCounter struct{ opens, reads atomic.Int64 }

func (c *ioCounter) MaybeError(op errorfs.Op, path string) error {
	switch op {
	case errorfs.OpOpen:
		c.opens.Add(1)
	case errorfs.OpRead:
		c.reads.Add(1)
	}
	return nil
}

func (c *ioCounter) total() int64 { return c.opens.Load() + c.reads.Load() }

// cacheOnlyDB returns a DB, reopened with cold caches, whose n keys
// (key%05d, compacted into SSTs) and range deletion of [key00100,
// key00200) lie only on disk, plus the counter of its file I/O.
func cacheOnlyDB(t *testing.T, n int) (*DB, *ioCounter) {
	t.Helper()
	mem := vfs.NewMem()
	d := apiMustOpen(t, "db", apiSmallOptions(mem))
	for i := range n {
		if err := d.Set(fmt.Appendf(nil, "key%05d", i), fmt.Appendf(nil, "value%05d", i), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.DeleteRange([]byte("key00100"), []byte("key00200"), NoSync); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	apiMustClose(t, d)
	c := &ioCounter{}
	opts := apiSmallOptions(errorfs.Wrap(mem, c))
	opts.Shared = NewShared(&SharedOptions{BlockCacheBytes: 64 << 20})
	d = apiMustOpen(t, "db", opts)
	apiWaitIdle(t, d)
	t.Cleanup(func() { d.Close() })
	return d, c
}

// TestCacheOnlyGet: a cache-only Get of a key that only an SST holds, in a
// DB just opened, fails with ErrIncomplete and opens or reads no file; once
// an ordinary Get has brought the table and block into memory, a cache-only
// Get answers from them with no I/O. Keys in the memtable are always
// answered; a snapshot's cache-only Get follows the same rules.
func TestCacheOnlyGet(t *testing.T) {
	d, c := cacheOnlyDB(t, 2000)
	key, want := []byte("key01234"), "value01234"
	cacheOnly := ReadOptions{CacheOnly: true}

	before := c.total()
	if v, err := d.GetWithOptions(key, cacheOnly); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("cache-only get of an uncached key: %q, %v; want ErrIncomplete", v, err)
	}
	if io := c.total() - before; io != 0 {
		t.Fatalf("the incomplete cache-only get did %d file opens and reads", io)
	}
	if v, err := d.Get(key); err != nil || string(v) != want {
		t.Fatalf("get: %q, %v", v, err)
	}
	if c.total() == before {
		t.Fatal("the ordinary get read nothing: the test's key is not on disk")
	}
	before = c.total()
	if v, err := d.GetWithOptions(key, cacheOnly); err != nil || string(v) != want {
		t.Fatalf("cache-only get after a get: %q, %v", v, err)
	}
	snap := d.NewSnapshot()
	defer snap.Close()
	if v, err := snap.GetWithOptions(key, cacheOnly); err != nil || string(v) != want {
		t.Fatalf("snapshot cache-only get after a get: %q, %v", v, err)
	}
	// A deleted key in a loaded table (its tombstones now cached) and a
	// key in the memtable.
	if _, err := d.GetWithOptions([]byte("key00150"), cacheOnly); !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrIncomplete) {
		t.Fatalf("cache-only get of a deleted key: %v", err)
	}
	if err := d.Set([]byte("fresh"), []byte("v"), NoSync); err != nil {
		t.Fatal(err)
	}
	if v, err := d.GetWithOptions([]byte("fresh"), cacheOnly); err != nil || string(v) != "v" {
		t.Fatalf("cache-only get of a memtable key: %q, %v", v, err)
	}
	if io := c.total() - before; io != 0 {
		t.Fatalf("cache-only gets of cached data did %d file opens and reads", io)
	}
}

// TestCacheOnlyIter: a cache-only iterator over tables not yet open fails
// with ErrIncomplete without I/O; after an ordinary scan has loaded every
// table and block, a cache-only scan returns the same keys with no I/O;
// a block evicted from the cache makes the cache-only scan fail at it,
// again without I/O.
func TestCacheOnlyIter(t *testing.T) {
	const n = 3000
	d, c := cacheOnlyDB(t, n)
	scan := func(o *IterOptions) ([]string, error) {
		it, err := d.NewIter(o)
		if err != nil {
			return nil, err
		}
		defer it.Close()
		var keys []string
		for ok := it.First(); ok; ok = it.Next() {
			keys = append(keys, string(it.Key()))
		}
		return keys, it.Error()
	}
	before := c.total()
	if _, err := scan(&IterOptions{CacheOnly: true}); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("cache-only scan of a cold DB: %v, want ErrIncomplete", err)
	}
	if io := c.total() - before; io != 0 {
		t.Fatalf("the incomplete cache-only scan did %d file opens and reads", io)
	}
	want, err := scan(nil)
	if err != nil || len(want) != n-100 {
		t.Fatalf("scan: %d keys, %v; want %d", len(want), err, n-100)
	}
	before = c.total()
	got, err := scan(&IterOptions{CacheOnly: true})
	if err != nil || len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
		t.Fatalf("cache-only scan after a scan: %d keys, %v; want %d", len(got), err, len(want))
	}
	if io := c.total() - before; io != 0 {
		t.Fatalf("the cache-only scan of cached data did %d file opens and reads", io)
	}

	// Evict one table's blocks: the cache-only scan stops there.
	live, _, err := d.LiveFiles()
	if err != nil || len(live) == 0 {
		t.Fatalf("live files: %v, %v", live, err)
	}
	d.shared.BlockCache.EvictFile(d.cacheID, live[len(live)-1].FileNum)
	before = c.total()
	if _, err := scan(&IterOptions{CacheOnly: true}); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("cache-only scan with a table's blocks evicted: %v, want ErrIncomplete", err)
	}
	if io := c.total() - before; io != 0 {
		t.Fatalf("the incomplete cache-only scan did %d file opens and reads", io)
	}
}
