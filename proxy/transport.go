package proxy

import (
	"net"
	"net/http"
	"time"
)

// NewTransport returns the transport for upstream calls: the defaults of
// http.DefaultTransport, with room for many concurrent calls to one host kept alive. It sets
// no ResponseHeaderTimeout: a model may think for minutes before its first byte, and the
// caller bounds each call with a context deadline instead.
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = 10 * time.Second
	t.ExpectContinueTimeout = time.Second
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = 90 * time.Second
	t.ForceAttemptHTTP2 = true
	return t
}
