package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// TestAbortedAnswersAreLogged: an answer that ends with the connection cut, not cleanly
// (an owner's too-large answer cut short by the upstream; a passed-through one whose copy
// failed, which the reverse proxy ends with http.ErrAbortHandler), still gets its log line
// and its count, marked interrupted, with why.
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
			if !strings.Contains(line, "role="+tc.role) || !strings.Contains(line, "interrupted=true err=") {
				t.Fatalf("request line %q; want role=%s, interrupted=true, and its error", line, tc.role)
			}
			if n := value(t, in.Reg, "llm_dedupe_requests_total", map[string]string{"role": tc.role}); n != 1 {
				t.Fatalf("%s requests counted: %v; want 1", tc.role, n)
			}
		})
	}
}

// TestClientThatLeftGetsNoFalseAnswer: a client that half-closes its connection after its
// request (as `nc -N` does) is taken for gone, as net/http cancels its request; it still
// reads, so what it reads must not look like a whole answer: not an empty 200, not a
// cleanly ended chunked body. It finds the connection closed, and is counted 499 in the
// role it had.
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

// lineWriter passes each log line it is given to its channel.
type lineWriter chan string

func (c lineWriter) Write(p []byte) (int, error) { c <- string(p); return len(p), nil }

// TestUpgradeIsLoggedWithItsStatus: a passed-through upgrade is logged with its 101, which
// the reverse proxy writes on the hijacked connection, not as a client that left (499).
func TestUpgradeIsLoggedWithItsStatus(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(upgrade))
	defer api.Close()
	lines := make(lineWriter, 16)
	in := newInstance(t, &upstream{URL: api.URL}, setup{base: api.URL, proxy: func(c *proxy.Config) {
		c.Logger = slog.New(slog.NewTextHandler(lines, nil))
	}})
	c, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if status, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(status, " 101 ") {
		t.Fatalf("status line %q (%v); want 101", status, err)
	}
	c.Close()
	for l := range lines {
		if strings.Contains(l, "msg=request") {
			if !strings.Contains(l, "status=101") {
				t.Fatalf("request line %q; want status=101", l)
			}
			return
		}
	}
}
