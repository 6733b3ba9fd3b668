package server

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcMetrics are a node's gRPC server metrics (grpc_server_*, listed in
// docs/shale-server.md): the names, help, labels, buckets and zero-valued
// series that go-grpc-middleware's Prometheus provider exported, counted
// with each method's series looked up once instead of on every message.
// The provider hashed the labels and looked the series up for each message
// of a stream (and read the clock twice for a duration it did not use): on
// KV.Calls streams, which carry a message each way per call at 256
// clients, that was 1.6-1.7% of a loaded node's CPU.
type grpcMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	handling                         *prometheus.HistogramVec

	// methods holds a *methodMetrics for every full method name that has
	// been initialized or called; an entry never changes once stored.
	methods sync.Map
}

// methodMetrics are the series of one method.
type methodMetrics struct {
	started, received, sent prometheus.Counter
	handling                prometheus.Observer
	handled                 [codes.Unauthenticated + 1]prometheus.Counter
}

func newGRPCMetrics() *grpcMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	return &grpcMetrics{
		started: counter("grpc_server_started_total", "Total number of RPCs started on the server.", labels...),
		handled: counter("grpc_server_handled_total", "Total number of RPCs completed on the server, regardless of success or failure.",
			append(labels[:3:3], "grpc_code")...),
		received: counter("grpc_server_msg_received_total", "Total number of RPC stream messages received on the server.", labels...),
		sent:     counter("grpc_server_msg_sent_total", "Total number of gRPC stream messages sent by the server.", labels...),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: prometheus.DefBuckets,
		}, labels),
	}
}

// Describe implements prometheus.Collector.
func (g *grpcMetrics) Describe(ch chan<- *prometheus.Desc) {
	g.started.Describe(ch)
	g.handled.Describe(ch)
	g.received.Describe(ch)
	g.sent.Describe(ch)
	g.handling.Describe(ch)
}

// Collect implements prometheus.Collector.
func (g *grpcMetrics) Collect(ch chan<- prometheus.Metric) {
	g.started.Collect(ch)
	g.handled.Collect(ch)
	g.received.Collect(ch)
	g.sent.Collect(ch)
	g.handling.Collect(ch)
}

// initialize makes the zero-valued series of every method of s's
// services, so that they are exported before their first call.
func (g *grpcMetrics) initialize(s *grpc.Server) {
	for service, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			g.method("/"+service+"/"+m.Name, grpcType(m.IsClientStream, m.IsServerStream))
		}
	}
}

// grpcType is a method's grpc_type label.
func grpcType(clientStream, serverStream bool) string {
	switch {
	case clientStream && serverStream:
		return "bidi_stream"
	case clientStream:
		return "client_stream"
	case serverStream:
		return "server_stream"
	}
	return "unary"
}

// method returns the series of fullMethod, of type typ, making them on
// its first use. A name without a service is labeled unknown/unknown.
func (g *grpcMetrics) method(fullMethod, typ string) *methodMetrics {
	if m, ok := g.methods.Load(fullMethod); ok {
		return m.(*methodMetrics)
	}
	service, name, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		service, name = "unknown", "unknown"
	}
	m := &methodMetrics{
		started:  g.started.WithLabelValues(typ, service, name),
		received: g.received.WithLabelValues(typ, service, name),
		sent:     g.sent.WithLabelValues(typ, service, name),
		handling: g.handling.WithLabelValues(typ, service, name),
	}
	for c := range m.handled {
		m.handled[c] = g.handled.WithLabelValues(typ, service, name, codes.Code(c).String())
	}
	got, _ := g.methods.LoadOrStore(fullMethod, m)
	return got.(*methodMetrics)
}

// done counts a call (or stream) that started at start and ended with err.
func (m *methodMetrics) done(start time.Time, err error) {
	code := codes.OK
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err)
		}
		code = st.Code()
	}
	if int(code) < len(m.handled) {
		m.handled[code].Inc()
	}
	m.handling.Observe(time.Since(start).Seconds())
}

// unaryInterceptor counts unary calls: started, one message received, one
// sent if the call succeeded, handled by code, and the handling time.
func (g *grpcMetrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	m := g.method(info.FullMethod, "unary")
	m.started.Inc()
	m.received.Inc()
	resp, err := handler(ctx, req)
	if err == nil {
		m.sent.Inc()
	}
	m.done(start, err)
	return resp, err
}

// streamInterceptor counts streams (started, handled by code, handling
// time) and the messages each receives and sends.
func (g *grpcMetrics) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	m := g.method(info.FullMethod, grpcType(info.IsClientStream, info.IsServerStream))
	m.started.Inc()
	err := handler(srv, &countedStream{ServerStream: ss, m: m})
	m.done(start, err)
	return err
}

// countedStream counts a stream's messages received and sent.
type countedStream struct {
	grpc.ServerStream
	m *methodMetrics
}

func (s *countedStream) RecvMsg(msg any) error {
	err := s.ServerStream.RecvMsg(msg)
	if err == nil {
		s.m.received.Inc()
	}
	return err
}

func (s *countedStream) SendMsg(msg any) error {
	err := s.ServerStream.SendMsg(msg)
	if err == nil {
		s.m.sent.Inc()
	}
	return err
}
