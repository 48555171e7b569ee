package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestKeyAgreesWithProxy sends requests to a running proxy and asks key about each with the
// same headers: every key it prints is the proxy's X-Dedupe-Key, before and after purges of
// a namespace and of the default one (read from Redis, or given with --generation in
// memory), and a request the proxy gives no key or refuses is said to be one.
func TestKeyAgreesWithProxy(t *testing.T) {
	const token = "key-test-admin-token-0123"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x"}`)
	}))
	defer up.Close()
	const body = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hi"}],"user":"u1"}`

	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			admin := redistest.FreeAddr(t)
			args := []string{"--upstream.base_url=" + up.URL, "--admin.listen=" + admin, "--admin.token=" + token,
				"--hashing.ignore_fields=user,metadata"}
			var redisArgs []string
			if backend == "redis" {
				redisArgs = []string{"--redis.addrs=" + redistest.Start(t).Addr}
			}
			base, stop, msgs := startServeLogs(t, append(args, redisArgs...)...)
			defer stop()
			waitLogged(t, msgs, "admin listening")

			// send posts body to path with headers ("Name: value") and returns the key the
			// proxy gave the request ("" for none) and the status.
			send := func(path string, headers ...string) (string, int) {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
				for _, h := range headers {
					name, value, _ := strings.Cut(h, ": ")
					req.Header.Add(name, value)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				return res.Header.Get("X-Dedupe-Key"), res.StatusCode
			}
			// key runs the key command as a user would for the same request.
			key := func(path string, extra []string, headers ...string) result {
				t.Helper()
				a := []string{"key", "--path=" + path, "--hashing.ignore_fields=user,metadata"}
				a = append(a, redisArgs...)
				a = append(a, extra...)
				for _, h := range headers {
					a = append(a, "--header", h)
				}
				return runCmd(t, nil, body, a...)
			}
			purge := func(ns string) string {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, "http://"+admin+"/admin/purge?namespace="+ns, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				var out struct{ Generation uint64 }
				if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode != 200 {
					t.Fatalf("purge of %q: %d %v", ns, res.StatusCode, err)
				}
				return strconv.FormatUint(out.Generation, 10)
			}
			agree := func(what, path string, gen string, headers ...string) {
				t.Helper()
				want, status := send(path, headers...)
				var extra []string
				if gen != "" && backend == "memory" {
					extra = []string{"--generation=" + gen} // the instance's memory: key cannot see it
				}
				r := key(path, extra, headers...)
				lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
				if status != 200 || want == "" || r.code != 0 || lines[len(lines)-1] != want {
					t.Errorf("%s: the proxy answered %d with key %q; key printed %q (status %d, %s)",
						what, status, want, r.stdout, r.code, r.stderr)
				}
			}

			const chat = "/v1/chat/completions"
			agree("no header", chat, "")
			agree("a credential", chat, "", "Authorization: Bearer sk-a")
			agree("a namespace", chat, "", "X-Dedupe-Namespace: team-b")
			agree("a query, its parameters out of order", chat+"?b=2&a=1", "")
			agree("another route", "/v1/embeddings", "")
			gen := purge("team-b")
			agree("a purged namespace", chat, gen, "X-Dedupe-Namespace: team-b", "Authorization: Bearer sk-a")
			gen = purge("")
			agree("the purged default namespace", chat, gen)

			if r := key(chat, nil, "X-Dedupe-Namespace: team-c"); backend == "memory" &&
				!strings.Contains(r.stderr, `note: without Redis, namespace "team-c"'s generation lives in the running instance's memory`) {
				t.Errorf("key with a namespace, in memory: stderr %q; want a note that it cannot see purges", r.stderr)
			}

			// Requests the proxy gives no key, or refuses: key says so, and prints no key.
			for _, tc := range []struct {
				what, path string
				headers    []string
				status     int
				says       string
			}{
				{"bypass", chat, []string{"X-Dedupe-Bypass: 1"}, 200, "straight upstream"},
				{"compressed", chat, []string{"Content-Encoding: gzip"}, 0, "straight upstream"},
				{"a route not deduplicated", "/v1/models", nil, 200, "not a deduplicated route"},
				{"two namespaces", chat, []string{"X-Dedupe-Namespace: a", "X-Dedupe-Namespace: b"}, 400, "refuses two X-Dedupe-Namespace"},
				{"an invalid namespace", chat, []string{"X-Dedupe-Namespace: a b"}, 400, "refuses X-Dedupe-Namespace"},
			} {
				if tc.status != 0 { // a gzip header on a body that is not gzip: nothing to check upstream
					if got, status := send(tc.path, tc.headers...); got != "" || status != tc.status {
						t.Errorf("%s: the proxy answered %d with key %q; want %d and no key", tc.what, status, got, tc.status)
					}
				}
				if r := key(tc.path, nil, tc.headers...); r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, tc.says) {
					t.Errorf("%s: key status %d, stdout %q, stderr %q; want 1, no key, and %q", tc.what, r.code, r.stdout, r.stderr, tc.says)
				}
			}
		})
	}
}

// TestKeyHeaderScope: with hashing.scope header:NAME, key hashes that header as the proxy
// does, and ignores the Authorization.
func TestKeyHeaderScope(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"id":"x"}`)
	}))
	defer up.Close()
	base, stop := startServe(t, "--upstream.base_url="+up.URL, "--hashing.scope=header:X-Tenant")
	defer stop()
	const body = `{"model":"m","input":"x"}`
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/embeddings", strings.NewReader(body))
	req.Header.Set("X-Tenant", "t1")
	req.Header.Set("Authorization", "Bearer sk-a")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	got := keyOf(t, nil, body, "--hashing.scope=header:X-Tenant", "--path=/v1/embeddings", "--header", "x-tenant: t1")
	if want := res.Header.Get("X-Dedupe-Key"); got != want {
		t.Errorf("key %s; want the proxy's %s", got, want)
	}
}
