package metrics

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// newTest returns a Metrics on a fresh registry.
func newTest(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return New(reg), reg
}

// exposition writes the text exposition of one counter family from values keyed by the
// label values in the order of labels, so that expected output is derived from the calls.
// The help text is taken from g: CollectAndCompare compares it too, and this test is about
// values (TestLint checks that every family has help).
func exposition(t *testing.T, g prometheus.Gatherer, name string, labels []string, values map[string]float64) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	help := ""
	for _, mf := range mfs {
		if mf.GetName() == name {
			help = mf.GetHelp()
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
	for k, v := range values { // CollectAndCompare sorts the series

		vals := strings.Split(k, "\x00")
		pairs := make([]string, len(labels))
		for i, l := range labels {
			pairs[i] = fmt.Sprintf("%s=%q", l, vals[i])
		}
		sort.Strings(pairs) // the parser keeps label pairs in the order written; Gather sorts them
		fmt.Fprintf(&b, "%s{%s} %s\n", name, strings.Join(pairs, ","), strconv.FormatFloat(v, 'g', -1, 64))
	}
	return b.String()
}

func key(vals ...string) string { return strings.Join(vals, "\x00") }

func TestLint(t *testing.T) {
	m, reg := newTest(t)
	RegisterInstance(reg, "0123456789ab", "v1")
	// Give every vector a child, so that the lint sees each metric, not only its absence.
	m.Request(context.Background(), "/v1/chat/completions", "owner", 200, time.Second)
	m.Upstream(context.Background(), "/v1/chat/completions", 0, time.Second)
	m.Saved("/v1/chat/completions", "gpt-4o", 10, 5)
	m.Sampled("/v1/chat/completions", "in_flight", "owner")
	m.WaitingAdd(1)
	for _, e := range []singleflight.Event{
		{Kind: singleflight.EventRole, Role: singleflight.RoleOwner},
		{Kind: singleflight.EventTakeover, Reason: "expired"},
		{Kind: singleflight.EventLeaseLost},
		{Kind: singleflight.EventFencedWrite, Op: "append"},
		{Kind: singleflight.EventHeartbeatFailed},
		{Kind: singleflight.EventRedisError, Op: "claim"},
		{Kind: singleflight.EventDegraded},
		{Kind: singleflight.EventFlightStart},
		{Kind: singleflight.EventWait, Duration: time.Second},
	} {
		m.Observe(e)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// Every collector of the package is registered and exposed under the llm_dedupe_ prefix.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var ours int
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), namespace+"_") {
			ours++
			if mf.GetHelp() == "" {
				t.Errorf("%s has no help text", mf.GetName())
			}
		}
	}
	if want := 23; ours != want {
		t.Errorf("got %d llm_dedupe_ families; want %d", ours, want)
	}
}

