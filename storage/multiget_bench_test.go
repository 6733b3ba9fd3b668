package storage

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// BenchmarkMultiGet compares MultiGet with a loop of Gets over the same
// batches of random keys (most present, some absent), read from SSTs whose
// blocks are in the block cache (the memtables empty), and reports ns/key.
//
//	go test -run '^$' -bench BenchmarkMultiGet -benchtime 2000x ./storage/
func BenchmarkMultiGet(b *testing.B) {
	const n = 200_000
	d, err := Open("db", &Options{FS: vfs.NewMem(), Logger: apiQuietLogger,
		Shared: NewShared(&SharedOptions{BlockCacheBytes: 256 << 20})})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	batch := NewBatch()
	for i := range n {
		batch.Set(fmt.Appendf(nil, "key%08d", i*2), fmt.Appendf(nil, "value-%08d-%0100d", i, i))
		if batch.Count() == 1000 {
			if err := d.Apply(batch, NoSync); err != nil {
				b.Fatal(err)
			}
			batch = NewBatch()
		}
	}
	if err := d.Apply(batch, NoSync); err != nil {
		b.Fatal(err)
	}
	if err := d.CompactRange(nil, nil); err != nil {
		b.Fatal(err)
	}
	it, err := d.NewIter(nil) // warm the block cache
	if err != nil {
		b.Fatal(err)
	}
	for ok := it.First(); ok; ok = it.Next() {
	}
	it.Close()
	for _, size := range []int{16, 64, 256} {
		rng := rand.New(rand.NewPCG(1, uint64(size)))
		batches := make([][][]byte, 64)
		for i := range batches {
			for range size {
				// Even numbers exist; one key in eight is absent.
				k := rng.IntN(n) * 2
				if rng.IntN(8) == 0 {
					k++
				}
				batches[i] = append(batches[i], fmt.Appendf(nil, "key%08d", k))
			}
		}
		b.Run(fmt.Sprintf("keys=%d/get-loop", size), func(b *testing.B) {
			for i := range b.N {
				for _, k := range batches[i%len(batches)] {
					if _, err := d.Get(k); err != nil && err != ErrNotFound {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/key")
		})
		b.Run(fmt.Sprintf("keys=%d/multiget", size), func(b *testing.B) {
			for i := range b.N {
				_, errs := d.MultiGet(batches[i%len(batches)])
				for _, err := range errs {
					if err != nil && err != ErrNotFound {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/key")
		})
	}
}
