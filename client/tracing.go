package client

import (
	"context"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Tracing (docs/client.md, "Tracing"; docs/tracing.md). Every call carries
// the W3C Trace Context of the span in its context, if there is one, to
// the node it reaches: in the gRPC metadata of a unary call or stream, in
// Call.trace_context on a KV.Calls stream. The node's spans then join the
// caller's trace. With WithTracerProvider the client also makes spans of
// its own: one per call (shale.client.<op>) and, below it, one per
// attempt, named after the gRPC method, which is the parent of the node's
// spans.

// tracerName names the SDK's tracer.
const tracerName = "github.com/shale-db/shale/client"

// WithTracerProvider makes the client trace its calls with tp: each call
// (Get, Put, Txn, SplitShard, ...) gets a span named shale.client.<op>
// ("shale.client.put"), and each attempt of it, one RPC to one node, a
// child client span named after the gRPC method ("shale.v1.KV/Put") with
// the node's address and ID, whose trace context the node receives. A
// call whose context holds a span becomes its child; tp's sampler decides
// for the others. Without this option (or with nil) the client makes no
// span, and still passes on the trace context of the caller's span.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) {
		o.tracer = nil
		if tp != nil {
			o.tracer = tp.Tracer(tracerName)
		}
	}
}

// startCall starts the span of a call (op) when the client traces (nil
// span otherwise); endCall ends it.
func (c *Client) startCall(ctx context.Context, op string) (context.Context, trace.Span) {
	if c.opts.tracer == nil {
		return ctx, nil
	}
	return c.opts.tracer.Start(ctx, "shale.client."+op)
}

// endCall ends a call's span (nil: none) with the call's outcome.
func endCall(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// traceContext is the W3C Trace Context of ctx's span (nil when ctx holds
// none).
func traceContext(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, tc)
	return tc
}

// withTraceMetadata adds the trace context tc to ctx's outgoing metadata.
func withTraceMetadata(ctx context.Context, tc map[string]string) context.Context {
	kv := make([]string, 0, 2*len(tc))
	for k, v := range tc {
		kv = append(kv, k, v)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// traceUnary is the outermost unary interceptor of every connection: under
// a recording span of a client that traces, the RPC gets its client span;
// the RPC carries the trace context of its context's span, if any.
func (c *Client) traceUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if c.opts.tracer == nil || !parent.IsRecording() {
		return invoker(withTraceMetadata(ctx, traceContext(ctx)), method, req, reply, cc, opts...)
	}
	service, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	attrs := []attribute.KeyValue{
		attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", service), attribute.String("rpc.method", name),
		attribute.String("server.address", cc.Target()),
	}
	if v := metadata.ValueFromOutgoingContext(ctx, shalev1.TargetNodeMetadataKey); len(v) > 0 {
		if id, err := strconv.ParseUint(v[0], 10, 64); err == nil {
			attrs = append(attrs, attribute.Int64("shale.node.id", int64(id)))
		}
	}
	ctx, sp := c.opts.tracer.Start(ctx, strings.TrimPrefix(method, "/"), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	err := invoker(withTraceMetadata(ctx, traceContext(ctx)), method, req, reply, cc, opts...)
	sp.SetAttributes(attribute.Int("rpc.grpc.status_code", int(status.Code(err))))
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
	return err
}

// traceStream makes a stream (a scan page, a watch) carry the trace
// context of its context's span, if any.
func traceStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if tc := traceContext(ctx); tc != nil {
		ctx = withTraceMetadata(ctx, tc)
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// traceInterceptors are the tracing interceptors of every connection,
// outermost.
func (c *Client) traceInterceptors() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.traceUnary), grpc.WithChainStreamInterceptor(traceStream)}
}
