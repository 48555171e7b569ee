package proxy

import (
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// nearMiss is a deduplicated route and the tail a path that nearly reaches it ends with:
// the route without its first segment (/chat/completions for /v1/chat/completions), which
// is what an SDK whose base URL lacks /v1, or has a prefix too many, sends.
type nearMiss struct {
	tail, route string
	logged      atomic.Int64 // unix nanoseconds of the last warning, 0 before the first
}

// nearMissEvery is how often a route's near misses are logged at most: a client whose
// base URL is wrong sends every request so, and one line a minute says it.
const nearMissEvery = time.Minute

// nearMissMsg is the warning of a near miss. See ADR 0079.
const nearMissMsg = "POST passed through, not deduplicated: its path ends like a deduplicated route; " +
	"is the client's base URL missing /v1 (http://HOST:PORT/v1)? If the upstream serves this path, add it to dedupe.paths"

// newNearMisses returns the near misses of the literal routes in paths, longest tail first,
// so that /chat/completions is taken for /v1/chat/completions rather than /v1/completions.
func newNearMisses(paths []string) []*nearMiss {
	var out []*nearMiss
	for _, route := range paths {
		if strings.ContainsAny(route, "{*") {
			continue
		}
		tail := route
		if i := strings.Index(route[1:], "/"); i >= 0 {
			tail = route[i+1:]
		}
		out = append(out, &nearMiss{tail: tail, route: route})
	}
	slices.SortStableFunc(out, func(a, b *nearMiss) int { return len(b.tail) - len(a.tail) })
	return out
}

// checkNearMiss counts, and logs at most once a minute per route, a POST that is passed
// through although its path ends like a deduplicated route: it deduplicates nothing, and
// the client would not know.
func (p *Proxy) checkNearMiss(r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	for _, m := range p.near {
		if !strings.HasSuffix(path, m.tail) {
			continue
		}
		p.cfg.Recorder.NearMiss(m.route)
		now, last := time.Now().UnixNano(), m.logged.Load()
		if (last == 0 || now-last >= int64(nearMissEvery)) && m.logged.CompareAndSwap(last, now) {
			p.cfg.Logger.Warn(nearMissMsg, "path", r.URL.Path[:min(len(r.URL.Path), 200)], "route", m.route)
		}
		return
	}
}
