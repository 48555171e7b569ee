package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"
)

// NewPassthrough returns a reverse proxy that sends every request to target unchanged, for
// the routes that are not deduplicated (and for the dedupe routes when a request bypasses).
//
// A path in target is a prefix: with target https://gw.example/openai, a request for
// /v1/models goes to https://gw.example/openai/v1/models; the query is kept. Hop-by-hop
// headers (Connection, the headers it lists, Upgrade outside an upgrade, TE, …) are dropped
// and X-Forwarded-For, -Host and -Proto are set anew. Every write of the answer is flushed at
// once, so server-sent events reach the client as the upstream sends them. If apiKey is not
// empty it replaces the client's Authorization, otherwise the client's is forwarded.
//
// When the upstream cannot be reached the client gets an OpenAI-style JSON error of type
// "upstream_error": 502 (code "upstream_unavailable"), or 504 (code "upstream_timeout") when
// the request's deadline ran out. The cause is logged to the proxy's ErrorLog, not sent.
func NewPassthrough(target *url.URL, apiKey string, transport http.RoundTripper) *httputil.ReverseProxy {
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			if apiKey != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+apiKey)
			}
		},
		Transport:     transport,
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			if res.StatusCode == http.StatusSwitchingProtocols {
				upgraded(res.Request.Context()) // a session now: the call's timeout no longer applies
			}
			return nil
		},
	}
	p.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if bodyTimedOut(r.Context()) {
			writeBodyTimeout(w)
			return
		}
		timedOut := isTimeout(err) || errors.Is(context.Cause(r.Context()), context.DeadlineExceeded)
		clientGone := errors.Is(err, context.Canceled) && r.Context().Err() != nil && !timedOut
		if clientGone {
			return // nothing to answer: counted 499 and closed (logRequests)
		}
		if p.ErrorLog != nil {
			p.ErrorLog.Printf("upstream %s %s: %v", r.Method, r.URL.Path, redactErr(err))
		}
		status, code, msg := http.StatusBadGateway, "upstream_unavailable", "the upstream API could not be reached"
		if timedOut {
			status, code, msg = http.StatusGatewayTimeout, "upstream_timeout", "the upstream API did not answer in time"
		}
		writeError(w, status, "upstream_error", code, msg)
	}
	return p
}

// fullDuplex lets the reverse proxy's transport go on reading the request body, to send it
// upstream, while the answer is being written: net/http's HTTP/1 server would otherwise
// close the body as the answer's head goes out. See ADR 0037.
func fullDuplex(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is full duplex already
		next.ServeHTTP(w, r)
	})
}

// Timeout returns middleware that ends each request's context after d, the hard limit of one
// upstream call. A protocol upgrade that happened (the upstream answered 101: a WebSocket
// session, such as the Realtime API's) is long-lived by design and is not limited; asking
// for one does not lift the limit. Unlike http.TimeoutHandler it does not buffer the
// answer, so streams pass through.
func Timeout(d time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if isUpgrade(r.Header) {
				ctx, cancel := context.WithCancelCause(r.Context())
				defer cancel(nil)
				t := time.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
				defer t.Stop()
				next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, upgradeKey{}, t)))
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), d)
			defer cancel()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

type upgradeKey struct{}

// upgraded lifts the timeout of ctx's request, set by Timeout, once its upgrade happened.
func upgraded(ctx context.Context) {
	if t, ok := ctx.Value(upgradeKey{}).(*time.Timer); ok {
		t.Stop()
	}
}

// isUpgrade reports whether h asks for a protocol upgrade: "Connection: upgrade" and an Upgrade.
func isUpgrade(h http.Header) bool {
	if h.Get("Upgrade") == "" {
		return false
	}
	for token := range listItems(h, "Connection") {
		if strings.EqualFold(token, "upgrade") {
			return true
		}
	}
	return false
}
