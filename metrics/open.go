package metrics

import (
	"net/http"
	"slices"
)

// CountOpen returns middleware that counts every request its handler serves in
// llm_dedupe_open_requests until the handler returns (a stream's last byte), except those
// whose path is one of skip (probes and scrapes: they say nothing of load). Requests in
// progress, unlike CPU, follow the load of a proxy that mostly waits on long answers: it
// is the gauge an autoscaler reads (ADR 0073). A nil *Metrics counts nothing.
func (m *Metrics) CountOpen(skip ...string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if m == nil {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if slices.Contains(skip, r.URL.Path) {
				next.ServeHTTP(w, r)
				return
			}
			m.open.Inc()
			defer m.open.Dec()
			next.ServeHTTP(w, r)
		})
	}
}
