package e2e

import (
	"bytes"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// runProxy runs the built binary to its end with env (and PATH) as its environment and
// stdin as its input, and returns its status and output.
func runProxy(t *testing.T, env []string, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(proxyBin, args...)
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return exitStatus(err), out.String(), errOut.String()
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("llm-dedupe-proxy %v still running after 20s; want it to stop with a message", args)
		return 0, "", ""
	}
}

// TestFirstMistakes: what a newcomer's first mistakes get from the real binary, each a
// message that names the key, flag or variable to change: a port already taken and a bad
// OTEL_* value stop start-up as an invalid value does (status 2, one plain line); a
// redis.addrs where nothing listens, or where another kind of server answers, is logged
// naming redis.addrs; key without a body and the admin API without a key say what was
// missing.
func TestFirstMistakes(t *testing.T) {
	admin := redistest.FreeAddr(t)
	c := startCluster(t, clusterOpts{n: 1, env: map[string]string{
		"LLM_DEDUPE_ADMIN_LISTEN": admin, "LLM_DEDUPE_ADMIN_TOKEN": "a-token-of-16-chars",
	}})
	taken := strings.TrimPrefix(c.ins[0].URL, "http://")

	t.Run("port taken", func(t *testing.T) {
		code, _, stderr := runProxy(t, []string{"LLM_DEDUPE_REDIS_ADDRS=" + c.redis.Addr}, "", "--listen="+taken)
		want := "llm-dedupe-proxy: invalid config: listen: " + taken + " is taken (by another llm-dedupe-proxy still running, or another server?): " +
			"stop what holds it, or listen elsewhere with --listen=127.0.0.1:PORT\n"
		if code != 2 || stderr != want {
			t.Errorf("a second proxy on %s: status %d, stderr\n%s\nwant 2 and only\n%s", taken, code, stderr, want)
		}
	})

	t.Run("bad OTEL value", func(t *testing.T) {
		code, _, stderr := runProxy(t, []string{"OTEL_TRACES_EXPORTER=jaeger"}, "", "--listen=127.0.0.1:0")
		want := "llm-dedupe-proxy: invalid config: OTEL_TRACES_EXPORTER: \"jaeger\" is not supported: use otlp, console or none (or a list: otlp,console)\n"
		if code != 2 || stderr != want {
			t.Errorf("OTEL_TRACES_EXPORTER=jaeger: status %d, stderr\n%s\nwant 2 and only\n%s", code, stderr, want)
		}
	})

	t.Run("redis.addrs wrong", func(t *testing.T) {
		nothing := redistest.FreeAddr(t)
		fakeAddr := strings.TrimPrefix(c.fake.URL, "http://")
		for _, tc := range []struct{ addr, level, says string }{
			{nothing, "WARN", "check redis.addrs and that Redis runs there"},
			{fakeAddr, "ERROR", "the server at redis.addrs does not answer as Redis does (another service on that port?): check redis.addrs"},
		} {
			p := startProc(t, "proxy on "+tc.addr, proxyBin, []string{"LLM_DEDUPE_REDIS_ADDRS=" + tc.addr, "LLM_DEDUPE_LISTEN=127.0.0.1:0"})
			l, _ := p.waitLine(0, 15*time.Second, "why Redis cannot be used", func(l string) bool {
				m := parseLog(l)
				msg, _ := m["msg"].(string)
				return m["level"] == tc.level && strings.Contains(msg, tc.says)
			})
			if addrs, _ := parseLog(l)["redis.addrs"].([]any); len(addrs) != 1 || addrs[0] != tc.addr {
				t.Errorf("redis.addrs=%s: logged %s; want redis.addrs [%s] in it", tc.addr, l, tc.addr)
			}
			p.kill()
		}
	})

	t.Run("key without a body", func(t *testing.T) {
		code, stdout, stderr := runProxy(t, nil, "\n", "key")
		if code != 1 || stdout != "" || !strings.HasPrefix(stderr, "llm-dedupe-proxy key: no request body on standard input") {
			t.Errorf("echo \"$unset\" | key: status %d, stdout %q, stderr %q; want 1 and that no body came", code, stdout, stderr)
		}
	})

	t.Run("admin DELETE without a key", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodDelete, "http://"+admin+"/admin/answers/", nil)
		req.Header.Set("Authorization", "Bearer a-token-of-16-chars")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body.String(), `"code":"invalid_key"`) ||
			!strings.Contains(body.String(), "the last line llm-dedupe-proxy key prints), got none") {
			t.Errorf("DELETE /admin/answers/: %d %s; want 400 invalid_key saying what a key is", resp.StatusCode, body.String())
		}
	})
}
