package proxy_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

const chatPath = "/v1/chat/completions"

// sampledBody is a chat request that samples: no temperature, the API's default of 1.
func sampledBody(prompt string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`
}

// wantAnswer checks an answer's role, its X-Dedupe-Sampled, and that it is the fake's
// reply n.
func wantAnswer(t *testing.T, who string, a answer, role, sampled string, n int) {
	t.Helper()
	reply := `"content":"reply ` + strconv.Itoa(n) + `"`
	if a.status != 200 || a.header.Get("X-Dedupe-Role") != role || a.header.Get(proxy.HeaderSampled) != sampled || !strings.Contains(a.body, reply) {
		t.Fatalf("%s: %d role %q sampled %q %s; want 200 %q %q with reply %d",
			who, a.status, a.header.Get("X-Dedupe-Role"), a.header.Get(proxy.HeaderSampled), a.body, role, sampled, n)
	}
}

// sampledCount is sampled_requests_total of a sampling and role, over instances.
func sampledCount(t *testing.T, ins []*instance, sampled, role string) float64 {
	t.Helper()
	n := 0.0
	for _, in := range ins {
		n += value(t, in.Reg, "llm_dedupe_sampled_requests_total", map[string]string{"sampled": sampled, "role": role})
	}
	return n
}

// TestSampledRequestsShareOnlyInFlight: identical sampled requests at once share one call;
// one sent after it ended (a "regenerate") makes a new call, but a client's retry is served
// the stored answer; a request that does not sample is stored as ever. See ADR 0078.
func TestSampledRequestsShareOnlyInFlight(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}
			ins := []*instance{newInstance(t, up, s)}
			if rs != nil {
				ins = append(ins, newInstance(t, up, s))
			}
			body := sampledBody("sampled " + name)
			up.Set(fakeHold())
			done := make(chan []answer)
			go func() { done <- burst(t, ins, 6, chatPath, body) }()
			waitWaiting(t, ins, 6)
			waitRoles(t, ins, len(ins))
			up.Release()
			herd := <-done
			if r := roles(herd); r["owner"] != 1 || r["follower"] != 5 || up.Calls() != 1 {
				t.Fatalf("6 sampled requests at once: roles %v, %d calls; want 1 owner, 5 followers, 1 call", r, up.Calls())
			}
			for _, a := range herd {
				wantAnswer(t, "herd", a, a.header.Get("X-Dedupe-Role"), "in_flight", 1)
			}
			last := ins[len(ins)-1]
			wantAnswer(t, "regenerate", post(t, last.URL, chatPath, body), "owner", "in_flight", 2)
			// On the instance of the call it retries: another may still keep the herd's
			// answer in memory, as old as the window allows (see ADR 0078).
			wantAnswer(t, "a retry", post(t, last.URL, chatPath, body, proxy.HeaderRetryCount, "1"), "hit", "retry", 2)
			wantAnswer(t, "a first try", post(t, ins[0].URL, chatPath, body, proxy.HeaderRetryCount, "0"), "owner", "in_flight", 3)

			for i, greedy := range []string{`"temperature":0,`, `"seed":7,`} {
				n, b := 4+i, strings.Replace(body, `{`, `{`+greedy, 1)
				wantAnswer(t, greedy, post(t, ins[0].URL, chatPath, b), "owner", "", n)
				wantAnswer(t, greedy+" again", post(t, last.URL, chatPath, b), "hit", "", n)
			}
			for _, c := range []struct {
				sampled, role string
				want          float64
			}{{"in_flight", "owner", 3}, {"in_flight", "follower", 5}, {"in_flight", "hit", 0}, {"retry", "hit", 1}} {
				if got := sampledCount(t, ins, c.sampled, c.role); got != c.want {
					t.Errorf("sampled_requests_total{sampled=%q,role=%q} = %v; want %v", c.sampled, c.role, got, c.want)
				}
			}
		})
	}
}

// TestSampledAnswerKeptForTheRetryWindow: a sampled request's answer is stored no longer
// than the retry window, served to a retry no older than it, and not stored at all where
// the Flights store nothing.
func TestSampledAnswerKeptForTheRetryWindow(t *testing.T) {
	rs := backends(t)["redis"]
	up := startUpstream(t)
	const window = 2 * time.Second
	s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Hour},
		proxy: func(c *proxy.Config) { c.SampledRetryWindow = window }}
	in := newInstance(t, up, s)
	body := sampledBody("window")
	first := post(t, in.URL, chatPath, body)
	wantAnswer(t, "first", first, "owner", "in_flight", 1)
	key := "ai:flight:result:{" + first.header.Get("X-Dedupe-Key") + "}"
	ctx := context.Background()
	if ttl := rs.Client().PTTL(ctx, key).Val(); ttl <= 0 || ttl > window {
		t.Fatalf("the sampled answer is stored for %v; want at most the window, %v", ttl, window)
	}
	// Aged past the window in Redis, read by an instance that has no copy of its own.
	at, err := rs.Client().HGet(ctx, key, "at").Int64()
	if err != nil {
		t.Fatal(err)
	}
	rs.Client().HSet(ctx, key, "at", at-window.Milliseconds()-1)
	other := newInstance(t, up, s)
	wantAnswer(t, "a retry after the window", post(t, other.URL, chatPath, body, proxy.HeaderRetryCount, "2"), "owner", "retry", 2)

	// Flights that store nothing (result_ttl 0) keep no sampled answer either.
	up2 := startUpstream(t)
	bare := newInstance(t, up2, setup{redis: rs, proxy: func(c *proxy.Config) { c.SampledRetryWindow = window }})
	body = sampledBody("dedupe only")
	wantAnswer(t, "first", post(t, bare.URL, chatPath, body), "owner", "in_flight", 1)
	wantAnswer(t, "its retry", post(t, bare.URL, chatPath, body, proxy.HeaderRetryCount, "1"), "owner", "retry", 2)
}

// TestSampledSharingSettings: never sends each sampled request upstream on its own, as a
// bypass, and still deduplicates those that do not sample; store keeps today's behaviour.
func TestSampledSharingSettings(t *testing.T) {
	rs := backends(t)["redis"]
	up := startUpstream(t)
	never := func(c *proxy.Config) { c.Sampled = proxy.ShareNever }
	s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}, proxy: never}
	ins := []*instance{newInstance(t, up, s), newInstance(t, up, s)}
	up.Set(fakeHold())
	done := make(chan []answer)
	go func() { done <- burst(t, ins, 4, chatPath, sampledBody("never")) }()
	if _, ok := up.Wait(fakeupstream.Stats{Calls: 4}, 10*time.Second); !ok {
		t.Fatalf("%d calls for 4 sampled requests at once under never; want 4", up.Calls())
	}
	up.Release()
	for _, a := range <-done {
		if a.status != 200 || a.header.Get("X-Dedupe-Role") != "bypass" || a.header.Get(proxy.HeaderSampled) != "never" {
			t.Fatalf("never: %d role %q sampled %q; want 200 bypass never", a.status, a.header.Get("X-Dedupe-Role"), a.header.Get(proxy.HeaderSampled))
		}
	}
	if got := sampledCount(t, ins, "never", "bypass"); got != 4 || up.Calls() != 4 {
		t.Fatalf("never: %d calls, sampled_requests_total{never,bypass} %v; want 4, 4", up.Calls(), got)
	}
	greedy := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"never"}]}`
	wantAnswer(t, "not sampled", post(t, ins[0].URL, chatPath, greedy), "owner", "", 5)
	wantAnswer(t, "not sampled, again", post(t, ins[1].URL, chatPath, greedy), "hit", "", 5)

	up2 := startUpstream(t)
	store := newInstance(t, up2, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute},
		proxy: func(c *proxy.Config) { c.Sampled = proxy.ShareAndStore }})
	body := sampledBody("store")
	wantAnswer(t, "store", post(t, store.URL, chatPath, body), "owner", "store", 1)
	wantAnswer(t, "store, again", post(t, store.URL, chatPath, body), "hit", "store", 1)
}
