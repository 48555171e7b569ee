package proxy

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// h1Server is a loopback upstream that counts its connections as they open and close.
type h1Server struct {
	*httptest.Server
	opened atomic.Int32
	closed chan struct{} // one per closed connection
}

func startH1Server(t *testing.T, h http.HandlerFunc) *h1Server {
	t.Helper()
	s := &h1Server{Server: httptest.NewUnstartedServer(h), closed: make(chan struct{}, 1000)}
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed:
			s.closed <- struct{}{}
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// waitClosed waits until the server saw one more connection close.
func (s *h1Server) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-s.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream saw no connection close in 5s")
	}
}

func newTestH1(t *testing.T) *h1Transport {
	h := newH1Transport(NewTransport())
	t.Cleanup(h.CloseIdleConnections)
	return h
}

func h1Post(ctx context.Context, t *testing.T, rt http.RoundTripper, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return string(b)
}

func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if r.URL.Query().Has("chunked") {
		w.Write(b[:1])
		w.(http.Flusher).Flush()
		w.Write(b[1:])
		return
	}
	w.Write(b)
}

func TestH1KeepsTheConnectionForTheNextCall(t *testing.T) {
	s := startH1Server(t, echo)
	h := newTestH1(t)
	for i, path := range []string{"/", "/?chunked", "/", "/?chunked"} {
		want := strings.Repeat("x", i+2)
		if got := readAll(t, h1Post(t.Context(), t, h, s.URL+path, want)); got != want {
			t.Fatalf("call %d: got %q; want %q", i, got, want)
		}
	}
	if n := s.opened.Load(); n != 1 {
		t.Fatalf("the upstream saw %d connections for four calls one after another; want 1", n)
	}
}

func TestH1AnswersAsTheUpstreamSends(t *testing.T) {
	more := make(chan struct{})
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first"))
		w.(http.Flusher).Flush()
		<-more
		w.Write([]byte(" second"))
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp := h1Post(ctx, t, newTestH1(t), s.URL, "")
	b := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, b); err != nil || string(b) != "first" {
		t.Fatalf("first read: %q, %v; want %q before the rest is sent", b, err, "first")
	}
	close(more)
	if got := readAll(t, resp); got != " second" {
		t.Fatalf("rest: got %q; want %q", got, " second")
	}
}

func TestH1DoesNotUseAConnectionTheUpstreamClosed(t *testing.T) {
	s := startH1Server(t, echo)
	h := newTestH1(t)
	readAll(t, h1Post(t.Context(), t, h, s.URL, "a"))
	s.CloseClientConnections() // the kept connection, as an upstream's keep-alive timeout would
	s.waitClosed(t)
	if got := readAll(t, h1Post(t.Context(), t, h, s.URL, "b")); got != "b" {
		t.Fatalf("got %q; want %q", got, "b")
	}
	if n := s.opened.Load(); n != 2 {
		t.Fatalf("the upstream saw %d connections; want 2", n)
	}
}

func TestH1CancelEndsTheCall(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	defer close(release)
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		io.ReadAll(r.Body) // so that the server watches for the client's close
		if r.URL.Query().Has("head") {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	h := newTestH1(t)
	cause := errors.New("test: call given up")

	t.Run("waiting for the head", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("x"))
		done := make(chan error, 1)
		go func() { _, err := h.RoundTrip(req); done <- err }()
		<-arrived
		cancel(cause)
		select {
		case err := <-done:
			if !errors.Is(err, cause) {
				t.Fatalf("got %v; want the cause %v", err, cause)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("RoundTrip still blocked 5s after its context ended")
		}
		s.waitClosed(t)
	})
	t.Run("reading the body", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		resp := h1Post(ctx, t, h, s.URL+"?head", "x")
		<-arrived
		done := make(chan error, 1)
		go func() { _, err := resp.Body.Read(make([]byte, 10)); done <- err }()
		cancel(cause)
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("read returned no error after the call was cancelled")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("read still blocked 5s after its context ended")
		}
		resp.Body.Close()
		s.waitClosed(t)
	})
}

