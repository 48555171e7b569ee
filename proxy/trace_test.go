package proxy_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/tracing"
)

// spanLog records ended spans and says when one ends: a server span ends after its
// client got the last byte, when the handler returns.
type spanLog struct {
	*tracetest.SpanRecorder
	mu    sync.Mutex
	ended chan struct{}
}

func newSpanLog() *spanLog {
	return &spanLog{SpanRecorder: tracetest.NewSpanRecorder(), ended: make(chan struct{})}
}

func (l *spanLog) OnEnd(s sdktrace.ReadOnlySpan) {
	l.SpanRecorder.OnEnd(s)
	l.mu.Lock()
	close(l.ended)
	l.ended = make(chan struct{})
	l.mu.Unlock()
}

// waitEnded waits until n spans whose name starts with prefix have ended.
func (l *spanLog) waitEnded(t *testing.T, prefix string, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		l.mu.Lock()
		ch := l.ended
		l.mu.Unlock()
		if got := spansNamed(l, prefix); len(got) >= n {
			return got
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d spans %q ended after 10s; want %d", len(spansNamed(l, prefix)), prefix, n)
		}
	}
}

// traced returns a setup whose instances trace into rec, as cmd wires tracing.
func traced(rs setup, rec *spanLog) setup {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := &tracing.Tracing{Tracer: tp.Tracer(tracing.Name), Propagator: propagation.TraceContext{}}
	rs.flight.Tracer = tr.Tracer
	rs.proxy = func(c *proxy.Config) { c.Tracing = tr }
	return rs
}

