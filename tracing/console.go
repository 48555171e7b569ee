package tracing

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// console writes each span as it ends on one line, for trying traces on a machine with no
// trace backend (OTEL_TRACES_EXPORTER=console; see ADR 0069): first what places it in a
// trace, up to " | ", then its attributes and its links' attributes.
//
//	server "POST /v1/chat/completions" trace=4bf9… span=00f0… parent=- link=5a1c…/9e2d… 2.004s | http.route=… llm_dedupe.role=follower link.llm_dedupe.link.reason=follower
type console struct {
	mu sync.Mutex // one line at a time
	w  io.Writer
}

var _ sdktrace.SpanExporter = (*console)(nil)

// ExportSpans writes spans, one line each.
func (c *console) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	var b strings.Builder
	for _, s := range spans {
		writeSpan(&b, s)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := io.WriteString(c.w, b.String())
	return err
}

// Shutdown has nothing to flush: every line is written when its span ends.
func (c *console) Shutdown(context.Context) error { return nil }

func writeSpan(b *strings.Builder, s sdktrace.ReadOnlySpan) {
	sc := s.SpanContext()
	parent := "-"
	if p := s.Parent(); p.IsValid() {
		parent = p.SpanID().String()
	}
	fmt.Fprintf(b, "%s %s trace=%s span=%s parent=%s", s.SpanKind(), strconv.Quote(s.Name()), sc.TraceID(), sc.SpanID(), parent)
	for _, l := range s.Links() {
		fmt.Fprintf(b, " link=%s/%s", l.SpanContext.TraceID(), l.SpanContext.SpanID())
	}
	fmt.Fprintf(b, " %s", s.EndTime().Sub(s.StartTime()).Round(time.Microsecond))
	if st := s.Status(); st.Code == codes.Error {
		b.WriteString(" error")
		if st.Description != "" {
			b.WriteString("=" + strconv.Quote(st.Description))
		}
	}
	b.WriteString(" |")
	for _, kv := range s.Attributes() {
		writeAttr(b, "", kv)
	}
	for _, l := range s.Links() {
		for _, kv := range l.Attributes {
			writeAttr(b, "link.", kv)
		}
	}
	b.WriteByte('\n')
}

// writeAttr writes " key=value", the value quoted when it holds a space, a quote, a "|"
// or a character that is not printable, so that a line stays one line.
func writeAttr(b *strings.Builder, prefix string, kv attribute.KeyValue) {
	v := kv.Value.Emit()
	if v == "" || strings.ContainsAny(v, " \"|=") || strconv.Quote(v) != `"`+v+`"` {
		v = strconv.Quote(v)
	}
	fmt.Fprintf(b, " %s%s=%s", prefix, kv.Key, v)
}
