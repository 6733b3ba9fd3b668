package memtable

import (
	"encoding/binary"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// BenchmarkAddPattern inserts 1<<17 entries per skiplist (then starts a new
// one) in the orders a Shale node's memtables see:
//   - random: 16-byte random keys (a shard's data records);
//   - dedup: "mdedup-id/" + 12 random bytes, all alike in their first 10
//     bytes (a shard's dedup records);
//   - ascending: one stream of ascending keys;
//   - raftlog-6: the Raft-log engine: 6 shards' entry keys ('r' + shard +
//     'e' + index, alike in their first 9 bytes), each cycle appending a
//     run of 4 entries to every shard in turn.
func BenchmarkAddPattern(b *testing.B) {
	const perList = 1 << 17
	rnd := benchKeys(perList)
	for _, bc := range []struct {
		name string
		key  func(i int) []byte
	}{
		{"random", func(i int) []byte { return rnd[i] }},
		{"dedup", func(i int) []byte { return append([]byte("mdedup-id/"), rnd[i][:12]...) }},
		{"ascending", func(i int) []byte { return binary.BigEndian.AppendUint64(make([]byte, 8, 16), uint64(i)) }},
		{"raftlog-6", func(i int) []byte {
			const shards, run = 6, 4
			cycle, pos := i/(shards*run), i%(shards*run)
			k := binary.BigEndian.AppendUint64([]byte{'r'}, uint64(2+pos/run))
			return binary.BigEndian.AppendUint64(append(k, 'e'), uint64(cycle*run+pos%run))
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			keys := make([][]byte, perList)
			for i := range keys {
				keys[i] = bc.key(i)
			}
			val := make([]byte, 100)
			arenaSize := uint32(perList * 200)
			s := NewSkiplist(arenaSize)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				j := i % perList
				if j == 0 && i > 0 {
					b.StopTimer()
					s = NewSkiplist(arenaSize)
					b.StartTimer()
				}
				if err := s.Add(base.MakeInternalKey(keys[j], base.SeqNum(i), base.KindSet), val); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
