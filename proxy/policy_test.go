package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

func TestMaxAgeHeader(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			in := newInstance(t, up, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}})
			const path = "/v1/chat/completions"
			body := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"max-age ` + name + `"}]}`
			steps := []struct {
				cc        string
				wantRole  string
				wantCalls int64
			}{
				{"", "owner", 1},
				{"max-age=60", "hit", 1},
				{"max-age=0", "owner", 2}, // like no-cache
				{"max-age=not-a-number", "hit", 2},
				{"no-store, max-age=3600", "hit", 2},
			}
			for _, s := range steps {
				var hdr []string
				if s.cc != "" {
					hdr = []string{"Cache-Control", s.cc}
				}
				a := post(t, in.URL, path, body, hdr...)
				if a.status != 200 || a.header.Get("X-Dedupe-Role") != s.wantRole || up.Calls() != s.wantCalls {
					t.Fatalf("Cache-Control %q: status %d role %q calls %d; want 200 %q %d",
						s.cc, a.status, a.header.Get("X-Dedupe-Role"), up.Calls(), s.wantRole, s.wantCalls)
				}
			}
			if rs == nil {
				return // the age of an answer in memory is tested in package singleflight
			}
			// An answer made 5 s ago (aged in Redis), read by an instance that has no copy.
			first := post(t, in.URL, path, body)
			key := "ai:flight:result:{" + first.header.Get("X-Dedupe-Key") + "}"
			at, err := rs.Client().HGet(context.Background(), key, "at").Int64()
			if err != nil {
				t.Fatal(err)
			}
			rs.Client().HSet(context.Background(), key, "at", at-5000)
			other := newInstance(t, up, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}})
			if a := post(t, other.URL, path, body, "Cache-Control", "max-age=10"); a.header.Get("X-Dedupe-Role") != "hit" || a.header.Get("Age") != "5" {
				t.Fatalf("max-age=10 on a 5 s old answer: role %q age %q; want hit 5", a.header.Get("X-Dedupe-Role"), a.header.Get("Age"))
			}
			calls := up.Calls()
			if a := post(t, other.URL, path, body, "Cache-Control", "max-age=2"); a.header.Get("X-Dedupe-Role") != "owner" || up.Calls() != calls+1 {
				t.Fatalf("max-age=2 on a 5 s old answer: role %q calls %d; want owner %d", a.header.Get("X-Dedupe-Role"), up.Calls(), calls+1)
			}
		})
	}
}

func TestStoreRules(t *testing.T) {
	rules := []proxy.StoreRule{}
	for _, s := range []string{"/v1/embeddings * 0", "* short-* 30s", "/v1/chat/completions * 5m"} {
		r, err := proxy.ParseStoreRule(s)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}
	for _, bad := range []string{"", "* *", "* * soon", "* * -1s", "[ * 1m"} {
		if _, err := proxy.ParseStoreRule(bad); err == nil {
			t.Errorf("ParseStoreRule(%q) accepted", bad)
		}
	}
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			in := newInstance(t, up, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Hour},
				proxy: func(c *proxy.Config) { c.StoreRules = rules }})
			cases := []struct {
				path, model string
				stored      bool
				ttl         time.Duration
			}{
				{"/v1/embeddings", "short-e", false, 0}, // the first rule that matches wins
				{"/v1/completions", "short-c", true, 30 * time.Second},
				{"/v1/chat/completions", "gpt", true, 5 * time.Minute},
				{"/v1/responses", "gpt", true, time.Hour}, // no rule: the default
			}
			for _, c := range cases {
				body := `{"model":"` + c.model + `","temperature":0,"input":"` + name + `"}`
				first := post(t, in.URL, c.path, body)
				again := post(t, in.URL, c.path, body)
				if got := again.header.Get("X-Dedupe-Role") == "hit"; got != c.stored {
					t.Fatalf("%s %s: stored %v (role %q); want %v", c.path, c.model, got, again.header.Get("X-Dedupe-Role"), c.stored)
				}
				if rs != nil && c.stored {
					ttl := rs.Client().PTTL(context.Background(), "ai:flight:result:{"+first.header.Get("X-Dedupe-Key")+"}").Val()
					if ttl > c.ttl || ttl < c.ttl-10*time.Second {
						t.Fatalf("%s %s: stored for %v; want %v", c.path, c.model, ttl, c.ttl)
					}
				}
			}
		})
	}
}

// toolUpstream answers every call with an answer that asks for a tool call, streamed or not.
func toolUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if strings.Contains(r.URL.RawQuery, "plain") {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"choices":[{"message":{"role":"assistant","content":"the key \"tool_calls\" is quoted here"},"finish_reason":"stop"}]}`))
			return
		}
		if strings.Contains(r.URL.RawQuery, "stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			f := w.(http.Flusher)
			// The marker is split across two writes (and reads).
			_, _ = w.Write([]byte(`data: {"choices":[{"delta":{"tool_`))
			f.Flush()
			_, _ = w.Write([]byte(`calls":[{"id":"call_1","function":{"name":"f","arguments":"{}"}}]}}]}` + "\n\ndata: [DONE]\n\n"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"message":{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestToolCallsPolicy(t *testing.T) {
	srv, calls := toolUpstream(t)
	for name, rs := range backends(t) {
		for _, noStore := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/store", true: "/no-store"}[noStore], func(t *testing.T) {
				in := newInstance(t, nil, setup{redis: rs, base: srv.URL, flight: singleflight.Options{ResultTTL: time.Minute},
					proxy: func(c *proxy.Config) { c.NoStoreToolCalls = noStore }})
				for _, q := range []string{"unary", "stream", "plain"} {
					body := `{"model":"m","temperature":0,"stream":` + map[bool]string{false: "false", true: "true"}[q == "stream"] +
						`,"messages":[{"role":"user","content":"` + name + `"}]}`
					path := "/v1/chat/completions?" + q + "=" + map[bool]string{false: "1", true: "2"}[noStore]
					before := calls.Load()
					post(t, in.URL, path, body)
					a := post(t, in.URL, path, body)
					wantHit := !noStore || q == "plain"
					if got := a.header.Get("X-Dedupe-Role") == "hit"; got != wantHit || a.status != 200 {
						t.Fatalf("%s: status %d role %q (calls %d); want hit %v", q, a.status, a.header.Get("X-Dedupe-Role"), calls.Load()-before, wantHit)
					}
				}
			})
		}
	}
}

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
			body := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"` + name + `"}]}`
			for _, s := range steps {
				a := post(t, in.URL, path, body, s.hdr...)
				if a.status != 200 || a.header.Get("X-Dedupe-Role") != s.wantRole || up.Calls() != s.wantCalls {
					t.Fatalf("%s: status %d role %q calls %d; want 200 %q %d", s.name, a.status, a.header.Get("X-Dedupe-Role"), up.Calls(), s.wantRole, s.wantCalls)
				}
			}
			// no-store: answered, not stored.
			nsBody := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"no-store ` + name + `"}]}`
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

