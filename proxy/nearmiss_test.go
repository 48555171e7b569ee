package proxy_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// TestNearMissIsCountedAndLogged: a POST that is passed through although its path ends
// like a deduplicated route (an SDK's base URL without /v1, a prefix too many, a trailing
// slash) is counted under the route it nearly reached, and logged once, with that route;
// other routes are neither.
func TestNearMissIsCountedAndLogged(t *testing.T) {
	up := startUpstream(t)
	var logs syncBuffer
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) }})
	const body = `{"model":"m","messages":[{"role":"user","content":"near"}]}`
	for _, tc := range []struct{ path, route string }{
		{"/chat/completions", "/v1/chat/completions"},
		{"/chat/completions", "/v1/chat/completions"}, // counted again, not logged again
		{"/openai/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/completions/", "/v1/chat/completions"},
		{"/completions", "/v1/completions"},
		{"/embeddings", "/v1/embeddings"},
		{"/v1/files", ""},
		{"/v1/chat/completions", ""}, // deduplicated
	} {
		a := post(t, in.URL, tc.path, body)
		if a.status != 200 {
			t.Fatalf("POST %s: %d %s", tc.path, a.status, a.body)
		}
		if deduped := a.header.Get("X-Dedupe-Role") != ""; deduped != (tc.path == "/v1/chat/completions") {
			t.Errorf("POST %s: X-Dedupe-Role %q; a near miss is passed through", tc.path, a.header.Get("X-Dedupe-Role"))
		}
	}
	for route, want := range map[string]float64{"/v1/chat/completions": 4, "/v1/completions": 1, "/v1/embeddings": 1, "/v1/responses": 0} {
		if got := value(t, in.Reg, "llm_dedupe_near_miss_requests_total", map[string]string{"route": route}); got != want {
			t.Errorf("near_miss_requests_total{route=%q} = %v; want %v", route, got, want)
		}
	}

	var logged []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["level"] == "WARN" {
			logged = append(logged, m)
		}
	}
	want := []string{"/chat/completions /v1/chat/completions", "/completions /v1/completions", "/embeddings /v1/embeddings"}
	if len(logged) != len(want) {
		t.Fatalf("warnings %v; want one per route nearly reached: %v", logged, want)
	}
	for i, m := range logged {
		msg, _ := m["msg"].(string)
		if !strings.Contains(msg, "base URL missing /v1") || !strings.Contains(msg, "dedupe.paths") || m["path"].(string)+" "+m["route"].(string) != want[i] {
			t.Errorf("warning %d: %v; want path and route %s, and the message naming the base URL and dedupe.paths", i, m, want[i])
		}
	}
}
