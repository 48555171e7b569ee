//go:build nethttpowners

package proxy

import "net/http"

// ownersTransport is t itself: the benchmark harness's build that measures h1Transport
// against net/http's Transport (see calls.go).
func ownersTransport(t *http.Transport) http.RoundTripper { return t }
