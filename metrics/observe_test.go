package metrics

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

func TestGauges(t *testing.T) {
	type step struct {
		kind singleflight.EventKind
		want float64 // the gauge after the event
	}
	tests := []struct {
		name  string
		gauge func(*Metrics) prometheus.Gauge
		steps []step
	}{
		{"degraded", func(m *Metrics) prometheus.Gauge { return m.degraded }, []step{
			{singleflight.EventDegraded, 1},
			{singleflight.EventDegraded, 1}, // repeated reports do not count up
			{singleflight.EventRecovered, 0},
			{singleflight.EventRecovered, 0},
			{singleflight.EventDegraded, 1},
			{singleflight.EventRecovered, 0},
		}},
		{"inflight", func(m *Metrics) prometheus.Gauge { return m.inflight }, []step{
			{singleflight.EventFlightStart, 1},
			{singleflight.EventFlightStart, 2},
			{singleflight.EventFlightEnd, 1},
			{singleflight.EventFlightStart, 2},
			{singleflight.EventFlightEnd, 1},
			{singleflight.EventFlightEnd, 0},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newTest(t)
			if got := testutil.ToFloat64(tc.gauge(m)); got != 0 {
				t.Fatalf("at start: got %g; want 0", got)
			}
			for i, s := range tc.steps {
				m.Observe(singleflight.Event{Kind: s.kind})
				if got := testutil.ToFloat64(tc.gauge(m)); got != s.want {
					t.Errorf("after step %d: got %g; want %g", i, got, s.want)
				}
			}
		})
	}
}

func TestObserveCounters(t *testing.T) {
	events := []singleflight.Event{
		{Kind: singleflight.EventRole, Role: singleflight.RoleOwner},
		{Kind: singleflight.EventRole, Role: singleflight.RoleFollower},
		{Kind: singleflight.EventRole, Role: singleflight.RoleFollower},
		{Kind: singleflight.EventRole, Role: singleflight.RoleHit},
		{Kind: singleflight.EventTakeover, Reason: "expired"},
		{Kind: singleflight.EventTakeover, Reason: "failed"},
		{Kind: singleflight.EventTakeover, Reason: "failed"},
		{Kind: singleflight.EventTakeover, Reason: "something new"},
		{Kind: singleflight.EventLeaseLost},
		{Kind: singleflight.EventFencedWrite, Op: "append"},
		{Kind: singleflight.EventFencedWrite, Op: "complete"},
		{Kind: singleflight.EventHeartbeatFailed},
		{Kind: singleflight.EventRedisError, Op: "claim"},
		{Kind: singleflight.EventRedisError, Op: "claim"},
		{Kind: singleflight.EventRedisError, Op: "renew"},
		{Kind: singleflight.EventRedisError},
		{Kind: singleflight.EventWait, Duration: 1500 * time.Millisecond},
		{Kind: singleflight.EventWait, Duration: 250 * time.Millisecond},
		{Kind: 0},   // unknown kinds are ignored
		{Kind: 250}, // unknown kinds are ignored
	}
	m, reg := newTest(t)
	roles := map[string]float64{}
	for _, r := range flightRoles {
		roles[r] = 0
	}
	takeovers := map[string]float64{}
	for _, r := range takeoverReasons {
		takeovers[r] = 0
	}
	redis := map[string]float64{}
	for _, op := range redisOps {
		redis[op] = 0
	}
	var leaseLost, fenced, heartbeat float64
	var waits uint64
	var waitSum float64
	for _, e := range events {
		m.Observe(e)
		switch e.Kind {
		case singleflight.EventRole:
			roles[e.Role.String()]++
		case singleflight.EventTakeover:
			takeovers[bounded(e.Reason, takeoverReasons)]++
		case singleflight.EventLeaseLost:
			leaseLost++
		case singleflight.EventFencedWrite:
			fenced++
		case singleflight.EventHeartbeatFailed:
			heartbeat++
		case singleflight.EventRedisError:
			op := e.Op
			if op == "" {
				op = "unknown"
			}
			redis[op]++
		case singleflight.EventWait:
			waits++
			waitSum += e.Duration.Seconds()
		}
	}
	if takeovers["other"] != 1 {
		t.Fatalf("script: got %g takeovers with an unknown reason; want 1", takeovers["other"])
	}

	vecs := []struct {
		name  string
		c     prometheus.Collector
		label string
		want  map[string]float64
	}{
		{"llm_dedupe_flight_roles_total", m.roles, "role", roles},
		{"llm_dedupe_takeovers_total", m.takeovers, "reason", takeovers},
		{"llm_dedupe_redis_errors_total", m.redisErrors, "op", redis},
	}
	for _, tc := range vecs {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]float64{}
			for k, v := range tc.want {
				want[key(k)] = v
			}
			text := exposition(t, reg, tc.name, []string{tc.label}, want)
			if err := testutil.CollectAndCompare(tc.c, strings.NewReader(text), tc.name); err != nil {
				t.Errorf("got a different exposition; want\n%s\n%v", text, err)
			}
		})
	}

	scalars := []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"lease_lost", m.leaseLost, leaseLost},
		{"fenced_writes", m.fencedWrites, fenced},
		{"heartbeat_failures", m.heartbeatFailures, heartbeat},
	}
	for _, tc := range scalars {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s: got %g; want %g", tc.name, got, tc.want)
		}
	}

	n, sum := histogram(t, reg, "llm_dedupe_follower_wait_seconds", map[string]string{})
	if n != waits || !near(sum, waitSum) {
		t.Errorf("follower_wait_seconds: got count %d sum %g; want count %d sum %g", n, sum, waits, waitSum)
	}
}

