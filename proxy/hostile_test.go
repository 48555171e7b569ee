package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// rawRequest writes raw (a request in HTTP/1.1 wire form, possibly incomplete) to the
// server at base and returns the response, waiting at most wait for it. The connection
// stays open until the server answers or closes it: what a stalled client does.
func rawRequest(t *testing.T, base, raw string, wait time.Duration) (*http.Response, string, error) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(wait))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b), nil
}

// TestStalledBodyIsCutOff: a client that sends the headers and part of a body, then
// stops, is answered 408 once proxy.Config.BodyReadTimeout passes without a read, on a
// deduplicated route and on a passed-through one; it does not hold the connection: the
// server closes it after the answer (it used to wait, with no deadline, for the rest of a
// body whose Content-Length said more was coming).
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

// TestOverLimitContentLengthAnsweredAtOnce: a declared Content-Length over max_body_bytes
// is answered 413 before any of the body is sent.
func TestOverLimitContentLengthAnsweredAtOnce(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.MaxBodyBytes = 1000 }})
	res, body, err := rawRequest(t, in.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"+
		"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n", 5*time.Second)
	if err != nil {
		t.Fatalf("no answer within 5s to a declared 50 MB body, none of it sent: %v", err)
	}
	if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"code":"request_too_large"`) {
		t.Errorf("got %d %s; want 413 with code request_too_large", res.StatusCode, body)
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

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDedupeFailureCauseLogged: the client of a failed call on a deduplicated route gets a
// 502 that does not say why (the cause may name internal addresses); the log must, without
// the secrets of the base URL.
func TestDedupeFailureCauseLogged(t *testing.T) {
	var logs syncBuffer
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: "http://127.0.0.1:1/openai?api-key=k3y-secret", flight: singleflight.Options{MaxAttempts: 1},
		proxy: func(c *proxy.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }})
	if a := post(t, in.URL, "/v1/chat/completions", chatBody); a.status != http.StatusBadGateway {
		t.Fatalf("got %d; want 502", a.status)
	}
	if l := logs.String(); !strings.Contains(l, "upstream call failed") || !strings.Contains(l, "connection refused") {
		t.Errorf("log %q; want a line \"upstream call failed\" with the cause (connection refused)", l)
	}
	if l := logs.String(); strings.Contains(l, "k3y-secret") {
		t.Errorf("log %q shows the api-key of the base URL", l)
	}
}

// TestClientThatStopsReadingIsCutOff: a client that stops reading its answer (a stream
// here; a large unary answer, or a passed-through download, alike) holds its connection,
// a goroutine and the answer's buffers for as long as it likes, unless a write that makes
// no progress for proxy.Config.SendTimeout ends the answer, as nginx's send_timeout does.
func TestClientThatStopsReadingIsCutOff(t *testing.T) {
	const size = 64 << 20
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		event := []byte("data: " + strings.Repeat("x", 64<<10) + "\n\n")
		for n := 0; n < size; n += len(event) {
			if _, err := w.Write(event); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
	}))
	t.Cleanup(gw.Close)
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: gw.URL, proxy: func(c *proxy.Config) { c.SendTimeout = 300 * time.Millisecond }})
	conn, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"never read"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-test-1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Read nothing until the proxy has ended the request.
	redistest.WaitUntil(t, 20*time.Second, "the proxy ends the answer nobody reads", func() (bool, string) {
		n := value(t, in.Reg, "llm_dedupe_requests_total", nil)
		return n >= 1, fmt.Sprintf("%v requests ended", n)
	})
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.Copy(io.Discard, conn)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) || got >= size {
		t.Fatalf("read %d bytes, then %v; want the connection closed before the %d-byte answer's end", got, err, size)
	}
}

// TestTruncatedBodyIsABadRequest: a body cut short of its Content-Length, by a client that
// then half-closes (it still reads), is answered 400, as nginx does (and counts it); a
// version that took it for a client gone answered nothing, and net/http then sent 200.
func TestTruncatedBodyIsABadRequest(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	conn.(*net.TCPConn).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"code":"body_unreadable"`) || up.Calls() != 0 {
		t.Fatalf("a body cut short of its Content-Length was answered %d %q (%d upstream calls); want 400 body_unreadable", res.StatusCode, b, up.Calls())
	}
}

