package storage

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// BenchmarkOverwriteCompaction overwrites 20,000 keys with 256-byte values
// 10 times (200,000 one-key Sets, unsynced, 1 MiB memtables, in memory),
// then compacts everything, reporting ns per write: the write, flush and
// compaction paths together, and the SST bytes left. "off" keeps no
// history horizon; "window-8MiB" keeps one bounded by HistoryWindowBytes
// (with a 256 MiB WAL archive, as a Shale node's shard engines keep): the
// versions overwritten within the last 8 MiB of writes, whose keeping
// costs flush and compaction work.
//
//	go test -run '^$' -bench BenchmarkOverwriteCompaction -benchtime 3x ./storage/
func BenchmarkOverwriteCompaction(b *testing.B) {
	const keys, rounds = 20_000, 10
	for _, tc := range []struct {
		name string
		set  func(o *Options)
	}{
		{"off", func(*Options) {}},
		{"window-8MiB", func(o *Options) {
			o.HistoryHorizon, o.HistoryWindowBytes, o.WALArchiveMaxBytes = true, 8<<20, 256<<20
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var sst uint64
			for range b.N {
				opts := &Options{FS: vfs.NewMem(), Logger: apiQuietLogger, MemTableSize: 1 << 20}
				tc.set(opts)
				d, err := Open("db", opts)
				if err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(1, 2))
				v := make([]byte, 256)
				for i := range keys * rounds {
					for j := 0; j < len(v); j += 8 {
						u := rng.Uint64()
						for k := range 8 {
							v[j+k] = byte(u >> (8 * k))
						}
					}
					if err := d.Set(fmt.Appendf(nil, "k%015d", i%keys), v, NoSync); err != nil {
						b.Fatal(err)
					}
				}
				if err := d.CompactRange(nil, nil); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				sst = sstBytes(d)
				if err := d.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keys*rounds), "ns/write")
			b.ReportMetric(float64(sst), "sst-bytes")
		})
	}
}
