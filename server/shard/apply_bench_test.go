package shard

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage"
)

// BenchmarkApplyPut applies single-put Txn commands, as the server proposes
// a client's put (a fresh 16-byte request ID, marked a first attempt):
// 10-byte keys, 256-byte values, on an in-memory filesystem. Besides time
// and allocations it reports what one applied put costs the shard engine's
// WAL, read back from it: records by kind and bytes per put. Cases:
// keys drawn from 100,000 (mostly new keys) or 1,000 (overwrites, whose
// change-log record carries the previous value), one entry per Apply call
// or 16 (as an apply worker batches a busy shard's entries).
func BenchmarkApplyPut(b *testing.B) {
	for _, bc := range []struct {
		name      string
		keys, per int
		records   int64 // record cache bytes
	}{
		{"keys=100000/entries=1", 100_000, 1, 64 << 20},
		{"keys=1000/entries=1", 1_000, 1, 64 << 20},
		{"keys=100000/entries=16", 100_000, 16, 64 << 20},
		{"keys=100000/entries=16/no-record-cache", 100_000, 16, 0},
	} {
		b.Run(bc.name, func(b *testing.B) { benchApplyPut(b, bc.keys, bc.per, bc.records) })
	}
}

func benchApplyPut(b *testing.B, keys, per int, records int64) {
	env := newTestEnv(b, nil)
	env.keepWAL = true
	env.records = NewRecordCache(records)
	s := env.bootstrap("shard", userDesc(2, "", ""), 100_000)
	f := newFeeder(s)
	value := strings.Repeat("v", 256)
	rng := rand.New(rand.NewPCG(1, 2))
	start := s.db.Metrics().WALBytes
	seq0 := s.db.LastSeq() + 1
	b.ReportAllocs()
	b.ResetTimer()
	ents := make([]replication.Entry, 0, per)
	for i := range b.N {
		id := make([]byte, 16)
		for j := range id {
			id[j] = byte(rng.Uint32())
		}
		cmd := txnCmd(int64(i+1), &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(fmt.Sprintf("k%09d", rng.IntN(keys)), value, 0, false)}})
		cmd.RequestId, cmd.FirstAttempt = id, true
		ents = append(ents, f.entry(marshalCmd(b, cmd)))
		if len(ents) == per || i == b.N-1 {
			if _, err := s.Apply(ents); err != nil {
				b.Fatal(err)
			}
			ents = ents[:0]
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(s.db.Metrics().WALBytes-start)/float64(b.N), "wal-B/put")
	it, err := s.db.UpdatesSince(seq0)
	if err != nil {
		b.Fatal(err)
	}
	defer it.Close()
	var sets, dels, logData int
	var dataB, dedupB, metaB, logB int // key and value bytes by record
	for it.Next() {
		r := it.Batch().Reader()
		for {
			kind, k, v, ok := r.Next()
			if !ok {
				break
			}
			switch kind {
			case storage.KindSet:
				sets++
				switch {
				case isDataKey(k):
					dataB += len(k) + len(v)
				case bytes.HasPrefix(k, dedupPrefix):
					dedupB += len(k) + len(v)
				default:
					metaB += len(k) + len(v)
				}
			case storage.KindDelete:
				dels++
			case storage.KindLogData:
				logData++
				logB += len(k) + len(v)
			}
		}
	}
	if err := it.Error(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(dataB)/float64(b.N), "data-B/put")
	b.ReportMetric(float64(dedupB)/float64(b.N), "dedup-B/put")
	b.ReportMetric(float64(metaB)/float64(b.N), "meta-B/put")
	b.ReportMetric(float64(logB)/float64(b.N), "logdata-B/put")
	b.ReportMetric(float64(sets)/float64(b.N), "sets/put")
	b.ReportMetric(float64(dels)/float64(b.N), "deletes/put")
	b.ReportMetric(float64(logData)/float64(b.N), "logdata/put")
}
