package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// BenchmarkGet measures a linearizable get (client and three in-process
// nodes together, one get at a time, of 1,000 keys written first), served
// from the leader's lease as shale-server does by default (lease) and by a
// ReadIndex round per get (readindex); allocations per get are exact where
// the machine's timing is not:
//
//	go test -run '^$' -bench BenchmarkGet -benchtime 5000x -count 3 ./server/
func BenchmarkGet(b *testing.B) {
	for _, lease := range []bool{true, false} {
		name := "readindex"
		if lease {
			name = "lease"
		}
		b.Run(name, func(b *testing.B) { benchGet(b, lease) })
	}
}

func benchGet(b *testing.B, lease bool) {
	c := testcluster.Start(b, testcluster.Options{Configure: func(cfg *server.Config) { cfg.LeaseReads = lease }})
	c.WaitLeaders(20 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl, err := client.New(ctx, c.Endpoints(), client.WithDefaultTimeout(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	value := make([]byte, 256)
	const keys = 1000
	for i := range keys {
		if _, err := cl.Put(ctx, fmt.Appendf(nil, "key%08d", i), value); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		kv, err := cl.Get(ctx, fmt.Appendf(nil, "key%08d", i%keys))
		if err != nil || len(kv.Value) != len(value) {
			b.Fatalf("get %d: %v, %v", i, kv, err)
		}
	}
}
