package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// The lease settings of every cluster: short, so that takeovers happen in about a second.
const (
	leaseTTL  = time.Second
	heartbeat = 300 * time.Millisecond
	jitter    = 100 * time.Millisecond
)

// fake is the fake upstream process and its control API.
type fake struct {
	*proc
	URL string
}

func startFake(t *testing.T) *fake {
	t.Helper()
	p := startProc(t, "fakeupstream", fakeBin, nil, "-listen", "127.0.0.1:0")
	addr, _ := p.waitLine(0, 10*time.Second, "its address", func(l string) bool { return strings.HasPrefix(l, "127.0.0.1:") })
	return &fake{proc: p, URL: "http://" + addr}
}

func (f *fake) control(method, path string, body any, out any) int {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, f.URL+path, rd)
	resp, err := client.Do(req)
	if err != nil {
		f.t.Fatalf("fake upstream %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			f.t.Fatalf("fake upstream %s %s: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

// set replaces the fake's behaviour (and re-arms its hold).
func (f *fake) set(b fakeupstream.Behavior) {
	f.t.Helper()
	f.control("POST", "/_fake/behavior", b, nil)
}

// release lets held answers go.
func (f *fake) release() { f.t.Helper(); f.control("POST", "/_fake/release", nil, nil) }

func (f *fake) stats() fakeupstream.Stats {
	f.t.Helper()
	var s fakeupstream.Stats
	f.control("GET", "/_fake/stats", nil, &s)
	return s
}

func (f *fake) calls() []fakeupstream.Call {
	f.t.Helper()
	var c []fakeupstream.Call
	f.control("GET", "/_fake/calls", nil, &c)
	return c
}

// waitFor blocks until every counter has reached want (the fake answers when it happens);
// it fails the test after d.
func (f *fake) waitFor(want fakeupstream.Stats, d time.Duration) fakeupstream.Stats {
	f.t.Helper()
	s, err := f.await(want, d)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// await is waitFor for another goroutine than the test's: it returns the failure.
func (f *fake) await(want fakeupstream.Stats, d time.Duration) (fakeupstream.Stats, error) {
	var s fakeupstream.Stats
	q := fmt.Sprintf("/_fake/wait?calls=%d&abandoned=%d&completed=%d&timeout=%s", want.Calls, want.Abandoned, want.Completed, d)
	resp, err := client.Get(f.URL + q)
	if err != nil {
		return s, fmt.Errorf("fake upstream wait: %v", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s, fmt.Errorf("fake upstream wait: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("fake upstream: counters %+v after %v; want at least %+v", s, d, want)
	}
	return s, nil
}

// timeTo starts timing now and measures, in the background, until the fake's counters
// reach want; the function it returns gives the duration (or fails the test after d).
func (f *fake) timeTo(want fakeupstream.Stats, d time.Duration) func() time.Duration {
	start := time.Now()
	type result struct {
		took time.Duration
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		_, err := f.await(want, d)
		ch <- result{time.Since(start), err}
	}()
	return func() time.Duration {
		f.t.Helper()
		r := <-ch
		if r.err != nil {
			f.t.Fatal(r.err)
		}
		return r.took
	}
}

// instance is one proxy process.
type instance struct {
	*proc
	URL    string
	memory bool // on the in-memory backend: LLM_DEDUPE_REDIS_ADDRS is empty
}

// cluster is a redis-server, the fake upstream and proxy processes sharing them.
type cluster struct {
	t     *testing.T
	redis *redistest.Server
	fake  *fake
	ins   []*instance
	env   []string // the proxies' environment, for starting another one
	// envOf is more environment of the i-th proxy (from 0), over env.
	envOf func(i int) map[string]string
}

// clusterOpts changes a cluster from the defaults.
type clusterOpts struct {
	n       int               // proxies; 3 if zero
	persist bool              // Redis with an append-only file
	env     map[string]string // LLM_DEDUPE_* settings (and other variables) over the defaults
	// envOf, if set, is more environment of the i-th proxy (from 0, also of one started
	// later), over env: proxies that differ.
	envOf func(i int) map[string]string
	// redisAddrs, if set, are the Redis the proxies use (a Cluster's nodes) instead of a
	// redis-server of the cluster's own.
	redisAddrs []string
	redisArgs  []string // more arguments of the cluster's own redis-server
}

// startCluster starts Redis, the fake upstream and the proxies, each on a free loopback
// port, and logs the lease settings for the scenario's timings.
func startCluster(t *testing.T, o clusterOpts) *cluster {
	t.Helper()
	if o.n == 0 {
		o.n = 3
	}
	c := &cluster{t: t, envOf: o.envOf}
	redisAddrs := strings.Join(o.redisAddrs, ",")
	if redisAddrs == "" {
		c.redis = redistest.Start(t, redistest.Options{Persist: o.persist, Args: o.redisArgs})
		redisAddrs = c.redis.Addr
	}
	c.fake = startFake(t)
	settings := map[string]string{
		"LLM_DEDUPE_LISTEN":                    "127.0.0.1:0",
		"LLM_DEDUPE_UPSTREAM_BASE_URL":         c.fake.URL,
		"LLM_DEDUPE_REDIS_ADDRS":               redisAddrs,
		"LLM_DEDUPE_FLIGHT_LEASE_TTL":          leaseTTL.String(),
		"LLM_DEDUPE_FLIGHT_HEARTBEAT_INTERVAL": heartbeat.String(),
		"LLM_DEDUPE_FLIGHT_TAKEOVER_JITTER":    jitter.String(),
		"LLM_DEDUPE_UPSTREAM_TIMEOUT":          "30s",
		"LLM_DEDUPE_UPSTREAM_IDLE_TIMEOUT":     "10s",
		"LLM_DEDUPE_SHUTDOWN_TIMEOUT":          "2s",
		"LLM_DEDUPE_LOG_FORMAT":                "json",
	}
	for k, v := range o.env {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var shown []string
	for _, k := range keys {
		c.env = append(c.env, k+"="+settings[k])
		if k != "LLM_DEDUPE_LISTEN" && k != "LLM_DEDUPE_UPSTREAM_BASE_URL" && k != "LLM_DEDUPE_REDIS_ADDRS" {
			shown = append(shown, strings.ToLower(strings.TrimPrefix(k, "LLM_DEDUPE_"))+"="+settings[k])
		}
	}
	t.Logf("cluster: %d proxies, redis %s (persist %v), upstream %s; %s", o.n, redisAddrs, o.persist, c.fake.URL, strings.Join(shown, " "))
	for range o.n {
		c.start()
	}
	return c
}

// start starts one more proxy and waits until it is ready.
func (c *cluster) start() *instance {
	c.t.Helper()
	name := fmt.Sprintf("proxy-%c", 'A'+len(c.ins))
	env := c.env
	if c.envOf != nil {
		env = slices.Clone(env)
		for k, v := range c.envOf(len(c.ins)) {
			env = append(env, k+"="+v) // later wins in exec
		}
	}
	p := startProc(c.t, name, proxyBin, env, "serve")
	l, _ := p.waitLine(0, 15*time.Second, `"listening"`, msgIs("listening"))
	in := &instance{proc: p, URL: "http://" + parseLog(l)["addr"].(string), memory: slices.Contains(env, "LLM_DEDUPE_REDIS_ADDRS=")}
	in.waitReady(10 * time.Second)
	c.ins = append(c.ins, in)
	return in
}

// readiness is the answer of /readyz.
type readiness struct {
	Code     int    `json:"-"`
	Status   string `json:"status"`
	Backend  string `json:"backend"`
	Degraded bool   `json:"degraded"`
}

func (in *instance) readyz() (readiness, error) {
	var r readiness
	resp, err := client.Get(in.URL + "/readyz")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	r.Code = resp.StatusCode
	return r, json.NewDecoder(resp.Body).Decode(&r)
}

func (in *instance) waitReady(d time.Duration) {
	in.t.Helper()
	want := "redis"
	if in.memory {
		want = "memory"
	}
	redistest.WaitUntil(in.t, d, in.name+" ready on the "+want+" backend", func() (bool, string) {
		r, err := in.readyz()
		return err == nil && r.Code == 200 && r.Backend == want && !r.Degraded, fmt.Sprintf("%+v %v", r, err)
	})
}

// waitDegraded waits until /readyz says degraded is want (and the instance still ready).
func (in *instance) waitDegraded(want bool, d time.Duration) {
	in.t.Helper()
	redistest.WaitUntil(in.t, d, fmt.Sprintf("%s /readyz degraded=%v", in.name, want), func() (bool, string) {
		r, err := in.readyz()
		return err == nil && r.Code == 200 && r.Degraded == want, fmt.Sprintf("%+v %v", r, err)
	})
}

// metric is the sum of the samples of name on the instance's /metrics whose labels
// include want.
func (in *instance) metric(name string, want map[string]string) float64 {
	in.t.Helper()
	v, err := scrape(in.URL, name, want)
	if err != nil {
		in.t.Fatalf("%s /metrics: %v", in.name, err)
	}
	return v
}

func scrape(base, name string, want map[string]string) (float64, error) {
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return sumSamples(string(b), name, want), nil
}

// sumSamples reads the Prometheus text format: "name{a="x",b="y"} value".
func sumSamples(text, name string, want map[string]string) float64 {
	sum := 0.0
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, labels, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		got := map[string]string{}
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				got[k] = strings.Trim(v, `"`)
			}
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if match {
			var f float64
			fmt.Sscan(value, &f)
			sum += f
		}
	}
	return sum
}

// sum adds a metric over instances.
func sum(ins []*instance, name string, want map[string]string) float64 {
	s := 0.0
	for _, in := range ins {
		s += in.metric(name, want)
	}
	return s
}

// waitWaiting waits until n client requests in all wait for a flight's outcome, as the
// instances' llm_dedupe_waiting_requests gauges say.
func waitWaiting(t testing.TB, ins []*instance, n int) {
	t.Helper()
	redistest.WaitUntil(t, 20*time.Second, fmt.Sprintf("%d requests waiting", n), func() (bool, string) {
		got := sum(ins, "llm_dedupe_waiting_requests", nil)
		return int(got) == n, fmt.Sprintf("%v waiting", got)
	})
}

// pause stops the process (SIGSTOP), resume continues it.
func (in *instance) pause()  { in.signal(syscall.SIGSTOP) }
func (in *instance) resume() { in.signal(syscall.SIGCONT) }

// killHard is kill -9: no shutdown, no goodbye to Redis.
func (in *instance) killHard() {
	in.t.Helper()
	in.signal(syscall.SIGKILL)
	in.wait(10 * time.Second)
}

// client is the HTTP client of every test request: no proxy from the environment, enough
// connections for the fan-in.
var client = &http.Client{Transport: &http.Transport{
	Proxy:               nil,
	MaxIdleConns:        1024,
	MaxIdleConnsPerHost: 512,
	IdleConnTimeout:     30 * time.Second,
}}

// answer is what a client got.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
	took   time.Duration
}

func (a answer) role() string {
	if a.header == nil {
		return ""
	}
	return a.header.Get("X-Dedupe-Role")
}

func (a answer) String() string {
	if a.err != nil {
		return "error " + a.err.Error()
	}
	b := a.body
	if len(b) > 300 {
		b = b[:300] + "…"
	}
	return fmt.Sprintf("%d role=%s %s", a.status, a.role(), b)
}

// clientTimeout bounds every client request: a hang is a failure, not a stuck test.
const clientTimeout = 20 * time.Second

// post sends one request with the given Authorization key and extra header pairs.
func post(base, path, body, apiKey string, hdr ...string) answer {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := *client
	c.Timeout = clientTimeout
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err, took: time.Since(start)}
}

// postAsync sends a request in the background; its answer arrives on the channel.
func postAsync(base, path, body, apiKey string, hdr ...string) <-chan answer {
	ch := make(chan answer, 1)
	go func() { ch <- post(base, path, body, apiKey, hdr...) }()
	return ch
}

// spread sends n identical requests in the background, round robin over ins.
func spread(ins []*instance, n int, path, body, apiKey string) []<-chan answer {
	out := make([]<-chan answer, n)
	for i := range n {
		out[i] = postAsync(ins[i%len(ins)].URL, path, body, apiKey)
	}
	return out
}

// collect waits for every answer.
func collect(chs []<-chan answer) []answer {
	out := make([]answer, len(chs))
	for i, ch := range chs {
		out[i] = <-ch
	}
	return out
}

// roles counts the X-Dedupe-Role of answers.
func roles(as []answer) map[string]int {
	m := map[string]int{}
	for _, a := range as {
		m[a.role()]++
	}
	return m
}

const (
	chatPath  = "/v1/chat/completions"
	embedPath = "/v1/embeddings"
	apiKeyA   = "sk-e2e-tenant-a"
	apiKeyB   = "sk-e2e-tenant-b"
)

// chatBody is a chat request that does not sample (temperature 0): its answer is stored
// for later identical requests. The model names the scenario, so that an answer meant for
// another request would show (the fake upstream echoes the model).
func chatBody(model, prompt string) string {
	return fmt.Sprintf(`{"model":%q,"temperature":0,"messages":[{"role":"user","content":%q}]}`, model, prompt)
}

// wantChat checks a unary chat answer: 200, exactly the fake's reply n for model (any n
// if n is 0), and the upstream's request id of the same call. It returns n.
func wantChat(t testing.TB, who string, a answer, model string, n int64) int64 {
	t.Helper()
	if a.err != nil || a.status != 200 {
		t.Errorf("%s: %v; want 200", who, a)
		return 0
	}
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil {
		t.Errorf("%s: body %q is not JSON: %v", who, a.body, err)
		return 0
	}
	got := int64(0)
	fmt.Sscanf(v.ID, "chatcmpl-%d", &got)
	if n != 0 && got != n {
		t.Errorf("%s: answer of call %d; want call %d", who, got, n)
	}
	if want := fakeupstream.Unary(chatPath, got, model); a.body != want {
		t.Errorf("%s: body %q; want exactly %q", who, a.body, want)
	}
	if id := a.header.Get("X-Request-Id"); id != fmt.Sprintf("req_%d", got) {
		t.Errorf("%s: X-Request-Id %q with the body of call %d: a mixed answer", who, id, got)
	}
	return got
}

// within fails unless d is in [lo, hi].
func within(t testing.TB, what string, d, lo, hi time.Duration) {
	t.Helper()
	if d < lo || d > hi {
		t.Errorf("%s took %v; want between %v and %v", what, d.Round(time.Millisecond), lo, hi)
	}
}

func ms(d time.Duration) int64 { return d.Milliseconds() }
