package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// TestExtensionMethodsPassThrough: every method but a deduplicated POST is passed through,
// an extension method (WebDAV's PROPFIND, any other token) too.
func TestExtensionMethodsPassThrough(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Method+" "+r.URL.Path)
	}))
	t.Cleanup(gw.Close)
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: gw.URL})
	for _, tc := range []struct{ method, path string }{{"PROPFIND", "/v1/models"}, {"FOO", "/v1/files"}, {"FOO", "/v1/chat/completions"}} {
		res, body, err := rawRequest(t, in.URL, tc.method+" "+tc.path+" HTTP/1.1\r\nHost: proxy\r\n\r\n", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.method + " " + tc.path; res.StatusCode != 200 || body != want {
			t.Errorf("%s %s: got %d %q; want 200 %q from the upstream", tc.method, tc.path, res.StatusCode, body, want)
		}
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