// TestTwoNamespacesAreRefused: a request naming two namespaces is refused, not keyed in
// the first one it names.
func TestTwoNamespacesAreRefused(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	res, body, err := rawRequest(t, in.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Dedupe-Namespace: a\r\nX-Dedupe-Namespace: b\r\n"+
		"Content-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"model\":\"m\"}", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_namespace"`) || !strings.Contains(body, "only one") || up.Calls() != 0 {
		t.Fatalf("got %d %s, %d upstream calls; want 400 invalid_namespace saying only one is allowed, and no call", res.StatusCode, body, up.Calls())
	}
}

// TestAsteriskTargetRefused: a request target that is no path ("*", which only OPTIONS may
// use, and net/http answers itself) is refused as a bad path, in JSON; the router answered
// a plain-text 404.
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

// TestIdentityContentEncodingIsDeduplicated: Content-Encoding: identity says the body is
// not encoded, so the key can see into it; only a real encoding is passed straight on.
func TestIdentityContentEncodingIsDeduplicated(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{flight: singleflight.Options{ResultTTL: time.Minute}})
	var got []string
	for range 2 {
		a := post(t, in.URL, "/v1/chat/completions", chatBody, "Content-Encoding", "identity")
		if a.status != http.StatusOK {
			t.Fatalf("got %d %s", a.status, a.body)
		}
		got = append(got, a.header.Get("X-Dedupe-Role"))
	}
	if got[0] != "owner" || got[1] != "hit" || up.Calls() != 1 {
		t.Fatalf("roles %v, %d upstream calls; want owner then hit, one call", got, up.Calls())
	}
	// Any encoding named, in any of the header's lines or list items, is one.
	for _, ce := range [][]string{{"identity", "gzip"}, {"identity, gzip"}} {
		h := "Content-Encoding: " + strings.Join(ce, "\r\nContent-Encoding: ") + "\r\n"
		res, _, err := rawRequest(t, in.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-test-1\r\n"+h+
			fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if r := res.Header.Get("X-Dedupe-Role"); r != "bypass" {
			t.Fatalf("Content-Encoding %q: role %q; want bypass", ce, r)
		}
	}
}

