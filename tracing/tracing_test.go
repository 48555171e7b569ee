package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
