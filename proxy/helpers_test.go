package proxy_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/metrics"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// upstream is a fake OpenAI API on a loopback port.
type upstream struct {
	*fakeupstream.Upstream
	URL string
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := fakeupstream.New()
	srv := httptest.NewServer(u)
	t.Cleanup(func() { u.Release(); srv.Close() })
	return &upstream{Upstream: u, URL: srv.URL}
}

// instance is one proxy, as a separate process would be: its own Group, metrics, server.
type instance struct {
	URL     string
	Group   *singleflight.Group
	Reg     *prometheus.Registry
	Metrics *metrics.Metrics
	Proxy   *proxy.Proxy
	srv     *httptest.Server
	closed  bool
}

type setup struct {
	redis  *redistest.Server // nil: in-memory
	base   string            // upstream base URL; default the fake's URL
	flight singleflight.Options
	proxy  func(*proxy.Config)
	// noAnnotate leaves out the wiring's Annotate, so that hits read their usage from
	// the bytes they were sent.
	noAnnotate bool
}

func newInstance(t testing.TB, up *upstream, s setup) *instance {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	o := s.flight
	o.Observer = m
	if s.flight.Observer != nil {
		o.Observer = tee{m, s.flight.Observer}
	}
	if o.Annotate == nil && !s.noAnnotate {
		o.Annotate = proxy.AnnotateUsage // as cmd wires it
	}
	if o.TakeoverJitter == 0 {
		o.TakeoverJitter = 20 * time.Millisecond
	}
	if s.redis != nil {
		o.Redis = s.redis.Client()
	}
	g := singleflight.New(o)
	base := s.base
	if base == "" {
		base = up.URL
	}
	target, _ := url.Parse(base)
	cfg := proxy.Config{
		Upstream: target,
		Flights:  g,
		Hasher:   hashing.New(hashing.Options{IgnoreFields: []string{"user"}, SkipCanonical: true}),
		Recorder: m,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if s.proxy != nil {
		s.proxy(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	in := &instance{URL: srv.URL, Group: g, Reg: reg, Metrics: m, Proxy: p, srv: srv}
	t.Cleanup(func() { in.close() })
	return in
}

// close stops the instance as a SIGTERM would: owned flights get a short grace, then are
// released.
func (in *instance) close() {
	if in.closed {
		return
	}
	in.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_ = in.Group.Close(ctx)
	in.srv.Close()
}

// answer is what a client got.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

func post(t *testing.T, base, path, body string, hdr ...string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-test-1")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// burst sends n identical requests spread over the instances, all at once.
func burst(t *testing.T, ins []*instance, n int, path, body string, hdr ...string) []answer {
	t.Helper()
	out := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = post(t, ins[i%len(ins)].URL, path, body, hdr...) })
	}
	wg.Wait()
	return out
}

func roles(as []answer) map[string]int {
	m := map[string]int{}
	for _, a := range as {
		m[a.header.Get("X-Dedupe-Role")]++
	}
	return m
}

const chatBody = `{"model":"gpt-test","messages":[{"role":"user","content":"hello"}]}`

type fakeBehavior = fakeupstream.Behavior
