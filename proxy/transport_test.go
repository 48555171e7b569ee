package proxy_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// countingTransport is a Transport given to the proxy: it counts the calls it makes and
// whether its idle connections were closed.
type countingTransport struct {
	*http.Transport
	calls, closedIdle atomic.Int32
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.calls.Add(1)
	return c.Transport.RoundTrip(r)
}

func (c *countingTransport) CloseIdleConnections() {
	c.closedIdle.Add(1)
	c.Transport.CloseIdleConnections()
}

// TestGivenTransportMakesEveryCall: a Transport given in Config makes the owners' calls
// and the passed-through ones, and is closed at shutdown.
func TestGivenTransportMakesEveryCall(t *testing.T) {
	up := startUpstream(t)
	tr := &countingTransport{Transport: proxy.NewTransport()}
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.Transport = tr }})
	if a := post(t, in.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"given"}]}`); a.status != 200 {
		t.Fatalf("an owned call: status %d; want 200", a.status)
	}
	if a := post(t, in.URL, "/v1/models", ""); a.status != 200 {
		t.Fatalf("a passed-through request: status %d; want 200", a.status)
	}
	if n := tr.calls.Load(); n != 2 {
		t.Fatalf("the given transport made %d calls; want 2 (the owner's and the passed-through one)", n)
	}
	in.Proxy.CloseIdleConnections()
	if n := tr.closedIdle.Load(); n != 1 {
		t.Fatalf("CloseIdleConnections reached the given transport %d times; want 1", n)
	}
}

// TestGivenTransportsSettingsHold: an *http.Transport given keeps its settings for the
// owners' calls; here DisableKeepAlives.
func TestGivenTransportsSettingsHold(t *testing.T) {
	up := startUpstream(t)
	var dials atomic.Int32
	tr := proxy.NewTransport()
	tr.DisableKeepAlives = true
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.Transport = tr }})
	for i := range 3 {
		if a := post(t, in.URL, "/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"kept-alive %d"}]}`, i)); a.status != 200 {
			t.Fatalf("owned call %d: status %d; want 200", i, a.status)
		}
	}
	if n := dials.Load(); n != 3 {
		t.Fatalf("%d connections for three calls with keep-alives off; want 3", n)
	}
}