func TestScriptedCalls(t *testing.T) {
	const chat, emb = "/v1/chat/completions", "/v1/embeddings"
	type request struct {
		route, role string
		code        int
		d           time.Duration
	}
	type upstream struct {
		route string
		code  int
		d     time.Duration
	}
	type saved struct {
		route, model       string
		prompt, completion int64
	}
	requests := []request{
		{chat, "owner", 200, 2 * time.Second},
		{chat, "follower", 200, 2 * time.Second},
		{chat, "follower", 200, 1500 * time.Millisecond},
		{chat, "hit", 200, 2 * time.Millisecond},
		{chat, "owner", 429, 300 * time.Millisecond},
		{emb, "bypass", 200, 80 * time.Millisecond},
		{emb, "owner", 502, 30 * time.Second},
	}
	upstreams := []upstream{
		{chat, 200, 2 * time.Second},
		{chat, 429, 300 * time.Millisecond},
		{emb, 200, 80 * time.Millisecond},
		{emb, 0, 30 * time.Second},
		{emb, 0, time.Second},
	}
	saves := []saved{
		{chat, "gpt-4o", 120, 30},
		{chat, "gpt-4o", 120, 0},
		{chat, "", 7, 3},
		{emb, "text-embedding-3-small", 50, 0},
		{emb, "text-embedding-3-small", 0, 0},
	}

	m, reg := newTest(t)
	wantReq := map[string]float64{}
	wantReqDur := map[string]struct {
		n   uint64
		sum float64
	}{}
	for _, r := range requests {
		m.Request(context.Background(), r.route, r.role, r.code, r.d)
		wantReq[key(r.route, r.role, strconv.Itoa(r.code))]++
		h := wantReqDur[key(r.route, r.role)]
		h.n++
		h.sum += r.d.Seconds()
		wantReqDur[key(r.route, r.role)] = h
	}
	wantUp := map[string]float64{}
	wantUpCount := map[string]uint64{}
	for _, u := range upstreams {
		m.Upstream(context.Background(), u.route, u.code, u.d)
		code := "error"
		if u.code != 0 {
			code = strconv.Itoa(u.code)
		}
		wantUp[key(u.route, code)]++
		wantUpCount[u.route]++
	}
	wantSaved := map[string]float64{}
	wantTokens := map[string]float64{}
	for _, s := range saves {
		m.Saved(s.route, s.model, s.prompt, s.completion)
		wantSaved[key(s.route)]++
		model := s.model
		if model == "" {
			model = "unknown"
		}
		if s.prompt > 0 {
			wantTokens[key(model, "prompt")] += float64(s.prompt)
		}
		if s.completion > 0 {
			wantTokens[key(model, "completion")] += float64(s.completion)
		}
	}

	counters := []struct {
		name   string
		c      prometheus.Collector
		labels []string
		want   map[string]float64
	}{
		{"llm_dedupe_requests_total", m.requests, []string{"route", "role", "code"}, wantReq},
		{"llm_dedupe_upstream_requests_total", m.upstream, []string{"route", "code"}, wantUp},
		{"llm_dedupe_saved_upstream_requests_total", m.savedRequests, []string{"route"}, wantSaved},
		{"llm_dedupe_saved_tokens_total", m.savedTokens, []string{"model", "kind"}, wantTokens},
	}
	for _, tc := range counters {
		t.Run(tc.name, func(t *testing.T) {
			want := exposition(t, reg, tc.name, tc.labels, tc.want)
			if err := testutil.CollectAndCompare(tc.c, strings.NewReader(want), tc.name); err != nil {
				t.Errorf("got a different exposition; want\n%s\n%v", want, err)
			}
		})
	}

	t.Run("llm_dedupe_request_duration_seconds", func(t *testing.T) {
		for k, want := range wantReqDur {
			lv := strings.Split(k, "\x00")
			labels := map[string]string{"route": lv[0], "role": lv[1]}
			n, sum := histogram(t, reg, "llm_dedupe_request_duration_seconds", labels)
			if n != want.n || !near(sum, want.sum) {
				t.Errorf("%v: got count %d sum %g; want count %d sum %g", lv, n, sum, want.n, want.sum)
			}
		}
	})
	t.Run("llm_dedupe_upstream_duration_seconds", func(t *testing.T) {
		for route, want := range wantUpCount {
			labels := map[string]string{"route": route}
			n, _ := histogram(t, reg, "llm_dedupe_upstream_duration_seconds", labels)
			if n != want {
				t.Errorf("%s: got count %d; want %d", route, n, want)
			}
		}
	})
}

// histogram returns the sample count and sum of the series of the histogram family name
// whose labels are exactly labels.
func histogram(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0, 0
}

func near(a, b float64) bool {
	d := a - b
	return d < 1e-9 && d > -1e-9
}

func TestUpstreamErrorCode(t *testing.T) {
	tests := []struct {
		code int
		want string
	}{
		{0, "error"},
		{-1, "error"},
		{200, "200"},
		{504, "504"},
	}
	for _, tc := range tests {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			m, _ := newTest(t)
			m.Upstream(context.Background(), "/v1/completions", tc.code, time.Millisecond)
			if got := testutil.ToFloat64(m.upstream.WithLabelValues("/v1/completions", tc.want)); got != 1 {
				t.Errorf("got %g for code label %q; want 1", got, tc.want)
			}
			if got := testutil.CollectAndCount(m.upstream); got != 1 {
				t.Errorf("got %d series; want 1", got)
			}
		})
	}
}

func TestSavedZeroTokens(t *testing.T) {
	m, _ := newTest(t)
	m.Saved("/v1/embeddings", "text-embedding-3-small", 0, 0)
	if got := testutil.ToFloat64(m.savedRequests.WithLabelValues("/v1/embeddings")); got != 1 {
		t.Errorf("got saved requests %g; want 1", got)
	}
	if got := testutil.CollectAndCount(m.savedTokens); got != 0 {
		t.Errorf("got %d saved_tokens series; want 0", got)
	}
	if got := len(m.models.seen); got != 0 {
		t.Errorf("got %d models remembered; want 0: a request without tokens must not use up the cap", got)
	}
}

