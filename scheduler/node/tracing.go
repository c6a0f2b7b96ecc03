package node

import (
	"context"
	"fmt"
	"net/url"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/scheduler/config"
)

// tracing is the process's trace pipeline: nil when tracing is off.
type tracing struct {
	tp *sdktrace.TracerProvider
}

// newTracing builds the tracer provider for cfg.Tracing: spans batched to
// the OTLP/HTTP exporter of tracing.endpoint, or to exp when set (tests).
// Off (nil) when neither is set.
func newTracing(cfg config.Tracing, exp sdktrace.SpanExporter) (*tracing, error) {
	if cfg.Endpoint == "" && exp == nil {
		return nil, nil
	}
	if exp == nil {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("tracing.endpoint: %w", err)
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host)}
		if u.Scheme == "http" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		if u.Path != "" && u.Path != "/" {
			opts = append(opts, otlptracehttp.WithURLPath(u.Path))
		}
		// New only configures: the first export opens the connection, so
		// a collector that is down costs dropped spans, never a start-up.
		if exp, err = otlptracehttp.New(context.Background(), opts...); err != nil {
			return nil, fmt.Errorf("tracing exporter: %w", err)
		}
	}
	ratio := cfg.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	name := cfg.ServiceName
	if name == "" {
		name = "sluice"
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		// A client's sampled flag decides for its trace; new traces are
		// sampled at sample_ratio.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
	)
	return &tracing{tp: tp}, nil
}

// tracer is the scheduler's tracer; nil when tracing is off.
func (t *tracing) tracer() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tp.Tracer("github.com/sluicehq/sluice/scheduler")
}

// shutdown exports the spans still batched, within ctx.
func (t *tracing) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}