func TestH1ClosesAConnectionLeftMidAnswer(t *testing.T) {
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("long") {
			w.Write([]byte("part"))
			w.(http.Flusher).Flush()
			<-r.Context().Done() // until the client goes
			return
		}
		echo(w, r)
	})
	h := newTestH1(t)
	resp := h1Post(t.Context(), t, h, s.URL+"?long", "")
	if _, err := resp.Body.Read(make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s.waitClosed(t)
	if got := readAll(t, h1Post(t.Context(), t, h, s.URL, "next")); got != "next" {
		t.Fatalf("got %q; want %q", got, "next")
	}
	if n := s.opened.Load(); n != 2 {
		t.Fatalf("the upstream saw %d connections; want 2 (the one left mid-answer is not kept)", n)
	}
}

// serveConns accepts ln's connections until the test ends, each handled on a goroutine of
// its own and closed after.
func serveConns(t *testing.T, ln net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { ln.Close() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
}

// rawUpstream answers each connection's first request with reply, then closes it if
// closeAfter; it counts the connections it accepted.
func rawUpstream(t *testing.T, reply string, closeAfter bool) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	serveConns(t, ln, func(c net.Conn) {
		accepted.Add(1)
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, reply)
		if !closeAfter {
			c.Read(make([]byte, 1)) // until the client closes
		}
	})
	return "http://" + ln.Addr().String(), &accepted
}

func TestH1SkipsInformationalAnswers(t *testing.T) {
	u, _ := rawUpstream(t, "HTTP/1.1 100 Continue\r\n\r\n"+
		"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"+
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false)
	resp := h1Post(t.Context(), t, newTestH1(t), u, "x")
	if got := readAll(t, resp); resp.StatusCode != 200 || got != "ok" {
		t.Fatalf("got %d %q; want 200 %q", resp.StatusCode, got, "ok")
	}
}

func TestH1DoesNotKeepAConnectionWhoseAnswerEndedIt(t *testing.T) {
	for name, reply := range map[string]string{
		"body until close":  "HTTP/1.1 200 OK\r\n\r\nhello",
		"connection: close": "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.0":          "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
	} {
		t.Run(name, func(t *testing.T) {
			// The upstream leaves a connection open after its answer unless the answer
			// has no length; the client must close it.
			u, accepted := rawUpstream(t, reply, name == "body until close")
			h := newTestH1(t)
			for range 2 {
				if got := readAll(t, h1Post(t.Context(), t, h, u, "x")); got != "hello" {
					t.Fatalf("got %q; want %q", got, "hello")
				}
				if n := h.kept(); n != 0 {
					t.Fatalf("%d connections kept after an answer that ended its connection", n)
				}
			}
			if n := accepted.Load(); n != 2 {
				t.Fatalf("the upstream accepted %d connections for two calls; want 2", n)
			}
		})
	}
}

func TestH1RefusesAnUnaskedSwitch(t *testing.T) {
	u, _ := rawUpstream(t, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, u, strings.NewReader("x"))
	if resp, err := newTestH1(t).RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatalf("got %d; want an error", resp.StatusCode)
	}
}

func TestH1ExpiresIdleConnections(t *testing.T) {
	s := startH1Server(t, echo)
	h := newTestH1(t)
	h.idleTimeout = 10 * time.Millisecond
	readAll(t, h1Post(t.Context(), t, h, s.URL, "x"))
	s.waitClosed(t)
	if n := h.kept(); n != 0 {
		t.Fatalf("%d connections still kept after their idle timeout", n)
	}
}

func TestH1KeepsAtMostMaxIdlePerHost(t *testing.T) {
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		echo(w, r)
	})
	h := newTestH1(t)
	h.maxIdle = 1
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { readAll(t, h1Post(t.Context(), t, h, s.URL, "x")) })
	}
	<-arrived
	<-arrived
	close(release)
	wg.Wait()
	s.waitClosed(t)
	if n := h.kept(); n != 1 {
		t.Fatalf("%d connections kept; want 1", n)
	}
}

func TestH1LeavesHTTPSAndProxiedCallsToTheFallback(t *testing.T) {
	tr := NewTransport()
	tr.Proxy = func(r *http.Request) (*url.URL, error) {
		if r.URL.Hostname() == "proxied.example" {
			return url.Parse("http://127.0.0.1:1")
		}
		return nil, nil
	}
	h := newH1Transport(tr)
	for u, want := range map[string]bool{
		"http://127.0.0.1:8080/v1/chat/completions":  true,
		"https://api.openai.com/v1/chat/completions": false,
		"http://proxied.example/v1/chat/completions": false,
	} {
		if got := h.handles(&http.Request{URL: mustURL(t, u)}); got != want {
			t.Errorf("handles(%s) = %v; want %v", u, got, want)
		}
	}
}

