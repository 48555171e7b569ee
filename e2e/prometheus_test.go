package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// Paths of the deployment files, from the repository root.
const (
	promConfigPath = "deploy/prometheus/prometheus.yml"
	dashboardPath  = "deploy/grafana/dashboards/llm-dedupe-proxy.json"
	promJob        = "llm-dedupe-proxy"
)

// prom is a Prometheus server the test started.
type prom struct {
	*proc
	URL string
}

// startPrometheus runs the Debian prometheus with deploy/prometheus/prometheus.yml, its
// targets replaced by the instances and its intervals by one second.
func startPrometheus(t *testing.T, ins []*instance) *prom {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found on PATH: install it (Debian: apt-get install prometheus; or run `make test`, which does)")
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot, promConfigPath))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("%s: %v", promConfigPath, err)
	}
	cfg["global"] = map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
	var targets []string
	for _, in := range ins {
		targets = append(targets, strings.TrimPrefix(in.URL, "http://"))
	}
	found := false
	for _, sc := range cfg["scrape_configs"].([]any) {
		sc := sc.(map[string]any)
		if sc["job_name"] == promJob {
			sc["static_configs"] = []any{map[string]any{"targets": targets}}
			found = true
		}
	}
	if !found {
		t.Fatalf("%s has no job %q", promConfigPath, promJob)
	}
	dir := t.TempDir()
	out, _ := yaml.Marshal(cfg)
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, out, 0o644); err != nil {
		t.Fatal(err)
	}
	for try := 0; ; try++ {
		addr := redistest.FreeAddr(t)
		p := startProc(t, "prometheus", bin, nil, "--config.file="+file, "--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+addr, "--log.level=warn", "--storage.tsdb.retention.time=1h")
		pr := &prom{proc: p, URL: "http://" + addr}
		ok := false
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && !ok {
			p.mu.Lock()
			exited := p.exited
			p.mu.Unlock()
			if exited {
				break
			}
			resp, err := client.Get(pr.URL + "/-/ready")
			if err == nil {
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
			}
			time.Sleep(50 * time.Millisecond) // a starting server: no event to wait on
		}
		if ok {
			return pr
		}
		if try == 2 {
			t.Fatalf("prometheus did not become ready on %s", addr)
		}
		p.kill() // the port was taken in between: try another one
	}
}

// sample is one element of an instant vector.
type sample struct {
	labels map[string]string
	value  float64
}

// query evaluates expr now through the HTTP API.
func (p *prom) query(expr string) ([]sample, error) {
	resp, err := client.Get(p.URL + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %s; want vector", expr, r.Data.ResultType)
	}
	var out []sample
	for _, s := range r.Data.Result {
		v, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		out = append(out, sample{labels: s.Metric, value: v})
	}
	return out, nil
}

// scalar is the value of a query that answers one sample, or NaN when it answers none.
func (p *prom) scalar(t testing.TB, expr string) float64 {
	t.Helper()
	ss, err := p.query(expr)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 1 {
		return math.NaN()
	}
	return ss[0].value
}

// waitValue waits until expr answers want (a scrape interval or two).
func (p *prom) waitValue(t testing.TB, expr string, want float64) {
	t.Helper()
	redistest.WaitUntil(t, 15*time.Second, fmt.Sprintf("prometheus: %s == %v", expr, want), func() (bool, string) {
		v := p.scalar(t, expr)
		return v == want, fmt.Sprint(v)
	})
}

// waitScrapedAfter waits until every target has been scraped after ts.
func (p *prom) waitScrapedAfter(t testing.TB, ts time.Time) {
	t.Helper()
	expr := fmt.Sprintf(`min(timestamp(up{job=%q}))`, promJob)
	at := float64(ts.UnixMilli()) / 1000
	redistest.WaitUntil(t, 15*time.Second, "prometheus scraped every instance after the traffic", func() (bool, string) {
		v := p.scalar(t, expr)
		return v > at, fmt.Sprintf("last scrape %v, traffic ended %v", v, at)
	})
}

