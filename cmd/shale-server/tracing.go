package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/credentials"
)

// tracingFlags are the OpenTelemetry tracing flags (docs/tracing.md).
type tracingFlags struct {
	endpoint    string
	sampleRatio float64
	insecure    bool
}

// defaultSampleRatio is --tracing-sample-ratio's default.
const defaultSampleRatio = 0.01

// tracerProvider builds the node's tracer provider from the flags, and
// the function that stops it at exit, sending what is still queued (for
// at most 5 s). The provider is nil when --tracing-endpoint is empty
// (tracing off: the node installs nothing). Otherwise spans go, in batches from a background goroutine, to
// the OTLP/gRPC collector at the endpoint; a request whose caller sent a
// trace context follows the caller's sampling decision, and the others are
// sampled at --tracing-sample-ratio. instance names the node in the
// spans' resource (service.instance.id); OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override the resource, and the exporter reads
// the other OTEL_EXPORTER_OTLP_* variables (headers, timeout,
// compression).
func (f tracingFlags) tracerProvider(ctx context.Context, instance string, log *slog.Logger) (trace.TracerProvider, func(), error) {
	if f.endpoint == "" {
		return nil, func() {}, nil
	}
	if f.sampleRatio < 0 || f.sampleRatio > 1 {
		return nil, nil, fmt.Errorf("--tracing-sample-ratio %v: want a number from 0 to 1", f.sampleRatio)
	}
	var opts []otlptracegrpc.Option
	switch {
	case strings.Contains(f.endpoint, "://"):
		// http:// is plaintext, https:// TLS, whatever --tracing-insecure says.
		opts = append(opts, otlptracegrpc.WithEndpointURL(f.endpoint))
	case f.insecure:
		opts = append(opts, otlptracegrpc.WithEndpoint(f.endpoint), otlptracegrpc.WithInsecure())
	default:
		// TLS, with the system's trusted CAs.
		opts = append(opts, otlptracegrpc.WithEndpoint(f.endpoint), otlptracegrpc.WithTLSCredentials(credentials.NewClientTLSFromCert(nil, "")))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("--tracing-endpoint %s: %w", f.endpoint, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "shale-server"), attribute.String("service.instance.id", instance)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, nil, fmt.Errorf("tracing resource: %w", err)
	}
	otel.SetErrorHandler(exportErrorLogger(log, time.Minute))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(f.sampleRatio))),
	)
	log.Info("tracing on", "endpoint", f.endpoint, "sample_ratio", f.sampleRatio)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: spans lost at shutdown", "err", err)
		}
	}
	return tp, stop, nil
}

// exportErrorLogger is OpenTelemetry's error handler for the node: the
// errors (spans the collector did not take, mostly) are logged, at most
// once per interval, with the number left unlogged since.
func exportErrorLogger(log *slog.Logger, interval time.Duration) otel.ErrorHandlerFunc {
	var mu sync.Mutex
	var last time.Time
	var skipped int
	return func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.Sub(last) >= interval {
			log.Warn("tracing: spans not exported", "err", err, "errors_not_logged", skipped)
			last, skipped = now, 0
			return
		}
		skipped++
	}
}
