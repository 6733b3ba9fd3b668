package server

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Tracing (docs/tracing.md). With Config.TracerProvider the node makes a
// server span for every call of the KV, Admin and Auth services but the
// nodes' own housekeeping (untracedMethods), for each call a KV.Calls
// stream carries, and for KV.ScanStream; it joins the caller's trace when
// the call carries a W3C Trace Context (gRPC metadata, or Call.trace_context
// on a KV.Calls stream), and otherwise the provider's sampler decides. A
// call this node makes to another node while serving a traced request (a
// request forwarded to a leader, a question to every node) gets a client
// span and carries the trace on. Replication and the shard engines add
// their spans below (replication.Config.TracerProvider). Without a
// provider none of this is installed.

// tracerName names the node's tracer.
const tracerName = "github.com/shale-db/shale/server"

// Attribute keys of the node's spans.
const (
	attrRPCSystem   = attribute.Key("rpc.system")
	attrRPCService  = attribute.Key("rpc.service")
	attrRPCMethod   = attribute.Key("rpc.method")
	attrGRPCStatus  = attribute.Key("rpc.grpc.status_code")
	attrServerAddr  = attribute.Key("server.address")
	attrNodeID      = attribute.Key("shale.node.id")
	attrShardID     = attribute.Key("shale.shard.id")
	attrKeys        = attribute.Key("shale.request.keys")
	attrKVCalls     = attribute.Key("shale.kv_calls")
	attrForwarded   = attribute.Key("shale.forwarded")
	traceParentKey  = shalev1.TraceParentMetadataKey
	traceStateKey   = shalev1.TraceStateMetadataKey
	tracedStreamKV  = "/shale.v1.KV/ScanStream"
	forwardSpanName = "forward "
)

// untracedMethods are the calls the nodes make among themselves to keep
// the cluster going (every second or so): tracing them would fill the
// traces with housekeeping.
var untracedMethods = map[string]bool{
	"/shale.v1.Admin/Heartbeat":    true,
	"/shale.v1.Admin/ReportShards": true,
	"/shale.v1.Admin/GetAuthState": true,
}

// tracedMethod reports whether the node makes a server span for calls of
// the unary method fullMethod.
func tracedMethod(fullMethod string) bool {
	if untracedMethods[fullMethod] {
		return false
	}
	return strings.HasPrefix(fullMethod, "/shale.v1.KV/") || strings.HasPrefix(fullMethod, "/shale.v1.Admin/") ||
		strings.HasPrefix(fullMethod, "/shale.v1.Auth/")
}

// rpcAttrs are the semantic-convention attributes of a gRPC method
// ("/shale.v1.KV/Put").
func rpcAttrs(fullMethod string) []attribute.KeyValue {
	service, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	return []attribute.KeyValue{attrRPCSystem.String("grpc"), attrRPCService.String(service), attrRPCMethod.String(method)}
}

// incomingTraceContext is the W3C Trace Context of an incoming call's
// metadata (nil when it has none).
func incomingTraceContext(ctx context.Context) propagation.MapCarrier {
	tp := metadata.ValueFromIncomingContext(ctx, traceParentKey)
	if len(tp) == 0 {
		return nil
	}
	tc := propagation.MapCarrier{traceParentKey: tp[0]}
	if ts := metadata.ValueFromIncomingContext(ctx, traceStateKey); len(ts) > 0 {
		tc[traceStateKey] = strings.Join(ts, ",")
	}
	return tc
}

