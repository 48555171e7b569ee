package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestRedisAuthFailureIsDegraded: a wrong or missing Redis password is not a healthy
// instance: it is reported at start-up as an error naming the cause, /readyz says
// degraded, and so does the metric, before any request.
func TestRedisAuthFailureIsDegraded(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{Password: "s3cret"})
	for name, extra := range map[string][]string{"wrong": {"--redis.password=wrong"}, "missing": nil} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"--redis.addrs=" + rs.Addr, "--upstream.base_url=http://127.0.0.1:1"}, extra...)
			base, stop, msgs := startServeLogs(t, args...)
			defer stop()
			waitLogged(t, msgs, "redis authentication failed: check redis.username and redis.password; serving with local-only dedupe")

			res, err := http.Get(base + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			var ready struct{ Degraded bool }
			json.NewDecoder(res.Body).Decode(&ready)
			res.Body.Close()
			if !ready.Degraded {
				t.Errorf("/readyz says degraded: false with a %s Redis password; want true", name)
			}
			res, err = http.Get(base + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			page, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if !strings.Contains(string(page), "\nllm_dedupe_backend_degraded 1\n") {
				t.Errorf("/metrics has no llm_dedupe_backend_degraded 1")
			}
		})
	}
}

// msgUnavailable is logged when Redis cannot be reached (wire.go's degradedMessage).
const msgUnavailable = "redis unavailable: serving with local-only dedupe until it answers (each instance calls the upstream for its own requests); " +
	"if it does not, check redis.addrs and that Redis runs there"

// TestUnusableRedisNamesRedisAddrs: a redis.addrs where nothing listens is logged as a
// warning (it may be a Redis still starting) and one where another server answers as an
// error (a configuration to fix); both name redis.addrs and give its value.
func TestUnusableRedisNamesRedisAddrs(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing := l.Addr().String()
	l.Close()
	web := httptest.NewServer(http.NotFoundHandler())
	defer web.Close()
	for _, tc := range []struct {
		name, addr, msg, level string
	}{
		{"nothing listens", nothing, msgUnavailable, "WARN"},
		{"not Redis", strings.TrimPrefix(web.URL, "http://"),
			"the server at redis.addrs does not answer as Redis does (another service on that port?): check redis.addrs; serving with local-only dedupe", "ERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stop, msgs := startServeLogs(t, "--redis.addrs="+tc.addr, "--upstream.base_url=http://127.0.0.1:1")
			defer stop()
			l := waitLogged(t, msgs, tc.msg)
			if addrs, _ := l["redis.addrs"].([]any); l["level"] != tc.level || len(addrs) != 1 || addrs[0] != tc.addr {
				t.Errorf("logged %v; want level %s and redis.addrs [%s]", l, tc.level, tc.addr)
			}
		})
	}
}

// TestHealthcheckRequireRedis: the check `helm test` runs passes on an instance that
// reaches its Redis and fails on one that does not, which still serves (fail-open).
func TestHealthcheckRequireRedis(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	check := func(base string) (int, string) {
		var stderr strings.Builder
		args := []string{"healthcheck", "--listen=" + strings.TrimPrefix(base, "http://"), "--require-redis", "--timeout=2s"}
		code := run(context.Background(), args, nil, strings.NewReader(""), io.Discard, &stderr)
		return code, stderr.String()
	}

	base, stop := startServe(t, "--redis.addrs="+rs.Addr, "--upstream.base_url=http://127.0.0.1:1")
	if code, stderr := check(base); code != 0 {
		t.Errorf("an instance on its Redis: status %d (%s); want 0", code, stderr)
	}
	stop()

	// A wrong address: a port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wrong := l.Addr().String()
	l.Close()
	base, stop, msgs := startServeLogs(t, "--redis.addrs="+wrong, "--upstream.base_url=http://127.0.0.1:1")
	defer stop()
	waitLogged(t, msgs, msgUnavailable)
	res, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/healthz of a degraded instance: %d; want 200 (it serves)", res.StatusCode)
	}
	if code, stderr := check(base); code != 1 || !strings.Contains(stderr, "degraded") {
		t.Errorf("an instance that does not reach its Redis: status %d (%s); want 1, degraded", code, stderr)
	}
}