// TestH1HoldsNoGoroutinePerConnection counts the goroutines of calls in flight, one
// connection each, with net/http's transport and with h1Transport.
func TestH1HoldsNoGoroutinePerConnection(t *testing.T) {
	const calls = 50
	count := func(rt http.RoundTripper) int {
		arrived, release := make(chan struct{}, calls), make(chan struct{})
		s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			<-release
		})
		before := runtime.NumGoroutine()
		var wg sync.WaitGroup
		for range calls {
			wg.Go(func() { readAll(t, h1Post(t.Context(), t, rt, s.URL, "x")) })
		}
		for range calls {
			<-arrived
		}
		n := runtime.NumGoroutine() - before
		close(release)
		wg.Wait()
		return n
	}
	// The connections stay open until the test ends, so that no goroutine of the first
	// count ends during the second; the counts are of goroutines each count started.
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	withH1, withNetHTTP := count(newTestH1(t)), count(tr)
	if d := withNetHTTP - withH1; d < 3*calls/2 {
		t.Fatalf("%d goroutines with net/http's transport, %d with h1Transport, for %d calls: want about %d fewer (two per connection), at least %d", withNetHTTP, withH1, calls, 2*calls, 3*calls/2)
	}
}

// kept counts the connections h keeps for the next call.
func (t *h1Transport) kept() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, conns := range t.idle {
		n += len(conns)
	}
	return n
}

func TestH1DecompressesTheGzipItAskedFor(t *testing.T) {
	const answer = `{"choices":[{"message":{"content":"hi"}}]}`
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") != "gzip" {
			w.Write([]byte(answer))
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write([]byte(answer))
		zw.Close()
	})
	h := newTestH1(t)
	for range 2 {
		resp := h1Post(t.Context(), t, h, s.URL, "x")
		if got := readAll(t, resp); got != answer || resp.Header.Get("Content-Encoding") != "" || !resp.Uncompressed {
			t.Fatalf("got %q, Content-Encoding %q, Uncompressed %v; want %q decompressed", got, resp.Header.Get("Content-Encoding"), resp.Uncompressed, answer)
		}
	}
	if n := s.opened.Load(); n != 1 {
		t.Fatalf("the upstream saw %d connections for two gzip answers; want 1", n)
	}
}

// TestH1WritesALargeRequestWhileReading: a request larger than maxInline is written by a
// goroutine of its own, so that an answer before the upstream read it all is not waited
// for; when the whole request went out, its connection is kept.
func TestH1WritesALargeRequestWhileReading(t *testing.T) {
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("refuse") {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge) // without reading the body
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n) // a short answer, read before the writer may have said it is done
	})
	h := newTestH1(t)
	body := strings.Repeat("x", 1<<20)
	for i := range 30 {
		if got := readAll(t, h1Post(t.Context(), t, h, s.URL, body)); got != fmt.Sprint(len(body)) {
			t.Fatalf("call %d: the upstream read %s bytes; want the %d sent", i, got, len(body))
		}
	}
	if n := s.opened.Load(); n != 1 {
		t.Fatalf("the upstream saw %d connections for 30 large calls one after another; want 1", n)
	}
	resp := h1Post(t.Context(), t, h, s.URL+"?refuse", body)
	readAll(t, resp)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %d; want the upstream's 413", resp.StatusCode)
	}
	s.waitClosed(t) // the refused request's: not all of it went out
	if n := h.kept(); n != 0 {
		t.Fatalf("%d connections kept; want none: the refused request was not all sent", n)
	}
}

// tinyBuffers returns a loopback listener and an h1Transport whose sockets have small
// buffers, so that a write waits for the upstream to read, as across a network.
func tinyBuffers(t *testing.T) (net.Listener, *h1Transport) {
	t.Helper()
	small := func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return err
	}
	ln, err := (&net.ListenConfig{Control: small}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := NewTransport()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			err = c.(*net.TCPConn).SetWriteBuffer(4096)
		}
		return c, err
	}
	h := newH1Transport(tr)
	t.Cleanup(h.CloseIdleConnections)
	return ln, h
}

const refusal = "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 9\r\n\r\ntoo large"

