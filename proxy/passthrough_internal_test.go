package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// passthrough starts upstream and a proxy in front of it whose base URL is upstream's URL
// followed by suffix; it returns the proxy's URL.
func passthrough(t *testing.T, upstream http.Handler, suffix, apiKey string) string {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	target, err := url.Parse(up.URL + suffix)
	if err != nil {
		t.Fatal(err)
	}
	transport := NewTransport()
	t.Cleanup(transport.CloseIdleConnections)
	px := httptest.NewServer(NewPassthrough(target, apiKey, transport))
	t.Cleanup(px.Close)
	return px.URL
}

// do sends req and returns the response with its body read.
func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func TestPassthroughURL(t *testing.T) {
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.RequestURI())
	})
	tests := []struct{ base, path, want string }{
		{"", "/v1/models?limit=2", "/v1/models?limit=2"},
		{"/", "/v1/models", "/v1/models"},
		{"/openai", "/v1/chat/completions?x=1", "/openai/v1/chat/completions?x=1"},
		{"/openai/", "/v1/embeddings", "/openai/v1/embeddings"},
		{"/deploy?api-version=2024", "/v1/models?x=1", "/deploy/v1/models?api-version=2024&x=1"},
	}
	for _, tt := range tests {
		t.Run(tt.base+" "+tt.path, func(t *testing.T) {
			u := passthrough(t, echo, tt.base, "")
			req, _ := http.NewRequest("GET", u+tt.path, nil)
			if _, got := do(t, req); got != tt.want {
				t.Errorf("upstream saw %q; want %q", got, tt.want)
			}
		})
	}
}

func TestPassthroughHopByHopHeaders(t *testing.T) {
	var seen http.Header
	u := passthrough(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "1")
		w.Header().Set("X-Resp-Kept", "1")
	}), "", "")
	req, _ := http.NewRequest("POST", u+"/v1/files", strings.NewReader("{}"))
	req.Header.Set("Connection", "X-Custom-Hop")
	req.Header.Set("X-Custom-Hop", "secret")
	req.Header.Set("Upgrade", "websocket") // not an upgrade: Connection does not list it
	req.Header.Set("TE", "gzip")
	req.Header.Set("Proxy-Connection", "keep-alive")
	req.Header.Set("Keep-Alive", "timeout=5")
	req.Header.Set("X-Forwarded-For", "203.0.113.9") // spoofed: replaced
	req.Header.Set("OpenAI-Organization", "org-1")
	res, _ := do(t, req)

	for _, h := range []string{"Connection", "X-Custom-Hop", "Upgrade", "TE", "Proxy-Connection", "Keep-Alive"} {
		if v := seen.Get(h); v != "" {
			t.Errorf("upstream got %s: %q; want it dropped", h, v)
		}
	}
	if got := seen.Get("OpenAI-Organization"); got != "org-1" {
		t.Errorf("upstream got OpenAI-Organization %q; want org-1", got)
	}
	if got := seen.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("upstream got X-Forwarded-For %q; want 127.0.0.1", got)
	}
	if res.Header.Get("X-Resp-Hop") != "" || res.Header.Get("X-Resp-Kept") != "1" {
		t.Errorf("client got response headers %v; want X-Resp-Hop dropped and X-Resp-Kept kept", res.Header)
	}
}

func TestPassthroughAuthorization(t *testing.T) {
	tests := []struct{ name, apiKey, client, want string }{
		{"forwarded", "", "Bearer sk-client", "Bearer sk-client"},
		{"replaced", "sk-proxy", "Bearer sk-client", "Bearer sk-proxy"},
		{"added", "sk-proxy", "", "Bearer sk-proxy"},
		{"none", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := passthrough(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, r.Header.Get("Authorization"))
			}), "", tt.apiKey)
			req, _ := http.NewRequest("GET", u+"/v1/models", nil)
			if tt.client != "" {
				req.Header.Set("Authorization", tt.client)
			}
			if _, got := do(t, req); got != tt.want {
				t.Errorf("upstream got Authorization %q; want %q", got, tt.want)
			}
		})
	}
}

