package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// value is the sum of the samples of metric name whose labels include want.
func value(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// waitWaiting waits until n requests in all wait for their flight's outcome.
func waitWaiting(t *testing.T, ins []*instance, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := 0.0
		for _, in := range ins {
			got += value(t, in.Reg, "llm_dedupe_waiting_requests", nil)
		}
		if int(got) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v requests waiting after 20s; want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond) // the gauge has no change notification over HTTP
	}
}

// waitRoles waits until n local flights over ins had their role decided: each has looked
// its key up in Redis. A request counted as waiting may not have yet, and one that looks
// only after the flight ended (an answer not stored) rightly starts a new call.
func waitRoles(t *testing.T, ins []*instance, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := 0.0
		for _, in := range ins {
			for _, role := range []string{"owner", "follower", "hit"} {
				got += value(t, in.Reg, "llm_dedupe_flight_roles_total", map[string]string{"role": role})
			}
		}
		if int(got) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v flights with a role after 20s; want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond) // the counter has no change notification over HTTP
	}
}

func backends(t *testing.T) map[string]*redistest.Server {
	return map[string]*redistest.Server{"memory": nil, "redis": redistest.Start(t)}
}

func TestBurstCostsOneCall(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeHold())
			s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}
			ins := []*instance{newInstance(t, up, s)}
			if rs != nil {
				ins = append(ins, newInstance(t, up, s))
			}
			done := make(chan []answer)
			go func() { done <- burst(t, ins, 100, "/v1/chat/completions", chatBody) }()
			waitWaiting(t, ins, 100)
			up.Release()
			as := <-done
			if up.Calls() != 1 {
				t.Fatalf("%d upstream calls; want 1", up.Calls())
			}
			for i, a := range as {
				if a.err != nil || a.status != 200 || a.body != as[0].body {
					t.Fatalf("answer %d: (%d, %q, %v); want 200 and the same body as the others", i, a.status, a.body, a.err)
				}
				if a.header.Get("X-Request-Id") != "req_1" || a.header.Get("Set-Cookie") != "" {
					t.Fatalf("answer %d headers %v: want the upstream's X-Request-Id and no Set-Cookie", i, a.header)
				}
				if len(a.header.Get("X-Dedupe-Key")) != 64 {
					t.Fatalf("answer %d: X-Dedupe-Key %q; want 64 hex", i, a.header.Get("X-Dedupe-Key"))
				}
			}
			// A request counts as waiting from before it joins the flight (its first byte
			// is what it waits for): one that joins only after the answer landed is a hit.
			if r := roles(as); r["owner"] != 1 || r["follower"]+r["hit"] != 99 {
				t.Fatalf("roles %v; want 1 owner, 99 followers or hits", r)
			}
			hit := post(t, ins[len(ins)-1].URL, "/v1/chat/completions", chatBody)
			if hit.header.Get("X-Dedupe-Role") != "hit" || hit.header.Get("Age") == "" || hit.body != as[0].body || up.Calls() != 1 {
				t.Fatalf("repeat: role %q Age %q calls %d; want hit with Age and still 1 call", hit.header.Get("X-Dedupe-Role"), hit.header.Get("Age"), up.Calls())
			}
			// Metrics: 99 followers and 1 hit saved a call each, 11+7 tokens each.
			saved, prompt, completion := 0.0, 0.0, 0.0
			for _, in := range ins {
				saved += value(t, in.Reg, "llm_dedupe_saved_upstream_requests_total", map[string]string{"route": "/v1/chat/completions"})
				prompt += value(t, in.Reg, "llm_dedupe_saved_tokens_total", map[string]string{"model": "gpt-test", "kind": "prompt"})
				completion += value(t, in.Reg, "llm_dedupe_saved_tokens_total", map[string]string{"model": "gpt-test", "kind": "completion"})
			}
			if saved != 100 || prompt != 100*11 || completion != 100*7 {
				t.Fatalf("saved %v requests, %v prompt and %v completion tokens; want 100, 1100, 700", saved, prompt, completion)
			}
		})
	}
}

func fakeHold() fakeBehavior { return fakeBehavior{Hold: true} }

