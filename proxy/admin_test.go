package proxy_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

const adminToken = "admin-secret-token"

// events is an Observer that lets a test wait for an event of a kind.
type events struct {
	mu sync.Mutex
	n  map[singleflight.EventKind]int
	ch chan struct{}
}

func newEvents() *events {
	return &events{n: map[singleflight.EventKind]int{}, ch: make(chan struct{})}
}

func (e *events) Observe(ev singleflight.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n[ev.Kind]++
	close(e.ch)
	e.ch = make(chan struct{})
}

// waitFor waits until n events of kind k were seen, at most d.
func (e *events) waitFor(t *testing.T, k singleflight.EventKind, n int, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		e.mu.Lock()
		got, ch := e.n[k], e.ch
		e.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("waited %v for %d events of kind %d; got %d", d, n, k, got)
		}
	}
}

// tee passes every event to two Observers.
type tee [2]singleflight.Observer

func (t tee) Observe(e singleflight.Event) { t[0].Observe(e); t[1].Observe(e) }

// adminOf serves the admin API of an instance on a loopback port.
func adminOf(t *testing.T, in *instance) string {
	t.Helper()
	h, err := proxy.NewAdmin(proxy.AdminConfig{Token: adminToken, Flights: in.Group, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func adminDo(t *testing.T, method, url, token string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// pair returns two instances sharing rs, or one instance twice in memory, and the event
// recorder of the second; both listen for purges.
func pair(t *testing.T, up *upstream, rs *redistest.Server, o singleflight.Options) (*instance, *instance, *events) {
	t.Helper()
	ev := newEvents()
	a := newInstance(t, up, setup{redis: rs, flight: o})
	b := a
	if rs != nil {
		o.Observer = ev
		b = newInstance(t, up, setup{redis: rs, flight: o})
	}
	for _, in := range []*instance{a, b} {
		select {
		case <-in.Group.Listening():
		case <-time.After(5 * time.Second):
			t.Fatal("the purge subscription did not start")
		}
	}
	return a, b, ev
}

func TestAdminToken(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			in := newInstance(t, startUpstream(t), setup{redis: rs})
			base := adminOf(t, in)
			for _, tok := range []string{"", "wrong", adminToken + "x", strings.ToUpper(adminToken)} {
				for _, ep := range []struct{ method, path string }{
					{"GET", "/admin/flights"}, {"DELETE", "/admin/answers/" + strings.Repeat("a", 64)}, {"POST", "/admin/purge?namespace=x"},
				} {
					status, hdr, body := adminDo(t, ep.method, base+ep.path, tok)
					errorBody(t, answer{status: status, header: hdr, body: body}, http.StatusUnauthorized, "invalid_admin_token")
					if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
						t.Fatalf("token %q: WWW-Authenticate %q; want Bearer", tok, hdr.Get("WWW-Authenticate"))
					}
				}
			}
			if status, _, body := adminDo(t, "GET", base+"/admin/flights", adminToken); status != 200 {
				t.Fatalf("right token: %d %s; want 200", status, body)
			}
			status, hdr, body := adminDo(t, "DELETE", base+"/admin/answers/not-a-key", adminToken)
			errorBody(t, answer{status: status, header: hdr, body: body}, http.StatusBadRequest, "invalid_key")
			status, hdr, body = adminDo(t, "POST", base+"/admin/purge", adminToken)
			errorBody(t, answer{status: status, header: hdr, body: body}, http.StatusBadRequest, "invalid_namespace")
		})
	}
}

// TestAdminSaysWhatWasWrong: a DELETE without a key (what an empty shell variable makes)
// is told what a key is, not that the endpoint does not exist; a path that is no endpoint
// is told the endpoints there are.
func TestAdminSaysWhatWasWrong(t *testing.T) {
	in := newInstance(t, startUpstream(t), setup{})
	base := adminOf(t, in)
	for _, tc := range []struct{ method, path, code, says string }{
		{"DELETE", "/admin/answers/", "invalid_key", "takes a key of 64 lower-case hex digits (an answer's X-Dedupe-Key, or the last line llm-dedupe-proxy key prints), got none"},
		{"DELETE", "/admin/answers", "invalid_key", "got none"},
		{"DELETE", "/admin/answers/ABC", "invalid_key", `got \"ABC\"`}, // as JSON escapes it
		{"GET", "/admin/answer", "not_found", "there are GET /admin/flights, DELETE /admin/answers/KEY and POST /admin/purge?namespace=NAME"},
	} {
		status, hdr, body := adminDo(t, tc.method, base+tc.path, adminToken)
		want := http.StatusBadRequest
		if tc.code == "not_found" {
			want = http.StatusNotFound
		}
		errorBody(t, answer{status: status, header: hdr, body: body}, want, tc.code)
		if !strings.Contains(body, tc.says) {
			t.Errorf("%s %s: %s; want it to say %q", tc.method, tc.path, body, tc.says)
		}
	}
}

