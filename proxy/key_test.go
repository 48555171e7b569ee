package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

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

// TestTwoNamespacesAreRefused: a request naming two namespaces is refused, not keyed in
// the first one it names.
func TestTwoNamespacesAreRefused(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	res, body, err := rawRequest(t, in.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Dedupe-Namespace: a\r\nX-Dedupe-Namespace: b\r\n"+
		"Content-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"model\":\"m\"}", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_namespace"`) || !strings.Contains(body, "only one") || up.Calls() != 0 {
		t.Fatalf("got %d %s, %d upstream calls; want 400 invalid_namespace saying only one is allowed, and no call", res.StatusCode, body, up.Calls())
	}
}

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

// TestNamespaceOfUnknownGenerationNeitherServesNorStores: a namespaced request whose
// generation cannot be read might be of a purged generation: it is not served the stored
// answer its key would find, and its own answer is not stored. See ADR 0047. Here Redis
// answers the read with an error (the generation's key is of the wrong type) and answers
// everything else, so that a stored answer is within reach.
func TestNamespaceOfUnknownGenerationNeitherServesNorStores(t *testing.T) {
	rs := redistest.Start(t)
	up := startUpstream(t)
	s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}
	const path, ns, nsKey = "/v1/chat/completions", "app-a", "ai:flight:ns:app-a"
	hdr := []string{"X-Dedupe-Namespace", ns}
	ctx := context.Background()
	stored := post(t, newInstance(t, up, s).URL, path, chatBody, hdr...) // generation 0
	if stored.status != 200 || stored.header.Get("X-Dedupe-Role") != "owner" {
		t.Fatalf("first request: %d %q; want 200 owner", stored.status, stored.header.Get("X-Dedupe-Role"))
	}

	if err := rs.Client().HSet(ctx, nsKey, "gen", 1).Err(); err != nil { // GET answers WRONGTYPE
		t.Fatal(err)
	}
	in := newInstance(t, up, s) // it never read the namespace
	if _, err := in.Group.NamespaceGeneration(ctx, ns); !errors.Is(err, singleflight.ErrNamespaceGenerationUnknown) {
		t.Fatalf("Generation: %v; want ErrNamespaceGenerationUnknown", err)
	}
	a := post(t, in.URL, path, chatBody, hdr...)
	if in.Group.Degraded() {
		t.Fatal("the instance went local-only: the stored answer was out of its reach")
	}
	if a.header.Get("X-Dedupe-Key") != stored.header.Get("X-Dedupe-Key") {
		t.Fatalf("key %s; want the stored answer's %s, that of generation 0", a.header.Get("X-Dedupe-Key"), stored.header.Get("X-Dedupe-Key"))
	}
	if a.status != 200 || a.header.Get("X-Dedupe-Role") != "owner" || a.body == stored.body || up.Calls() != 2 {
		t.Fatalf("unknown generation: %d %q, %d calls; want 200 owner with a call of its own", a.status, a.header.Get("X-Dedupe-Role"), up.Calls())
	}

	// Readable again: an instance with no copy of its own finds the first answer, not this one.
	if err := rs.Client().Del(ctx, nsKey).Err(); err != nil {
		t.Fatal(err)
	}
	later := post(t, newInstance(t, up, s).URL, path, chatBody, hdr...)
	if later.header.Get("X-Dedupe-Role") != "hit" || later.body != stored.body {
		t.Fatalf("after it: %q %s; want a hit of the first answer %s", later.header.Get("X-Dedupe-Role"), later.body, stored.body)
	}
}
