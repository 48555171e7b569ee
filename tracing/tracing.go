// Package tracing sets up OpenTelemetry traces from the standard environment variables and
// holds the attribute names the proxy's spans use. See ADR 0061.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	// Exporters names where spans go, for the start-up log: "otlp", "console" or both.
	Exporters string
	provider  *sdktrace.TracerProvider
}

// Shutdown exports the spans still buffered, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Enabled reports whether the environment asks for traces: OTEL_SDK_DISABLED is not true,
// and OTEL_TRACES_EXPORTER names console, or names otlp (the default) with an OTLP endpoint
// set (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	otlp, console, _ := exporters(getenv)
	return otlp || console
}

// exporters reads OTEL_TRACES_EXPORTER, a comma-separated list: otlp (the default; only
// with an endpoint set), console (one line per span on standard output, see console) or
// none. Another name is an error rather than no traces.
func exporters(getenv func(string) string) (otlp, console bool, err error) {
	list := getenv("OTEL_TRACES_EXPORTER")
	if strings.TrimSpace(list) == "" {
		list = "otlp"
	}
	for _, name := range strings.Split(list, ",") {
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "none":
			return false, false, nil
		case "otlp":
			otlp = getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
		case "console":
			console = true
		default:
			err = &EnvError{Name: "OTEL_TRACES_EXPORTER", Rule: fmt.Sprintf("%q is not supported: use otlp, console or none (or a list: otlp,console)", strings.TrimSpace(name))}
		}
	}
	return otlp, console, err
}

// protocol is the OTLP protocol the environment names: http/protobuf (the default) or grpc.
func protocol(getenv func(string) string) (string, error) {
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	p := getenv(name)
	if p == "" {
		name = "OTEL_EXPORTER_OTLP_PROTOCOL"
		p = getenv(name)
	}
	switch p {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return "grpc", nil
	}
	return "", &EnvError{Name: name, Rule: fmt.Sprintf("%q is not supported: use http/protobuf or grpc", p)}
}

// New returns the tracing the environment asks for, or nil when it asks for none (see
// Enabled); an OTEL_* value it cannot use is an error (see Check). The exporters (OTLP;
// console, to standard output), the sampler (OTEL_TRACES_SAMPLER, default
// parentbased_always_on), the batch processor (OTEL_BSP_*) and the resource
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) read their own variables; version is
// service.version.
func New(ctx context.Context, version string) (*Tracing, error) {
	return newTracing(ctx, version, os.Getenv, os.Stdout)
}

func newTracing(ctx context.Context, version string, getenv func(string) string, stdout io.Writer) (*Tracing, error) {
	if err := Check(getenv); err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	useOTLP, useConsole, _ := exporters(getenv)
	var opts []sdktrace.TracerProviderOption
	var names []string
	if useConsole {
		names = append(names, "console")
		// Each span written as it ends: a reader watching the lines sees a request's span
		// when its answer is out, not after a batch delay.
		opts = append(opts, sdktrace.WithSyncer(&console{w: stdout}))
	}
	if useOTLP {
		proto, _ := protocol(getenv)
		var exp sdktrace.SpanExporter
		var err error
		if proto == "grpc" {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
		names = append(names, "otlp")
	}
	if len(opts) == 0 {
		return nil, nil
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
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	return &Tracing{
		Tracer: tp.Tracer(Name, trace.WithInstrumentationVersion(version)),
		// W3C trace context only: a client's baggage header goes upstream with its other
		// headers already.
		Propagator: propagation.TraceContext{},
		Exporters:  strings.Join(names, ","),
		provider:   tp,
	}, nil
}
