package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// sampledChat is a chat request that samples: no temperature (the API's default, 1), no
// seed; more is a JSON member or two put in front of the messages ("" for none).
func sampledChat(model, prompt, more string) string {
	return fmt.Sprintf(`{"model":%q,%s"messages":[{"role":"user","content":%q}]}`, model, more, prompt)
}

// wantSampled checks an answer's role and X-Dedupe-Sampled ("" for none).
func wantSampled(t *testing.T, who string, a answer, role, sampled string) {
	t.Helper()
	if a.role() != role || a.header.Get("X-Dedupe-Sampled") != sampled {
		t.Errorf("%s: role %q, X-Dedupe-Sampled %q; want %q, %q", who, a.role(), a.header.Get("X-Dedupe-Sampled"), role, sampled)
	}
}

// heldBurst sends n identical requests over the instances while the upstream holds its
// answers, lets them go once ready says so, and returns the answers.
func heldBurst(t *testing.T, c *cluster, n int, body string, ready func()) []answer {
	t.Helper()
	c.fake.set(fakeupstream.Behavior{Hold: true})
	chs := spread(c.ins, n, chatPath, body, apiKeyA)
	ready()
	c.fake.release()
	return collect(chs)
}

// TestSampledRequests: with the default dedupe.sampled (in_flight), through two instances
// on Redis, 20 identical sampled requests at once make one call; the same request sent
// after its answer (a "regenerate") makes a new call; with temperature 0, or a seed, it is
// a hit, and so are embeddings, as before. See ADR 0078.
func TestSampledRequests(t *testing.T) {
	c := startCluster(t, clusterOpts{n: 2})
	const model = "e2e-sampled"
	body := sampledChat(model, "Write a haiku", "")

	herd := heldBurst(t, c, 20, body, func() { waitWaiting(t, c.ins, 20) })
	if r := roles(herd); r["owner"] != 1 || r["follower"] != 19 {
		t.Errorf("20 sampled requests at once: roles %v; want 1 owner, 19 followers", r)
	}
	for i, a := range herd {
		wantChat(t, fmt.Sprintf("herd %d", i), a, model, 1)
		wantSampled(t, "herd", a, a.role(), "in_flight")
	}
	c.fake.set(fakeupstream.Behavior{})
	regen := post(c.ins[1].URL, chatPath, body, apiKeyA)
	wantChat(t, "regenerate", regen, model, 2)
	wantSampled(t, "regenerate", regen, "owner", "in_flight")

	n := int64(2)
	for _, more := range []string{`"temperature":0,`, `"seed":7,`} {
		n++
		b := sampledChat(model, "Write a haiku", more)
		first, again := post(c.ins[0].URL, chatPath, b, apiKeyA), post(c.ins[1].URL, chatPath, b, apiKeyA)
		wantChat(t, more+" first", first, model, n)
		wantChat(t, more+" again", again, model, n)
		wantSampled(t, more+" first", first, "owner", "")
		wantSampled(t, more+" again", again, "hit", "")
	}
	emb := fmt.Sprintf(`{"model":%q,"input":"embed me"}`, model)
	for i, in := range c.ins {
		a := post(in.URL, embedPath, emb, apiKeyA)
		if want := fakeupstream.Unary(embedPath, n+1, model); a.status != 200 || a.body != want {
			t.Errorf("embeddings %d: %v; want call %d's, %s", i, a, n+1, want)
		}
		wantSampled(t, "embeddings", a, map[bool]string{true: "owner", false: "hit"}[i == 0], "")
	}
	if s := c.fake.stats(); s.Calls != n+1 {
		t.Errorf("upstream %+v; want %d calls: the herd's, the regenerate's, one each with temperature 0, a seed and embeddings", s, n+1)
	}
	for _, m := range []struct {
		role string
		want float64
	}{{"owner", 2}, {"follower", 19}, {"hit", 0}} {
		got := sum(c.ins, "llm_dedupe_sampled_requests_total", map[string]string{"sampled": "in_flight", "role": m.role})
		if got != m.want {
			t.Errorf("sampled_requests_total{sampled=in_flight,role=%s} = %v; want %v", m.role, got, m.want)
		}
	}
}

// retryOutput is what e2e/node/retry.mjs prints.
type retryOutput struct {
	Content, Role, Sampled string
	Tries                  []struct {
		Instance   int
		RetryCount string
		AtMs       int64 // since the script started
	}
}

