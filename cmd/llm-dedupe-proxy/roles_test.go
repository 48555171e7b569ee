package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestWhichAnswersCarryARole checks the README's tables of response headers: an answer
// of a flight carries its role and key (an upstream error shared with it too), a bypass
// only its role, and what the proxy does not deduplicate or refuses before any flight
// carries neither.
func TestWhichAnswersCarryARole(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.RawQuery, "fail") {
			w.WriteHeader(http.StatusInternalServerError)
		}
		io.WriteString(w, `{"id":"x"}`)
	}))
	defer up.Close()
	base, stop := startServe(t, "--upstream.base_url="+up.URL, "--limits.max_body_bytes=100", "--flight.max_attempts=1")
	defer stop()

	const chat = "/v1/chat/completions"
	tests := []struct {
		what, method, path, body, header string
		status                           int
		role                             string // "" for none
		key                              bool
	}{
		{"an owner", "POST", chat, `{"n":1,"temperature":0}`, "", 200, "owner", true},
		{"a hit", "POST", chat, `{"n":1,"temperature":0}`, "", 200, "hit", true},
		{"an upstream error", "POST", chat + "?fail", `{"n":2}`, "", 500, "owner", true},
		{"a bypass", "POST", chat, `{"n":1,"temperature":0}`, "X-Dedupe-Bypass: 1", 200, "bypass", false},
		{"another route", "GET", "/v1/models", "", "", 200, "", false},
		{"another method on a deduplicated route", "GET", chat, "", "", 200, "", false},
		{"a body that is not JSON", "POST", chat, `{"n":`, "", 400, "", false},
		{"a bad namespace", "POST", chat, `{"n":1,"temperature":0}`, "X-Dedupe-Namespace: a b", 400, "", false},
		{"a body too large", "POST", chat, `{"n":"` + strings.Repeat("x", 200) + `"}`, "", 413, "", false},
		{"a dot segment", "GET", "/v1/%2e%2e/admin", "", "", 400, "", false},
		{"the proxy's own endpoint", "GET", "/healthz", "", "", 200, "", false},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
		if name, value, ok := strings.Cut(tt.header, ": "); ok {
			req.Header.Set(name, value)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		role, key := res.Header.Get("X-Dedupe-Role"), res.Header.Get("X-Dedupe-Key")
		if res.StatusCode != tt.status || role != tt.role || (key != "") != tt.key {
			t.Errorf("%s: %d, X-Dedupe-Role %q, X-Dedupe-Key %q; want %d, %q, a key %v",
				tt.what, res.StatusCode, role, key, tt.status, tt.role, tt.key)
		}
	}
}
