package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// TestStalledBodyIsCutOff: a client that sends the headers and part of a body, then
// stops, is answered 408 once proxy.Config.BodyReadTimeout passes without a read, on a
// deduplicated route and on a passed-through one; it does not hold the connection: the
// server closes it after the answer, not waiting for the rest of the body.
func TestStalledBodyIsCutOff(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.BodyReadTimeout = 200 * time.Millisecond }})
	for _, path := range []string{"/v1/chat/completions", "/v1/files"} {
		t.Run(path, func(t *testing.T) {
			start := time.Now()
			conn, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nHost: proxy\r\n"+
				"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(conn)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer within 5s of a stalled body (BodyReadTimeout 200ms): %v", err)
			}
			b, _ := io.ReadAll(res.Body)
			body := string(b)
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("after the 408, reading the connection gave %v; want EOF: the server closes it", err)
			}
			if res.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, `"code":"request_body_timeout"`) {
				t.Errorf("got %d %s; want 408 with code request_body_timeout", res.StatusCode, body)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("answered after %v; want about the body read timeout", d)
			}
			// A passed-through body streams to the upstream as it comes; a deduplicated
			// one is read whole first, so a body that never came is never sent.
			if path == "/v1/chat/completions" && up.Calls() != 0 {
				t.Errorf("%d upstream calls; want 0", up.Calls())
			}
		})
	}
}

// TestDotSegmentsNeverLeaveThePrefix: a path with dot segments, plain or percent-encoded,
// must never reach the upstream outside the base URL's path prefix (with the proxy's own
// API key it would reach other APIs of the gateway). Such paths are refused.
func TestDotSegmentsNeverLeaveThePrefix(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RawPath+" "+r.URL.Path)
		mu.Unlock()
		io.WriteString(w, "{}")
	}))
	t.Cleanup(gw.Close)
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: gw.URL + "/openai", proxy: func(c *proxy.Config) { c.APIKey = "sk-proxy" }})
	paths := []string{
		"/v1/../../admin/keys",
		"/v1/%2e%2e/%2e%2e/admin/keys",
		"/v1/%2E%2E%2F%2E%2E%2Fadmin/keys",
		"/v1/..%2f..%2fadmin/keys",
		"/v1/..\\..\\admin/keys",
		"/v1/chat/completions/../../../admin/keys",
		"/v1/./../admin",
		"/..",
		"http:../../admin/keys", // absolute form with an opaque part: no path at all
		"http:v1/models",
	}
	for _, p := range paths {
		for _, method := range []string{"GET", "POST"} {
			res, body, err := rawRequest(t, in.URL, method+" "+p+" HTTP/1.1\r\nHost: proxy\r\nContent-Length: 2\r\n\r\n{}", 5*time.Second)
			if err != nil {
				t.Fatalf("%s %s: %v", method, p, err)
			}
			if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_path"`) {
				t.Errorf("%s %s: got %d %s; want 400 with code invalid_path", method, p, res.StatusCode, body)
			}
		}
	}
	mu.Lock()
	if len(seen) != 0 {
		t.Errorf("the upstream saw %q; want no request: every path above leaves /openai/", seen)
	}
	mu.Unlock()
	// An ordinary path still goes through, under the prefix.
	if a := post(t, in.URL, "/v1/files", "{}"); a.status != 200 {
		t.Errorf("POST /v1/files: got %d; want 200", a.status)
	}
}

// TestConnectRefused: the proxy is a reverse proxy of one API, never a forward proxy or a
// tunnel: CONNECT is refused with 405; so are TRACE and TRACK, which an upstream that
// echoes them would answer with the request as sent, the proxy's own API key in it.
func TestConnectRefused(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.APIKey = "sk-proxy" }})
	for _, line := range []string{"CONNECT example.com:443", "TRACE /v1/models", "TRACK /v1/models"} {
		res, body, err := rawRequest(t, in.URL, line+" HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(body, `"code":"method_not_allowed"`) {
			t.Errorf("%s: got %d %s; want 405 with code method_not_allowed", line, res.StatusCode, body)
		}
	}
	if up.Calls() != 0 {
		t.Errorf("%d upstream calls; want none", up.Calls())
	}
}

// TestBodyTimeoutEndsWithTheBody: the body read timeout applies to the body only: an
// answer that takes longer than it, after the whole body came, is not cut off.
func TestBodyTimeoutEndsWithTheBody(t *testing.T) {
	up := startUpstream(t)
	up.Set(fakeBehavior{Delay: 500 * time.Millisecond})
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.BodyReadTimeout = 100 * time.Millisecond }})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions?passthrough=1"} {
		hdr := []string{}
		if strings.Contains(path, "passthrough") {
			hdr = []string{"X-Dedupe-Bypass", "1"}
		}
		if a := post(t, in.URL, path, chatBody, hdr...); a.err != nil || a.status != 200 {
			t.Errorf("POST %s answered after 500ms: got %d, %v; want 200", path, a.status, a.err)
		}
	}
}

// TestAsteriskTargetRefused: a request target that is no path ("*", which only OPTIONS may
// use, and net/http answers itself) is refused as a bad path, in JSON.
func TestAsteriskTargetRefused(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	for _, method := range []string{"POST", "GET"} {
		res, body, err := rawRequest(t, in.URL, method+" * HTTP/1.1\r\nHost: proxy\r\nContent-Length: 2\r\n\r\n{}", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_path"`) || up.Calls() != 0 {
			t.Fatalf("%s *: got %d %s, %d upstream calls; want 400 invalid_path and none", method, res.StatusCode, body, up.Calls())
		}
	}
}

// TestH2CPrefaceRefused: net/http hands the HTTP/2 preface ("PRI * HTTP/2.0") to the handler
// of a server without h2c; it is refused, not passed through as an extension method.
func TestH2CPrefaceRefused(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream "+r.Method)
	}))
	t.Cleanup(gw.Close)
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: gw.URL})
	res, body, err := rawRequest(t, in.URL, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusHTTPVersionNotSupported || !strings.Contains(body, `"code":"h2c_not_supported"`) {
		t.Fatalf("got %d %q; want 505 with code h2c_not_supported", res.StatusCode, body)
	}
}