// TestPassthroughStreamsSSE checks that an event reaches the client while the upstream is
// still holding the stream open.
func TestPassthroughStreamsSSE(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	u := passthrough(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: [DONE]\n\n")
	}), "", "")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", u+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	client := &http.Client{Transport: &http.Transport{}} // no connection shared with other tests
	defer client.CloseIdleConnections()
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "data: {\"n\":1}\n" {
		t.Fatalf("first line %q, %v; want the first event before the upstream finishes", first, err)
	}
	once.Do(func() { close(release) })
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: [DONE]\n\n" {
		t.Errorf("rest %q, %v; want the [DONE] event", rest, err)
	}
}

func TestPassthroughUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	target, _ := url.Parse("http://" + addr)
	px := httptest.NewServer(NewPassthrough(target, "", NewTransport()))
	defer px.Close()

	req, _ := http.NewRequest("POST", px.URL+"/v1/chat/completions", strings.NewReader("{}"))
	res, body := do(t, req)
	checkError(t, res, body, http.StatusBadGateway, "upstream_unavailable")
	if strings.Contains(body, addr) {
		t.Errorf("body %s names the upstream address; want the cause only in the log", body)
	}
}

func TestTimeout(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // until the body is read, a closed connection goes unnoticed
		<-r.Context().Done()        // never answers in time
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	px := httptest.NewServer(Timeout(50 * time.Millisecond)(NewPassthrough(target, "", NewTransport())))
	defer px.Close()

	req, _ := http.NewRequest("POST", px.URL+"/v1/chat/completions", strings.NewReader("{}"))
	res, body := do(t, req)
	checkError(t, res, body, http.StatusGatewayTimeout, "upstream_timeout")
}

func TestIsUpgrade(t *testing.T) {
	tests := []struct {
		connection, upgrade string
		want                bool
	}{
		{"Upgrade", "websocket", true},
		{"keep-alive, upgrade", "websocket", true},
		{"keep-alive", "websocket", false},
		{"Upgrade", "", false},
	}
	for _, tt := range tests {
		h := http.Header{"Connection": {tt.connection}, "Upgrade": {tt.upgrade}}
		if got := isUpgrade(h); got != tt.want {
			t.Errorf("isUpgrade(Connection %q, Upgrade %q) = %v; want %v", tt.connection, tt.upgrade, got, tt.want)
		}
	}
}

func checkError(t *testing.T, res *http.Response, body string, status int, code string) {
	t.Helper()
	if res.StatusCode != status {
		t.Errorf("status %d; want %d", res.StatusCode, status)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q; want application/json", ct)
	}
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if e.Error.Type != "upstream_error" || e.Error.Code != code || e.Error.Message == "" {
		t.Errorf("error %+v; want type upstream_error, code %s and a message", e.Error, code)
	}
}

// TestUpgradeHeaderKeepsTimeout: asking for an upgrade does not lift the timeout; only an
// upgrade that happened (101) does. Here the upstream answers no upgrade and too late.
func TestUpgradeHeaderKeepsTimeout(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second): // a slow call, far past the timeout
			io.WriteString(w, "late")
		}
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	px := httptest.NewServer(Timeout(100 * time.Millisecond)(NewPassthrough(target, "", NewTransport())))
	defer px.Close()

	req, _ := http.NewRequest("GET", px.URL+"/v1/models", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	start := time.Now()
	res, body := do(t, req)
	checkError(t, res, body, http.StatusGatewayTimeout, "upstream_timeout")
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("answered after %v; want about the 100ms timeout", d)
	}
}

// TestUpgradeOutlivesTimeout: a protocol switch that happened (101) is a long-lived
// session, which the timeout of one call does not end.
func TestUpgradeOutlivesTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		line, _ := brw.ReadString('\n') // echo one line
		io.WriteString(conn, line)
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	px := httptest.NewServer(Timeout(timeout)(NewPassthrough(target, "", NewTransport())))
	defer px.Close()

	conn, err := net.Dial("tcp", strings.TrimPrefix(px.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, "GET /v1/realtime HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("got %v, %v; want 101", res, err)
	}
	time.Sleep(3 * timeout) // the session outlives the timeout: that is what is tested
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); line != "ping\n" {
		t.Errorf("echo after the timeout: %q, %v; want \"ping\\n\"", line, err)
	}
}
