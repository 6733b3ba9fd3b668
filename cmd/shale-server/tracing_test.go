package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/freeport"
)

// fakeCollector is an OTLP/gRPC trace receiver that keeps what it gets.
type fakeCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.ResourceSpans
}

func (c *fakeCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spans = append(c.spans, req.GetResourceSpans()...)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// collectedSpan is a span the collector got, with its resource's
// attributes.
type collectedSpan struct {
	span     *tracepb.Span
	resource map[string]string
}

func (c *fakeCollector) received() []collectedSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []collectedSpan
	for _, rs := range c.spans {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				out = append(out, collectedSpan{span: sp, resource: res})
			}
		}
	}
	return out
}

// TestTracingFlagsExportSpans runs shale-server with --tracing-endpoint
// pointing at an OTLP receiver and --tracing-sample-ratio 1: one put's
// spans (its handler, the Raft proposal, apply and engine write) reach
// the receiver in one trace by the time the node has stopped, with the
// node's resource.
func TestTracingFlagsExportSpans(t *testing.T) {
	col := &fakeCollector{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, col)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	ports, err := freeport.Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--data-dir", filepath.Join(t.TempDir(), "n1"), "--node-id", "1", "--listen", addr,
		"--initial-cluster", "1=" + addr, "--shutdown-drain-timeout", "-1s", "--log-level", "error",
		"--tracing-endpoint", lis.Addr().String(), "--tracing-sample-ratio", "1"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	cl, err := client.New(cctx, []string{addr})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if _, err := cl.Put(cctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shale-server: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("shale-server did not stop")
	}

	spans := col.received()
	var put collectedSpan
	for _, s := range spans {
		if s.span.GetName() == "shale.v1.KV/Put" && s.span.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
			put = s
		}
	}
	if put.span == nil {
		t.Fatalf("no shale.v1.KV/Put server span among the %d spans received", len(spans))
	}
	if put.resource["service.name"] != "shale-server" || put.resource["service.instance.id"] != addr {
		t.Errorf("the spans' resource is %v, want service.name shale-server and service.instance.id %s", put.resource, addr)
	}
	trace := hex.EncodeToString(put.span.GetTraceId())
	inTrace := map[string]bool{}
	for _, s := range spans {
		if hex.EncodeToString(s.span.GetTraceId()) == trace {
			inTrace[s.span.GetName()] = true
		}
	}
	for _, name := range []string{"shale.raft.propose", "shale.raft.apply", "shale.engine.write"} {
		if !inTrace[name] {
			t.Errorf("no %s span in the put's trace; it has %v", name, inTrace)
		}
	}
}

// TestTracingFlags: no endpoint, no provider (tracing off); a ratio
// outside [0, 1] is refused.
func TestTracingFlags(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	tp, stop, err := tracingFlags{sampleRatio: defaultSampleRatio, insecure: true}.tracerProvider(context.Background(), "a", log)
	if err != nil || tp != nil {
		t.Fatalf("without an endpoint: provider %v, error %v; want none", tp, err)
	}
	stop()
	_, _, err = tracingFlags{endpoint: "127.0.0.1:4317", sampleRatio: 1.5, insecure: true}.tracerProvider(context.Background(), "a", log)
	if err == nil || !strings.Contains(err.Error(), "--tracing-sample-ratio") {
		t.Fatalf("ratio 1.5: error %v, want one naming --tracing-sample-ratio", err)
	}
}

// TestExportErrorLogger: export errors are logged at most once per
// interval, with the count of those not logged.
func TestExportErrorLogger(t *testing.T) {
	var buf bytes.Buffer
	h := exportErrorLogger(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	for range 3 {
		h(fmt.Errorf("collector down"))
	}
	if n := strings.Count(buf.String(), "spans not exported"); n != 1 {
		t.Fatalf("3 errors within the interval logged %d times, want 1:\n%s", n, buf.String())
	}
}
