package proxy

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"
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
			info := &st.info
			*info = requestInfo{start: time.Now(), role: role}
			ww := &st.w
			*ww = statusWriter{ResponseWriter: w, draining: &p.draining, send: p.cfg.SendTimeout}
			// The line is written and the request counted whether next returns or panics
			// (the reverse proxy ends an answer whose copy failed with
			// http.ErrAbortHandler): a panic is not recovered, so that it goes on with its
			// own stack.
			panicking := true
			defer func() { p.finish(route, r, ww, info, panicking) }()
			next.ServeHTTP(ww, r)
			panicking = false
		})
	}
}

// finish records and logs a request once its handler has returned or panicked, and ends
// with http.ErrAbortHandler one whose answer must not look whole (requestInfo.abort).
func (p *Proxy) finish(route string, r *http.Request, ww *statusWriter, info *requestInfo, panicking bool) {
	if ww.status != 0 {
		// The server's last write (a chunked body's end) comes after the handler, maybe
		// long after the last deadline was set (a stream quiet before its end).
		ww.deadline()
	}
	d := time.Since(info.start)
	status := ww.status
	switch {
	case status != 0:
		info.broken = info.broken || panicking // an answer begun, then cut
	case panicking && r.Context().Err() == nil:
		status = http.StatusInternalServerError // a panic before any answer
	default:
		status = 499 // the client left before an answer
	}
	if route != "passthrough" {
		p.cfg.Recorder.Request(route, info.role, status, d)
	}
	if p.cfg.Logger.Enabled(r.Context(), slog.LevelInfo) { // else its attributes need not be made
		p.logRequest(r, route, info, status, d)
	}
	if !panicking && (info.abort || (ww.status == 0 && r.Context().Err() != nil)) {
		// Nothing written, the client taken for gone: net/http would send an empty 200,
		// which a client still reading a half-closed connection takes for an answer.
		// Closing the connection says what happened, as nginx's 499 does.
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
	if info.broken {
		attrs = append(attrs, slog.Bool("interrupted", true))
	}
	p.cfg.Logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// statusWriter records the status of an answer for its log line and metrics, as chi's
// middleware.WrapResponseWriter did, without its two allocations: it is kept in the
// request's state. Like it, it passes an informational status (1xx but 101) on without
// taking it for the answer's, passes on only the first other one, and takes a Write or a
// flush before any WriteHeader for 200. A hijack (an upgrade) is taken for its 101 (see
// Hijack); everything else the server's writer can do (deadlines) is reached through
// Unwrap, as http.ResponseController does.
//
// While the proxy drains, the answer's status line gets Connection: close, so that the
// client's next request opens a connection through the load balancer. It is added as the
// status is written, not when the request arrives: an answer begun before the drain
// closes its connection too, and a reverse proxy that clears the header after a 1xx does
// not lose it. A 101 never comes here (the reverse proxy writes it on the hijacked
// connection), so an upgrade keeps its Connection: Upgrade alone.
//
// Each write and flush gives the connection SendTimeout to take the bytes: a client that
// stops reading cannot hold its connection, goroutine and answer forever.
type statusWriter struct {
	http.ResponseWriter
	status   int
	draining *atomic.Bool
	send     time.Duration
}

func (w *statusWriter) WriteHeader(code int) {
	switch {
	case code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols:
		w.ResponseWriter.WriteHeader(code)
	case w.status == 0:
		w.status = code
		if w.draining != nil && w.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.send <= 0 {
		return w.ResponseWriter.Write(b)
	}
	// A connection's deadline bounds a whole write: a large answer (a unary one is one
	// Write) goes in pieces, each given SendTimeout, so that a client reading steadily but
	// slowly is not cut off.
	n := 0
	for {
		piece := b[n:min(len(b), n+sendPiece)]
		w.deadline()
		k, err := w.ResponseWriter.Write(piece)
		n += k
		if err != nil || n == len(b) {
			return n, err
		}
	}
}

// sendPiece is the most written to the client under one deadline.
const sendPiece = 64 << 10

// deadline gives the next write to the client SendTimeout to make progress. The server
// lifts it once the answer is written, before it reads the connection's next request.
func (w *statusWriter) deadline() {
	if w.send > 0 {
		_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.send))
	}
}

// FlushError is how http.ResponseController flushes: the server's writer's flush, after
// the header.
func (w *statusWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.deadline()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the connection over: the reverse proxy does for an upgrade, once the
// upstream has answered 101, which it then writes on the connection itself. The answer
// is taken for that 101.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}
