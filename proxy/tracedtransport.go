package proxy

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
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
	attrs := append(serverAttrs(r.URL), semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path))
	ctx, span := tt.t.Tracer.Start(r.Context(), r.Method, clientKind, trace.WithAttributes(attrs...))
	out := r.Clone(ctx) // a RoundTripper does not change the request it is given
	sendTrace(tt.t, ctx, out.Header)
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

// serverAttrs are server.address and server.port of an upstream URL.
func serverAttrs(u *url.URL) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 1, 5)
	attrs[0] = semconv.ServerAddress(u.Hostname())
	if port, err := strconv.Atoi(u.Port()); err == nil {
		attrs = append(attrs, semconv.ServerPort(port))
	}
	return attrs
}

// sendTrace puts the trace context of ctx's span in an upstream request's headers, in
// place of the client's.
func sendTrace(t *tracing.Tracing, ctx context.Context, h http.Header) {
	h.Del("Traceparent")
	h.Del("Tracestate")
	t.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}
