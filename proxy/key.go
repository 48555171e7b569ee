package proxy

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
)

// HeaderNamespace names a request's namespace: part of its key, so that an application
// can keep its answers apart from others' and an operator can purge them all at once.
const HeaderNamespace = "X-Dedupe-Namespace"

// maxNamespaceLen bounds a namespace name; names are kept in every instance's memory.
const maxNamespaceLen = 64

// ValidNamespace reports whether ns may name a namespace: empty (the default one), or up
// to 64 letters, digits and . _ - :.
func ValidNamespace(ns string) bool {
	if len(ns) > maxNamespaceLen {
		return false
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._-:", c) >= 0) {
			return false
		}
	}
	return true
}

// KeyPath is the path and, if there is one, the query of a request, in the form the key is
// made of: the query is sent upstream (Azure-style APIs choose the API version there), so
// it is part of the key, its parameters sorted. See ADR 0044.
func KeyPath(u *url.URL) string {
	if u.RawQuery == "" {
		return u.Path
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return u.Path + "?" + u.RawQuery
	}
	return u.Path + "?" + q.Encode()
}

// keyOf makes a request's key in the namespace it names, or answers why it cannot. A
// namespace whose generation could not be read may have been purged: the request neither
// gets nor makes a stored answer (its controls say no-cache, no-store). See ADR 0047.
func (p *Proxy) keyOf(w http.ResponseWriter, r *http.Request, body []byte) (hashing.Request, controls, bool) {
	ns := r.Header.Get(HeaderNamespace)
	if len(r.Header.Values(HeaderNamespace)) > 1 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_namespace",
			"send only one "+HeaderNamespace+" header")
		return hashing.Request{}, controls{}, false
	}
	if !ValidNamespace(ns) {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_namespace",
			HeaderNamespace+" must be at most 64 letters, digits and . _ - :")
		return hashing.Request{}, controls{}, false
	}
	gen, genErr := p.cfg.Flights.NamespaceGeneration(r.Context(), ns)
	req, err := p.cfg.Hasher.KeyIn(hashing.Namespace{Name: ns, Gen: gen}, r.Method, KeyPath(r.URL), r.Header, body)
	if err != nil {
		msg := "the request body is not valid JSON"
		if errors.Is(err, hashing.ErrInvalidJSON) {
			msg = "the request body is not a valid JSON object: " + strings.TrimPrefix(err.Error(), "hashing: invalid JSON: ")
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", msg)
		return hashing.Request{}, controls{}, false
	}
	cc := cacheControl(r.Header)
	if genErr != nil {
		cc.noCache, cc.noStore = true, true
	}
	var ok bool
	if cc.finish, ok = finishAbandoned(r.Header, p.cfg.FinishAbandoned); !ok {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_abandoned",
			HeaderAbandoned+" must be finish or cancel, sent once")
		return hashing.Request{}, controls{}, false
	}
	return req, cc, true
}