// TestSampledRetryIsServedItsCall: the official Node SDK's request times out on the client
// and the SDK retries it, on the other instance: the retry gets the answer of the call its
// first try started, after that call ended (a hit, from Redis) and while it runs (it
// follows), with no second call. The retry waits at a gate until the test lets it go.
func TestSampledRetryIsServedItsCall(t *testing.T) {
	dir := installNodeSDK(t)
	// A grace well past the calls, so that the call the first try left runs to its end.
	c := startCluster(t, clusterOpts{n: 2, env: map[string]string{"LLM_DEDUPE_FLIGHT_ABANDON_GRACE": "30s"}})
	const model, timeout = "e2e-sampled-retry", 1500 * time.Millisecond
	var (
		mu   sync.Mutex
		open chan struct{} // closed when retries may go
	)
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		o := open
		mu.Unlock()
		select {
		case <-o:
		case <-r.Context().Done():
		}
	}))
	defer gate.Close()

	for _, tc := range []struct {
		name  string
		delay time.Duration // of the upstream's answer
		ended bool          // the retry goes once the call has ended
		roles []string      // the retry's
	}{
		{"after its call ended", 2 * time.Second, true, []string{"hit"}},
		// Its retry comes at about 1.9 s: it follows, or, on a slow machine, it is a hit.
		{"while its call runs", 2500 * time.Millisecond, false, []string{"follower", "hit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.fake.set(fakeupstream.Behavior{Delay: tc.delay})
			before := c.fake.stats()
			left := c.ins[0].metric("llm_dedupe_requests_total", map[string]string{"code": "499"})
			o := make(chan struct{})
			mu.Lock()
			open = o
			mu.Unlock()
			if !tc.ended {
				close(o)
			}
			cfg, _ := json.Marshal(map[string]any{
				"bases": []string{c.ins[0].URL + "/v1", c.ins[1].URL + "/v1"}, "apiKey": apiKeyA, "model": model,
				"prompt": tc.name, "timeoutMs": timeout.Milliseconds(), "gate": gate.URL,
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "retry.mjs"), string(cfg))
			var stdout, stderr bytes.Buffer
			cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.ended {
				// The first try's client left; its handler returns once the call's answer
				// is stored (ADR 0020) and counts it 499.
				redistest.WaitUntil(t, 20*time.Second, "the first try counted 499", func() (bool, string) {
					n := c.ins[0].metric("llm_dedupe_requests_total", map[string]string{"code": "499"})
					return n > left, fmt.Sprintf("%v", n)
				})
				close(o)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("node retry.mjs: %v\nstderr:\n%s", err, stderr.String())
			}
			var out retryOutput
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("node retry.mjs printed %q: %v", stdout.String(), err)
			}
			call := before.Calls + 1
			if want := fmt.Sprintf("reply %d", call); out.Content != want || !contains(tc.roles, out.Role) || out.Sampled != "retry" {
				t.Errorf("the SDK got %q, role %q, X-Dedupe-Sampled %q; want %q, one of %q, retry", out.Content, out.Role, out.Sampled, want, tc.roles)
			}
			if len(out.Tries) < 2 || out.Tries[0].RetryCount != "0" || out.Tries[1].RetryCount != "1" || out.Tries[1].Instance != 1 {
				t.Errorf("tries %+v; want the first (X-Stainless-Retry-Count 0) on instance 0, its retry (1) on instance 1", out.Tries)
			}
			if s := c.fake.stats(); s.Calls != call || s.Completed != before.Completed+1 || s.Abandoned != before.Abandoned {
				t.Errorf("upstream %+v, before %+v; want one call more, completed", s, before)
			}
			// The SDK's wait before its retry, from when the first try's timeout ended it.
			wait := time.Duration(out.Tries[1].AtMs-out.Tries[0].AtMs)*time.Millisecond - timeout
			t.Logf("SAMPLED-RETRY %s: %d tries %+v, the first retry sent %v after its first try timed out, served as a %s",
				tc.name, len(out.Tries), out.Tries, wait, out.Role)
		})
	}
}

func contains(set []string, s string) bool {
	for _, x := range set {
		if x == s {
			return true
		}
	}
	return false
}

// TestSampledSharingSettings: dedupe.sampled never sends 20 identical sampled requests at
// once upstream as 20 calls, and still deduplicates a request that does not sample;
// dedupe.sampled store gives today's results: one call, then hits.
func TestSampledSharingSettings(t *testing.T) {
	const model = "e2e-sampled-settings"
	body := sampledChat(model, "Write a haiku", "")
	t.Run("never", func(t *testing.T) {
		c := startCluster(t, clusterOpts{n: 2, env: map[string]string{"LLM_DEDUPE_DEDUPE_SAMPLED": "never"}})
		herd := heldBurst(t, c, 20, body, func() { c.fake.waitFor(fakeupstream.Stats{Calls: 20}, 20*time.Second) })
		for _, a := range herd {
			if a.status != 200 {
				t.Errorf("never: %v; want 200", a)
			}
			wantSampled(t, "never", a, "bypass", "never")
		}
		greedy := chatBody(model, "Write a haiku")
		wantChat(t, "temperature 0", post(c.ins[0].URL, chatPath, greedy, apiKeyA), model, 21)
		a := post(c.ins[1].URL, chatPath, greedy, apiKeyA)
		wantChat(t, "temperature 0 again", a, model, 21)
		wantSampled(t, "temperature 0 again", a, "hit", "")
		if s := c.fake.stats(); s.Calls != 21 {
			t.Errorf("upstream %+v; want 21 calls: 20 sampled, one not", s)
		}
		if got := sum(c.ins, "llm_dedupe_sampled_requests_total", map[string]string{"sampled": "never", "role": "bypass"}); got != 20 {
			t.Errorf("sampled_requests_total{sampled=never,role=bypass} = %v; want 20", got)
		}
	})
	t.Run("store", func(t *testing.T) {
		c := startCluster(t, clusterOpts{n: 2, env: map[string]string{"LLM_DEDUPE_DEDUPE_SAMPLED": "store"}})
		herd := heldBurst(t, c, 20, body, func() { waitWaiting(t, c.ins, 20) })
		if r := roles(herd); r["owner"] != 1 || r["follower"] != 19 {
			t.Errorf("store: roles %v; want 1 owner, 19 followers", r)
		}
		for i, in := range c.ins {
			a := post(in.URL, chatPath, body, apiKeyA)
			wantChat(t, fmt.Sprintf("store, later, on instance %d", i), a, model, 1)
			wantSampled(t, "store, later", a, "hit", "store")
		}
		if s := c.fake.stats(); s.Calls != 1 {
			t.Errorf("upstream %+v; want 1 call", s)
		}
	})
}