func attrOf(attrs []attribute.KeyValue, k attribute.Key) (attribute.Value, bool) {
	for _, a := range attrs {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// spansNamed are the ended spans whose name starts with prefix.
func spansNamed(rec *spanLog, prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

// TestEveryAnswerLinksToTheCallThatMadeIt: over two instances on one Redis, the one
// upstream call has a client span whose context the upstream received; the owner's server
// span is its parent and keeps the client's trace; every follower's and hit's server span
// links to that call, whichever instance served it, and none reuses its span ID.
func TestEveryAnswerLinksToTheCallThatMadeIt(t *testing.T) {
	bodies := map[string]string{"unary": chatBody,
		"stream": `{"model":"gpt-test","temperature":0,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`}
	for name, rs := range backends(t) {
		for kind, body := range bodies {
			t.Run(name+"/"+kind, func(t *testing.T) { linksToTheCall(t, rs, body) })
		}
	}
}

func linksToTheCall(t *testing.T, rs *redistest.Server, chatBody string) {
	{
		{
			up := startUpstream(t)
			up.Set(fakeHold())
			rec := newSpanLog()
			s := traced(setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}, rec)
			ins := []*instance{newInstance(t, up, s)}
			if rs != nil {
				ins = append(ins, newInstance(t, up, s))
			}
			const incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			done := make(chan []answer)
			go func() {
				done <- burst(t, ins, 20, "/v1/chat/completions", chatBody, "Traceparent", incoming)
			}()
			if strings.Contains(chatBody, `"stream":true`) {
				waitRoles(t, ins, len(ins)) // a stream's first bytes come before the hold
			} else {
				waitWaiting(t, ins, 20)
			}
			up.Release()
			as := <-done
			hit := post(t, ins[len(ins)-1].URL, "/v1/chat/completions", chatBody)
			if up.Calls() != 1 || hit.header.Get("X-Dedupe-Role") != "hit" {
				t.Fatalf("%d calls, repeat served as %q; want 1 call and a hit", up.Calls(), hit.header.Get("X-Dedupe-Role"))
			}

			calls := rec.waitEnded(t, "chat ", 1)
			if len(calls) != 1 {
				t.Fatalf("%d upstream client spans; want 1", len(calls))
			}
			call := calls[0]
			sent := up.Log()[0].Traceparent
			want := "00-" + call.SpanContext().TraceID().String() + "-" + call.SpanContext().SpanID().String() + "-01"
			if sent != want || call.SpanKind() != trace.SpanKindClient {
				t.Fatalf("upstream got traceparent %q; want the client span's %q", sent, want)
			}
			if v, _ := attrOf(call.Attributes(), tracing.GenAIResponseID); v.AsString() == "" {
				t.Errorf("client span attributes %v: want gen_ai.response.id", call.Attributes())
			}
			if v, _ := attrOf(call.Attributes(), tracing.GenAIInputTokens); v.AsInt64() != 11 {
				t.Errorf("client span input tokens %v; want 11", v.AsInt64())
			}

			servers := rec.waitEnded(t, "POST /v1/chat/completions", len(as)+1)
			if len(servers) != len(as)+1 {
				t.Fatalf("%d server spans; want %d", len(servers), len(as)+1)
			}
			byRole := map[string]int{}
			for _, sp := range servers {
				role, _ := attrOf(sp.Attributes(), tracing.Role)
				byRole[role.AsString()]++
				if sp.SpanContext().SpanID() == call.SpanContext().SpanID() {
					t.Fatalf("a %s span reuses the call's span ID", role.AsString())
				}
				if sp.SpanContext().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" && role.AsString() != "hit" {
					t.Errorf("%s span in trace %s; want the incoming trace kept", role.AsString(), sp.SpanContext().TraceID())
				}
				switch role.AsString() {
				case "owner":
					if call.Parent().SpanID() != sp.SpanContext().SpanID() {
						t.Errorf("client span's parent %s; want the owner's server span %s", call.Parent().SpanID(), sp.SpanContext().SpanID())
					}
				case "follower", "hit":
					links := sp.Links()
					if len(links) != 1 || links[0].SpanContext.SpanID() != call.SpanContext().SpanID() {
						t.Fatalf("%s span links %v; want one link to the call", role.AsString(), links)
					}
					reason, _ := attrOf(links[0].Attributes, tracing.LinkReason)
					if reason.AsString() != role.AsString() {
						t.Errorf("%s link reason %q", role.AsString(), reason.AsString())
					}
				default:
					t.Errorf("server span with role %q", role.AsString())
				}
			}
			if byRole["owner"] != 1 || byRole["follower"]+byRole["hit"] != len(as) {
				t.Fatalf("server span roles %v; want 1 owner and %d followers or hits", byRole, len(as))
			}
		}
	}
}

// TestUntracedRequestsSendTheClientsTraceparentOn: with tracing off, nothing is added and
// the client's own traceparent goes upstream untouched.
func TestUntracedRequestsSendTheClientsTraceparentOn(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	const incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if a := post(t, in.URL, "/v1/chat/completions", chatBody, "Traceparent", incoming); a.status != 200 {
		t.Fatalf("status %d", a.status)
	}
	if got := up.Log()[0].Traceparent; got != incoming {
		t.Fatalf("upstream got %q; want the client's %q", got, incoming)
	}
}

// TestBypassedCallsHaveAClientSpan: a request that goes straight upstream has a client
// span too, child of its server span, and the upstream gets that span's context.
func TestBypassedCallsHaveAClientSpan(t *testing.T) {
	up := startUpstream(t)
	rec := newSpanLog()
	in := newInstance(t, up, traced(setup{}, rec))
	if a := post(t, in.URL, "/v1/chat/completions", chatBody, proxy.HeaderBypass, "1"); a.status != 200 {
		t.Fatalf("status %d", a.status)
	}
	calls := rec.waitEnded(t, "POST", 2)
	var server, client sdktrace.ReadOnlySpan
	for _, s := range calls {
		switch s.SpanKind() {
		case trace.SpanKindServer:
			server = s
		case trace.SpanKindClient:
			client = s
		}
	}
	if server == nil || client == nil || client.Parent().SpanID() != server.SpanContext().SpanID() {
		t.Fatalf("spans %v; want a client span child of the server span", calls)
	}
	if role, _ := attrOf(server.Attributes(), tracing.Role); role.AsString() != "bypass" {
		t.Errorf("server span role %q; want bypass", role.AsString())
	}
	want := "00-" + client.SpanContext().TraceID().String() + "-" + client.SpanContext().SpanID().String() + "-01"
	if got := up.Log()[0].Traceparent; got != want {
		t.Fatalf("upstream got %q; want %q", got, want)
	}
}

// TestRequestLogNamesItsTrace: a traced request's log line carries its trace ID, kept from
// the client's traceparent.
func TestRequestLogNamesItsTrace(t *testing.T) {
	up := startUpstream(t)
	var buf syncBuffer
	rec := newSpanLog()
	s := traced(setup{}, rec)
	tracedCfg := s.proxy
	s.proxy = func(c *proxy.Config) { tracedCfg(c); c.Logger = slog.New(slog.NewJSONHandler(&buf, nil)) }
	in := newInstance(t, up, s)
	const incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if a := post(t, in.URL, "/v1/chat/completions", chatBody, "Traceparent", incoming); a.status != 200 {
		t.Fatalf("status %d", a.status)
	}
	rec.waitEnded(t, "POST", 1) // the line is written before the span ends
	if !strings.Contains(buf.String(), `"trace_id":"0af7651916cd43dd8448eb211c80319c"`) {
		t.Fatalf("log %s; want the request's trace_id", buf.String())
	}
}

// TestCutCallsSpanIsMarkedAbandoned: a call whose client gave up, and which nobody else
// waits for, is cut; its client span ends marked abandoned. See ADR 0074.
func TestCutCallsSpanIsMarkedAbandoned(t *testing.T) {
	up := startUpstream(t)
	up.Set(fakeHold())
	rec := newSpanLog()
	in := newInstance(t, up, traced(setup{flight: singleflight.Options{AbandonGrace: time.Millisecond}}, rec))
	ctx, giveUp := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, in.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-up.Started()
	giveUp()
	<-done
	spans := rec.waitEnded(t, "chat ", 1)
	if v, ok := attrOf(spans[0].Attributes(), tracing.Abandoned); !ok || !v.AsBool() {
		t.Fatalf("the cut call's span %q has attributes %v; want %s=true", spans[0].Name(), spans[0].Attributes(), tracing.Abandoned)
	}
	if _, ok := up.Wait(fakeupstream.Stats{Calls: 1, Abandoned: 1}, 10*time.Second); !ok {
		t.Fatalf("upstream %+v; want its one call cut", up.Stats())
	}
}
