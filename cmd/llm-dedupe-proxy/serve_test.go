package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"
)

// startServe runs serve in-process on a free port and returns its base URL and a function that
// stops it (as SIGTERM would) and returns its exit status.
func startServe(t *testing.T, args ...string) (string, func() int) {
	base, stop, _ := startServeLogs(t, args...)
	return base, stop
}

// logLine is a line of serve's JSON log, decoded.
type logLine map[string]any

// startServeLogs is startServe that also returns the lines serve logs, as they come.
func startServeLogs(t *testing.T, args ...string) (string, func() int, <-chan logLine) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logs, logw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		args := append([]string{"serve", "--listen=127.0.0.1:0", "--log.format=json"}, args...)
		done <- run(ctx, args, nil, strings.NewReader(""), io.Discard, logw)
		logw.Close()
	}()

	addr := make(chan string, 1)
	msgs := make(chan logLine, 1000)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			var line logLine
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				if line["msg"] == "listening" {
					addr <- line["addr"].(string)
				}
				select {
				case msgs <- line:
				default:
				}
			}
		}
		close(addr)
	}()
	var base string
	select {
	case a, ok := <-addr:
		if !ok {
			cancel()
			t.Fatalf("serve stopped before listening: status %d", <-done)
		}
		base = "http://" + a
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("serve did not log \"listening\" within 10s")
	}
	stop := func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop within 10s of the signal")
			return -1
		}
	}
	return base, stop, msgs
}

// waitLogged waits until serve logs msg, and returns that line.
func waitLogged(t *testing.T, msgs <-chan logLine, msg string) logLine {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l := <-msgs:
			if l["msg"] == msg {
				return l
			}
		case <-timeout:
			t.Fatalf("serve did not log %q within 10s", msg)
		}
	}
}

func TestServe(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization"))
	}))
	defer up.Close()
	base, stop := startServe(t, "--upstream.base_url="+up.URL+"/prefix", "--upstream.api_key=sk-proxy")

	res, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"status":"ok"}` {
		t.Errorf("/healthz: %d %q; want 200 {\"status\":\"ok\"}", res.StatusCode, body)
	}

	res, err = http.Post(base+"/v1/chat/completions?x=1", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if want := "POST /prefix/v1/chat/completions?x=1 Bearer sk-proxy"; string(body) != want {
		t.Errorf("passthrough: upstream saw %q; want %q", body, want)
	}

	if code := stop(); code != 0 {
		t.Errorf("after the signal: status %d; want 0", code)
	}
}

// TestServeFinishesRequestsOnShutdown checks that a request in progress when the signal comes
// still gets its whole answer.
func TestServeFinishesRequestsOnShutdown(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		close(started)
		<-release
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	base, stop, msgs := startServeLogs(t, "--upstream.base_url="+up.URL)

	got := make(chan string, 1)
	go func() {
		res, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
		if err != nil {
			got <- err.Error()
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		got <- string(b)
	}()
	<-started
	stopped := make(chan int, 1)
	go func() { stopped <- stop() }()
	waitLogged(t, msgs, "shutting down")
	close(release)
	if b := <-got; b != "data: 1\n\ndata: [DONE]\n\n" {
		t.Errorf("answer during shutdown %q; want both events", b)
	}
	if code := <-stopped; code != 0 {
		t.Errorf("status %d; want 0", code)
	}
}

// TestServeGoesOnServingForShutdownDelay: after the signal the instance says it is not
// ready, yet answers requests until the delay ends, on the connections clients already
// hold too, each closed after its answer; then it stops.
func TestServeGoesOnServingForShutdownDelay(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"id":"x"}`)
	}))
	defer up.Close()
	const delay = 3 * time.Second
	base, stop, msgs := startServeLogs(t, "--upstream.base_url="+up.URL, "--shutdown_delay="+delay.String())
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	// post sends a request nobody else sends and says whether it went on a kept connection.
	post := func(i int) (*http.Response, string, bool) {
		t.Helper()
		var reused bool
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(c httptrace.GotConnInfo) { reused = c.Reused }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(`{"model":"m","n":%d}`, i)))
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res, string(body), reused
	}
	post(0) // a connection kept alive, idle when the signal comes

	stopped := make(chan int, 1)
	signalled := time.Now()
	go func() { stopped <- stop() }()
	waitLogged(t, msgs, "draining: serving on, ready no more")

	res, body, reused := post(1)
	if res.StatusCode != 200 || body != `{"id":"x"}` || !reused || !res.Close {
		t.Errorf("a request during the delay: %d %q, on the kept connection %v, closed after it %v; want 200 {\"id\":\"x\"}, true, true", res.StatusCode, body, reused, res.Close)
	}
	res, err := client.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("/readyz during the delay: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the delay: %d; want 503", res.StatusCode)
	}
	if code := <-stopped; code != 0 {
		t.Errorf("status %d; want 0", code)
	}
	if took := time.Since(signalled); took < delay {
		t.Errorf("stopped %s after the signal; want at least the delay, %s", took, delay)
	}
}

func TestHealthcheck(t *testing.T) {
	base, stop := startServe(t)
	listen := "--listen=" + strings.TrimPrefix(base, "http://")
	var stderr strings.Builder
	if code := run(context.Background(), []string{"healthcheck", listen}, nil, strings.NewReader(""), io.Discard, &stderr); code != 0 {
		t.Fatalf("healthcheck of a running proxy: status %d (%s); want 0", code, stderr.String())
	}
	stop()
	if code := run(context.Background(), []string{"healthcheck", listen, "--timeout=1s"}, nil, strings.NewReader(""), io.Discard, io.Discard); code != 1 {
		t.Fatalf("healthcheck of a stopped proxy: status %d; want 1", code)
	}
}

// TestServeWarnsOfAnExposedKey: with upstream.api_key set, listening on every interface is
// logged as a warning at start-up; on loopback it is not. The test never listens beyond
// loopback: its wildcard address is on a port a loopback listener holds, so serve warns,
// then fails to listen.
func TestServeWarnsOfAnExposedKey(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, port, _ := net.SplitHostPort(held.Addr().String())
	for _, listen := range []string{":" + port, "0.0.0.0:" + port, "[::]:" + port} {
		r := runCmd(t, nil, "", "serve", "--listen="+listen, "--upstream.api_key=sk-shared", "--log.format=json")
		if r.code != 2 || !strings.Contains(r.stderr, `"level":"WARN","msg":"`+exposedKey+`","listen":"`+listen+`"`) {
			t.Errorf("listen %s with an api_key: status %d, log\n%s\nwant the warning, then 2 (the port is held)", listen, r.code, r.stderr)
		}
	}
	base, stop, msgs := startServeLogs(t, "--upstream.api_key=sk-shared")
	defer stop()
	if _, err := http.Get(base + "/healthz"); err != nil {
		t.Fatal(err)
	}
	for len(msgs) > 0 {
		if l := <-msgs; l["msg"] == exposedKey {
			t.Errorf("listening on 127.0.0.1 with an api_key: warned %v", l)
		}
	}
	for listen, want := range map[string]bool{":8080": true, "0.0.0.0:80": true, "[::]:80": true, "127.0.0.1:8080": false,
		"localhost:8080": false, "10.0.0.5:8080": false, "[::1]:80": false} {
		if got := everyInterface(listen); got != want {
			t.Errorf("everyInterface(%q) = %v; want %v", listen, got, want)
		}
	}
}