// TestOutcomePolicy: what an upstream status does to a flight (ADR 0033). A status that
// is retried (5xx, 408) reaches the owner's own client, and the requests waiting with it
// are answered by the call a follower makes in its place; any other status is every
// waiting request's answer. None but a 2xx is stored.
func TestOutcomePolicy(t *testing.T) {
	rs := redistest.Start(t)
	cases := []struct {
		name      string
		fail      []int
		wantCalls int64 // for a burst of 3 and then one more request
		status    int
		retryAft  bool
		// retried is the status of a call that was retried: the first owner's client, and
		// it alone, gets it (0: no call was retried).
		retried int
	}{
		{"200 stored", nil, 1, 200, false, 0},
		{"400 shared not stored", []int{400, 400}, 2, 400, false, 0},
		{"401 shared not stored", []int{401, 401}, 2, 401, false, 0},
		{"422 shared not stored", []int{422, 422}, 2, 422, false, 0},
		{"429 shared with Retry-After", []int{429, 429}, 2, 429, true, 0},
		{"500 then success: taken over", []int{500}, 2, 200, false, 500},
		{"408 then success: taken over like a 5xx", []int{408}, 2, 200, false, 408},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeBehavior{Hold: true, Fail: tc.fail, RetryAfter: "7"})
			s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}
			ins := []*instance{newInstance(t, up, s), newInstance(t, up, s)}
			body := fmt.Sprintf(`{"model":"m","temperature":0,"messages":[{"role":"user","content":%q}]}`, tc.name)
			done := make(chan []answer)
			go func() { done <- burst(t, ins, 3, "/v1/chat/completions", body) }()
			waitWaiting(t, ins, 3)
			waitRoles(t, ins, len(ins))
			up.Release()
			as := <-done
			retried := 0
			for _, a := range as {
				if tc.retried != 0 && a.status == tc.retried {
					if role := a.header.Get("X-Dedupe-Role"); role != "owner" {
						t.Fatalf("status %d as %q; want it only for the owner whose call it answered", a.status, role)
					}
					retried++
					continue
				}
				if a.status != tc.status {
					t.Fatalf("status %d (%s); want %d", a.status, a.body, tc.status)
				}
				if tc.retryAft && a.header.Get("Retry-After") != "7" {
					t.Fatalf("Retry-After %q; want 7", a.header.Get("Retry-After"))
				}
			}
			if want := min(tc.retried, 1); retried != want {
				t.Fatalf("%d clients got the retried call's %d; want %d, the owner's own", retried, tc.retried, want)
			}
			post(t, ins[0].URL, "/v1/chat/completions", body)
			if up.Calls() != tc.wantCalls {
				t.Fatalf("%d upstream calls; want %d", up.Calls(), tc.wantCalls)
			}
		})
	}
}