// startServerSpan starts the server span of a call of fullMethod whose
// caller's trace context is tc (nil: none).
func (n *Node) startServerSpan(ctx context.Context, fullMethod string, tc propagation.MapCarrier, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if tc != nil {
		ctx = propagation.TraceContext{}.Extract(ctx, tc)
	}
	attrs = append(append(rpcAttrs(fullMethod), attrNodeID.Int64(int64(n.cfg.NodeID))), attrs...)
	return n.tracer.Start(ctx, strings.TrimPrefix(fullMethod, "/"), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// endServerSpan ends a server span with the call's outcome. As the
// OpenTelemetry conventions for gRPC servers have it, only the codes that
// say the server failed mark the span an error; a refusal the client can
// act on (NotLeader, InvalidArgument, NotFound, ...) does not.
func endServerSpan(sp trace.Span, err error) {
	code := status.Code(err)
	sp.SetAttributes(attrGRPCStatus.Int(int(code)))
	switch code {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		sp.SetStatus(otelcodes.Error, err.Error())
	}
	sp.End()
}

// traceUnaryInterceptor makes the server span of a unary call.
func (n *Node) traceUnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !tracedMethod(info.FullMethod) {
		return handler(ctx, req)
	}
	ctx, sp := n.startServerSpan(ctx, info.FullMethod, incomingTraceContext(ctx))
	resp, err := handler(ctx, req)
	endServerSpan(sp, err)
	return resp, err
}

// traceStreamInterceptor makes the server span of a KV.ScanStream call.
// Other streams get none: a Watch lives for hours, KV.Calls gets one span
// per call (serveCall), and the nodes' own streams are Raft traffic and
// backups.
func (n *Node) traceStreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != tracedStreamKV {
		return handler(srv, ss)
	}
	ctx, sp := n.startServerSpan(ss.Context(), info.FullMethod, incomingTraceContext(ss.Context()))
	err := handler(srv, &tracedServerStream{ServerStream: ss, ctx: ctx})
	endServerSpan(sp, err)
	return err
}

// tracedServerStream is a server stream whose context holds its span.
type tracedServerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedServerStream) Context() context.Context { return s.ctx }

// startCallSpan starts the server span of a call of method that a KV.Calls
// stream carries (nil span when the node does not trace).
func (n *Node) startCallSpan(ctx context.Context, method string, c *shalev1.Call) (context.Context, trace.Span) {
	if n.tracer == nil {
		return ctx, nil
	}
	var tc propagation.MapCarrier
	if m := c.GetTraceContext(); len(m) > 0 {
		tc = m
	}
	return n.startServerSpan(ctx, "/shale.v1.KV/"+method, tc, attrKVCalls.Bool(true))
}

// tracePeerInterceptor traces the unary calls this node makes to other
// nodes: under a recording span (a traced request being served) the call
// gets a client span, named "forward <method>" when the request is
// forwarded to the node that can serve it, and the call carries the trace
// context; otherwise it carries the trace context it has, if any, so that
// a request the node did not sample is not sampled anew by the next.
func (n *Node) tracePeerInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		if parent.SpanContext().IsValid() {
			ctx = injectTraceContext(ctx)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	fwd := len(metadata.ValueFromOutgoingContext(ctx, forwardedKey)) > 0
	name := strings.TrimPrefix(method, "/")
	if fwd {
		name = forwardSpanName + name
	}
	attrs := append(rpcAttrs(method), attrServerAddr.String(cc.Target()), attrForwarded.Bool(fwd), attrNodeID.Int64(int64(n.cfg.NodeID)))
	ctx, sp := n.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	err := invoker(injectTraceContext(ctx), method, req, reply, cc, opts...)
	sp.SetAttributes(attrGRPCStatus.Int(int(status.Code(err))))
	if err != nil {
		sp.SetStatus(otelcodes.Error, err.Error())
	}
	sp.End()
	return err
}

// injectTraceContext adds ctx's W3C Trace Context to its outgoing
// metadata.
func injectTraceContext(ctx context.Context) context.Context {
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, tc)
	kv := make([]string, 0, 2*len(tc))
	for k, v := range tc {
		kv = append(kv, k, v)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// traceRequest records on a traced request's server span the shard it was
// routed to and how many keys (and ranges) its operations and compares
// name.
func (n *Node) traceRequest(ctx context.Context, shardID uint64, keys int) {
	if n.tracer == nil {
		return
	}
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(attrShardID.Int64(int64(shardID)), attrKeys.Int(keys))
	}
}

// serverTraceOptions are the interceptors of the node's gRPC server that
// trace its calls (none when the node does not trace). They come first, so
// that a span covers everything its call goes through.
func (n *Node) serverTraceOptions() []grpc.ServerOption {
	if n.tracer == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(n.traceUnaryInterceptor), grpc.ChainStreamInterceptor(n.traceStreamInterceptor)}
}

// peerTraceOptions are the dial options that trace the node's calls to
// other nodes (none when the node does not trace).
func (n *Node) peerTraceOptions() []grpc.DialOption {
	if n.tracer == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(n.tracePeerInterceptor)}
}
