package proxy_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// TestDedupeFailureCauseLogged: the client of a failed call on a deduplicated route gets a
// 502 that does not say why (the cause may name internal addresses); the log must, without
// the secrets of the base URL.
func TestDedupeFailureCauseLogged(t *testing.T) {
	var logs syncBuffer
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: "http://127.0.0.1:1/openai?api-key=k3y-secret", flight: singleflight.Options{MaxAttempts: 1},
		proxy: func(c *proxy.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }})
	if a := post(t, in.URL, "/v1/chat/completions", chatBody); a.status != http.StatusBadGateway {
		t.Fatalf("got %d; want 502", a.status)
	}
	if l := logs.String(); !strings.Contains(l, "upstream call failed") || !strings.Contains(l, "connection refused") {
		t.Errorf("log %q; want a line \"upstream call failed\" with the cause (connection refused)", l)
	}
	if l := logs.String(); strings.Contains(l, "k3y-secret") {
		t.Errorf("log %q shows the api-key of the base URL", l)
	}
}

func TestAPIKeyReplacesAuthorization(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.APIKey = "sk-proxy" }})
	post(t, in.URL, "/v1/chat/completions", chatBody)
	if log := up.Log(); len(log) != 1 || log[0].Authorization != "Bearer sk-proxy" {
		t.Fatalf("upstream saw %+v; want Authorization Bearer sk-proxy", log)
	}
}

func TestUpstreamUnreachable(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: "http://127.0.0.1:1", flight: singleflight.Options{MaxAttempts: 2}})
	a := post(t, in.URL, "/v1/chat/completions", chatBody)
	if a.status != http.StatusBadGateway || !strings.Contains(a.body, `"type":"upstream_error"`) {
		t.Fatalf("got (%d, %s); want 502 with an OpenAI-style error", a.status, a.body)
	}
}

func TestStreamIdleTimeout(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeBehavior{Hold: true}) // stalls before the last event, forever
			in := newInstance(t, up, setup{redis: rs, proxy: func(c *proxy.Config) { c.IdleTimeout = 200 * time.Millisecond }})
			c := openStream(t, in.URL, streamBody)
			got := c.rest()
			if !strings.Contains(got, "tok0") || !strings.Contains(got, "event: error\n") || strings.Contains(got, "[DONE]") {
				t.Fatalf("transcript %q; want the first events, then an error event", got)
			}
			// The stalled call was abandoned, and nothing was stored.
			if a := openStream(t, in.URL, streamBody); a.role() == "hit" {
				t.Fatalf("an interrupted stream was stored")
			}
		})
	}
}
