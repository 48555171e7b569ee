package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// StoreRule says how long answers of a route and model are stored. Route and Model are
// path.Match patterns ("*" or empty: any); a TTL of 0 stores nothing (dedupe only).
type StoreRule struct {
	Route string
	Model string
	TTL   time.Duration
}

// ParseStoreRule reads a rule written "ROUTE MODEL TTL", separated by spaces: for example
// "/v1/embeddings * 24h" or "* gpt-4o* 0".
func ParseStoreRule(s string) (StoreRule, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return StoreRule{}, fmt.Errorf("proxy: store rule %q: want \"ROUTE MODEL TTL\"", s)
	}
	ttl, err := time.ParseDuration(f[2])
	if err != nil || ttl < 0 {
		return StoreRule{}, fmt.Errorf("proxy: store rule %q: TTL %q is not a duration of 0 or more", s, f[2])
	}
	r := StoreRule{Route: f[0], Model: f[1], TTL: ttl}
	for _, p := range []string{r.Route, r.Model} {
		if _, err := path.Match(p, ""); err != nil {
			return StoreRule{}, fmt.Errorf("proxy: store rule %q: bad pattern %q", s, p)
		}
	}
	return r, nil
}

func (r StoreRule) matches(route, model string) bool {
	return match(r.Route, route) && match(r.Model, model)
}

func match(pattern, s string) bool {
	if pattern == "" || pattern == "*" {
		return true
	}
	ok, _ := path.Match(pattern, s)
	return ok
}

// storing is what an owner may do with a 2xx answer.
type storing struct {
	noStore     bool          // share with the flight only
	ttl         time.Duration // 0: the Flights' own
	noToolCalls bool          // share, not store, an answer with a tool call
}

// storePolicy is the storing of a request: the first StoreRule that matches decides the
// TTL (0: not stored), then the client's no-store, then, for a request that samples, the
// retry window (ADRs 0049, 0078).
func (p *Proxy) storePolicy(route, model string, cc controls) storing {
	s := storing{noStore: cc.noStore, noToolCalls: p.cfg.NoStoreToolCalls}
	for _, r := range p.cfg.StoreRules {
		if r.matches(route, model) {
			if r.TTL == 0 {
				s.noStore = true
			}
			s.ttl = r.TTL
			break
		}
	}
	if cc.sampled && !s.noStore {
		s.ttl = p.sampledTTL(s.ttl)
		s.noStore = s.ttl <= 0
	}
	return s
}

// toolCallMarkers are the JSON keys and values with which an answer asks the client to
// call a tool: Chat Completions' tool_calls (and the older function_call), the Responses
// API's function_call and custom_tool_call output items. A marker in the text of an answer
// is escaped (\"tool_calls\") and does not match; a false match only means not stored.
var toolCallMarkers = [][]byte{[]byte(`"tool_calls"`), []byte(`"function_call"`), []byte(`"custom_tool_call"`)}

// toolCallScan passes an upstream answer through and notes whether it holds a tool call,
// across reads: the last bytes of each read are kept for a marker split between two.
type toolCallScan struct {
	r     io.Reader
	carry []byte
	found bool
}

var _ io.Reader = (*toolCallScan)(nil)

func (s *toolCallScan) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 && !s.found {
		buf := append(s.carry, p[:n]...)
		for _, m := range toolCallMarkers {
			if bytes.Contains(buf, m) {
				s.found = true
			}
		}
		const keep = len(`"custom_tool_call"`) - 1
		s.carry = append(s.carry[:0], buf[max(0, len(buf)-keep):]...)
	}
	return n, err
}

// controls are the request's Cache-Control directives the proxy obeys.
type controls struct {
	noCache, noStore bool
	maxAge           time.Duration // > 0: a stored answer no older than this
	finish           bool          // the call runs to its end even when nobody waits (ADR 0074)
	sampled          bool          // the answer is stored at most the retry window (ADR 0078)
}

// finishAbandoned reads HeaderAbandoned, def when it is absent; false ok for a value that
// is neither finish nor cancel, or more than one.
func finishAbandoned(h http.Header, def bool) (finish, ok bool) {
	vs := h.Values(HeaderAbandoned)
	switch {
	case len(vs) == 0:
		return def, true
	case len(vs) > 1:
		return false, false
	}
	switch strings.ToLower(strings.TrimSpace(vs[0])) {
	case "finish":
		return true, true
	case "cancel":
		return false, true
	}
	return false, false
}

// cacheControl reads no-cache, no-store and max-age=N. max-age=0 is no-cache: a stored
// answer is not served, an upstream call in flight is still joined. A max-age that is not
// a number is ignored. See ADR 0048.
func cacheControl(h http.Header) controls {
	var c controls
	for d := range listItems(h, "Cache-Control") {
		d = strings.ToLower(d)
		switch {
		case d == "no-cache":
			c.noCache = true
		case d == "no-store":
			c.noStore = true
		case strings.HasPrefix(d, "max-age="):
			n, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(d, "max-age="), `"`), 10, 64)
			switch {
			case err != nil || n < 0:
			case n == 0:
				c.noCache = true
			case c.maxAge == 0 || time.Duration(n)*time.Second < c.maxAge:
				c.maxAge = time.Duration(min(n, 1<<32)) * time.Second
			}
		}
	}
	return c
}

// outcomeOf is the policy for an upstream status: what may be shared and stored. See ADR
// 0033.
func outcomeOf(status int) singleflight.Outcome {
	switch {
	case status/100 == 2:
		return singleflight.Store
	case status == http.StatusRequestTimeout:
		return singleflight.Retry
	case status/100 == 4:
		// 400, 401, 403, 404, 422 and 429 (with its Retry-After) are what the same
		// request would get again: shared with this flight, never stored.
		return singleflight.Share
	default:
		return singleflight.Retry
	}
}
