package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// largeUpstream answers every call with body, after release is closed; calls counts them
// and started is closed at the first.
type largeUpstream struct {
	URL     string
	calls   atomic.Int64
	started chan struct{}
	release chan struct{}
}

func startLargeUpstream(t *testing.T, contentType, body string) *largeUpstream {
	t.Helper()
	u := &largeUpstream{started: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u.calls.Add(1) == 1 {
			close(u.started)
		}
		<-u.release
		w.Header().Set("Content-Type", contentType)
		for len(body) > 0 { // in pieces, as a network delivers it
			n := min(len(body), 8<<10)
			if _, err := w.Write([]byte(body[:n])); err != nil {
				return
			}
			body = body[n:]
		}
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

// TestLargeAnswerReachesItsOwnClient: an answer larger than MaxResponseBytes, the most the
// proxy shares, still reaches the client whose request made the call, whole; the requests
// waiting with it get an error saying why, and nothing is called again.
func TestLargeAnswerReachesItsOwnClient(t *testing.T) {
	const limit = 64 << 10
	unary := `{"id":"big","object":"chat.completion","choices":[{"message":{"content":"` + strings.Repeat("x", 5*limit) + `"}}]}`
	var sse strings.Builder
	for i := 0; sse.Len() < 5*limit; i++ {
		fmt.Fprintf(&sse, "data: {\"choices\":[{\"delta\":{\"content\":\"%d %s\"}}]}\n\n", i, strings.Repeat("y", 500))
	}
	sse.WriteString("data: [DONE]\n\n")
	tests := []struct {
		name, contentType, body, req string
		followerStatus               int
		followerHas                  string
	}{
		{"unary", "application/json", unary, chatBody, http.StatusBadGateway, `"code":"upstream_too_large"`},
		{"stream", "text/event-stream", sse.String(), `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hello"}]}`,
			http.StatusOK, "event: error\ndata: {\"error\":{\"message\":"},
	}
	for _, tc := range tests {
		for name, rs := range backends(t) {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				big := startLargeUpstream(t, tc.contentType, tc.body)
				up := startUpstream(t)
				ins := []*instance{
					newInstance(t, up, setup{redis: rs, base: big.URL, proxy: func(c *proxy.Config) { c.MaxResponseBytes = limit }}),
				}
				if rs != nil { // a follower on another instance too
					ins = append(ins, newInstance(t, up, setup{redis: rs, base: big.URL, proxy: func(c *proxy.Config) { c.MaxResponseBytes = limit }}))
				}
				owner := make(chan answer, 1)
				go func() { owner <- post(t, ins[0].URL, "/v1/chat/completions", tc.req) }()
				select {
				case <-big.started:
				case <-time.After(10 * time.Second):
					t.Fatal("no upstream call within 10s")
				}
				followers := make(chan []answer, 1)
				go func() { followers <- burst(t, ins, 4, "/v1/chat/completions", tc.req) }()
				waitWaiting(t, ins, 5)
				close(big.release)

				a := <-owner
				if a.status != http.StatusOK || a.body != tc.body || a.header.Get("X-Dedupe-Role") != "owner" {
					i := 0
					for i < len(a.body) && i < len(tc.body) && a.body[i] == tc.body[i] {
						i++
					}
					t.Errorf("owner's client: got %d, role %q, %d bytes; want 200, owner and the whole answer (%d bytes); they differ at %d: %.300q",
						a.status, a.header.Get("X-Dedupe-Role"), len(a.body), len(tc.body), i, a.body[i:])
				}
				for i, f := range <-followers {
					if f.status != tc.followerStatus || !strings.Contains(f.body, tc.followerHas) || !strings.Contains(f.body, "too_large") {
						t.Errorf("follower %d: got %d %.200q; want %d with %q", i, f.status, f.body, tc.followerStatus, tc.followerHas)
					}
				}
				if n := big.calls.Load(); n != 1 {
					t.Errorf("%d upstream calls; want 1: an answer too large to share is not a failure to retry", n)
				}
			})
		}
	}
}

// TestLargeAnswerCutShortIsBrokenForItsOwnClient: when the upstream breaks off an answer
// too large to share, after the part the proxy could have shared, the client whose
// request made the call gets a broken answer, never one that looks whole.
func TestLargeAnswerCutShortIsBrokenForItsOwnClient(t *testing.T) {
	const limit = 64 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"big","choices":[{"message":{"content":"` + strings.Repeat("x", 3*limit)))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection breaks mid-answer
	}))
	t.Cleanup(srv.Close)
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			in := newInstance(t, startUpstream(t), setup{redis: rs, base: srv.URL, proxy: func(c *proxy.Config) { c.MaxResponseBytes = limit }})
			a := post(t, in.URL, "/v1/chat/completions", chatBody)
			if a.err == nil {
				t.Fatalf("got %d, role %q, %d bytes, and a clean end; want a broken answer", a.status, a.header.Get("X-Dedupe-Role"), len(a.body))
			}
			if a.status != http.StatusOK || len(a.body) <= limit {
				t.Fatalf("got %d with %d bytes before the break; want 200 and more than %d", a.status, len(a.body), limit)
			}
		})
	}
}
