package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// A Responses API stream that ends without response.completed is shared with the flight
// but never stored: the next identical request calls again.
func TestIncompleteResponsesStreamNotStored(t *testing.T) {
	for _, last := range []string{"", "response.failed", "response.incomplete", "response.completed"} {
		t.Run("last="+last, func(t *testing.T) {
			var calls atomic.Int32
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n")
				io.WriteString(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"par\"}\n\n")
				if last != "" {
					fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n", last, last)
				}
			}))
			defer up.Close()
			in := newInstance(t, nil, setup{base: up.URL, flight: singleflight.Options{ResultTTL: time.Minute}})
			body := `{"model":"m","stream":true,"input":"hi"}`
			post(t, in.URL, "/v1/responses", body)
			a := post(t, in.URL, "/v1/responses", body)
			wantStored := last == "response.completed"
			if stored := a.header.Get("X-Dedupe-Role") == "hit"; stored != wantStored {
				t.Fatalf("second request role %q (calls %d); stored %v, want %v", a.header.Get("X-Dedupe-Role"), calls.Load(), stored, wantStored)
			}
		})
	}
}

// The query is sent upstream, so it is part of the key: two API versions never share.
func TestQueryIsPartOfTheKey(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{flight: singleflight.Options{ResultTTL: time.Minute}})
	a := post(t, in.URL, "/v1/chat/completions?api-version=2024-02-01", chatBody)
	b := post(t, in.URL, "/v1/chat/completions?api-version=2025-01-01", chatBody)
	c := post(t, in.URL, "/v1/chat/completions?b=2&api-version=2024-02-01", chatBody)
	d := post(t, in.URL, "/v1/chat/completions?api-version=2024-02-01&b=2", chatBody)
	if a.header.Get("X-Dedupe-Key") == b.header.Get("X-Dedupe-Key") || b.header.Get("X-Dedupe-Role") != "owner" {
		t.Fatalf("different queries: keys equal or second not an owner (%s)", b.header.Get("X-Dedupe-Role"))
	}
	if c.header.Get("X-Dedupe-Key") != d.header.Get("X-Dedupe-Key") || d.header.Get("X-Dedupe-Role") != "hit" {
		t.Fatalf("same parameters in another order: role %q; want hit on the same key", d.header.Get("X-Dedupe-Role"))
	}
}
