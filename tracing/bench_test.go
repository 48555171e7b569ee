package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkSpanFloor is what the SDK and the OTLP/HTTP exporter cost for one span shaped
// as a hit's server span (nine attributes, a link), with nothing of the proxy around it:
// the floor under what tracing every request adds to the hit path. See ADR 0061.
func BenchmarkSpanFloor(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer sink.Close()
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
	b.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	tr, err := New(context.Background(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()
	origin := Origin{Span: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: 1}), Attempt: 1}
	kind := trace.WithSpanKind(trace.SpanKindServer)
	b.ReportAllocs()
	for b.Loop() {
		_, span := tr.Tracer.Start(context.Background(), "POST /v1/chat/completions", kind)
		span.SetAttributes(attribute.String("http.request.method", "POST"), attribute.Int("http.response.status_code", 200),
			Role.String("hit"), attribute.String("http.route", "/v1/chat/completions"), GenAIOperation.String("chat"),
			KeyPrefix.String("0123456789ab"), GenAIRequestModel.String("gpt-4o"), Attempt.Int(1))
		span.AddLink(LinkTo(origin, true))
		span.End()
	}
}
