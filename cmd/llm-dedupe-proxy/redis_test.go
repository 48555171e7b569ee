package main

import (
	"encoding/json"
	"io"
	"net/http"
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
