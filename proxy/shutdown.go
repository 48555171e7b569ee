package proxy

import "net/http"

// Drain makes /readyz answer 503, so that a load balancer stops sending new requests while
// the server finishes the ones it has, and closes each client connection after its next
// answer on the API's routes (statusWriter), so that the client's next request goes
// through the balancer anew.
func (p *Proxy) Drain() { p.draining.Store(true) }

// CloseIdleConnections closes the upstream connections kept for the next call, at shutdown.
func (p *Proxy) CloseIdleConnections() {
	if c, ok := p.cfg.Transport.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// healthz answers 200 while the process serves at all.
func (p *Proxy) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz reports the backend; it answers 503 only while the instance drains. A degraded
// Redis backend still serves (local-only dedupe), so it is ready. See ADR 0040.
func (p *Proxy) readyz(w http.ResponseWriter, _ *http.Request) {
	status := http.StatusOK
	state := "ready"
	if p.draining.Load() {
		status, state = http.StatusServiceUnavailable, "draining"
	}
	v := map[string]any{
		"status":   state,
		"backend":  p.cfg.Flights.Backend(),
		"degraded": p.cfg.Flights.Degraded(),
	}
	if p.cfg.InstanceID != "" {
		v["instance"] = p.cfg.InstanceID
	}
	writeJSON(w, status, v)
}
