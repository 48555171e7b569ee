package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestFlightsCommand runs serve with its admin API and lists a flight held in progress,
// in memory and with Redis.
func TestFlightsCommand(t *testing.T) {
	const token = "flights-test-token-0123"
	const body = `{"model":"gpt-cli\u001b[2J\nFAKE-ROW\u0007","messages":[]}`
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			started, release := make(chan struct{}, 1), make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				started <- struct{}{}
				<-release
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"x"}`)
			}))
			defer up.Close()
			admin := redistest.FreeAddr(t)
			args := []string{"--upstream.base_url=" + up.URL, "--admin.listen=" + admin, "--admin.token=" + token}
			var keyArgs []string // key reads the namespace's generation where the proxy does
			if backend == "redis" {
				addrs := "--redis.addrs=" + redistest.Start(t).Addr
				args, keyArgs = append(args, addrs), []string{addrs}
			}
			base, stop, msgs := startServeLogs(t, args...)
			waitLogged(t, msgs, "admin listening")

			done := make(chan struct{})
			go func() {
				defer close(done)
				res, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err == nil {
					res.Body.Close()
				}
			}()
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream call did not start")
			}

			env := map[string]string{"LLM_DEDUPE_ADMIN_TOKEN": token}
			r := runCmd(t, env, "", "flights", "--admin.listen="+admin)
			if r.code != 0 || !strings.Contains(r.stdout, "KEY") || !strings.Contains(r.stdout, "running") ||
				!strings.Contains(r.stdout, "/v1/chat/completions") || !strings.Contains(r.stdout, "gpt-cli") ||
				!strings.Contains(r.stdout, "1 flight in progress ("+backend+")") {
				t.Errorf("flights: status %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			// The owner is an instance one can find: in its /readyz and its /metrics.
			if owner := ownerListed(r.stdout); owner == "" || readyzInstance(t, base) != owner ||
				!strings.Contains(getBody(t, base+"/metrics"), `llm_dedupe_instance_info{instance_id="`+owner+`",version=`) {
				t.Errorf("flights lists owner %q; want the instance id of /readyz (%s) and /metrics", owner, readyzInstance(t, base))
			}
			// The key is printed whole: the one key prints, which the admin API takes.
			var listed string
			if lines := strings.Split(r.stdout, "\n"); len(lines) > 1 {
				listed, _, _ = strings.Cut(lines[1], " ")
			}
			if want := keyOf(t, nil, body, keyArgs...); listed != want {
				t.Errorf("flights lists key %q; want the whole key, %s, as key prints it", listed, want)
			}
			// A client chose the model: its control characters are shown escaped, and
			// cannot add a row or move the operator's terminal.
			if lines := strings.Count(r.stdout, "\n"); strings.ContainsAny(r.stdout, "\x1b\a") || lines != 3 {
				t.Errorf("flights printed the model's control characters raw (%d lines):\n%q", lines, r.stdout)
			}
			r = runCmd(t, env, "", "flights", "--admin.listen="+admin, "--json")
			if r.code != 0 || !strings.Contains(r.stdout, `"model":"gpt-cli\u001b[2J\nFAKE-ROW\u0007"`) {
				t.Errorf("flights --json: status %d %s%s", r.code, r.stdout, r.stderr)
			}
			r = runCmd(t, map[string]string{"LLM_DEDUPE_ADMIN_TOKEN": "wrong-token-0123456789"}, "", "flights", "--admin.listen="+admin)
			if r.code != 1 || !strings.Contains(r.stderr, "answered 401") {
				t.Errorf("flights with a wrong token: status %d %s; want 1 and 401", r.code, r.stderr)
			}
			close(release)
			<-done
			// What flights printed is what DELETE /admin/answers/{key} takes.
			req, _ := http.NewRequest(http.MethodDelete, "http://"+admin+"/admin/answers/"+listed, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			deleted, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || !strings.Contains(string(deleted), `"found":true`) {
				t.Errorf("DELETE /admin/answers/ of the key flights listed: %d %s; want 200 and found", res.StatusCode, deleted)
			}
			if code := stop(); code != 0 {
				t.Errorf("serve: status %d", code)
			}
		})
	}
}

// TestFlightsSaysWhatToPass: flights without the admin API's address or token says which
// flag or variable gives it, not the rule serve is held to.
func TestFlightsSaysWhatToPass(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"no address", nil, nil, []string{"--admin.listen=HOST:PORT", "LLM_DEDUPE_ADMIN_LISTEN"}},
		{"no token", nil, []string{"--admin.listen=127.0.0.1:9091"}, []string{"--admin.token=TOKEN", "LLM_DEDUPE_ADMIN_TOKEN"}},
		{"no token, address from the environment", map[string]string{"LLM_DEDUPE_ADMIN_LISTEN": "127.0.0.1:9091"}, nil,
			[]string{"--admin.token=TOKEN", "LLM_DEDUPE_ADMIN_TOKEN"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCmd(t, tc.env, "", append([]string{"flights"}, tc.args...)...)
			if r.code != 2 {
				t.Errorf("status %d; want 2", r.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q; want it to name %s", r.stderr, w)
				}
			}
			if strings.Contains(r.stderr, "invalid config") {
				t.Errorf("stderr %q; want what to pass, not serve's rule", r.stderr)
			}
		})
	}
}

// ownerListed is the OWNER of the first flight flights printed.
func ownerListed(out string) string {
	lines := strings.Split(out, "\n")
	if len(lines) < 2 {
		return ""
	}
	if f := strings.Fields(lines[1]); len(f) > 2 {
		return f[2]
	}
	return ""
}

func readyzInstance(t *testing.T, base string) string {
	t.Helper()
	var v struct{ Instance string }
	if err := json.Unmarshal([]byte(getBody(t, base+"/readyz")), &v); err != nil {
		t.Fatal(err)
	}
	return v.Instance
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}
