// Package metrics defines every Prometheus collector of the proxy, in one place.
//
// # Names and labels
//
// Every metric is prefixed llm_dedupe_ and measured in base units (seconds, counts). Label
// values come only from bounded sets, so that no client can make the proxy's series grow
// without limit:
//
//   - route is the configured route path (for example "/v1/chat/completions") or a fixed
//     name such as "passthrough", never the raw request URL;
//   - sampled (sampled requests) is in_flight, retry, never or store, what the proxy did
//     with a request that samples;
//   - role is owner, follower, hit, bypass, rejected or unknown; code is the HTTP status as a decimal string,
//     or "error" for an upstream call that got no response (transport error, timeout);
//   - reason (takeovers) is one of expired, failed, shutdown, degraded, or "other" for a
//     reason this package does not know yet; op (Redis errors) is the name of a coordinator
//     operation chosen by the code, never by input ("unknown" if empty);
//   - model is the request's "model" string, which a client controls: after [MaxModels]
//     distinct values, every new one is counted as "other", and "" as "unknown"; so is
//     one longer than [MaxModelBytes] or not valid UTF-8.
//
// # Wiring
//
// [New] registers everything on the Registerer it is given (never the global one), the
// proxy handler calls [Metrics.Request], [Metrics.Upstream], [Metrics.Saved],
// [Metrics.Sampled] and [Metrics.WaitingAdd], [Metrics.CountOpen] wraps the proxy handler, and the singleflight Group is given the *Metrics as its Observer.
// A nil *Metrics is valid and records nothing, so tests and tools may leave it out.
package metrics

