package tracing

import (
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The GenAI semantic conventions' attributes (development status: not in the semconv
// package) and the proxy's own, under one prefix.
const (
	GenAIOperation     = attribute.Key("gen_ai.operation.name")
	GenAIProvider      = attribute.Key("gen_ai.provider.name")
	GenAIRequestModel  = attribute.Key("gen_ai.request.model")
	GenAIResponseModel = attribute.Key("gen_ai.response.model")
	GenAIResponseID    = attribute.Key("gen_ai.response.id")
	GenAIInputTokens   = attribute.Key("gen_ai.usage.input_tokens")
	GenAIOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")

	Role       = attribute.Key("llm_dedupe.role")        // owner, follower, hit, bypass
	KeyPrefix  = attribute.Key("llm_dedupe.key_prefix")  // the request key's first 12 hex digits
	Attempt    = attribute.Key("llm_dedupe.attempt")     // the attempt that made the answer (1, 2, ...)
	Namespace  = attribute.Key("llm_dedupe.namespace")   // X-Dedupe-Namespace, when set
	Takeover   = attribute.Key("llm_dedupe.takeover")    // why an owner took the flight over
	Abandoned  = attribute.Key("llm_dedupe.abandoned")   // the call was cut: no client waited for it (ADR 0074)
	LinkReason = attribute.Key("llm_dedupe.link.reason") // on a link to the origin: follower, hit, takeover
)

// Link reasons: why a request's answer came from another request's upstream call.
const (
	LinkFollower = "follower" // it waited for that call, in flight
	LinkHit      = "hit"      // that call's stored answer served it
	LinkTakeover = "takeover" // it waited for a call that took its flight over
)

// Origin is the upstream call that made an answer: its client span and its attempt. It
// travels with the answer (singleflight.Head.Origin) to followers and hits on every
// instance, for as long as the answer is kept.
type Origin struct {
	Span    trace.SpanContext
	Attempt int
}

// String is the origin as it travels: a W3C traceparent, a space, the attempt.
func (o Origin) String() string {
	if !o.Span.IsValid() {
		return ""
	}
	var b strings.Builder
	b.Grow(58)
	b.WriteString("00-")
	b.WriteString(o.Span.TraceID().String())
	b.WriteByte('-')
	b.WriteString(o.Span.SpanID().String())
	b.WriteByte('-')
	b.WriteString(o.Span.TraceFlags().String())
	b.WriteByte(' ')
	b.WriteString(strconv.Itoa(o.Attempt))
	return b.String()
}

// ParseOrigin reads what String wrote; false for anything else.
func ParseOrigin(s string) (Origin, bool) {
	tp, at, _ := strings.Cut(s, " ")
	// 00-<32 hex>-<16 hex>-<2 hex>
	if len(tp) != 55 || tp[:3] != "00-" || tp[35] != '-' || tp[52] != '-' {
		return Origin{}, false
	}
	tid, err1 := trace.TraceIDFromHex(tp[3:35])
	sid, err2 := trace.SpanIDFromHex(tp[36:52])
	flags, err3 := strconv.ParseUint(tp[53:], 16, 8)
	if err1 != nil || err2 != nil || err3 != nil {
		return Origin{}, false
	}
	n, _ := strconv.Atoi(at)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags), Remote: true})
	return Origin{Span: sc, Attempt: n}, true
}

// LinkTo is the link a request's span makes to the origin of its answer: reason is hit for
// a stored answer, else follower, or takeover when a later attempt made it. The attempt is
// an attribute of the request's span.
func LinkTo(o Origin, hit bool) trace.Link {
	reason := LinkFollower
	switch {
	case hit:
		reason = LinkHit
	case o.Attempt > 1:
		reason = LinkTakeover
	}
	return trace.Link{SpanContext: o.Span, Attributes: []attribute.KeyValue{LinkReason.String(reason)}}
}

// Operation is gen_ai.operation.name for a deduplicated route; "" for a route it does not know.
func Operation(route string) string {
	switch {
	case strings.HasSuffix(route, "/chat/completions"):
		return "chat"
	case strings.HasSuffix(route, "/completions"):
		return "text_completion"
	case strings.HasSuffix(route, "/embeddings"):
		return "embeddings"
	case strings.HasSuffix(route, "/responses"):
		return "chat"
	}
	return ""
}
