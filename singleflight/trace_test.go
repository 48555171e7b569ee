package singleflight

import (
	"context"
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestTakeoverIsTracedAndItsOriginReachesFollowers: a follower whose owner dies waits
// (dedupe.wait), takes the flight over (dedupe.takeover) as attempt 2, and the answer's
// Head.Origin, set by the owner function, reaches a follower on another Group through
// Redis and a later hit through the stored answer. Every span is a child of the caller's.
func TestTakeoverIsTracedAndItsOriginReachesFollowers(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	rec := &endedSpans{SpanRecorder: tracetest.NewSpanRecorder(), next: make(chan struct{}, 16)}
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	o := Options{LeaseTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond,
		TakeoverJitter: 50 * time.Millisecond, ResultTTL: time.Minute, Tracer: tracer}
	a, bg, c := b.group(t, o), b.group(t, o), b.group(t, o)
	revive := deadOwner(a)
	defer revive()
	key := uniqueKey()
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})

	hang := make(chan struct{})
	defer close(hang)
	started := make(chan struct{}, 1)
	dead := func(ctx context.Context, w *Writer) (Result, error) {
		started <- struct{}{}
		<-hang
		return Result{}, errors.New("dead")
	}
	attempts := make(chan Attempt, 1)
	second := func(ctx context.Context, w *Writer) (Result, error) {
		attempts <- AttemptOf(ctx)
		return Result{Head: Head{Status: 200, Origin: "made-by-2"}, Body: []byte("second")}, nil
	}
	ra, _ := a.Do(key, false, dead)
	defer ra.Close()
	<-started

	call := CallOptions{Trace: parent}
	rb, err := bg.DoWith(key, call, second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out := readAll(ctx, rb); out.err != nil || out.body != "second" || out.head.Origin != "made-by-2" {
		t.Fatalf("taker got (%q, origin %q, %v); want second, made-by-2", out.body, out.head.Origin, out.err)
	}
	if got := <-attempts; got.N != 2 || got.Takeover != "expired" {
		t.Fatalf("owner function told %+v; want attempt 2, takeover expired", got)
	}
	hit, _ := c.DoWith(key, call, second)
	if out := readAll(ctx, hit); out.role != RoleHit || out.head.Origin != "made-by-2" {
		t.Fatalf("other instance: role %v origin %q; want a hit with the stored origin", out.role, out.head.Origin)
	}

	// The last span ends when C's lead does, which may be just after its answer.
	ended, deadline := rec.Ended(), time.After(10*time.Second)
	for len(ended) < 4 {
		select {
		case <-rec.next:
			ended = rec.Ended()
		case <-deadline:
			t.Fatalf("%d spans ended after 10s; want 4", len(ended))
		}
	}
	names := map[string]int{}
	for _, s := range ended {
		names[s.Name()]++
		if s.Parent().SpanID() != parent.SpanID() || s.SpanContext().TraceID() != parent.TraceID() {
			t.Errorf("span %s has parent %s; want the caller's", s.Name(), s.Parent().SpanID())
		}
	}
	// B: look-up (follow), wait, takeover (jitter, look-up, claim); C: its look-up (hit).
	if names["dedupe.lookup"] != 2 || names["dedupe.wait"] != 1 || names["dedupe.takeover"] != 1 {
		t.Fatalf("spans %v; want 2 dedupe.lookup, 1 dedupe.wait, 1 dedupe.takeover", names)
	}
}

// TestOriginTravelsInTheEncodedHeader: Head.Origin goes through the header's encoding and
// back, and never shows as a header.
func TestOriginTravelsInTheEncodedHeader(t *testing.T) {
	for _, h := range []Head{
		{Status: 200, Origin: "00-01000000000000000000000000000000-0200000000000000-01 2"},
		{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}, Origin: "o"},
		{Status: 502, Header: map[string][]string{"X-Odd": {"é\"<"}}, Origin: "o 1"},
		{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}},
	} {
		got, err := decodeHead("200", encodeHead(h))
		if err != nil {
			t.Fatal(err)
		}
		if got.Origin != h.Origin || len(got.Header) != len(h.Header) {
			t.Fatalf("decoded %+v from %+v", got, h)
		}
		if _, ok := got.Header[originKey]; ok {
			t.Fatalf("origin left in the header: %v", got.Header)
		}
	}
}

// endedSpans records spans and signals each end on next.
type endedSpans struct {
	*tracetest.SpanRecorder
	next chan struct{}
}

func (e *endedSpans) OnEnd(s sdktrace.ReadOnlySpan) {
	e.SpanRecorder.OnEnd(s)
	select {
	case e.next <- struct{}{}:
	default:
	}
}
