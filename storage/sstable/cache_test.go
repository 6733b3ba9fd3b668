package sstable

import (
	"math/rand"
	"testing"

	"github.com/shale-db/shale/storage/cache"
)

// The shared block cache must satisfy BlockCache.
var _ BlockCache = (*cache.Cache)(nil)

func TestWithSharedCache(t *testing.T) {
	c := cache.New(1 << 20)
	rng := rand.New(rand.NewSource(4))
	kvs := randomKVs(rng, 1500, 2)
	opts := DefaultWriterOptions()
	opts.BlockSize = 512
	data, _ := build(t, opts, kvs, nil)
	// Two files with the same file number in different cache namespaces.
	data2, _ := build(t, opts, kvs[:100], nil)
	r1 := open(t, data, ReaderOptions{Cache: c, CacheID: c.NewID(), FileNum: 1})
	r2 := open(t, data2, ReaderOptions{Cache: c, CacheID: c.NewID(), FileNum: 1})
	for i := 0; i < 3; i++ {
		exercise(t, rng, r1, kvs, nil, nil, 300)
		exercise(t, rng, r2, kvs[:100], nil, nil, 300)
	}
}
