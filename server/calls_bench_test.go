package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
)

// BenchmarkCallsWrites measures a write of each kind the SDK sends over
// KV.Calls (client and three in-process nodes together, one write at a
// time): a put of a new key, a delete of a key written before the timer
// starts, and a compare-and-swap that creates a new key (ExpectAbsent).
// Allocations per write are exact where the machine's timing is not:
//
//	go test -run '^$' -bench BenchmarkCallsWrites -benchtime 3000x -count 3 ./server/
func BenchmarkCallsWrites(b *testing.B) {
	value := make([]byte, 256)
	for _, w := range []struct {
		name string
		// prepare runs before the timer starts, write on it, for the i-th
		// write.
		prepare, write func(ctx context.Context, cl *client.Client, key []byte) error
	}{
		{name: "put", write: func(ctx context.Context, cl *client.Client, key []byte) error {
			_, err := cl.Put(ctx, key, value)
			return err
		}},
		{name: "delete", prepare: func(ctx context.Context, cl *client.Client, key []byte) error {
			_, err := cl.Put(ctx, key, value)
			return err
		}, write: func(ctx context.Context, cl *client.Client, key []byte) error {
			r, err := cl.Delete(ctx, key)
			if err == nil && !r.Deleted {
				err = fmt.Errorf("delete of %q deleted nothing", key)
			}
			return err
		}},
		{name: "cas", write: func(ctx context.Context, cl *client.Client, key []byte) error {
			ok, _, err := cl.CompareAndSwap(ctx, key, nil, value, client.ExpectAbsent())
			if err == nil && !ok {
				err = fmt.Errorf("compare-and-swap of absent %q failed", key)
			}
			return err
		}},
	} {
		b.Run(w.name, func(b *testing.B) {
			c := testcluster.Start(b, testcluster.Options{})
			c.WaitLeaders(20 * time.Second)
			cl := newClient(b, c)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for i := range 200 { // warm the routes and connections
				if _, err := cl.Put(ctx, fmt.Appendf(nil, "warm%03d", i), value); err != nil {
					b.Fatal(err)
				}
			}
			if w.prepare != nil {
				for i := range b.N {
					if err := w.prepare(ctx, cl, fmt.Appendf(nil, "key%08d", i)); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := w.write(ctx, cl, fmt.Appendf(nil, "key%08d", i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
