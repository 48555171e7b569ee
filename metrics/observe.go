package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// Observe records a singleflight event; it is the Observer the Group reports to. It only
// updates in-memory collectors, so it is cheap and never blocks. Unknown kinds are ignored,
// so that a new event kind cannot break an older Metrics.
func (m *Metrics) Observe(e singleflight.Event) {
	if m == nil {
		return
	}
	switch e.Kind {
	case singleflight.EventRole:
		m.roleSeries.get(e.Role, func(r singleflight.Role) prometheus.Counter {
			return m.roles.WithLabelValues(r.String())
		}).Inc()
	case singleflight.EventTakeover:
		m.takeovers.WithLabelValues(bounded(e.Reason, takeoverReasons)).Inc()
	case singleflight.EventLeaseLost:
		m.leaseLost.Inc()
	case singleflight.EventFencedWrite:
		m.fencedWrites.Inc()
	case singleflight.EventHeartbeatFailed:
		m.heartbeatFailures.Inc()
	case singleflight.EventRedisError:
		op := e.Op
		if op == "" {
			op = "unknown"
		}
		m.redisErrors.WithLabelValues(op).Inc()
	case singleflight.EventDegraded:
		m.degraded.Set(1)
	case singleflight.EventRecovered:
		m.degraded.Set(0)
	case singleflight.EventFlightStart:
		m.inflight.Inc()
	case singleflight.EventFlightEnd:
		m.inflight.Dec()
	case singleflight.EventPurge:
		m.purges.WithLabelValues(bounded(e.Op, purgeKinds)).Inc()
	case singleflight.EventInvalidated:
		m.invalidations.WithLabelValues(bounded(e.Op, invalidationKinds)).Inc()
	case singleflight.EventWait:
		m.followerWait.Observe(e.Duration.Seconds())
	case singleflight.EventAbandoned:
		m.abandoned.WithLabelValues(bounded(e.Reason, abandonOutcomes)).Inc()
		m.abandonedBytes.Add(float64(e.Bytes))
	}
}

// bounded returns v if it is one of known, else "other", so that a reason the package does
// not know yet is still counted without opening the label to arbitrary strings.
func bounded(v string, known []string) string {
	for _, k := range known {
		if v == k {
			return v
		}
	}
	return "other"
}