import (
	"context"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

const namespace = "llm_dedupe"

// MaxModels is how many distinct model label values saved_tokens_total keeps before it
// counts every new model as "other": the model string comes from the client, and an
// unbounded label would let anyone exhaust Prometheus's memory.
const MaxModels = 100

// MaxModelBytes is the longest model string used as a label value; a longer one (or one
// that is not valid UTF-8, which Prometheus refuses) is counted as "other". The distinct
// values are capped by MaxModels, their length by this: 100 × 128 bytes bound what clients
// can add to /metrics. Real model and deployment names are far shorter.
const MaxModelBytes = 128

// Label values the package substitutes for input it will not use as is.
const (
	modelOther   = "other"
	modelUnknown = "unknown"
	codeError    = "error"
)

// takeoverReasons are the reasons singleflight reports for EventTakeover; they are
// pre-initialised to 0 so that dashboards and rate() see them before the first takeover.
var takeoverReasons = []string{"expired", "failed", "shutdown", "degraded"}

// redisOps are the coordinator operations singleflight names in EventRedisError (and the
// start-up check, "ping"), pre-initialised so that an alert on redis_errors_total sees 0
// before the first error. An operation not listed is still counted under its own name.
var redisOps = []string{"lookup", "claim", "incr", "renew", "append", "complete", "fail", "xread", "subscribe", "namespace", "ping", "unwait"}

// flightRoles are the roles a local flight can be given (EventRole), pre-initialised too.
var flightRoles = []string{"owner", "follower", "hit"}

// purgeKinds are the kinds of purge (EventPurge, EventInvalidated), pre-initialised too.
var purgeKinds = []string{"answer", "namespace"}

// abandonOutcomes are the outcomes singleflight reports for EventAbandoned (ADR 0074).
var abandonOutcomes = []string{"cancelled", "finished", "rejoined"}

// invalidationKinds are purgeKinds and "all", which is not pre-initialised: it only
// happens when a subscription was lost.
var invalidationKinds = []string{"answer", "namespace", "all"}

// durationBuckets span what an LLM proxy sees: a cache hit in about a millisecond up to a
// long generation of several minutes, 16 buckets growing by about ×1.7.
var durationBuckets = prometheus.ExponentialBucketsRange(0.001, 300, durationBucketCount)

const durationBucketCount = 16

// Metrics holds every collector of the proxy, so that callers record through a few methods
// instead of knowing metric names and labels. It implements singleflight.Observer. Its
// methods are safe for concurrent use and never block on I/O; a nil *Metrics records
// nothing.
type Metrics struct {
	requests         *prometheus.CounterVec
	requestDuration  *prometheus.HistogramVec
	upstream         *prometheus.CounterVec
	upstreamDuration *prometheus.HistogramVec
	savedRequests    *prometheus.CounterVec
	savedTokens      *prometheus.CounterVec
	waiting          prometheus.Gauge
	open             prometheus.Gauge

	inflight          prometheus.Gauge
	roles             *prometheus.CounterVec
	takeovers         *prometheus.CounterVec
	leaseLost         prometheus.Counter
	fencedWrites      prometheus.Counter
	heartbeatFailures prometheus.Counter
	redisErrors       *prometheus.CounterVec
	degraded          prometheus.Gauge
	followerWait      prometheus.Histogram
	purges            *prometheus.CounterVec
	invalidations     *prometheus.CounterVec
	abandoned         *prometheus.CounterVec
	abandonedBytes    prometheus.Counter
	nearMisses        *prometheus.CounterVec
	sampled           *prometheus.CounterVec

	models modelSet

	// Children of the vectors above, by their labels; see series.
	requestSeries  series[requestLabels, requestChildren]
	upstreamSeries series[upstreamLabels, upstreamChildren]
	savedSeries    series[string, prometheus.Counter] // by route
	tokenSeries    series[tokenLabels, prometheus.Counter]
	roleSeries     series[singleflight.Role, prometheus.Counter]
	sampledSeries  series[sampledLabels, prometheus.Counter]
}

type requestLabels struct {
	route, role string
	code        int
}

type requestChildren struct {
	count     prometheus.Counter
	duration  prometheus.Observer
	exemplars *exemplarGate
}

type upstreamLabels struct {
	route string
	code  int
}

type upstreamChildren struct {
	count     prometheus.Counter
	duration  prometheus.Observer
	exemplars *exemplarGate
}

type tokenLabels struct{ model, kind string }

var _ singleflight.Observer = (*Metrics)(nil)

// RegisterInstance registers llm_dedupe_instance_info, 1 with the instance's id (the owner
// the admin API lists for the flights it runs) and version as labels, so that an owner can
// be found among the scraped instances. One series per process: see ADR 0041.
func RegisterInstance(reg prometheus.Registerer, id, version string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   namespace,
		Name:        "instance_info",
		Help:        "Always 1: the instance id this process is listed as owner under, and its version.",
		ConstLabels: prometheus.Labels{"instance_id": id, "version": version},
	})
	g.Set(1)
	reg.MustRegister(g)
}

