package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// logRequests logs one line per request and records it: route, role, status, duration and
// the first 12 hex digits of the key. Never the Authorization header, never a body.
func (p *Proxy) logRequests(route string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			role := "rejected" // until the handler decides one
			if route == "passthrough" {
				role = "passthrough"
			}
			st := stateFrom(r.Context())
			if st == nil { // not behind ServeHTTP's guard
				st = &reqState{}
				r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
			}
			var span trace.Span
			if p.cfg.Tracing != nil {
				r, span = p.startSpan(r, route)
			}
			info := &st.info
			*info = requestInfo{start: time.Now(), role: role}
			ww := &st.w
			*ww = statusWriter{ResponseWriter: w, draining: &p.draining, send: p.cfg.SendTimeout}
			// The line is written and the request counted whether next returns or panics
			// (the reverse proxy aborts an answer whose copy failed); a panic is not
			// recovered, so that it keeps its stack.
			panicking := true
			defer func() { p.finish(route, r, ww, info, panicking, span) }()
			next.ServeHTTP(ww, r)
			panicking = false
		})
	}
}

// finish records and logs a request once its handler has returned or panicked, and ends
// with http.ErrAbortHandler one whose answer must not look whole (requestInfo.abort). See
// ADR 0038.
func (p *Proxy) finish(route string, r *http.Request, ww *statusWriter, info *requestInfo, panicking bool, span trace.Span) {
	if ww.status != 0 {
		// The server's last write (a chunked body's end) comes after the handler, maybe
		// long after the last deadline was set (a stream quiet before its end).
		ww.deadline()
	}
	d := time.Since(info.start)
	status := ww.status
	switch {
	case status != 0:
		if panicking && info.broken == nil {
			info.broken = errAborted // an answer begun, then cut
		}
	case panicking && r.Context().Err() == nil:
		status = http.StatusInternalServerError // a panic before any answer
	default:
		status = 499 // the client left before an answer
	}
	if route != "passthrough" {
		p.cfg.Recorder.Request(r.Context(), route, info.role, status, d)
	}
	if info.sampled != "" {
		p.cfg.Recorder.Sampled(route, string(info.sampled), info.role)
	}
	if p.cfg.Logger.Enabled(r.Context(), slog.LevelInfo) { // else its attributes need not be made
		p.logRequest(r, route, info, status, d)
	}
	if span != nil {
		endSpan(span, r, route, info, status)
	}
	if !panicking && (info.abort || (ww.status == 0 && r.Context().Err() != nil)) {
		// Nothing written to a client taken for gone: net/http would send an empty 200;
		// the connection is closed instead, as nginx does for its 499.
		panic(http.ErrAbortHandler)
	}
}

// logRequest writes a request's line.
func (p *Proxy) logRequest(r *http.Request, route string, info *requestInfo, status int, d time.Duration) {
	attrs := []slog.Attr{
		slog.String("method", r.Method), slog.String("route", route), slog.String("role", info.role),
		slog.Int("status", status), slog.Float64("duration_ms", float64(d.Microseconds())/1000),
	}
	if len(info.key) >= 12 {
		attrs = append(attrs, slog.String("key", info.key[:12]))
	}
	if info.sampled != "" {
		attrs = append(attrs, slog.String("sampled", string(info.sampled)))
	}
	if info.broken != nil {
		attrs = append(attrs, slog.Bool("interrupted", true), slog.String("err", info.broken.Error()))
	}
	if sc := trace.SpanContextFromContext(r.Context()); sc.IsValid() {
		attrs = append(attrs, slog.String("trace_id", sc.TraceID().String())) // ADR 0061
	}
	p.cfg.Logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// requestInfo is what the handler learnt, for the request's log line.
type requestInfo struct {
	role    string
	key     string
	sampled sampling // what was done with a request that samples (ADR 0078)
	// What a traced request's span says (ADR 0061): set only when tracing is on.
	model, namespace string
	origin           string // singleflight.Head.Origin of its answer
	ownCall          bool   // its answer came from its own function's call
	broken           error  // why an answer begun was cut short
	// abort: the answer must not look whole to the client (its own answer cut short, or a
	// client taken for gone): the connection is closed, once the request is logged.
	abort bool
	start time.Time
}