// TestAbortedAnswersAreLogged: an answer that ends with the connection cut, not cleanly
// (an owner's too-large answer cut short by the upstream; a passed-through one whose copy
// failed, which the reverse proxy ends with http.ErrAbortHandler), still gets its log line
// and its count, marked interrupted.
func TestAbortedAnswersAreLogged(t *testing.T) {
	const limit = 64 << 10
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"big","choices":[{"message":{"content":"`+strings.Repeat("x", 3*limit))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(cut.Close)
	for _, tc := range []struct {
		name, role string
		hdr        []string
	}{
		{"owner, too large to share", "owner", nil},
		{"bypassed", "bypass", []string{"X-Dedupe-Bypass", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncBuffer{}
			in := newInstance(t, startUpstream(t), setup{base: cut.URL, proxy: func(c *proxy.Config) {
				c.MaxResponseBytes = limit
				c.Logger = slog.New(slog.NewTextHandler(logs, nil))
			}})
			if a := post(t, in.URL, "/v1/chat/completions", chatBody, tc.hdr...); a.err == nil {
				t.Fatalf("the client read a whole answer (%d, %d bytes); want it cut off", a.status, len(a.body))
			}
			var line string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "msg=request") {
					line = l
				}
			}
			if !strings.Contains(line, "role="+tc.role) || !strings.Contains(line, "interrupted=true") {
				t.Fatalf("request line %q; want role=%s, interrupted=true", line, tc.role)
			}
			if n := value(t, in.Reg, "llm_dedupe_requests_total", map[string]string{"role": tc.role}); n != 1 {
				t.Fatalf("%s requests counted: %v; want 1", tc.role, n)
			}
		})
	}
}

// TestExtensionMethodsPassThrough: every method but a deduplicated POST is passed through,
// an extension method (WebDAV's PROPFIND, any other token) too; chi answered them 405 with
// no body, before looking at routes.
func TestExtensionMethodsPassThrough(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Method+" "+r.URL.Path)
	}))
	t.Cleanup(gw.Close)
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: gw.URL})
	for _, tc := range []struct{ method, path string }{{"PROPFIND", "/v1/models"}, {"FOO", "/v1/files"}, {"FOO", "/v1/chat/completions"}} {
		res, body, err := rawRequest(t, in.URL, tc.method+" "+tc.path+" HTTP/1.1\r\nHost: proxy\r\n\r\n", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.method + " " + tc.path; res.StatusCode != 200 || body != want {
			t.Errorf("%s %s: got %d %q; want 200 %q from the upstream", tc.method, tc.path, res.StatusCode, body, want)
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

// TestClientThatLeftGetsNoFalseAnswer: a client that half-closes its connection after its
// request (as `nc -N` does) is taken for gone, as net/http cancels its request; it still
// reads, so what it reads must not look like a whole answer. A follower that left before
// its answer used to get net/http's default, an empty 200; one that left mid-stream, a
// cleanly ended chunked body. Both now find the connection closed, and are counted 499
// in the role they had.
func TestClientThatLeftGetsNoFalseAnswer(t *testing.T) {
	// send writes body as a request on a new connection, whose reader is returned.
	send := func(t *testing.T, base, body string) (*bufio.Reader, *net.TCPConn) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-test-1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		return bufio.NewReader(conn), conn.(*net.TCPConn)
	}
	t.Run("before its answer", func(t *testing.T) {
		up := startUpstream(t)
		up.Set(fakeHold())
		in := newInstance(t, up, setup{})
		started := up.Started()
		owner := make(chan answer, 1)
		go func() { owner <- post(t, in.URL, "/v1/chat/completions", chatBody) }()
		<-started
		br, conn := send(t, in.URL, chatBody)
		conn.CloseWrite()
		got, err := io.ReadAll(br)
		if err != nil || len(got) > 0 {
			t.Fatalf("a follower that left read %q (%v); want the connection closed with nothing sent", got, err)
		}
		up.Release()
		if a := <-owner; a.status != http.StatusOK || a.body == "" {
			t.Fatalf("the owner's client got %d %q", a.status, a.body)
		}
		if n := value(t, in.Reg, "llm_dedupe_requests_total", map[string]string{"role": "follower", "code": "499"}); n != 1 {
			t.Fatalf("follower requests counted 499: %v; want 1", n)
		}
	})
	t.Run("an owner, before its unary answer", func(t *testing.T) {
		up := startUpstream(t)
		up.Set(fakeHold())
		in := newInstance(t, up, setup{flight: singleflight.Options{ResultTTL: time.Minute}})
		// A server of the test's own passes each request's context on, so that the call
		// is released only once the server has taken the client for gone.
		ctxs := make(chan context.Context, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctxs <- r.Context()
			in.Proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		started := up.Started()
		br, conn := send(t, srv.URL, chatBody)
		ctx := <-ctxs
		<-started
		conn.CloseWrite()
		<-ctx.Done()
		up.Release()
		got, err := io.ReadAll(br)
		if err != nil || len(got) > 0 {
			t.Fatalf("an owner that left read %q (%v); want the connection closed with nothing sent", got, err)
		}
		if n := value(t, in.Reg, "llm_dedupe_requests_total", map[string]string{"role": "owner", "code": "499"}); n != 1 {
			t.Fatalf("owner requests counted 499: %v; want 1", n)
		}
		// Its call still made the answer, for the next identical request.
		if a := post(t, in.URL, "/v1/chat/completions", chatBody); a.header.Get("X-Dedupe-Role") != "hit" || up.Calls() != 1 {
			t.Fatalf("the next request was %q after %d calls; want a hit of the one call", a.header.Get("X-Dedupe-Role"), up.Calls())
		}
	})
	t.Run("bypassed, while its call runs", func(t *testing.T) {
		up := startUpstream(t)
		up.Set(fakeHold())
		in := newInstance(t, up, setup{})
		started := up.Started()
		conn, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Dedupe-Bypass: 1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		<-started
		conn.(*net.TCPConn).CloseWrite()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(conn)
		up.Release()
		if err != nil || len(got) > 0 {
			t.Fatalf("a bypassing client that left read %q (%v); want the connection closed with nothing sent, not an error that blames the upstream", got, err)
		}
		if n := value(t, in.Reg, "llm_dedupe_requests_total", map[string]string{"role": "bypass", "code": "499"}); n != 1 {
			t.Fatalf("bypass requests counted 499: %v; want 1", n)
		}
	})
	t.Run("mid-stream", func(t *testing.T) {
		up := startUpstream(t)
		up.Set(fakeBehavior{Hold: true}) // the last event is held
		in := newInstance(t, up, setup{})
		started := up.Started()
		owner := openStream(t, in.URL, streamBody)
		<-started
		br, conn := send(t, in.URL, streamBody)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body := bufio.NewReader(res.Body)
		for {
			l, err := body.ReadString('\n')
			if err != nil {
				t.Fatalf("stream ended before its first event: %v", err)
			}
			if strings.Contains(l, "tok0") {
				break
			}
		}
		conn.CloseWrite()
		if rest, err := io.ReadAll(body); err == nil {
			t.Fatalf("a follower that left mid-stream read the rest as a whole answer %q; want it cut off", rest)
		}
		up.Release()
		if got := owner.rest(); !strings.Contains(got, "[DONE]") {
			t.Fatalf("the owner's stream %q", got)
		}
	})
}

// TestPassedThroughBodyGoesOnAfterTheAnswerBegins: the reverse proxy's transport writes
// the request body upstream while the answer comes back. net/http's server, by default,
// consumes what is left of a request body and closes it as the answer's head is written;
// the transport, reading the body after that, then failed and closed the upstream
// connection, cutting the stream it carried. Under load it happened to ordinary
// requests too, between the transport's last body write and its check for the body's end
// (TestStreamEndingAfterAQuietSpellEndsCleanly, one run in ten to twenty-five). Here the
// upstream answers before it reads the body, and the client sends the body's second half
// only once the answer has begun: the upstream must still get the whole body, and the
// client the whole stream.
func TestPassedThroughBodyGoesOnAfterTheAnswerBegins(t *testing.T) {
	gotBody := make(chan string, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).EnableFullDuplex()
		http.NewResponseController(w).Flush()
		b, _ := io.ReadAll(r.Body)
		gotBody <- string(b)
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(gw.Close)
	in := newInstance(t, startUpstream(t), setup{base: gw.URL})
	conn, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := `{"first half":"` + strings.Repeat("a", 100) + `","second half":"` + strings.Repeat("b", 100) + `"}`
	half := len(body) / 2
	fmt.Fprintf(conn, "POST /v1/threads/runs HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:half])
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewReader(res.Body)
	if l, err := sc.ReadString('\n'); err != nil || l != "data: first\n" {
		t.Fatalf("first line %q (%v)", l, err)
	}
	io.WriteString(conn, body[half:])
	rest, err := io.ReadAll(sc)
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the rest of the stream %q, then %v; want it whole", rest, err)
	}
	if b := <-gotBody; b != body {
		t.Fatalf("the upstream got a body of %d bytes; want the client's %d", len(b), len(body))
	}
}
