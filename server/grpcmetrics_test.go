package server

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// TestGRPCMetrics: the grpc_server_* series are made at zero for every
// method of the server's services (handled for every code), and count a
// unary call (a message each way, none sent on an error), a stream's
// messages each way, the code each ended with and its handling time.
func TestGRPCMetrics(t *testing.T) {
	m := newGRPCMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(m.unaryInterceptor), grpc.ChainStreamInterceptor(m.streamInterceptor))
	hs := health.NewServer()
	hs.SetServingStatus("up", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	m.initialize(srv)

	// series gathers the registry: each series' value (a histogram's
	// count) by metric name (less grpc_server_), type, method and code.
	series := func() map[string]float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range s.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				if l["grpc_service"] != "grpc.health.v1.Health" {
					t.Fatalf("%s: labels %v", mf.GetName(), l)
				}
				k := strings.Join([]string{strings.TrimPrefix(mf.GetName(), "grpc_server_"), l["grpc_type"], l["grpc_method"]}, " ")
				if c, ok := l["grpc_code"]; ok {
					k += " " + c
				}
				if h := s.GetHistogram(); h != nil {
					out[k] = float64(h.GetSampleCount())
				} else {
					out[k] = s.GetCounter().GetValue()
				}
			}
		}
		return out
	}
	before := series()
	for k, v := range before {
		if v != 0 {
			t.Errorf("%s: %v before any call", k, v)
		}
	}
	for _, k := range []string{"started_total unary Check", "msg_received_total unary Check", "msg_sent_total server_stream Watch",
		"handled_total unary Check Unauthenticated", "handled_total server_stream Watch OK", "handling_seconds unary Check"} {
		if _, ok := before[k]; !ok {
			t.Errorf("no series %q before any call", k)
		}
	}

	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx := context.Background()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "up"}); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "absent"}); status.Code(err) != codes.NotFound {
		t.Fatalf("check of an absent service: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: "up"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	hs.SetServingStatus("up", healthpb.HealthCheckResponse_NOT_SERVING)
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	srv.GracefulStop() // waits for the watch's handler to return and be counted

	got := series()
	for k, want := range map[string]float64{
		"started_total unary Check": 2, "msg_received_total unary Check": 2, "msg_sent_total unary Check": 1,
		"handled_total unary Check OK": 1, "handled_total unary Check NotFound": 1, "handling_seconds unary Check": 2,
		"started_total server_stream Watch": 1, "msg_received_total server_stream Watch": 1,
		"msg_sent_total server_stream Watch": 2, "handled_total server_stream Watch Canceled": 1,
		"handling_seconds server_stream Watch": 1,
	} {
		if got[k] != want {
			t.Errorf("%s: %v, want %v", k, got[k], want)
		}
	}
	if len(got) != len(before) {
		t.Errorf("%d series after the calls, %d before", len(got), len(before))
	}
}
