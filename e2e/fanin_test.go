package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// TestFanIn: 300 concurrent identical requests over three instances cost one upstream call,
// and every client gets the same answer.
func TestFanIn(t *testing.T) {
	c := startCluster(t, clusterOpts{})
	c.fake.set(fakeupstream.Behavior{Hold: true})
	const n = 300
	model := "e2e-fanin"
	body := chatBody(model, "fan in")
	chs := spread(c.ins, n, chatPath, body, apiKeyA)
	waitWaiting(t, c.ins, n) // every request has reached its flight: now let the answer go
	if s := c.fake.stats(); s.Calls != 1 {
		t.Fatalf("%d upstream calls with %d requests waiting; want 1", s.Calls, n)
	}
	c.fake.release()
	as := collect(chs)

	for i, a := range as {
		wantChat(t, fmt.Sprintf("client %d", i), a, model, 1)
		if len(a.header.Get("X-Dedupe-Key")) != 64 {
			t.Errorf("client %d: X-Dedupe-Key %q; want 64 hex digits", i, a.header.Get("X-Dedupe-Key"))
		}
	}
	if r := roles(as); r["owner"] != 1 || r["follower"] != n-1 {
		t.Errorf("roles %v; want 1 owner and %d followers", r, n-1)
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 1, Completed: 1}) {
		t.Errorf("upstream %+v; want 1 call, completed", s)
	}
	// Each instance saw a third of the clients; two of them only as followers of the third.
	for _, in := range c.ins {
		if got := in.metric("llm_dedupe_requests_total", map[string]string{"route": chatPath}); got != n/3 {
			t.Errorf("%s: %v requests; want %d", in.name, got, n/3)
		}
	}
	if got := sum(c.ins, "llm_dedupe_saved_upstream_requests_total", nil); got != n-1 {
		t.Errorf("saved upstream requests %v; want %d", got, n-1)
	}
	if got := sum(c.ins, "llm_dedupe_upstream_requests_total", nil); got != 1 {
		t.Errorf("upstream requests counted %v; want 1", got)
	}

	// The answer is stored: a repeat on any instance is a hit, with its age.
	for _, in := range c.ins {
		a := post(in.URL, chatPath, body, apiKeyA)
		wantChat(t, in.name+" repeat", a, model, 1)
		if a.role() != "hit" || a.header.Get("Age") == "" {
			t.Errorf("%s repeat: role %q, Age %q; want a hit with an Age", in.name, a.role(), a.header.Get("Age"))
		}
	}
	if s := c.fake.stats(); s.Calls != 1 {
		t.Errorf("%d upstream calls after the repeats; want 1", s.Calls)
	}
}

// TestTenantIsolation: the same request with two API keys is two flights and two upstream
// calls, each tenant gets its own answer, and a stored answer is never served to another key.
func TestTenantIsolation(t *testing.T) {
	c := startCluster(t, clusterOpts{})
	c.fake.set(fakeupstream.Behavior{Hold: true})
	model := "e2e-tenants"
	body := chatBody(model, "whose answer is this?")
	var chs []<-chan answer
	for i, in := range c.ins { // both tenants on every instance
		chs = append(chs, postAsync(in.URL, chatPath, body, apiKeyA), postAsync(c.ins[(i+1)%3].URL, chatPath, body, apiKeyB))
	}
	waitWaiting(t, c.ins, len(chs))
	c.fake.waitFor(fakeupstream.Stats{Calls: 2}, 5*time.Second)
	c.fake.release()
	as := collect(chs)

	byKey := map[string]int64{}
	for i, a := range as {
		key := []string{apiKeyA, apiKeyB}[i%2]
		n := wantChat(t, fmt.Sprintf("client %d (%s)", i, key), a, model, 0)
		if prev, ok := byKey[key]; ok && prev != n {
			t.Errorf("tenant %s got the answers of calls %d and %d; want one", key, prev, n)
		}
		byKey[key] = n
	}
	if byKey[apiKeyA] == byKey[apiKeyB] {
		t.Errorf("both tenants got the answer of call %d; want one call each", byKey[apiKeyA])
	}
	if s := c.fake.stats(); s.Calls != 2 {
		t.Errorf("%d upstream calls; want 2 (one per API key)", s.Calls)
	}
	seen := map[string]bool{}
	for _, call := range c.fake.calls() {
		seen[call.Authorization] = true
	}
	if !seen["Bearer "+apiKeyA] || !seen["Bearer "+apiKeyB] || len(seen) != 2 {
		t.Errorf("upstream saw Authorization %v; want each tenant's own key", seen)
	}

	// Stored answers stay with their tenant; a third key cannot read either.
	for key, n := range byKey {
		a := post(c.ins[2].URL, chatPath, body, key)
		wantChat(t, "repeat with "+key, a, model, n)
		if a.role() != "hit" {
			t.Errorf("repeat with %s: role %q; want hit", key, a.role())
		}
	}
	a := post(c.ins[0].URL, chatPath, body, "sk-e2e-someone-else")
	if n := wantChat(t, "third key", a, model, 3); a.role() != "owner" || n != 3 {
		t.Errorf("third key: role %q, call %d; want owner of a call of its own (3)", a.role(), n)
	}
	for _, call := range c.fake.calls() {
		if !strings.HasPrefix(call.Authorization, "Bearer sk-e2e-") {
			t.Errorf("upstream saw Authorization %q; want the client's own", call.Authorization)
		}
	}
}
