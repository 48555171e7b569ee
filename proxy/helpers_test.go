package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
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
		Upstream:  target,
		ResultTTL: o.ResultTTL,
		Flights:   g,
		Hasher:    hashing.New(hashing.Options{IgnoreFields: []string{"user"}, SkipCanonical: true}),
		Recorder:  m,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
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

const chatBody = `{"model":"gpt-test","temperature":0,"messages":[{"role":"user","content":"hello"}]}`

type fakeBehavior = fakeupstream.Behavior

// rawRequest writes raw (a request in HTTP/1.1 wire form, possibly incomplete) to the
// server at base and returns the response, waiting at most wait for it. The connection
// stays open until the server answers or closes it: what a stalled client does.
func rawRequest(t *testing.T, base, raw string, wait time.Duration) (*http.Response, string, error) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(wait))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b), nil
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// upgrade is an upstream's side of a WebSocket upgrade: a 101 on the hijacked
// connection, kept until the client goes.
func upgrade(w http.ResponseWriter, _ *http.Request) {
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	brw.Flush()
	c.Read(make([]byte, 1))
}

// errorBody checks an OpenAI-style error object.
func errorBody(t *testing.T, a answer, status int, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type, Code string
		}
	}
	if a.status != status || json.Unmarshal([]byte(a.body), &e) != nil || e.Error.Code != code || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("got (%d, %s); want %d with error code %q, a message and a type", a.status, a.body, status, code)
	}
}

// value is the sum of the samples of metric name whose labels include want.
func value(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// waitWaiting waits until n requests in all wait for their flight's outcome.
func waitWaiting(t *testing.T, ins []*instance, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := 0.0
		for _, in := range ins {
			got += value(t, in.Reg, "llm_dedupe_waiting_requests", nil)
		}
		if int(got) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v requests waiting after 20s; want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond) // the gauge has no change notification over HTTP
	}
}

// waitRoles waits until n local flights over ins had their role decided: each has looked
// its key up in Redis. A request counted as waiting may not have yet, and one that looks
// only after the flight ended (an answer not stored) rightly starts a new call.
func waitRoles(t *testing.T, ins []*instance, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := 0.0
		for _, in := range ins {
			for _, role := range []string{"owner", "follower", "hit"} {
				got += value(t, in.Reg, "llm_dedupe_flight_roles_total", map[string]string{"role": role})
			}
		}
		if int(got) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v flights with a role after 20s; want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond) // the counter has no change notification over HTTP
	}
}

func backends(t *testing.T) map[string]*redistest.Server {
	return map[string]*redistest.Server{"memory": nil, "redis": redistest.Start(t)}
}

func fakeHold() fakeBehavior { return fakeBehavior{Hold: true} }
