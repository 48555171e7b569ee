package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/tracing"
)

// Spans (ADR 0061): a server span per request, honouring the client's traceparent, and a
// client span per upstream call of a flight, whose context goes upstream in traceparent
// and travels with the answer (Head.Origin), so that every follower and hit links to it.
// With Config.Tracing nil, none of this runs.

// Span options made once: an option is an interface value, allocated when made.
var (
	serverKind = trace.WithSpanKind(trace.SpanKindServer)
	clientKind = trace.WithSpanKind(trace.SpanKindClient)
)

// startSpan starts a request's server span, a child of the trace the request names. Its
// attributes are set once, when it ends.
func (p *Proxy) startSpan(r *http.Request, route string) (*http.Request, trace.Span) {
	t := p.cfg.Tracing
	ctx := t.Propagator.Extract(r.Context(), canonicalCarrier(r.Header))
	name := r.Method
	if route != "passthrough" {
		name += " " + route
	}
	ctx, span := t.Tracer.Start(ctx, name, serverKind)
	return r.WithContext(ctx), span
}

// endSpan ends a request's server span with what the request learnt: its role, key and
// model, and a link to the upstream call that made its answer when another request's did.
func endSpan(span trace.Span, r *http.Request, route string, info *requestInfo, status int) {
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, semconv.HTTPRequestMethodKey.String(r.Method), semconv.HTTPResponseStatusCode(status),
		tracing.Role.String(info.role))
	if route == "passthrough" {
		attrs = append(attrs, semconv.URLPath(r.URL.Path))
	} else {
		attrs = append(attrs, semconv.HTTPRoute(route))
		if op := tracing.Operation(route); op != "" {
			attrs = append(attrs, tracing.GenAIOperation.String(op))
		}
	}
	if len(info.key) >= 12 {
		attrs = append(attrs, tracing.KeyPrefix.String(info.key[:12]))
	}
	if info.model != "" {
		attrs = append(attrs, tracing.GenAIRequestModel.String(info.model))
	}
	if info.namespace != "" {
		attrs = append(attrs, tracing.Namespace.String(info.namespace))
	}
	if o, ok := tracing.ParseOrigin(info.origin); ok {
		attrs = append(attrs, tracing.Attempt.Int(o.Attempt))
		// Every answer of another request's call links to it: a follower's, a hit's, and
		// an owner's whose attempt lost its lease to another instance's.
		if !info.ownCall {
			span.AddLink(tracing.LinkTo(o, info.role == singleflight.RoleHit.String()))
		}
	}
	if info.broken != nil {
		attrs = append(attrs, attribute.Bool("llm_dedupe.interrupted", true))
	}
	span.SetAttributes(attrs...)
	if status >= 500 || info.broken != nil {
		span.SetStatus(codes.Error, strconv.Itoa(status))
	}
	span.End()
}

// canonicalCarrier reads the trace context's headers by their canonical names, which
// http.Header.Get would make anew from the lower-case names the propagator asks for.
type canonicalCarrier http.Header

