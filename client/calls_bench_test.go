package client

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// callsKV is the fake KV service with KV.Calls, serving each call's Put
// through the fake's unary Put (other methods are refused).
type callsKV struct{ fakeKVService }

func (k *callsKV) Calls(stream shalev1.KV_CallsServer) error {
	var mu sync.Mutex
	for {
		in, err := stream.Recv()
		if err != nil {
			return nil
		}
		for _, c := range in.GetCalls() {
			go func() {
				r := &shalev1.CallResult{Id: c.GetId()}
				req := &shalev1.PutRequest{}
				if err := codec.Unmarshal(c.GetRequest(), req); err != nil || c.GetMethod() != "Put" {
					r.Code, r.Message = 3, fmt.Sprintf("not a put: %s", c.GetMethod())
				} else if resp, err := k.Put(stream.Context(), req); err != nil {
					r.Code, r.Message = 2, err.Error()
				} else {
					r.Response, _ = codec.Marshal(resp)
				}
				mu.Lock()
				defer mu.Unlock()
				_ = stream.Send(&shalev1.ResultBatch{Results: []*shalev1.CallResult{r}})
			}()
		}
	}
}

// BenchmarkPutCalls measures the SDK's cost of a Put over a KV.Calls
// stream: clients (each its own Client, so its own connection) making one
// put at a time, as shale-bench cluster's simulated clients do. The
// allocations include the in-process fake node's.
func BenchmarkPutCalls(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			// Fixed windows, as shale-server's: no bandwidth-estimator PINGs.
			fc := newFakeClusterWith(b, 1, fakeServerSetup{
				opts: func(*fakeNode) []grpc.ServerOption {
					return []grpc.ServerOption{grpc.InitialWindowSize(DefaultWindowBytes), grpc.InitialConnWindowSize(DefaultConnWindowBytes)}
				},
				kv: func(n *fakeNode) shalev1.KVServer { return &callsKV{fakeKVService{n: n}} },
			})
			cls := make([]*Client, clients)
			for i := range cls {
				cls[i] = fc.client()
				if _, err := cls[i].Put(context.Background(), []byte("k"), []byte("v")); err != nil {
					b.Fatal(err)
				}
			}
			val := make([]byte, 256)
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N / clients
			for i, cl := range cls {
				n := per
				if i == 0 {
					n += b.N % clients
				}
				wg.Go(func() {
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					key := fmt.Appendf(nil, "key%04d", i)
					for range n {
						if _, err := cl.Put(ctx, key, val); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
