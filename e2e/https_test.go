package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestHTTPSUpstreamOverHTTP2: an instance reaches an HTTPS upstream, trusted through the
// system's certificate file (SSL_CERT_FILE), over HTTP/2 as it reaches api.openai.com:
// one connection carries many calls, and no connection's goroutines are per call.
func TestHTTPSUpstreamOverHTTP2(t *testing.T) {
	cert := filepath.Join(t.TempDir(), "upstream.pem")
	fp := startProc(t, "fakeupstream", fakeBin, nil, "-listen", "127.0.0.1:0", "-tls-cert", cert)
	addr, _ := fp.waitLine(0, 10*time.Second, "its address", func(l string) bool { return strings.HasPrefix(l, "127.0.0.1:") })
	rs := redistest.Start(t)
	c := &cluster{t: t, env: []string{
		"LLM_DEDUPE_LISTEN=127.0.0.1:0",
		"LLM_DEDUPE_REDIS_ADDRS=" + rs.Addr,
		"LLM_DEDUPE_UPSTREAM_BASE_URL=https://" + addr,
		"LLM_DEDUPE_LOG_FORMAT=json",
		"SSL_CERT_FILE=" + cert,
	}}
	in := c.start()
	const n = 3
	for i := range n {
		a := post(in.URL, chatPath, chatBody("https-upstream", fmt.Sprintf("prompt %d", i)), apiKeyA)
		if a.err != nil || a.status != http.StatusOK || a.role() != "owner" {
			t.Fatalf("request %d: %v; want 200 from an owner", i, a)
		}
	}

	pem, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := hc.Get("https://" + addr + "/_fake/calls")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var calls []fakeupstream.Call
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		t.Fatal(err)
	}
	if len(calls) != n {
		t.Fatalf("the upstream had %d calls; want %d", len(calls), n)
	}
	for _, call := range calls {
		if call.Proto != "HTTP/2.0" {
			t.Fatalf("call %d came over %s; want HTTP/2.0", call.N, call.Proto)
		}
	}
}