// panelExpr is one query of the Grafana dashboard.
type panelExpr struct {
	panel, legend, expr string
}

// dashboardExprs reads every PromQL expression of the dashboard.
func dashboardExprs(t testing.TB) []panelExpr {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var out []panelExpr
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("dashboard panel %q has a query without expr", p.Title)
			}
			out = append(out, panelExpr{p.Title, tg.LegendFormat, tg.Expr})
		}
	}
	return out
}

// grafanaVars replaces the variables Grafana fills in: the rate window (Grafana makes it
// at least four scrapes) and the dashboard's time range.
func grafanaVars(expr, rateInterval, rng string) string {
	return strings.NewReplacer("$__rate_interval", rateInterval, "$__range", rng).Replace(expr)
}

// TestPrometheus: a real Prometheus scrapes three instances through a scenario (bursts,
// hits, streams, an upstream failure taken over, a Redis outage); its query API must agree
// with what the clients saw, and every query of the Grafana dashboard must return data.
func TestPrometheus(t *testing.T) {
	c := startCluster(t, clusterOpts{})
	p := startPrometheus(t, c.ins)
	p.waitValue(t, fmt.Sprintf(`count(up{job=%q} == 1)`, promJob), float64(len(c.ins)))
	model := "e2e-prometheus"

	var all []answer
	// Twice the same kinds of traffic: the first creates every labelled series, the
	// second moves them, so that rates over the window see both.
	scenario := func(tag string) {
		t.Helper()
		all = append(all, burstAndHits(t, c, chatBody(model, tag+" burst"), 15)...)
		all = append(all, streamBurst(t, c, streamBody(model, tag+" stream"), 6)...)
		all = append(all, failedThenTakenOver(t, c, chatBody(model, tag+" failing"), 4)...)
	}
	scenario("first")

	// Redis goes away: each instance serves a request local-only and reports degraded;
	// Prometheus sees it, then sees it end when Redis is back.
	c.redis.Stop()
	for _, in := range c.ins {
		a := post(in.URL, chatPath, chatBody(model, "during the outage on "+in.name), apiKeyA)
		wantChat(t, in.name+" during the outage", a, model, 0)
		all = append(all, a)
	}
	p.waitValue(t, `count(llm_dedupe_backend_degraded == 1)`, float64(len(c.ins)))
	c.redis.Restart()
	for _, in := range c.ins {
		in.waitDegraded(false, 10*time.Second)
	}
	p.waitValue(t, `count(llm_dedupe_backend_degraded == 0)`, float64(len(c.ins)))

	scenario("second")

	// What the clients saw.
	roleCount := map[string]float64{}
	saved := 0.0
	for _, a := range all {
		if a.err != nil {
			t.Fatalf("a client request failed: %v", a)
		}
		roleCount[a.role()]++
		if (a.role() == "follower" || a.role() == "hit") && a.status/100 == 2 {
			saved++
		}
	}
	calls := float64(c.fake.stats().Calls)
	// Every request is counted by its instance before Prometheus looks.
	redistest.WaitUntil(t, 10*time.Second, "instances counted every request", func() (bool, string) {
		n := sum(c.ins, "llm_dedupe_requests_total", nil)
		return n == float64(len(all)), fmt.Sprintf("%v of %d", n, len(all))
	})
	p.waitScrapedAfter(t, time.Now())

	// Prometheus agrees with the clients and the upstream.
	if v := p.scalar(t, `sum(llm_dedupe_saved_upstream_requests_total)`); v != saved {
		t.Errorf("prometheus: saved upstream requests %v; want %v (followers and hits the clients saw)", v, saved)
	}
	byRole, err := p.query(`sum by (role) (llm_dedupe_requests_total)`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range byRole {
		got[s.labels["role"]] = s.value
	}
	if fmt.Sprint(got) != fmt.Sprint(roleCount) {
		t.Errorf("prometheus: requests by role %v; want %v (the X-Dedupe-Role the clients saw)", got, roleCount)
	}
	if v := p.scalar(t, `sum(llm_dedupe_upstream_requests_total)`); v != calls {
		t.Errorf("prometheus: upstream requests %v; want %v (the fake upstream's count)", v, calls)
	}
	if v := p.scalar(t, `sum(llm_dedupe_takeovers_total{reason="failed"})`); v != 2 {
		t.Errorf("prometheus: takeovers{reason=failed} %v; want 2 (one per failed call)", v)
	}
	t.Logf("PROMETHEUS roles %v saved %v upstream calls %v", roleCount, saved, calls)

	// Every dashboard query returns data over the scenario.
	exprs := dashboardExprs(t)
	values := map[string]float64{}
	for _, e := range exprs {
		q := grafanaVars(e.expr, "1m", "5m")
		ss, err := p.query(q)
		if err != nil {
			t.Errorf("dashboard %q (%s): %v", e.panel, e.legend, err)
			continue
		}
		finite := 0
		var shown []string
		for _, s := range ss {
			if !math.IsNaN(s.value) && !math.IsInf(s.value, 0) {
				finite++
			}
			shown = append(shown, fmt.Sprintf("%v=%.3g", s.labels, s.value))
		}
		sort.Strings(shown)
		if finite == 0 {
			t.Errorf("dashboard %q (%s): %s answered %v; want data", e.panel, e.legend, q, shown)
			continue
		}
		if len(ss) == 1 {
			values[e.panel+"/"+e.legend] = ss[0].value
		}
		t.Logf("dashboard %q %s: %s", e.panel, e.legend, strings.Join(shown, " "))
	}
	if v := values["Dedupe ratio/saved / requests"]; !(v > 0 && v <= 1) {
		t.Errorf("dashboard dedupe ratio %v; want in (0, 1]", v)
	}
	if v := values["Tokens saved/tokens"]; !(v > 0) {
		t.Errorf("dashboard tokens saved %v; want more than 0", v)
	}
	if v := values["Instances degraded/degraded"]; v != 0 {
		t.Errorf("dashboard instances degraded %v; want 0 after the outage", v)
	}
}

// burstAndHits sends n identical requests over the instances at once (one upstream call),
// then one more per instance (hits).
func burstAndHits(t *testing.T, c *cluster, body string, n int) []answer {
	t.Helper()
	c.fake.set(fakeupstream.Behavior{Hold: true})
	chs := spread(c.ins, n, chatPath, body, apiKeyA)
	waitWaiting(t, c.ins, n)
	c.fake.release()
	as := collect(chs)
	for _, in := range c.ins {
		as = append(as, post(in.URL, chatPath, body, apiKeyA))
	}
	return as
}

// streamBurst sends n identical streaming requests over the instances and waits until each
// has its first chunk before the upstream sends the last.
func streamBurst(t *testing.T, c *cluster, body string, n int) []answer {
	t.Helper()
	c.fake.set(fakeupstream.Behavior{Hold: true, Chunks: 3})
	var ss []*sseClient
	for i := range n {
		ss = append(ss, openSSE(c.ins[i%len(c.ins)].URL, body, apiKeyA))
	}
	for i, s := range ss {
		s.waitEvents(t, fmt.Sprintf("stream %d", i), 1)
	}
	c.fake.release()
	var as []answer
	for _, s := range ss {
		r := s.result()
		as = append(as, answer{status: r.status, header: r.header, body: r.transcript, err: r.err})
	}
	return as
}

// failedThenTakenOver makes the first instance's upstream call fail with 500 while
// followers wait on the others; one of them takes over.
func failedThenTakenOver(t *testing.T, c *cluster, body string, followers int) []answer {
	t.Helper()
	before := c.fake.stats().Calls
	c.fake.set(fakeupstream.Behavior{Hold: true, Fail: []int{500}})
	chs := []<-chan answer{postAsync(c.ins[0].URL, chatPath, body, apiKeyA)}
	c.fake.waitFor(fakeupstream.Stats{Calls: before + 1}, 10*time.Second)
	chs = append(chs, spread(c.ins[1:], followers, chatPath, body, apiKeyA)...)
	waitWaiting(t, c.ins, 1+followers)
	c.fake.release()
	return collect(chs)
}
