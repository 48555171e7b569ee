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