func TestAdminPurgeAnswer(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			a, b, ev := pair(t, up, rs, singleflight.Options{ResultTTL: time.Minute})
			const path = "/v1/chat/completions"
			body := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"purge ` + name + `"}]}`
			first := post(t, a.URL, path, body)
			if role := first.header.Get("X-Dedupe-Role"); role != "owner" {
				t.Fatalf("first: role %q", role)
			}
			if role := post(t, b.URL, path, body).header.Get("X-Dedupe-Role"); role != "hit" {
				t.Fatalf("second instance before purge: role %q; want hit", role)
			}
			key := first.header.Get("X-Dedupe-Key")
			status, _, out := adminDo(t, "DELETE", adminOf(t, a)+"/admin/answers/"+key, adminToken)
			if status != 200 || !strings.Contains(out, `"found":true`) {
				t.Fatalf("DELETE: %d %s; want 200 found", status, out)
			}
			if rs != nil {
				ev.waitFor(t, singleflight.EventInvalidated, 1, 10*time.Second) // awaited, not timed (ADR 0046)
			}
			calls := up.Calls()
			if a := post(t, b.URL, path, body); a.header.Get("X-Dedupe-Role") != "owner" || up.Calls() != calls+1 {
				t.Fatalf("second instance after purge: role %q calls %d; want owner %d", a.header.Get("X-Dedupe-Role"), up.Calls(), calls+1)
			}
			if got := value(t, a.Reg, "llm_dedupe_purges_total", map[string]string{"kind": "answer"}); got != 1 {
				t.Fatalf("purges_total{kind=answer} = %v; want 1", got)
			}
		})
	}
}

func TestNamespaces(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			a, b, ev := pair(t, up, rs, singleflight.Options{ResultTTL: time.Minute})
			const path = "/v1/chat/completions"
			body := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"ns ` + name + `"}]}`
			role := func(in *instance, ns string) string {
				t.Helper()
				var hdr []string
				if ns != "" {
					hdr = []string{"X-Dedupe-Namespace", ns}
				}
				a := post(t, in.URL, path, body, hdr...)
				if a.status != 200 {
					t.Fatalf("namespace %q: status %d %s", ns, a.status, a.body)
				}
				return a.header.Get("X-Dedupe-Role")
			}
			for _, ns := range []string{"", "app-a", "app-b"} {
				if r := role(a, ns); r != "owner" {
					t.Fatalf("namespace %q first: %s; want owner (namespaces never share)", ns, r)
				}
			}
			for _, ns := range []string{"", "app-a", "app-b"} {
				if r := role(b, ns); r != "hit" {
					t.Fatalf("namespace %q again: %s; want hit", ns, r)
				}
			}
			status, _, out := adminDo(t, "POST", adminOf(t, a)+"/admin/purge?namespace=app-a", adminToken)
			if status != 200 || !strings.Contains(out, `"generation":`) {
				t.Fatalf("purge: %d %s", status, out)
			}
			if rs != nil {
				ev.waitFor(t, singleflight.EventInvalidated, 1, 10*time.Second) // awaited, not timed (ADR 0046)
			}
			if r := role(b, "app-a"); r != "owner" {
				t.Fatalf("purged namespace: %s; want owner", r)
			}
			for _, ns := range []string{"", "app-b"} {
				if r := role(b, ns); r != "hit" {
					t.Fatalf("namespace %q after another's purge: %s; want hit", ns, r)
				}
			}
			bad := post(t, a.URL, path, body, "X-Dedupe-Namespace", "no spaces please")
			errorBody(t, bad, http.StatusBadRequest, "invalid_namespace")
			if got := value(t, a.Reg, "llm_dedupe_purges_total", map[string]string{"kind": "namespace"}); got != 1 {
				t.Fatalf("purges_total{kind=namespace} = %v; want 1", got)
			}
		})
	}
}

func TestAdminFlights(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeHold())
			a, b, _ := pair(t, up, rs, singleflight.Options{InstanceID: "inst-" + name})
			done := make(chan answer, 1)
			go func() { done <- post(t, a.URL, "/v1/chat/completions", chatBody) }()
			if _, ok := up.Wait(fakeupstream.Stats{Calls: 1}, 10*time.Second); !ok {
				t.Fatal("the upstream call did not start")
			}
			status, _, out := adminDo(t, "GET", adminOf(t, b)+"/admin/flights", adminToken)
			var got proxy.FlightsJSON
			if err := json.Unmarshal([]byte(out), &got); status != 200 || err != nil {
				t.Fatalf("GET /admin/flights: %d %s %v", status, out, err)
			}
			if len(got.Flights) != 1 {
				t.Fatalf("flights %+v; want one", got.Flights)
			}
			f := got.Flights[0]
			if f.State != "running" || f.Owner != "inst-"+name || f.Attempt != 1 || f.Route != "/v1/chat/completions" ||
				f.Model != "gpt-test" || len(f.Key) != 64 || got.Backend != name {
				t.Fatalf("flight %+v backend %s", f, got.Backend)
			}
			if rs != nil && f.LeaseLeftMs <= 0 {
				t.Fatalf("lease left %d ms; want more than 0", f.LeaseLeftMs)
			}
			up.Release()
			if a := <-done; a.status != 200 {
				t.Fatalf("held request: %d", a.status)
			}
		})
	}
}
