package metrics

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// TestDurationsCarryTheTraceIDOfASampledSpan: the request and upstream histograms keep
// the trace ID of a sampled span as an exemplar, and none without one.
func TestDurationsCarryTheTraceIDOfASampledSpan(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	sampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xab}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}))
	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xcd}, SpanID: trace.SpanID{1}}))
	m.Request(sampled, "/v1/chat/completions", "follower", 200, 3*time.Second)
	m.Upstream(sampled, "/v1/chat/completions", 200, 3*time.Second)
	m.Request(unsampled, "/v1/embeddings", "owner", 200, time.Second)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := trace.TraceID{0xab}.String()
	found := map[string]int{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			for _, b := range mt.GetHistogram().GetBucket() {
				if ex := b.GetExemplar(); ex != nil {
					if got := ex.GetLabel()[0].GetValue(); got != want {
						t.Errorf("%s exemplar trace_id %s; want %s", f.GetName(), got, want)
					}
					found[f.GetName()]++
				}
			}
		}
	}
	if found["llm_dedupe_request_duration_seconds"] != 1 || found["llm_dedupe_upstream_duration_seconds"] != 1 {
		t.Fatalf("exemplars %v; want one on each duration histogram, for the sampled span only", found)
	}
}

// TestOneExemplarASecondPerBucket: a bucket takes a new exemplar once its last is a second
// old; another bucket is not held back by it.
func TestOneExemplarASecondPerBucket(t *testing.T) {
	g := newExemplarGate()
	now := time.Now().UnixNano()
	if !g.admit(0.002, now) || g.admit(0.002, now+int64(500*time.Millisecond)) {
		t.Fatal("a bucket took two exemplars within a second")
	}
	if !g.admit(30, now+1) {
		t.Fatal("a slow bucket was held back by a fast one")
	}
	if !g.admit(0.002, now+int64(time.Second)) {
		t.Fatal("a bucket took no exemplar a second after its last")
	}
}
