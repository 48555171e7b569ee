package metrics

import "github.com/prometheus/client_golang/prometheus"

// sampledLabels are the labels of sampled_requests_total: route, what was done with the
// request (in_flight, retry, never, store: the proxy's X-Dedupe-Sampled) and its role.
type sampledLabels struct{ route, sampled, role string }

func newSampledCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "sampled_requests_total",
		Help:      "Client requests that sample (temperature absent or above 0, no seed), by route, what was done with them (in_flight: served no stored answer; retry: a client's retry, served one within the window; never: sent upstream alone; store: like any other) and role.",
	}, []string{"route", "sampled", "role"})
}

// Sampled records one finished request that samples, so that an operator sees what the
// sampled-request policy costs: under in_flight, role owner counts the calls made for
// requests that were served no stored answer, follower the calls shared while in flight,
// and a retry's hit an answer kept for a client's retry. See ADR 0078.
func (m *Metrics) Sampled(route, sampled, role string) {
	if m == nil {
		return
	}
	m.sampledSeries.get(sampledLabels{route, sampled, role}, func(l sampledLabels) prometheus.Counter {
		return m.sampled.WithLabelValues(l.route, l.sampled, l.role)
	}).Inc()
}