func TestPreinitialised(t *testing.T) {
	m, _ := newTest(t)
	tests := []struct {
		name  string
		c     prometheus.Collector
		known []string
	}{
		{"takeovers", m.takeovers, takeoverReasons},
		{"roles", m.roles, flightRoles},
		{"redis errors", m.redisErrors, redisOps},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := testutil.CollectAndCount(tc.c); got != len(tc.known) {
				t.Errorf("got %d series; want %d", got, len(tc.known))
			}
		})
	}
	for _, r := range takeoverReasons {
		if got := testutil.ToFloat64(m.takeovers.WithLabelValues(r)); got != 0 {
			t.Errorf("takeovers{reason=%q}: got %g; want 0", r, got)
		}
	}
	for _, op := range redisOps {
		if got := testutil.ToFloat64(m.redisErrors.WithLabelValues(op)); got != 0 {
			t.Errorf("redis_errors_total{op=%q}: got %g; want 0", op, got)
		}
	}
}

func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.Request(context.Background(), "/v1/chat/completions", "owner", 200, time.Second)
	m.Upstream(context.Background(), "/v1/chat/completions", 200, time.Second)
	m.Saved("/v1/chat/completions", "gpt-4o", 1, 1)
	m.Sampled("/v1/chat/completions", "retry", "hit")
	m.WaitingAdd(1)
	m.Observe(singleflight.Event{Kind: singleflight.EventDegraded})
}

func TestNewTwicePanics(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg)
	defer func() {
		if recover() == nil {
			t.Errorf("got no panic registering twice; want one")
		}
	}()
	New(reg)
}

func TestWaiting(t *testing.T) {
	m, _ := newTest(t)
	deltas := []int{1, 1, 1, -1, 1, -1, -1, -1}
	var want float64
	for i, d := range deltas {
		m.WaitingAdd(d)
		want += float64(d)
		if got := testutil.ToFloat64(m.waiting); got != want {
			t.Errorf("after step %d: got %g; want %g", i, got, want)
		}
	}
	if want != 0 {
		t.Fatalf("script ends at %g; want it to end at 0", want)
	}
}

// TestRecordingDoesNotAllocate: once a series exists, recording a request, a saving and a
// role allocates nothing: these run on every request.
func TestRecordingDoesNotAllocate(t *testing.T) {
	m, reg := newTest(t)
	calls := 0
	record := func() {
		calls++
		m.Request(context.Background(), "/v1/chat/completions", "hit", 200, time.Millisecond)
		m.Upstream(context.Background(), "/v1/chat/completions", 200, time.Millisecond)
		m.Saved("/v1/chat/completions", "gpt-4o", 11, 7)
		m.Sampled("/v1/chat/completions", "retry", "hit")
		m.Observe(singleflight.Event{Kind: singleflight.EventRole, Role: singleflight.RoleHit})
	}
	record()
	if n := testing.AllocsPerRun(100, record); n != 0 {
		t.Errorf("%v allocations per request; want 0", n)
	}
	// The same series as the vectors make: one per label set used, with its count.
	if got := testutil.ToFloat64(m.requests.WithLabelValues("/v1/chat/completions", "hit", "200")); got != float64(calls) {
		t.Errorf("requests_total = %v; want %d", got, calls)
	}
	if got := testutil.ToFloat64(m.sampled.WithLabelValues("/v1/chat/completions", "retry", "hit")); got != float64(calls) {
		t.Errorf("sampled_requests_total = %v; want %d", got, calls)
	}
	if got := testutil.ToFloat64(m.savedTokens.WithLabelValues("gpt-4o", "completion")); got != float64(calls*7) {
		t.Errorf("saved completion tokens = %v; want %d", got, calls*7)
	}
	if n, err := testutil.GatherAndCount(reg, "llm_dedupe_saved_tokens_total"); err != nil || n != 2 {
		t.Errorf("%d saved_tokens series (%v); want 2", n, err)
	}
}

// TestEveryRedisOpIsPreinitialised reads the coordinator's source for the operations it
// names in EventRedisError: each must start at 0 (subscribe and namespace once did not).
func TestEveryRedisOpIsPreinitialised(t *testing.T) {
	files, err := filepath.Glob("../singleflight/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no singleflight source: %v", err)
	}
	named := regexp.MustCompile(`EventRedisError, Op: "([a-z]+)"|redisErr\("([a-z]+)"|fenced\("([a-z]+)"|o\.final\(ctx, "([a-z]+)"|Op: op`)
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(src), -1) {
			for _, op := range m[1:] {
				if op != "" {
					seen[op] = true
				}
			}
		}
	}
	if len(seen) < 5 {
		t.Fatalf("found only %v in singleflight's source: the pattern no longer matches it", seen)
	}
	for op := range seen {
		if !slices.Contains(redisOps, op) {
			t.Errorf("singleflight reports Redis errors of op %q, which redis_errors_total does not start at 0", op)
		}
	}
}
