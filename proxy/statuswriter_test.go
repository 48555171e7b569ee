package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// TestSlowButSteadyClientGetsWholeUnaryAnswer: limits.send_timeout bounds a write that
// makes no progress (nginx's send_timeout: between two successive writes), not a whole
// answer. A unary answer is one Write of the whole body, and a connection's write deadline
// bounds a whole Write: it is written in pieces, each with a deadline of its own, so that a
// client reading steadily but slowly is not cut off mid-answer.
func TestSlowButSteadyClientGetsWholeUnaryAnswer(t *testing.T) {
	const size = 16 << 20
	pad := strings.Repeat("x", size)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[],"pad":"`+pad+`"}`)
	}))
	t.Cleanup(gw.Close)
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: gw.URL, proxy: func(c *proxy.Config) { c.SendTimeout = time.Second }})

	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 32<<10) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"slow reader"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	// Read steadily at about 4 MB/s: never a pause anywhere near SendTimeout.
	buf := make([]byte, 64<<10)
	var got int
	var longest time.Duration
	last := time.Now()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		n, err := conn.Read(buf)
		got += n
		if n > 0 {
			if gap := time.Since(last); gap > longest {
				longest = gap
			}
			last = time.Now()
		}
		if err != nil {
			break
		}
		time.Sleep(16 * time.Millisecond)
	}
	if got < size {
		t.Fatalf("read %d of more than %d bytes, the longest gap between two reads %v (SendTimeout 1s): a client taking its answer steadily was cut off",
			got, size, longest)
	}
}

// TestStreamEndingAfterAQuietSpellEndsCleanly: an upstream that ends its stream more than
// SendTimeout after its last event (upstream.idle_timeout allows it, passthrough has no
// idle limit) still gives the client a clean end: the deadline of the last write is set
// anew when the handler returns, for net/http's final write of the chunked body's end.
func TestStreamEndingAfterAQuietSpellEndsCleanly(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		http.NewResponseController(w).Flush()
		time.Sleep(1500 * time.Millisecond) // quiet, then the end
	}))
	t.Cleanup(gw.Close)
	up := startUpstream(t)
	in := newInstance(t, up, setup{base: gw.URL, proxy: func(c *proxy.Config) {
		c.SendTimeout = time.Second
		c.IdleTimeout = 5 * time.Second
	}})
	for _, path := range []string{"/v1/chat/completions", "/v1/threads/runs"} {
		t.Run(path, func(t *testing.T) {
			res, err := http.Post(in.URL+path, "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"quiet end"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			if err != nil || !strings.Contains(string(b), "[DONE]") {
				t.Fatalf("read %q, then %v; want the whole stream and a clean end (SendTimeout 1s, the upstream quiet 1.5s before its end)", b, err)
			}
		})
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
