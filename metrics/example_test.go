package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/metrics"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

func ExampleNew() {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)

	// The proxy serves the registry on /metrics…
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	// …gives m to its singleflight.Group as the Observer, and records each request.
	var obs singleflight.Observer = m
	obs.Observe(singleflight.Event{Kind: singleflight.EventDegraded})
	m.Upstream(context.Background(), "/v1/chat/completions", 200, 2*time.Second)
	m.Request(context.Background(), "/v1/chat/completions", "owner", 200, 2*time.Second)
	m.Request(context.Background(), "/v1/chat/completions", "follower", 200, 2*time.Second)
	m.Saved("/v1/chat/completions", "gpt-4o-mini", 120, 30)

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range []string{"llm_dedupe_backend_degraded", "llm_dedupe_requests_total", "llm_dedupe_saved_tokens_total"} {
			if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
				fmt.Println(line)
			}
		}
	}
	// Output:
	// llm_dedupe_backend_degraded 1
	// llm_dedupe_requests_total{code="200",role="follower",route="/v1/chat/completions"} 1
	// llm_dedupe_requests_total{code="200",role="owner",route="/v1/chat/completions"} 1
	// llm_dedupe_saved_tokens_total{kind="completion",model="gpt-4o-mini"} 30
	// llm_dedupe_saved_tokens_total{kind="prompt",model="gpt-4o-mini"} 120
}
