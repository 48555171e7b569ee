package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
)

// A request that samples asks for an answer, not the answer: a "regenerate" must get a new
// one, an eval's samples must stay independent, and a client's retry still wants the one
// its call made. See ADR 0078.

// HeaderSampled, on the answer of a request that samples, says what was done with it: its
// sampling.
const HeaderSampled = "X-Dedupe-Sampled"

// HeaderRetryCount is the header in which the official OpenAI SDKs (Python, Node, Go) number
// the tries of one call: 0 on the first, 1 and up on its retries.
const HeaderRetryCount = "X-Stainless-Retry-Count"

// DefaultSampledRetryWindow is Config.SampledRetryWindow's default: the SDKs wait at most 8 s
// between two tries (0.5 s doubled, minus up to a quarter), and a try whose client gave up
// joined a call that had not ended when it did.
const DefaultSampledRetryWindow = 10 * time.Second

// SampledSharing is how requests that sample are shared and stored.
type SampledSharing uint8

const (
	// ShareInFlight shares a sampled request's call with the identical requests that join
	// it while it runs; its answer is served to no request sent after it, but a client's
	// retry (HeaderRetryCount) within Config.SampledRetryWindow.
	ShareInFlight SampledSharing = iota
	// ShareAndStore shares and stores sampled requests' answers like any other.
	ShareAndStore
	// ShareNever sends every sampled request upstream on its own, as X-Dedupe-Bypass does.
	ShareNever
)

var sharingNames = [...]string{ShareInFlight: "in_flight", ShareAndStore: "store", ShareNever: "never"}

func (s SampledSharing) String() string {
	if int(s) < len(sharingNames) {
		return sharingNames[s]
	}
	return "SampledSharing(" + strconv.Itoa(int(s)) + ")"
}

// ParseSampledSharing reads in_flight, store or never.
func ParseSampledSharing(s string) (SampledSharing, error) {
	for i, name := range sharingNames {
		if s == name {
			return SampledSharing(i), nil
		}
	}
	return 0, fmt.Errorf("proxy: sampled sharing %q: want in_flight, store or never", s)
}

// sampling is what was done with a request that samples, as HeaderSampled and the metrics
// name it; "" for a request that does not sample.
type sampling string

const (
	sampledInFlight sampling = "in_flight" // joins a call in flight; served no stored answer
	sampledRetry    sampling = "retry"     // a retry: served a stored answer within the window
	sampledNever    sampling = "never"     // straight upstream, alone
	sampledStore    sampling = "store"     // like any other request
)

// samples reports whether a request on route asks the model for a sample, so that an
// identical request may rightly get another answer. Routes are told apart by their end, so
// that Azure's deployment paths match too. Chat Completions and Completions sample unless
// temperature is 0 or a seed asks for a repeatable answer; the Responses API unless
// temperature is 0 (it takes no seed); an absent or null temperature is those APIs'
// default, 1. Embeddings, and every other route, never sample.
func samples(route string, req hashing.Request) bool {
	switch {
	case strings.HasSuffix(route, "/completions"): // chat/completions too
		if req.Seed {
			return false
		}
	case strings.HasSuffix(route, "/responses"):
	default:
		return false
	}
	return req.Temperature == "" || positive(req.Temperature)
}

// positive reports whether a JSON number is above 0: no minus sign, and a digit other than
// 0 before its exponent.
func positive(num string) bool {
	if strings.HasPrefix(num, "-") {
		return false
	}
	mantissa, _, _ := strings.Cut(strings.ToLower(num), "e")
	return strings.ContainsAny(mantissa, "123456789")
}

// samplingOf is what is done with a request: nothing special unless it samples, then what
// Config.Sampled says, a client's retry told apart under ShareInFlight.
func (p *Proxy) samplingOf(route string, req hashing.Request, h http.Header) sampling {
	if !samples(route, req) {
		return ""
	}
	switch p.cfg.Sampled {
	case ShareAndStore:
		return sampledStore
	case ShareNever:
		return sampledNever
	}
	if n, err := strconv.Atoi(strings.TrimSpace(h.Get(HeaderRetryCount))); err == nil && n > 0 {
		return sampledRetry
	}
	return sampledInFlight
}

// applySampling marks the answer of a request that samples and adjusts its controls: a
// first try is served no stored answer, a retry none older than the window; either's
// answer is stored at most for the window (storePolicy). It reports false when the request
// went straight upstream (ShareNever), already answered.
func (p *Proxy) applySampling(w http.ResponseWriter, r *http.Request, s sampling, body []byte, cc *controls, st *reqState) bool {
	if s == "" {
		return true
	}
	st.info.sampled = s
	w.Header().Set(HeaderSampled, string(s))
	switch s {
	case sampledNever:
		st.info.role = "bypass"
		w.Header().Set(HeaderRole, "bypass")
		r.Body = io.NopCloser(bytes.NewReader(body))
		p.pass.ServeHTTP(w, r)
		return false
	case sampledInFlight:
		cc.noCache, cc.sampled = true, true
	case sampledRetry:
		window := p.cfg.SampledRetryWindow
		if window <= 0 {
			cc.noCache = true
		} else if cc.maxAge == 0 || window < cc.maxAge {
			cc.maxAge = window
		}
		cc.sampled = true
	}
	return true
}

// sampledTTL is how long the answer of a sampled request is stored, given the TTL the
// rules gave it (0: the Flights' own): no longer than the retry window.
func (p *Proxy) sampledTTL(ttl time.Duration) time.Duration {
	if ttl == 0 {
		ttl = p.cfg.ResultTTL
	}
	return min(ttl, p.cfg.SampledRetryWindow)
}
