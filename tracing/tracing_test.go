package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEnabledOnlyWithAnEndpoint(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp, console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, false},
	} {
		if got := Enabled(env(tc.env)); got != tc.want {
			t.Errorf("Enabled(%v) = %v; want %v", tc.env, got, tc.want)
		}
	}
}

func TestProtocol(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "http/protobuf"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "http/protobuf"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, ""},
	} {
		got, err := protocol(env(tc.env))
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("protocol(%v) = %q, %v; want %q", tc.env, got, err, tc.want)
		}
	}
}

func TestOriginRoundTrip(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xab, 1}, SpanID: trace.SpanID{0xcd, 2}, TraceFlags: trace.FlagsSampled})
	o := Origin{Span: sc, Attempt: 3}
	got, ok := ParseOrigin(o.String())
	if !ok || got.Attempt != 3 || got.Span.TraceID() != sc.TraceID() || got.Span.SpanID() != sc.SpanID() || !got.Span.IsSampled() || !got.Span.IsRemote() {
		t.Fatalf("ParseOrigin(%q) = %+v, %v", o.String(), got, ok)
	}
	for _, bad := range []string{"", "x", "00-zz-yy-01 1", "01-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01 1"} {
		if _, ok := ParseOrigin(bad); ok {
			t.Errorf("ParseOrigin(%q) accepted", bad)
		}
	}
	if (Origin{}).String() != "" {
		t.Error("an origin without a span is not empty")
	}
	if l := LinkTo(got, false); l.Attributes[0].Value.AsString() != LinkTakeover {
		t.Errorf("attempt 3 followed: reason %v; want takeover", l.Attributes[0].Value)
	}
	if l := LinkTo(Origin{Span: sc, Attempt: 1}, true); l.Attributes[0].Value.AsString() != LinkHit {
		t.Errorf("hit: reason %v", l.Attributes[0].Value)
	}
}

// TestNewExportsOverOTLPHTTP: with an endpoint in the environment, New exports spans over
// http/protobuf to it, with the service name the environment gives.
func TestNewExportsOverOTLPHTTP(t *testing.T) {
	got := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.URL.Path + " " + r.Header.Get("Content-Type") + " " + string(b)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "proxy-under-test")
	tr, err := New(context.Background(), "v0")
	if err != nil || tr == nil {
		t.Fatalf("New: %v, %v", tr, err)
	}
	_, span := tr.Tracer.Start(context.Background(), "a-span")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case req := <-got:
		if !strings.HasPrefix(req, "/v1/traces application/x-protobuf") || !strings.Contains(req, "a-span") || !strings.Contains(req, "proxy-under-test") {
			t.Fatalf("export %q; want a protobuf POST to /v1/traces with the span and service name", req)
		}
	default:
		t.Fatal("nothing exported")
	}
}

func TestNewIsNilWithoutAnEndpoint(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tr, err := New(context.Background(), "v0")
	if tr != nil || err != nil {
		t.Fatalf("New = %v, %v; want nil, nil", tr, err)
	}
	if tr.Shutdown(context.Background()) != nil {
		t.Fatal("Shutdown of nil tracing failed")
	}
}

// TestConsoleWritesALinePerSpan: OTEL_TRACES_EXPORTER=console writes each span when it
// ends, on one line: kind, name, ids, parent, links and duration, then " | " and its
// attributes and its links', a value with a space or a newline quoted.
func TestConsoleWritesALinePerSpan(t *testing.T) {
	var out syncBuffer
	tr, err := newTracing(context.Background(), "v0", env(map[string]string{"OTEL_TRACES_EXPORTER": "console"}), &out)
	if err != nil || tr == nil || tr.Exporters != "console" {
		t.Fatalf("newTracing: %+v, %v; want console tracing", tr, err)
	}
	defer tr.Shutdown(context.Background())
	origin := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xab, 1}, SpanID: trace.SpanID{0xcd, 2}, TraceFlags: trace.FlagsSampled})
	ctx, parent := tr.Tracer.Start(context.Background(), "POST /v1/chat/completions", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithLinks(LinkTo(Origin{Span: origin, Attempt: 1}, false)))
	_, child := tr.Tracer.Start(ctx, "dedupe.wait")
	child.SetAttributes(attribute.String("llm_dedupe.verdict", "follow"), attribute.String("note", "two words\nand a line"))
	child.End()
	if got := out.String(); !strings.HasPrefix(got, "internal \"dedupe.wait\" trace="+child.SpanContext().TraceID().String()+
		" span="+child.SpanContext().SpanID().String()+" parent="+parent.SpanContext().SpanID().String()+" ") ||
		!strings.HasSuffix(got, ` | llm_dedupe.verdict=follow note="two words\nand a line"`+"\n") {
		t.Errorf("the child span, as it ended, was written as %q", got)
	}
	parent.SetAttributes(attribute.String("llm_dedupe.role", "follower"))
	parent.End()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], `server "POST /v1/chat/completions" trace=`) ||
		!strings.Contains(lines[1], " parent=- link="+origin.TraceID().String()+"/"+origin.SpanID().String()+" ") ||
		!strings.HasSuffix(lines[1], " | llm_dedupe.role=follower link.llm_dedupe.link.reason=follower") {
		t.Errorf("console wrote %q; want the server span second, its link and its attributes", lines)
	}
}

func TestUnknownExporterIsRefused(t *testing.T) {
	if _, err := newTracing(context.Background(), "v0", env(map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "use otlp, console or none") {
		t.Errorf("OTEL_TRACES_EXPORTER=jaeger: %v; want an error naming what is supported", err)
	}
}

// syncBuffer is a strings.Builder spans may be written to from any goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