func (c canonicalCarrier) Get(key string) string {
	var vs []string
	switch key {
	case "traceparent":
		vs = c["Traceparent"]
	case "tracestate":
		vs = c["Tracestate"]
	default:
		return http.Header(c).Get(key)
	}
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

func (c canonicalCarrier) Set(key, value string) { http.Header(c).Set(key, value) }
func (c canonicalCarrier) Keys() []string        { return propagation.HeaderCarrier(c).Keys() }

// upstreamCall is the client span of one upstream call of a flight; nil when not traced.
type upstreamCall struct {
	span   trace.Span
	origin string
	scan   answerScan
}

// startCall starts the client span of an upstream call, a child of the span of the request
// whose function runs it, and sends its context upstream.
func (p *Proxy) startCall(ctx context.Context, leader *http.Request, route, model string, out *http.Request) *upstreamCall {
	t := p.cfg.Tracing
	if t == nil {
		return nil
	}
	a := singleflight.AttemptOf(ctx)
	parent := trace.ContextWithSpanContext(ctx, trace.SpanContextFromContext(leader.Context()))
	op := tracing.Operation(route)
	name := op + " " + model
	if op == "" {
		name = out.Method + " " + route
	}
	attrs := append(serverAttrs(p.cfg.Upstream), tracing.GenAIProvider.String("openai"),
		tracing.GenAIRequestModel.String(model), semconv.HTTPRequestMethodKey.String(out.Method), tracing.Attempt.Int(a.N))
	if op != "" {
		attrs = append(attrs, tracing.GenAIOperation.String(op))
	}
	if a.Takeover != "" {
		attrs = append(attrs, tracing.Takeover.String(a.Takeover))
	}
	_, span := t.Tracer.Start(parent, name, clientKind, trace.WithAttributes(attrs...))
	sendTrace(t, trace.ContextWithSpan(ctx, span), out.Header)
	return &upstreamCall{span: span, origin: tracing.Origin{Span: span.SpanContext(), Attempt: a.N}.String()}
}

// spanContext is ctx with the call's span: its duration's exemplar names the call's trace.
func (c *upstreamCall) spanContext(ctx context.Context) context.Context {
	if c == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, c.span)
}

// originOf is the origin an answer of this call carries.
func (c *upstreamCall) originOf() string {
	if c == nil {
		return ""
	}
	return c.origin
}

// answer has the call's answer read through its scan.
func (c *upstreamCall) answer(r io.Reader) io.Reader {
	if c == nil {
		return r
	}
	c.scan.r = r
	return &c.scan
}

// end ends the call's span with its status and what its answer says of itself, marked
// abandoned when the call was cut because nobody waited for it (ADR 0074).
func (c *upstreamCall) end(ctx context.Context, code int, err error) {
	if c == nil {
		return
	}
	if errors.Is(context.Cause(ctx), singleflight.ErrAbandoned) {
		c.span.SetAttributes(tracing.Abandoned.Bool(true))
	}
	if code != 0 {
		c.span.SetAttributes(semconv.HTTPResponseStatusCode(code))
	}
	c.span.SetAttributes(c.scan.attrs()...)
	if err != nil {
		c.span.RecordError(err)
	}
	if err != nil || code >= 400 || code == 0 {
		c.span.SetStatus(codes.Error, redactErrString(err, code))
	}
	c.span.End()
}

func redactErrString(err error, code int) string {
	if err != nil {
		return redactErr(err).Error()
	}
	return "upstream answered " + strconv.Itoa(code)
}

// answerScan keeps the start and the end of an answer as it is read: the response's id
// and model are near its start, its usage at its end.
type answerScan struct {
	r    io.Reader
	head []byte
	tail []byte
}

const scanHead, scanTail = 4 << 10, 16 << 10

func (s *answerScan) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	c := b[:n]
	if room := scanHead - len(s.head); room > 0 {
		s.head = append(s.head, c[:min(room, len(c))]...)
	}
	s.tail = append(s.tail, c...)
	if len(s.tail) > 2*scanTail {
		s.tail = append(s.tail[:0], s.tail[len(s.tail)-scanTail:]...)
	}
	return n, err
}

// attrs are the GenAI response attributes the answer says: id, model and token usage.
func (s *answerScan) attrs() []attribute.KeyValue {
	var attrs []attribute.KeyValue
	if v := firstString(s.head, `"id"`); v != "" {
		attrs = append(attrs, tracing.GenAIResponseID.String(v))
	}
	if v := firstString(s.head, `"model"`); v != "" {
		attrs = append(attrs, tracing.GenAIResponseModel.String(v))
	}
	if in, out := usageOf(s.tail); in != 0 || out != 0 {
		attrs = append(attrs, tracing.GenAIInputTokens.Int64(in), tracing.GenAIOutputTokens.Int64(out))
	}
	return attrs
}

// firstString is the string value of the first member named key in b, "" if none.
func firstString(b []byte, key string) string {
	var v string
	if !decodeMember(b, bytes.Index(b, []byte(key)), key, &v) || len(v) > 256 {
		return ""
	}
	return v
}
