// Package tracing sets up OpenTelemetry traces from the standard environment variables and
// holds the attribute names the proxy's spans use. See ADR 0061.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of every span the proxy makes, and the service name
// when OTEL_SERVICE_NAME does not say one.
const Name = "llm-dedupe-proxy"

// Tracing is what the proxy traces with: nil when tracing is off, and then nothing is
// traced, extracted or injected.
type Tracing struct {
	Tracer     trace.Tracer
	Propagator propagation.TextMapPropagator
	provider   *sdktrace.TracerProvider
}

// Shutdown exports the spans still buffered, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Enabled reports whether the environment asks for traces: an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_SDK_DISABLED is
// not true and OTEL_TRACES_EXPORTER is not none.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// protocol is the OTLP protocol the environment names: http/protobuf (the default) or grpc.
func protocol(getenv func(string) string) (string, error) {
	p := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if p == "" {
		p = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch p {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return "grpc", nil
	}
	return "", fmt.Errorf("tracing: OTLP protocol %q is not supported: use http/protobuf or grpc", p)
}

// New returns the tracing the environment asks for, or nil when it asks for none (see
// Enabled). The exporter, the sampler (OTEL_TRACES_SAMPLER, default parentbased_always_on),
// the batch processor (OTEL_BSP_*) and the resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES) read their own variables; version is service.version.
func New(ctx context.Context, version string) (*Tracing, error) {
	if !Enabled(os.Getenv) {
		return nil, nil
	}
	proto, err := protocol(os.Getenv)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if proto == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	host, _ := os.Hostname()
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(Name), semconv.ServiceVersion(version),
			semconv.ServiceInstanceID(fmt.Sprintf("%s-%d", host, os.Getpid()))),
		resource.WithHost(), resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{
		Tracer: tp.Tracer(Name, trace.WithInstrumentationVersion(version)),
		// W3C trace context only: a client's baggage header goes upstream with its other
		// headers already.
		Propagator: propagation.TraceContext{},
		provider:   tp,
	}, nil
}
