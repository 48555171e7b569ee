package proxy_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

func TestControlHeaders(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			in := newInstance(t, up, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}})
			const path = "/v1/chat/completions"
			steps := []struct {
				name      string
				hdr       []string
				wantRole  string
				wantCalls int64
			}{
				{"first call stores", nil, "owner", 1},
				{"repeat is a hit", nil, "hit", 1},
				{"no-cache skips the stored answer", []string{"Cache-Control", "no-cache"}, "owner", 2},
				{"bypass goes straight upstream", []string{"X-Dedupe-Bypass", "1"}, "bypass", 3},
				{"the stored answer is still served", nil, "hit", 3},
			}
			body := `{"model":"m","messages":[{"role":"user","content":"` + name + `"}]}`
			for _, s := range steps {
				a := post(t, in.URL, path, body, s.hdr...)
				if a.status != 200 || a.header.Get("X-Dedupe-Role") != s.wantRole || up.Calls() != s.wantCalls {
					t.Fatalf("%s: status %d role %q calls %d; want 200 %q %d", s.name, a.status, a.header.Get("X-Dedupe-Role"), up.Calls(), s.wantRole, s.wantCalls)
				}
			}
			// no-store: answered, not stored.
			nsBody := `{"model":"m","messages":[{"role":"user","content":"no-store ` + name + `"}]}`
			before := up.Calls()
			post(t, in.URL, path, nsBody, "Cache-Control", "no-store")
			if a := post(t, in.URL, path, nsBody); a.header.Get("X-Dedupe-Role") != "owner" || up.Calls() != before+2 {
				t.Fatalf("after no-store: role %q calls %d; want owner and %d", a.header.Get("X-Dedupe-Role"), up.Calls(), before+2)
			}
			// Cache-Control and X-Dedupe-Bypass are the proxy's, never forwarded.
			for _, c := range up.Log() {
				if strings.Contains(c.Body, "Cache-Control") {
					t.Fatalf("control leaked into the body")
				}
			}
		})
	}
}

// errorBody checks an OpenAI-style error object.
func errorBody(t *testing.T, a answer, status int, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type, Code string
		}
	}
	if a.status != status || json.Unmarshal([]byte(a.body), &e) != nil || e.Error.Code != code || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("got (%d, %s); want %d with error code %q, a message and a type", a.status, a.body, status, code)
	}
}

func TestBadRequests(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.MaxBodyBytes = 100 }})
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `{"messages":"`+strings.Repeat("x", 200)+`"}`), 413, "request_too_large")
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `not json`), 400, "invalid_json")
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `[1,2]`), 400, "invalid_json")
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `{"a":1} trailing`), 400, "invalid_json")
	if up.Calls() != 0 {
		t.Fatalf("%d upstream calls for bad requests; want 0", up.Calls())
	}
	// The instance still serves afterwards.
	if a := post(t, in.URL, "/v1/embeddings", `{"model":"e","input":"x"}`); a.status != 200 {
		t.Fatalf("after bad requests: %d %s", a.status, a.body)
	}
}

