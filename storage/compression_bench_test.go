package storage

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// BenchmarkLastLevelCompression writes the same 100,000 JSON-like records
// (user profiles: repeated field names, a few distinct values per field)
// with each last-level compression, compacts them to the last level and
// reports its SST bytes, so that the dictionary's saving can be read off:
//
//	go test -run '^$' -bench BenchmarkLastLevelCompression -benchtime 1x ./storage/
func BenchmarkLastLevelCompression(b *testing.B) {
	cities := []string{"Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Toronto", "Perth", "Tallinn"}
	plans := []string{"free", "pro", "team", "enterprise"}
	record := func(rng *rand.Rand, i int) []byte {
		return fmt.Appendf(nil, `{"id":%d,"name":"user-%07d","email":"user%07d@example.com","city":%q,"plan":%q,"created":"2026-%02d-%02dT%02d:%02d:00Z","active":%t,"logins":%d}`,
			i, rng.IntN(1e7), i, cities[rng.IntN(len(cities))], plans[rng.IntN(len(plans))],
			1+rng.IntN(12), 1+rng.IntN(28), rng.IntN(24), rng.IntN(60), rng.IntN(2) == 0, rng.IntN(5000))
	}
	for _, tc := range []struct {
		name  string
		comp  Compression
		level int
	}{
		{"snappy", SnappyCompression, 0},
		{"zstd-3", ZstdCompression, 3},
		{"zstd-dict-3", ZstdDictCompression, 3},
		{"zstd-19", ZstdCompression, 19},
		{"zstd-dict-19", ZstdDictCompression, 19},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var size, raw uint64
			for range b.N {
				opts := &Options{FS: vfs.NewMem(), Logger: apiQuietLogger}
				opts.Levels[6] = LevelOptions{Compression: tc.comp, ZstdLevel: tc.level}
				d, err := Open("db", opts)
				if err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(1, 2))
				batch := NewBatch()
				raw = 0
				for i := range 100_000 {
					k, v := fmt.Appendf(nil, "user/%08d", i), record(rng, i)
					raw += uint64(len(k) + len(v))
					batch.Set(k, v)
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
				m := d.Metrics()
				size = m.Levels[6].Bytes
				if m.Levels[6].Files == 0 || size == 0 {
					b.Fatalf("nothing in L6: %+v", m.Levels[6])
				}
				if err := d.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(size), "L6-bytes")
			b.ReportMetric(float64(raw)/float64(size), "ratio")
		})
	}
}
