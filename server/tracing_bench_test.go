package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// BenchmarkTracingPut measures what tracing costs a put (client and three
// in-process nodes together, one put at a time): with tracing off, and with
// every node sampling 1% of the requests that come without a trace
// context (--tracing-sample-ratio 0.01), exporting through a batcher to
// an exporter that drops the spans. Allocations per put are exact where
// the machine's timing is not:
//
//	go test -run '^$' -bench BenchmarkTracingPut -benchtime 3000x -count 3 ./server/
func BenchmarkTracingPut(b *testing.B) {
	for _, mode := range []struct {
		name  string
		ratio float64 // 0: off
	}{{"off", 0}, {"ratio-0.01", 0.01}} {
		b.Run(mode.name, func(b *testing.B) {
			c := testcluster.Start(b, testcluster.Options{Configure: func(cfg *server.Config) {
				if mode.ratio > 0 {
					tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()),
						sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(mode.ratio))))
					b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
					cfg.TracerProvider = tp
				}
			}})
			c.WaitLeaders(20 * time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cl, err := client.New(ctx, c.Endpoints(), client.WithDefaultTimeout(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			value := make([]byte, 256)
			for i := range 200 { // warm the routes and connections
				if _, err := cl.Put(ctx, fmt.Appendf(nil, "warm%03d", i), value); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := cl.Put(ctx, fmt.Appendf(nil, "key%08d", i), value); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