// New creates the proxy's collectors and registers them on reg, together with the Go
// runtime and process collectors, so that one Registerer serves the whole /metrics page.
// It panics if a collector is already registered on reg: that is a wiring mistake (New
// called twice on one registry), not a condition to handle at run time.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "requests_total",
			Help:      "Client requests answered on deduplicated routes, by route, role (owner, follower, hit, bypass; rejected before any flight; unknown: the client left before its flight decided) and HTTP status code (499: the client left).",
		}, []string{"route", "role", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "request_duration_seconds",
			Help:      "Time from receiving a client request to its last response byte, by route and role.",
			Buckets:   durationBuckets,
		}, []string{"route", "role"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "upstream_requests_total",
			Help:      "Calls made to the upstream API, by route and HTTP status code (\"error\" when no response came: transport error or timeout).",
		}, []string{"route", "code"}),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "upstream_duration_seconds",
			Help:      "Duration of calls to the upstream API, to the end of the response body, by route.",
			Buckets:   durationBuckets,
		}, []string{"route"}),
		savedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "saved_upstream_requests_total",
			Help:      "Client requests served without an upstream call of their own (followers and hits), by route.",
		}, []string{"route"}),
		savedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "saved_tokens_total",
			Help:      "Tokens not billed because a request was served from another request's upstream call, by model and kind (prompt, completion).",
		}, []string{"model", "kind"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "waiting_requests",
			Help:      "Client requests on a deduplicated route currently waiting for the first byte of their answer (owners included).",
		}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "open_requests",
			Help:      "Client requests in progress on every route, deduplicated or passed through, streams until their last byte; probes and scrapes not counted. The measure to autoscale on.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "inflight_flights",
			Help:      "Local flights (distinct request keys being served) currently in this process.",
		}),
		roles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "flight_roles_total",
			Help:      "Roles decided for local flights (owner, follower, hit); a takeover decides a flight's role again.",
		}, []string{"role"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "takeovers_total",
			Help:      "Times this process contended to take over a flight from another owner, by reason (expired, failed, shutdown, degraded).",
		}, []string{"reason"}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "lease_lost_total",
			Help:      "Times an owner in this process learnt another owner had taken over and cancelled its upstream call.",
		}),
		fencedWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "fenced_writes_total",
			Help:      "Writes by a stale owner of this process that Redis refused because the fencing token had changed.",
		}),
		heartbeatFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "heartbeat_failures_total",
			Help:      "Lease renewals that failed for reasons other than fencing (network, timeout, Redis error).",
		}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "redis_errors_total",
			Help:      "Failed Redis commands, by coordinator operation.",
		}, []string{"op"}),
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "backend_degraded",
			Help:      "1 while Redis is unreachable and this process deduplicates locally only, else 0.",
		}),
		followerWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "follower_wait_seconds",
			Help:      "Time a local flight spent following an owner in another process, until its outcome or a takeover.",
			Buckets:   durationBuckets,
		}),
		purges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "purges_total",
			Help:      "Purges asked of this instance through the admin API, by kind (answer, namespace).",
		}, []string{"kind"}),
		invalidations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "purge_invalidations_total",
			Help:      "Purges applied to this instance's memory as they arrived from any instance, by kind (answer, namespace; all: everything after a lost subscription).",
		}, []string{"kind"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "abandoned_flights_total",
			Help:      "Calls owned here that no client of this instance waited for any more, by how that ended: cancelled (cut after the grace, nobody waiting anywhere), rejoined (a client came back within the grace), finished (ran to its end: clients elsewhere waited, one asked to finish, or Redis could not be asked).",
		}, []string{"outcome"}),
		abandonedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "abandoned_bytes_total",
			Help:      "Bytes of answers that calls owned here received from the upstream while no client of this instance waited for them.",
		}),
		nearMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "near_miss_requests_total",
			Help:      "POST requests passed through, not deduplicated, whose path ends like the deduplicated route (/chat/completions for /v1/chat/completions): most often a client whose base URL lacks /v1.",
		}, []string{"route"}),
		sampled: newSampledCounter(),
		models:  modelSet{max: MaxModels},
	}
	for _, o := range abandonOutcomes {
		m.abandoned.WithLabelValues(o)
	}
	for _, k := range purgeKinds {
		m.purges.WithLabelValues(k)
		m.invalidations.WithLabelValues(k)
	}
	for _, r := range takeoverReasons {
		m.takeovers.WithLabelValues(r)
	}
	for _, r := range flightRoles {
		m.roles.WithLabelValues(r)
	}
	for _, op := range redisOps {
		m.redisErrors.WithLabelValues(op)
	}
	reg.MustRegister(
		m.requests, m.requestDuration, m.upstream, m.upstreamDuration,
		m.savedRequests, m.savedTokens, m.waiting, m.open,
		m.inflight, m.roles, m.takeovers, m.leaseLost, m.fencedWrites,
		m.heartbeatFailures, m.redisErrors, m.degraded, m.followerWait,
		m.purges, m.invalidations, m.abandoned, m.abandonedBytes, m.nearMisses, m.sampled,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Request records one finished client request, so that operators see traffic, status codes
// and latency split by how each request was served. route is the configured route path;
// role is owner, follower, hit or bypass; d runs to the last byte sent.
func (m *Metrics) Request(ctx context.Context, route, role string, code int, d time.Duration) {
	if m == nil {
		return
	}
	c := m.requestSeries.get(requestLabels{route, role, code}, func(l requestLabels) requestChildren {
		return requestChildren{
			count:     m.requests.WithLabelValues(l.route, l.role, strconv.Itoa(l.code)),
			duration:  m.requestDuration.WithLabelValues(l.route, l.role),
			exemplars: newExemplarGate(),
		}
	})
	c.count.Inc()
	c.exemplars.observe(ctx, c.duration, d.Seconds())
}

// Upstream records one call to the upstream API, the cost the proxy exists to save. A code
// of 0 (or below) means no response came (transport error or timeout) and is counted as
// "error".
func (m *Metrics) Upstream(ctx context.Context, route string, code int, d time.Duration) {
	if m == nil {
		return
	}
	c := m.upstreamSeries.get(upstreamLabels{route, max(code, 0)}, func(l upstreamLabels) upstreamChildren {
		code := codeError
		if l.code > 0 {
			code = strconv.Itoa(l.code)
		}
		return upstreamChildren{
			count:     m.upstream.WithLabelValues(l.route, code),
			duration:  m.upstreamDuration.WithLabelValues(l.route),
			exemplars: newExemplarGate(),
		}
	})
	c.count.Inc()
	c.exemplars.observe(ctx, c.duration, d.Seconds())
}

// Saved records one request served without its own upstream call (a follower or a hit),
// with the tokens its response reports, so that the savings can be shown in requests and
// in what they would have been billed. Token counts of zero or less add nothing; model ""
// is counted as "unknown", and past MaxModels distinct models as "other".
func (m *Metrics) Saved(route, model string, promptTokens, completionTokens int64) {
	if m == nil {
		return
	}
	m.savedSeries.get(route, func(route string) prometheus.Counter {
		return m.savedRequests.WithLabelValues(route)
	}).Inc()
	if promptTokens <= 0 && completionTokens <= 0 {
		return
	}
	model = m.models.label(model)
	if promptTokens > 0 {
		m.tokens(model, "prompt").Add(float64(promptTokens))
	}
	if completionTokens > 0 {
		m.tokens(model, "completion").Add(float64(completionTokens))
	}
}

// tokens is the saved-tokens counter of a model label and kind.
func (m *Metrics) tokens(model, kind string) prometheus.Counter {
	return m.tokenSeries.get(tokenLabels{model, kind}, func(l tokenLabels) prometheus.Counter {
		return m.savedTokens.WithLabelValues(l.model, l.kind)
	})
}

// WaitingAdd moves the waiting-requests gauge by delta (+1 when a request starts waiting
// for the first byte of its answer, -1 when it comes), so that a pile-up behind a slow
// upstream call is visible while it happens, not only when the requests finish.
func (m *Metrics) WaitingAdd(delta int) {
	if m == nil {
		return
	}
	m.waiting.Add(float64(delta))
}

// NearMiss records a POST passed through whose path ends like the deduplicated route route
// (a client's base URL without /v1, most often): requests that could have been
// deduplicated and were not. route is a configured route, so its values are bounded.
func (m *Metrics) NearMiss(route string) {
	if m == nil {
		return
	}
	m.nearMisses.WithLabelValues(route).Inc()
}

// exemplarGate lets one exemplar a second into each bucket of a duration histogram:
// Prometheus keeps only a bucket's latest, and making one allocates (ADR 0061).
type exemplarGate struct {
	last [durationBucketCount + 1]atomic.Int64 // unix ns of each bucket's latest
}

func newExemplarGate() *exemplarGate { return &exemplarGate{} }

// observe records v, with the trace ID of ctx's span as its exemplar when that span is
// sampled and v's bucket had none for a second: a dashboard goes from a slow bucket to
// its trace.
func (g *exemplarGate) observe(ctx context.Context, h prometheus.Observer, v float64) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		if eo, ok := h.(prometheus.ExemplarObserver); ok && g.admit(v, time.Now().UnixNano()) {
			eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	h.Observe(v)
}

func (g *exemplarGate) admit(v float64, now int64) bool {
	l := &g.last[sort.SearchFloat64s(durationBuckets, v)]
	t := l.Load()
	return now-t >= int64(time.Second) && l.CompareAndSwap(t, now)
}
