package proxy

import (
	"io"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/tracing"
)

// tracedTransport gives each passed-through or bypassing upstream call a client span,
// child of its request's server span, whose context goes upstream in traceparent; the
// span ends with the answer's body. Deduplicated calls have theirs in startCall. ADR 0061.
type tracedTransport struct {
	next http.RoundTripper
	t    *tracing.Tracing
}

func (tt tracedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, span := tt.t.Tracer.Start(r.Context(), r.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.HTTPRequestMethodKey.String(r.Method), semconv.ServerAddress(r.URL.Hostname()), semconv.URLPath(r.URL.Path)))
	if port, err := strconv.Atoi(r.URL.Port()); err == nil {
		span.SetAttributes(semconv.ServerPort(port))
	}
	out := r.Clone(ctx) // a RoundTripper does not change the request it is given
	out.Header.Del("Traceparent")
	out.Header.Del("Tracestate")
	tt.t.Propagator.Inject(ctx, propagation.HeaderCarrier(out.Header))
	resp, err := tt.next.RoundTrip(out)
	if err != nil {
		span.RecordError(redactErr(err))
		span.SetStatus(codes.Error, "no response")
		span.End()
		return nil, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		span.End() // the body is the upgraded connection: left as it is
		return resp, nil
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
	return resp, nil
}

// spanBody ends a call's span when its answer's body is closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.span.End() })
	return err
}
