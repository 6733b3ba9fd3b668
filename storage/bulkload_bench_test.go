package storage

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// BenchmarkBulkLoad loads 500,000 random 16-byte keys with 100-byte values
// in batches of 1,000 (unsynced) into an empty DB and flushes, with each
// memtable kind, reporting ns per key (the vector memtable's case: a load
// that reads nothing until it is done).
//
//	go test -run '^$' -bench BenchmarkBulkLoad -benchtime 3x ./storage/
func BenchmarkBulkLoad(b *testing.B) {
	const n = 500_000
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%016x", rng.Uint64())
	}
	value := make([]byte, 100)
	for _, kind := range []MemTableKind{SkiplistMemTable, VectorMemTable} {
		b.Run(kind.String(), func(b *testing.B) {
			for range b.N {
				d, err := Open("db", &Options{FS: vfs.NewMem(), Logger: apiQuietLogger, MemTable: kind,
					L0CompactionTrigger: 8, L0SlowdownTrigger: 40, L0StopTrigger: 60})
				if err != nil {
					b.Fatal(err)
				}
				batch := NewBatch()
				for i, k := range keys {
					batch.Set(k, value)
					if (i+1)%1000 == 0 {
						if err := d.Apply(batch, NoSync); err != nil {
							b.Fatal(err)
						}
						batch = NewBatch()
					}
				}
				if err := d.Flush(); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := d.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
		})
	}
}
