package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// errBodyTimeout is what reading a request body returns when the client sent nothing for
// BodyReadTimeout.
var errBodyTimeout = errors.New("proxy: the client sent no request body bytes for body_read_timeout")

// guard refuses what no route may see, before routing: CONNECT, TRACE and TRACK, the
// HTTP/2 preface (no h2c), a target that is not a path, and paths with dot segments, which
// the upstream would resolve outside the base URL's prefix. See ADR 0039. It bounds the
// wait between two reads of a request body (see ADR 0036) and gives the request its state.
func (p *Proxy) guard(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	switch r.Method {
	case "PRI": // the HTTP/2 preface, which net/http passes on to a server without h2c
		writeError(w, http.StatusHTTPVersionNotSupported, "invalid_request_error", "h2c_not_supported",
			"HTTP/2 without TLS (h2c) is not supported: use HTTP/1.1, or HTTP/2 over TLS in front of the proxy")
		return r, false
	case http.MethodConnect, http.MethodTrace, "TRACK":
		// An upstream that echoes TRACE would show the proxy's own upstream.api_key.
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			r.Method+" is not supported: this is a reverse proxy of an OpenAI-compatible API")
		return r, false
	}
	if r.URL.Opaque != "" || (r.URL.Path != "" && !strings.HasPrefix(r.URL.Path, "/")) {
		// "*" (net/http answers OPTIONS * itself), or an absolute form with an opaque part
		// ("http:../../admin"), which the reverse proxy would send on outside the prefix.
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_path",
			"the request target is not a path")
		return r, false
	}
	if HasDotSegment(r.URL.Path) {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_path",
			"the request path has \".\" or \"..\" segments, plain or percent-encoded")
		return r, false
	}
	st := &reqState{}
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
	if r.Body != nil && r.Body != http.NoBody {
		st.body = timedBody{body: r.Body, w: w, d: p.cfg.BodyReadTimeout}
		r.Body = &st.body
	}
	return r, true
}

// reqState is what the proxy keeps of one request, in one context value and one
// allocation: the guarded body, the log line's info, the client's writer and the handoff.
type reqState struct {
	body timedBody
	info requestInfo
	w    statusWriter
	ho   handoff // of a deduplicated request's flight
}

type stateKey struct{}

// stateFrom returns the state of ctx's request, or nil outside Proxy.ServeHTTP.
func stateFrom(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey{}).(*reqState)
	return st
}

// HasDotSegment reports whether path (decoded: %2e%2e and %2f are already "." and "/")
// has a "." or ".." segment, with "\" also taken as a separator, as some servers do: such a
// request is refused before routing.
func HasDotSegment(path string) bool {
	for path != "" {
		seg, rest := path, ""
		if i := strings.IndexAny(path, `/\`); i >= 0 {
			seg, rest = path[:i], path[i+1:]
		}
		if seg == "." || seg == ".." {
			return true
		}
		path = rest
	}
	return false
}

// timedBody is a request body whose every read must bring bytes within d: the deadline is
// set on the connection before each read and lifted at the body's end, so that it bounds
// nothing but the body. See ADR 0036.
type timedBody struct {
	body     io.ReadCloser
	w        http.ResponseWriter // whose ResponseController sets the deadlines
	d        time.Duration
	ended    bool
	timedOut atomic.Bool
}

var _ io.ReadCloser = (*timedBody)(nil)

func (b *timedBody) Read(p []byte) (int, error) {
	if b.ended {
		return b.body.Read(p)
	}
	_ = http.NewResponseController(b.w).SetReadDeadline(time.Now().Add(b.d))
	n, err := b.body.Read(p)
	if err != nil {
		b.ended = true
		if isTimeout(err) {
			// The deadline stays passed, so that the server does not wait for the rest of
			// the body after the answer: it closes the connection.
			b.timedOut.Store(true)
			err = errors.Join(errBodyTimeout, err)
		} else {
			_ = http.NewResponseController(b.w).SetReadDeadline(time.Time{}) // the server lifts it too, when it sees the end
		}
	}
	return n, err
}

func (b *timedBody) Close() error { return b.body.Close() }

// bodyTimedOut reports whether the request body of ctx's request stopped coming.
func bodyTimedOut(ctx context.Context) bool {
	st := stateFrom(ctx)
	return st != nil && st.body.timedOut.Load()
}

// writeBodyTimeout answers a request whose body stopped coming.
func writeBodyTimeout(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusRequestTimeout, "invalid_request_error", "request_body_timeout",
		"the request body stopped coming: nothing arrived for the body read timeout")
}
