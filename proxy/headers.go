package proxy

import (
	"iter"
	"net/http"
	"strings"
)

// Request and response headers of the proxy.
const (
	HeaderRole   = "X-Dedupe-Role"
	HeaderKey    = "X-Dedupe-Key"
	HeaderBypass = "X-Dedupe-Bypass"
	// HeaderAbandoned is a request's wish for its call once no client waits for it:
	// "finish" (run it to its end and keep its answer) or "cancel" (cut it). Any client of a
	// flight that asks finish makes it finish. See ADR 0074.
	HeaderAbandoned = "X-Dedupe-Abandoned"
)

// listItems yields the items of a header that holds a comma-separated list, over all of
// its lines, each trimmed of spaces (an empty item too).
func listItems(h http.Header, name string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, v := range h.Values(name) {
			for item := range strings.SplitSeq(v, ",") {
				if !yield(strings.TrimSpace(item)) {
					return
				}
			}
		}
	}
}
