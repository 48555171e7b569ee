package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// chartGrace is the grace the Helm chart gives a pod by default (its values.yaml) and the
// longest upstream call it must cover (config.upstream.timeout, else the proxy's default in
// config.example.yaml), with the Redis pool the chart sets. See ADR 0071.
type chartGrace struct {
	delay, timeout, upstreamTimeout time.Duration
	poolSize                        int
}

func readChartGrace(t *testing.T) chartGrace {
	t.Helper()
	vals := readYAML(t, filepath.Join(repoRoot, "deploy/helm/llm-dedupe-proxy/values.yaml"))
	sd, _ := vals["shutdown"].(map[string]any)
	seconds := func(key string) time.Duration {
		n, ok := sd[key].(int)
		if !ok {
			t.Fatalf("values.yaml shutdown.%s = %v; want an integer", key, sd[key])
		}
		return time.Duration(n) * time.Second
	}
	g := chartGrace{delay: seconds("delaySeconds"), timeout: seconds("timeoutSeconds")}
	up, _ := lookupYAML(vals, "config", "upstream", "timeout").(string)
	if up == "" {
		up, _ = lookupYAML(readYAML(t, filepath.Join(repoRoot, "config.example.yaml")), "upstream", "timeout").(string)
	}
	d, err := time.ParseDuration(up)
	if err != nil {
		t.Fatalf("upstream.timeout %q: %v", up, err)
	}
	g.upstreamTimeout = d
	g.poolSize, _ = lookupYAML(vals, "config", "redis", "pool_size").(int)
	return g
}

func lookupYAML(m map[string]any, keys ...string) any {
	var x any = m
	for _, k := range keys {
		mm, _ := x.(map[string]any)
		x = mm[k]
	}
	return x
}

// rolloutScale is how much the chart's durations are shrunk: E2E_ROLLOUT_SCALE (0.25 runs
// the chart's 600 s shutdown_timeout as 150 s, with streams of two minutes), else so that
// shutdown_timeout lasts 6 s. The arithmetic is the same at every scale.
func rolloutScale(t *testing.T, g chartGrace) float64 {
	t.Helper()
	if s := os.Getenv("E2E_ROLLOUT_SCALE"); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f <= 0 || f > 1 {
			t.Fatalf("E2E_ROLLOUT_SCALE=%q: want a number in (0, 1]", s)
		}
		return f
	}
	return float64(6*time.Second) / float64(g.timeout)
}

// rollout is a rolling restart of a three-instance cluster under a load of long identical
// streams, done as Kubernetes does it with maxSurge 1 and maxUnavailable 0: a new instance
// is started and ready before an old one gets SIGTERM; the old one is sent new requests for
// half of shutdown_delay more (the balancer's lag), and must exit before its grace period
// (delay + timeout + 5 s) ends, when the kubelet would kill it. A scale-down follows: one
// more SIGTERM without a replacement.
type rollout struct {
	t       *testing.T
	c       *cluster
	delay   time.Duration // shutdown_delay
	grace   time.Duration // terminationGracePeriodSeconds
	stream  time.Duration // how long each upstream stream runs
	chunks  int
	mu      sync.Mutex
	routed  []*instance // the instances the balancer sends to
	clients []*sseClient
	groups  int // distinct requests sent, each to every routed instance
	stop    chan struct{}
	done    chan struct{}
}

func startRollout(t *testing.T, delay, timeout, grace, upstreamTimeout, stream time.Duration) *rollout {
	t.Helper()
	c := startCluster(t, clusterOpts{env: map[string]string{
		"LLM_DEDUPE_SHUTDOWN_DELAY":    delay.String(),
		"LLM_DEDUPE_SHUTDOWN_TIMEOUT":  timeout.String(),
		"LLM_DEDUPE_UPSTREAM_TIMEOUT":  upstreamTimeout.String(),
		"LLM_DEDUPE_REDIS_POOL_SIZE":   strconv.Itoa(readChartGrace(t).poolSize),
		"LLM_DEDUPE_FLIGHT_RESULT_TTL": "10m",
	}})
	// The fake waits its delay before each event of the stream, the role and usage events
	// included: the stream lasts events × delay.
	const chunks = 32
	events := strings.Count(fakeupstream.Transcript(chatPath, 1, "e2e-rollout", chunks, true), "\n\n")
	c.fake.set(fakeupstream.Behavior{Delay: stream / time.Duration(events), Chunks: chunks})
	r := &rollout{t: t, c: c, delay: delay, grace: grace, stream: stream, chunks: chunks,
		routed: append([]*instance(nil), c.ins...), stop: make(chan struct{}), done: make(chan struct{})}
	go r.load()
	return r
}

// load starts a group of identical streams, one on each routed instance, four times a
// stream's length, until stop.
func (r *rollout) load() {
	defer close(r.done)
	tick := time.NewTicker(r.stream / 4)
	defer tick.Stop()
	for {
		r.mu.Lock()
		body := streamBody("e2e-rollout", fmt.Sprintf("long answer %d", r.groups))
		r.groups++
		for _, in := range r.routed {
			r.clients = append(r.clients, openSSETimeout(in.URL, body, apiKeyA, 2*r.stream+clientTimeout))
		}
		r.mu.Unlock()
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
	}
}