// TestObserveConcurrent runs the Group's pattern of events from many goroutines at once; run
// it with -race. Every counter must add up and the gauges must come back to where they were.
func TestObserveConcurrent(t *testing.T) {
	const goroutines, rounds = 32, 200
	m, reg := newTest(t)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				m.Observe(singleflight.Event{Kind: singleflight.EventFlightStart})
				m.Observe(singleflight.Event{Kind: singleflight.EventRole, Role: singleflight.RoleFollower})
				m.WaitingAdd(1)
				m.Observe(singleflight.Event{Kind: singleflight.EventTakeover, Reason: "expired"})
				m.Observe(singleflight.Event{Kind: singleflight.EventRedisError, Op: "renew"})
				m.Observe(singleflight.Event{Kind: singleflight.EventWait, Duration: time.Millisecond})
				m.Saved("/v1/chat/completions", modelName(g%3), 2, 1)
				m.Request(context.Background(), "/v1/chat/completions", "follower", 200, time.Millisecond)
				m.WaitingAdd(-1)
				m.Observe(singleflight.Event{Kind: singleflight.EventFlightEnd})
			}
		}()
	}
	wg.Wait()

	const n = goroutines * rounds
	tests := []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"inflight", m.inflight, 0},
		{"waiting", m.waiting, 0},
		{"roles follower", m.roles.WithLabelValues("follower"), n},
		{"takeovers expired", m.takeovers.WithLabelValues("expired"), n},
		{"redis errors renew", m.redisErrors.WithLabelValues("renew"), n},
		{"requests", m.requests.WithLabelValues("/v1/chat/completions", "follower", "200"), n},
		{"saved requests", m.savedRequests.WithLabelValues("/v1/chat/completions"), n},
	}
	for _, tc := range tests {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s: got %g; want %g", tc.name, got, tc.want)
		}
	}
	if got, _ := histogram(t, reg, "llm_dedupe_follower_wait_seconds", map[string]string{}); got != n {
		t.Errorf("follower wait count: got %d; want %d", got, n)
	}
	var prompt float64
	for i := range 3 {
		prompt += testutil.ToFloat64(m.savedTokens.WithLabelValues(modelName(i), "prompt"))
	}
	if want := float64(2 * n); prompt != want {
		t.Errorf("saved prompt tokens: got %g; want %g", prompt, want)
	}
}

func TestPurgesAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Observe(singleflight.Event{Kind: singleflight.EventPurge, Op: "answer"})
	m.Observe(singleflight.Event{Kind: singleflight.EventPurge, Op: "namespace"})
	m.Observe(singleflight.Event{Kind: singleflight.EventPurge, Op: "namespace"})
	m.Observe(singleflight.Event{Kind: singleflight.EventInvalidated, Op: "all"})
	for _, c := range []struct {
		c    prometheus.Collector
		kind string
		want float64
	}{{m.purges, "answer", 1}, {m.purges, "namespace", 2}, {m.invalidations, "all", 1}, {m.invalidations, "answer", 0}} {
		if got := testutil.ToFloat64(c.c.(*prometheus.CounterVec).WithLabelValues(c.kind)); got != c.want {
			t.Errorf("%s: got %v; want %v", c.kind, got, c.want)
		}
	}
}
