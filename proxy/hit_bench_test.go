package proxy_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/tracing"
)

// hitBody is a chat request about the size of a real one (~1 KB), as the bench harness
// sends.
var hitBody = `{"model":"bench-model","temperature":0,"stream":false,"messages":[` +
	`{"role":"system","content":"` + strings.Repeat("You are a careful assistant. Answer briefly and cite the source of every fact. ", 11) + `"},` +
	`{"role":"user","content":"the same question"}]}`

// discardWriter is a ResponseWriter that keeps nothing but the status, so that a
// benchmark counts the handler's allocations and not a recorder's.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Flush()                      {}

// SetReadDeadline and SetWriteDeadline succeed, as the server's own writer's do.
func (w *discardWriter) SetReadDeadline(time.Time) error  { return nil }
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }

// rewindBody is a request body read again on every iteration.
type rewindBody struct{ *bytes.Reader }

func (rewindBody) Close() error { return nil }

// BenchmarkHitPath serves a stored answer through the proxy's handler, called directly
// (no sockets), so that ns/op and allocs/op are the proxy's own work per hit: guard,
// routing, log and metrics middleware, body read, key, flight lookup, response. The
// request log is at warn, as the bench harness runs the proxy, except in log-info, where
// every hit writes its line (to nowhere), as with the default level.
func BenchmarkHitPath(b *testing.B) {
	up := startUpstream(b)
	rs := redistest.Start(b)
	quiet := func(c *proxy.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	loud := func(c *proxy.Config) { c.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil)) }
	// traced exports every span over OTLP/HTTP to a sink that drops it, as the bench
	// harness's trace phase does.
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	b.Cleanup(sink.Close)
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
	b.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	tr, err := tracing.New(context.Background(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	traced := func(c *proxy.Config) { quiet(c); c.Tracing = tr }
	for _, s := range []struct {
		name string
		s    setup
	}{
		{"memory", setup{flight: singleflight.Options{ResultTTL: time.Hour}, proxy: quiet}},
		{"redis", setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Hour}, proxy: quiet}},
		{"memory-log-info", setup{flight: singleflight.Options{ResultTTL: time.Hour}, proxy: loud}},
		{"memory-traced", setup{flight: singleflight.Options{ResultTTL: time.Hour, Tracer: tr.Tracer}, proxy: traced}},
	} {
		b.Run(s.name, func(b *testing.B) {
			in := newInstance(b, up, s.s)
			raw := []byte(hitBody)
			body := rewindBody{bytes.NewReader(raw)}
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
			req.ContentLength = int64(len(hitBody)) // as clients send it
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer sk-bench")
			w := &discardWriter{h: http.Header{}}
			serve := func() {
				body.Reset(raw)
				clear(w.h)
				w.status = 0
				in.Proxy.ServeHTTP(w, req)
			}
			serve() // the owner: stores the answer
			serve()
			if w.status != http.StatusOK || w.h.Get("X-Dedupe-Role") != "hit" {
				b.Fatalf("status %d, role %q; want 200, hit", w.status, w.h.Get("X-Dedupe-Role"))
			}
			b.ReportAllocs()
			for b.Loop() {
				serve()
			}
		})
	}
}