// postRefused posts n bytes to ln and checks that the upstream's 413 comes back.
func postRefused(t *testing.T, h *h1Transport, ln net.Listener, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ln.Addr().String(), strings.NewReader(strings.Repeat("x", n)))
	resp, err := h.RoundTrip(req)
	if err != nil {
		t.Fatalf("%d bytes: %v; want the upstream's 413", n, err)
	}
	if got := readAll(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge || got != "too large" {
		t.Fatalf("%d bytes: %d %q; want 413 %q", n, resp.StatusCode, got, "too large")
	}
}

// TestH1ReadsAnAnswerSentBeforeTheBodyWasRead: an upstream reads a request's head, answers
// 413 and closes, with the body unread: its system resets the connection, and the rest of
// the write fails. The answer, received before the reset, is handed on.
func TestH1ReadsAnAnswerSentBeforeTheBodyWasRead(t *testing.T) {
	ln, h := tinyBuffers(t)
	serveConns(t, ln, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.WriteString(c, refusal)
		}
	})
	// 40 KiB: inline, yet more than the buffers take; 1 MiB: written by its own goroutine.
	for _, n := range []int{40 << 10, 1 << 20} {
		for range 20 {
			postRefused(t, h, ln, n)
		}
	}
	if n := h.kept(); n != 0 {
		t.Fatalf("%d connections kept after answers whose upstream closed them", n)
	}
}

// TestH1ReadsAnAnswerWhileTheUpstreamWaits: an upstream answers 413 after the head and
// neither reads the rest nor closes. A large request's write waits, so the answer is read
// meanwhile.
func TestH1ReadsAnAnswerWhileTheUpstreamWaits(t *testing.T) {
	ln, h := tinyBuffers(t)
	serveConns(t, ln, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.WriteString(c, refusal)
		}
		<-t.Context().Done()
	})
	postRefused(t, h, ln, 1<<20)
	if n := h.kept(); n != 0 {
		t.Fatalf("%d connections kept; want none: the request was not all sent", n)
	}
}

// wrapped is a dialer's own connection type.
type wrapped struct{ net.Conn }

type unwrappable struct{ net.Conn }

func (u unwrappable) NetConn() net.Conn { return u.Conn }

func TestH1KeepsOnlyConnectionsItCanCheck(t *testing.T) {
	for name, wrap := range map[string]func(net.Conn) net.Conn{
		"wrapped":              func(c net.Conn) net.Conn { return wrapped{c} },
		"wrapped with NetConn": func(c net.Conn) net.Conn { return unwrappable{c} },
	} {
		t.Run(name, func(t *testing.T) {
			s := startH1Server(t, echo)
			tr := NewTransport()
			dial := tr.DialContext
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := dial(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return wrap(c), nil
			}
			h := newH1Transport(tr)
			t.Cleanup(h.CloseIdleConnections)
			readAll(t, h1Post(t.Context(), t, h, s.URL, "x"))
			s.CloseClientConnections() // what a kept connection may meet
			want := 0
			if name == "wrapped with NetConn" {
				want = 1
				s.waitClosed(t)
			}
			if n := h.kept(); n != want {
				t.Fatalf("%d connections kept; want %d", n, want)
			}
			if got := readAll(t, h1Post(t.Context(), t, h, s.URL, "y")); got != "y" {
				t.Fatalf("got %q; want %q", got, "y")
			}
		})
	}
}

func TestH1BoundsTheAnswersHead(t *testing.T) {
	u, _ := rawUpstream(t, "HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("b", 4096)+"\r\nContent-Length: 2\r\n\r\nok", false)
	h := newTestH1(t)
	h.maxHeader = 1024
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, u, strings.NewReader("x"))
	if resp, err := h.RoundTrip(req); !errors.Is(err, errHeaderTooLarge) {
		if err == nil {
			resp.Body.Close()
		}
		t.Fatalf("got %v; want %v", err, errHeaderTooLarge)
	}
	h.maxHeader = 8192
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodPost, u, strings.NewReader("x"))
	resp, err := h.RoundTrip(req)
	if err != nil {
		t.Fatalf("a head under the limit: %v", err)
	}
	if got := readAll(t, resp); got != "ok" {
		t.Fatalf("got %q; want %q", got, "ok")
	}
}

func TestOwnersDoNotForwardExpect(t *testing.T) {
	h := (&Proxy{}).forwardHeader(http.Header{"Expect": {"100-continue"}, "X-Kept": {"1"}})
	if h.Get("Expect") != "" || h.Get("X-Kept") != "1" {
		t.Fatalf("forwarded %v; want X-Kept without Expect", h)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