// terminate is a pod's end: SIGTERM, the balancer's lag, and an exit within the grace.
func (r *rollout) terminate(old *instance) time.Duration {
	r.t.Helper()
	start := time.Now()
	old.signal(syscall.SIGTERM)
	time.AfterFunc(r.delay/2, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, in := range r.routed {
			if in == old {
				r.routed = append(r.routed[:i:i], r.routed[i+1:]...)
			}
		}
	})
	if code := old.wait(r.grace); code != 0 {
		r.t.Errorf("%s exited with status %d; want 0", old.name, code)
	}
	return time.Since(start)
}

// restart replaces old: a new instance first, ready and routed, then old's end.
func (r *rollout) restart(old *instance) time.Duration {
	r.t.Helper()
	fresh := r.c.start()
	r.mu.Lock()
	r.routed = append(r.routed, fresh)
	r.mu.Unlock()
	return r.terminate(old)
}

// finish stops the load and checks every stream: it returns how many were whole, cut
// (stream_interrupted, an error status or a broken connection), and the upstream calls.
func (r *rollout) finish() (whole, cut int, s fakeupstream.Stats) {
	r.t.Helper()
	close(r.stop)
	<-r.done
	for i, cl := range r.clients {
		res := cl.result()
		if res.err != nil || res.status != 200 {
			r.t.Logf("stream %d: status %d, error %v", i, res.status, res.err)
			cut++
			continue
		}
		if _, interrupted := checkStream(r.t, fmt.Sprintf("stream %d", i), res, "e2e-rollout", r.chunks); interrupted {
			cut++
			continue
		}
		whole++
	}
	// Every group's flight has ended: each is stored, completed or abandoned.
	s = r.c.fake.waitFor(fakeupstream.Stats{Calls: int64(r.groups)}, 10*time.Second)
	return whole, cut, r.c.fake.stats()
}

// TestRollingRestartUnderLongStreams: with the chart's default grace (values.yaml), a
// rolling restart of three instances and a scale-down, under streams as long as the longest
// upstream call, cut no stream and call the upstream once per distinct request. Durations
// are the chart's scaled down (rolloutScale); the arithmetic is the same. See ADR 0071.
func TestRollingRestartUnderLongStreams(t *testing.T) {
	g := readChartGrace(t)
	if g.timeout < g.upstreamTimeout {
		t.Fatalf("the chart's shutdown.timeoutSeconds %v is below upstream.timeout %v: a deploy cuts the longest calls", g.timeout, g.upstreamTimeout)
	}
	k := rolloutScale(t, g)
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * k) }
	delay, timeout, upstream := scale(g.delay), scale(g.timeout), scale(g.upstreamTimeout)
	grace := scale(g.delay + g.timeout + 5*time.Second)
	// The longest stream that ends before the upstream timeout, less a margin for a loaded
	// machine.
	stream := upstream * 4 / 5
	t.Logf("ROLLOUT scale=%.4f shutdown_delay=%v shutdown_timeout=%v grace=%v upstream.timeout=%v stream=%v (chart: %v %v, upstream.timeout %v)",
		k, delay, timeout, grace, upstream, stream, g.delay, g.timeout, g.upstreamTimeout)

	r := startRollout(t, delay, timeout, grace, upstream, stream)
	olds := append([]*instance(nil), r.c.ins...)
	// The first group's streams are open on every instance: the gauge an autoscaler reads.
	redistest.WaitUntil(t, 10*time.Second, "open streams counted", func() (bool, string) {
		got := sum(olds, "llm_dedupe_open_requests", nil)
		return got >= float64(len(olds)), fmt.Sprintf("llm_dedupe_open_requests %v", got)
	})
	for _, old := range olds {
		took := r.restart(old)
		t.Logf("ROLLOUT %s restarted: exited %v after SIGTERM (grace %v)", old.name, took.Round(time.Millisecond), grace)
	}
	took := r.terminate(r.c.ins[3])
	t.Logf("ROLLOUT scale-down: %s exited %v after SIGTERM", r.c.ins[3].name, took.Round(time.Millisecond))

	whole, cut, s := r.finish()
	t.Logf("ROLLOUT %d streams over %d distinct requests: %d whole, %d cut; upstream %+v", len(r.clients), r.groups, whole, cut, s)
	if cut != 0 {
		t.Errorf("%d streams cut; want none", cut)
	}
	if want := (fakeupstream.Stats{Calls: int64(r.groups), Completed: int64(r.groups)}); s != want {
		t.Errorf("upstream %+v; want %+v: one call per distinct request, none abandoned", s, want)
	}
}

// TestShortGraceCutsLongStreams is the same rolling restart's first step with a
// shutdown_timeout a third of the streams' length: what a shorter grace costs. Streams
// still running when it ends are cut or called again. See ADR 0071.
func TestShortGraceCutsLongStreams(t *testing.T) {
	const (
		stream = 3 * time.Second
		delay  = 50 * time.Millisecond
	)
	timeout := stream / 3
	r := startRollout(t, delay, timeout, delay+timeout+5*time.Second, 2*stream, stream)
	// Streams on every instance, well short of their end.
	r.c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
	r.restart(r.c.ins[0])
	whole, cut, s := r.finish()
	t.Logf("ROLLOUT short grace: %d streams over %d distinct requests: %d whole, %d cut; upstream %+v", len(r.clients), r.groups, whole, cut, s)
	if cut == 0 && s.Calls == int64(r.groups) {
		t.Errorf("no stream cut and no second call with shutdown_timeout %v under streams of %v; want the grace's cost to show", timeout, stream)
	}
}
