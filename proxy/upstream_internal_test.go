package proxy

import (
	"net/http"
	"testing"
)

func TestOwnersDoNotForwardExpect(t *testing.T) {
	h := (&Proxy{}).forwardHeader(http.Header{"Expect": {"100-continue"}, "X-Kept": {"1"}})
	if h.Get("Expect") != "" || h.Get("X-Kept") != "1" {
		t.Fatalf("forwarded %v; want X-Kept without Expect", h)
	}
}
