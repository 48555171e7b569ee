//go:build !nethttpowners

package proxy

import "net/http"

// ownersTransport makes the owners' calls when Config.Transport is nil: h1Transport, with
// t for what it does not handle. The benchmark harness builds the proxy with the tag
// nethttpowners to compare it with t alone (calls_nethttp.go).
func ownersTransport(t *http.Transport) http.RoundTripper { return newH1Transport(t) }