func TestPassthroughAndPrefix(t *testing.T) {
	up := startUpstream(t)
	prefixed := newInstance(t, up, setup{base: up.URL + "/openai", flight: singleflight.Options{ResultTTL: time.Minute}})
	res, err := http.Get(prefixed.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), "fake-model") {
		t.Fatalf("GET /v1/models: (%d, %s); want the upstream's model list", res.StatusCode, b)
	}
	a := post(t, prefixed.URL, "/v1/responses", `{"model":"m","input":"hi"}`)
	if a.status != 200 || !strings.Contains(a.body, `"object":"response"`) {
		t.Fatalf("POST /v1/responses: (%d, %s)", a.status, a.body)
	}
	log := up.Log()
	if len(log) != 1 || log[0].Path != "/openai/v1/responses" {
		t.Fatalf("upstream saw %+v; want one call to /openai/v1/responses", log)
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

func TestReadyz(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	get := func() (int, map[string]any) {
		res, err := http.Get(in.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(res.Body).Decode(&v)
		return res.StatusCode, v
	}
	if code, v := get(); code != 200 || v["backend"] != "memory" || v["degraded"] != false {
		t.Fatalf("readyz: %d %v; want 200 memory not degraded", code, v)
	}
	in.Proxy.Drain()
	if code, v := get(); code != 503 || v["status"] != "draining" {
		t.Fatalf("readyz while draining: %d %v; want 503 draining", code, v)
	}
}

// Other methods on a deduplicated path are passed through, not refused.
func TestOtherMethodsPassThrough(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	req, _ := http.NewRequest(http.MethodDelete, in.URL+"/v1/responses", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("X-Dedupe-Role") != "" || up.Calls() != 1 {
		t.Fatalf("DELETE /v1/responses: %d role %q calls %d; want the upstream's 200, no role, 1 call", res.StatusCode, res.Header.Get("X-Dedupe-Role"), up.Calls())
	}
}

// TestBodyWithAndWithoutLength: a body is read the same whether the client sends its
// Content-Length or streams it chunked: up to max_body_bytes it is keyed alike, one byte
// more is 413 either way.
func TestBodyWithAndWithoutLength(t *testing.T) {
	up := startUpstream(t)
	const limit = 200
	in := newInstance(t, up, setup{flight: singleflight.Options{ResultTTL: time.Minute},
		proxy: func(c *proxy.Config) { c.MaxBodyBytes = limit }})
	body := func(n int) string { // a JSON object of exactly n bytes
		const open, end = `{"model":"m","input":"`, `"}`
		return open + strings.Repeat("x", n-len(open)-len(end)) + end
	}
	send := func(b string, chunked bool) answer {
		var r io.Reader = strings.NewReader(b)
		if chunked {
			r = io.MultiReader(r) // a reader of unknown length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, in.URL+"/v1/embeddings", r)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: string(rb)}
	}
	known, unknown := send(body(limit), false), send(body(limit), true)
	if known.status != 200 || unknown.status != 200 {
		t.Fatalf("a body of the limit: %d with Content-Length, %d chunked; want 200", known.status, unknown.status)
	}
	if k, u := known.header.Get("X-Dedupe-Key"), unknown.header.Get("X-Dedupe-Key"); k != u || unknown.header.Get("X-Dedupe-Role") != "hit" {
		t.Fatalf("chunked: key %s role %s; want the key %s and a hit", u, unknown.header.Get("X-Dedupe-Role"), k)
	}
	errorBody(t, send(body(limit+1), false), 413, "request_too_large")
	errorBody(t, send(body(limit+1), true), 413, "request_too_large")
}

// TestRoutes: only a POST to a deduplicated path, exactly as configured, is deduplicated;
// every other request is passed through, as the router would route it.
func TestRoutes(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	for _, tt := range []struct {
		method, path string
		deduped      bool
	}{
		{http.MethodPost, "/v1/chat/completions", true},
		{http.MethodPost, "/v1/chat/completions?api-version=1", true},
		{http.MethodPost, "/v1/embeddings", true},
		{http.MethodPut, "/v1/chat/completions", false},
		{http.MethodPost, "/v1/chat/completions/", false},
		{http.MethodPost, "/v1/chat%2Fcompletions", false},
		{http.MethodPost, "/v1/chat/%63ompletions", false}, // the router matches the raw path
		{http.MethodPost, "/V1/chat/completions", false},
		{http.MethodPost, "/v1/other", false},
	} {
		req, _ := http.NewRequest(tt.method, in.URL+tt.path, strings.NewReader(chatBody))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if got := res.Header.Get("X-Dedupe-Role") != ""; got != tt.deduped {
			t.Errorf("%s %s: role %q; want deduplicated %v", tt.method, tt.path, res.Header.Get("X-Dedupe-Role"), tt.deduped)
		}
	}
}
