package shard

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage"
)

// BenchmarkApplyPut applies single-put Txn commands, as the server proposes
// a client's put (a fresh 16-byte request ID, marked a first attempt), one
// entry per Apply call: 10-byte keys drawn from 100,000, 256-byte values,
// on an in-memory filesystem. Besides time and allocations it reports what
// one applied put costs the shard engine's WAL, read back from it: records
// by kind and bytes (issue 21's lean apply is measured against these).
func BenchmarkApplyPut(b *testing.B) {
	env := newTestEnv(b, nil)
	env.keepWAL = true
	s := env.bootstrap("shard", userDesc(2, "", ""), 100_000)
	f := newFeeder(s)
	value := strings.Repeat("v", 256)
	rng := rand.New(rand.NewPCG(1, 2))
	start := s.db.Metrics().WALBytes
	seq0 := s.db.LastSeq() + 1
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := make([]byte, 16)
		for j := range id {
			id[j] = byte(rng.Uint32())
		}
		cmd := txnCmd(int64(i+1), &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(fmt.Sprintf("k%09d", rng.IntN(100_000)), value, 0, false)}})
		cmd.RequestId, cmd.FirstAttempt = id, true
		if _, err := s.Apply([]replication.Entry{f.entry(marshalCmd(b, cmd))}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(s.db.Metrics().WALBytes-start)/float64(b.N), "wal-B/put")
	it, err := s.db.UpdatesSince(seq0)
	if err != nil {
		b.Fatal(err)
	}
	defer it.Close()
	var sets, dels, logData, batches int
	for it.Next() {
		batches++
		r := it.Batch().Reader()
		for {
			kind, _, _, ok := r.Next()
			if !ok {
				break
			}
			switch kind {
			case storage.KindSet:
				sets++
			case storage.KindDelete:
				dels++
			case storage.KindLogData:
				logData++
			}
		}
	}
	if err := it.Error(); err != nil {
		b.Fatal(err)
	}
	if batches > 0 {
		b.ReportMetric(float64(sets)/float64(batches), "sets/put")
		b.ReportMetric(float64(dels)/float64(batches), "deletes/put")
		b.ReportMetric(float64(logData)/float64(batches), "logdata/put")
	}
}