func TestTenantsNeverShare(t *testing.T) {
	up := startUpstream(t)
	up.Set(fakeHold())
	in := newInstance(t, up, setup{flight: singleflight.Options{ResultTTL: time.Minute}})
	done := make(chan answer, 2)
	go func() { done <- post(t, in.URL, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-alice") }()
	go func() {
		done <- post(t, in.URL, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-mallory")
	}()
	waitWaiting(t, []*instance{in}, 2)
	up.Release()
	a, b := <-done, <-done
	if up.Calls() != 2 || a.body == b.body {
		t.Fatalf("%d calls, bodies equal %v; want 2 calls and different answers", up.Calls(), a.body == b.body)
	}
	// Once alice's answer is stored, a wrong key still cannot read it.
	wrong := post(t, in.URL, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-wrong")
	if wrong.header.Get("X-Dedupe-Role") != "owner" || up.Calls() != 3 {
		t.Fatalf("wrong key: role %q, calls %d; want owner and a call of its own", wrong.header.Get("X-Dedupe-Role"), up.Calls())
	}
	for _, c := range up.Log() {
		if !strings.HasPrefix(c.Authorization, "Bearer sk-") {
			t.Fatalf("upstream saw Authorization %q; want the client's", c.Authorization)
		}
	}
}

func TestOutcomePolicy(t *testing.T) {
	rs := redistest.Start(t)
	cases := []struct {
		name      string
		fail      []int
		wantCalls int64 // for a burst of 3 and then one more request
		status    int
		retryAft  bool
	}{
		{"200 stored", nil, 1, 200, false},
		{"400 shared not stored", []int{400, 400}, 2, 400, false},
		{"401 shared not stored", []int{401, 401}, 2, 401, false},
		{"422 shared not stored", []int{422, 422}, 2, 422, false},
		{"429 shared with Retry-After", []int{429, 429}, 2, 429, true},
		{"500 then success: taken over", []int{500}, 2, 200, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeBehavior{Hold: true, Fail: tc.fail, RetryAfter: "7"})
			s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}
			ins := []*instance{newInstance(t, up, s), newInstance(t, up, s)}
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, tc.name)
			done := make(chan []answer)
			go func() { done <- burst(t, ins, 3, "/v1/chat/completions", body) }()
			waitWaiting(t, ins, 3)
			waitRoles(t, ins, len(ins))
			up.Release()
			as := <-done
			owners := 0
			for _, a := range as {
				if a.header.Get("X-Dedupe-Role") == "owner" && a.status == 500 {
					owners++ // the owner's client gets its own upstream answer
					continue
				}
				if a.status != tc.status {
					t.Fatalf("status %d (%s); want %d", a.status, a.body, tc.status)
				}
				if tc.retryAft && a.header.Get("Retry-After") != "7" {
					t.Fatalf("Retry-After %q; want 7", a.header.Get("Retry-After"))
				}
			}
			post(t, ins[0].URL, "/v1/chat/completions", body)
			if up.Calls() != tc.wantCalls {
				t.Fatalf("%d upstream calls; want %d", up.Calls(), tc.wantCalls)
			}
		})
	}
}

// TestOwnersClientGetsItsFailureAtOnce: the client whose request made a call that failed
// (a 500) gets that answer as soon as the call ends, while the call is tried again for the
// requests waiting with it on the same instance; they get the retry's answer.
func TestOwnersClientGetsItsFailureAtOnce(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeBehavior{Hold: true, Fail: []int{500}})
			in := newInstance(t, up, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}})
			body := `{"model":"m","messages":[{"role":"user","content":"own failure, ` + name + `"}]}`
			answers := make(chan answer, 3)
			for range 3 {
				go func() { answers <- post(t, in.URL, "/v1/chat/completions", body) }()
			}
			waitWaiting(t, []*instance{in}, 3)
			waitRoles(t, []*instance{in}, 1)
			up.ReleaseHeld() // the first call answers 500; the retry will be held
			if _, ok := up.Wait(fakeupstream.Stats{Calls: 2}, 10*time.Second); !ok {
				t.Fatalf("%d upstream calls; want the retry for the waiting requests", up.Calls())
			}
			select {
			case a := <-answers:
				if a.status != 500 || a.header.Get("X-Dedupe-Role") != "owner" || !strings.Contains(a.body, "of call 1") {
					t.Fatalf("first answer: %d %q role %q; want the owner's own 500 from call 1", a.status, a.body, a.header.Get("X-Dedupe-Role"))
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the owner's client got nothing while the retry for the others is held")
			}
			up.Release()
			for range 2 {
				if a := <-answers; a.status != 200 || a.header.Get("X-Dedupe-Role") != "follower" {
					t.Fatalf("waiter: %d %q role %q; want the retry's 200 as a follower", a.status, a.body, a.header.Get("X-Dedupe-Role"))
				}
			}
			if n := up.Calls(); n != 2 {
				t.Fatalf("%d upstream calls; want 2", n)
			}
		})
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
