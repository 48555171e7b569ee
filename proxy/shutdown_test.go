package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// An owner shut down mid-flight releases its flight: a follower on another instance takes
// over at once, well before the lease would have run out.
func TestShutdownReleasesToFollowers(t *testing.T) {
	rs := redistest.Start(t)
	up := startUpstream(t)
	up.Set(fakeBehavior{Hold: true}) // the owner's call never answers
	lease := 3 * time.Second
	s := setup{redis: rs, flight: singleflight.Options{LeaseTTL: lease, HeartbeatInterval: time.Second, TakeoverJitter: 50 * time.Millisecond}}
	a, b := newInstance(t, up, s), newInstance(t, up, s)

	started := up.Started()
	ownerDone := make(chan answer, 1)
	go func() { ownerDone <- post(t, a.URL, "/v1/chat/completions", chatBody) }()
	<-started
	followers := make(chan []answer, 1)
	go func() { followers <- burst(t, []*instance{b}, 5, "/v1/chat/completions", chatBody) }()
	waitWaiting(t, []*instance{b}, 5)

	up.Set(fakeBehavior{}) // calls from now on answer at once
	stop := time.Now()
	a.close() // SIGTERM with a short shutdown_timeout: the flight is released
	as := <-followers
	took := time.Since(stop)
	for _, f := range as {
		if f.status != 200 || f.body == "" {
			t.Fatalf("follower got (%d, %q); want 200", f.status, f.body)
		}
	}
	if took >= lease {
		t.Fatalf("followers answered %v after the owner's shutdown; want before the lease (%v) ran out", took, lease)
	}
	if up.Calls() != 2 {
		t.Fatalf("%d upstream calls; want 2 (the released one and the takeover)", up.Calls())
	}
	if v := value(t, b.Reg, "llm_dedupe_takeovers_total", map[string]string{"reason": "shutdown"}); v != 1 {
		t.Fatalf("takeovers_total{reason=shutdown} = %v on the follower's instance; want 1", v)
	}
	// The owner's own client is answered, not left hanging: with the proxy's error, not
	// one that blames the upstream.
	if o := <-ownerDone; o.status != http.StatusServiceUnavailable || !strings.Contains(o.body, `"type":"server_error"`) || !strings.Contains(o.body, `"code":"shutting_down"`) {
		t.Fatalf("the owner's client got %d %s; want 503 server_error shutting_down", o.status, o.body)
	}
	t.Logf("takeover after shutdown: %v (lease %v)", took, lease)
}

// TestClosedFlightsAnswerShuttingDown: a request that comes once the flights are closed
// (the proxy shutting down, its listener still open) is answered 503 shutting_down at once,
// and no call is made.
func TestClosedFlightsAnswerShuttingDown(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			in := newInstance(t, up, setup{redis: rs})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := in.Group.Close(ctx); err != nil {
				t.Fatal(err)
			}
			for _, body := range []string{chatBody, `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hello"}]}`} {
				errorBody(t, post(t, in.URL, "/v1/chat/completions", body), http.StatusServiceUnavailable, "shutting_down")
			}
			if up.Calls() != 0 {
				t.Fatalf("%d upstream calls; want none", up.Calls())
			}
		})
	}
}

// TestDrainClosesConnectionsAfterTheirAnswer: while the proxy drains, an answer on the
// API's routes says Connection: close, also after a 1xx the reverse proxy passed on (it
// clears the header then), and never on an upgrade, whose 101 keeps Connection: Upgrade.
func TestDrainClosesConnectionsAfterTheirAnswer(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/hints":
			w.Header().Set("Link", "</a>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "after hints")
		case "/v1/realtime":
			upgrade(w, r)
		default:
			io.WriteString(w, `{"id":"x"}`)
		}
	}))
	defer api.Close()
	up := &upstream{URL: api.URL}
	in := newInstance(t, up, setup{base: api.URL})
	in.Proxy.Drain()

	// head sends a raw request and returns the status line and the Connection values of
	// the answer's head (the last one, after any 1xx).
	head := func(req string) (string, []string) {
		t.Helper()
		c, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, req)
		br := bufio.NewReader(c)
		for {
			tp := textproto.NewReader(br)
			status, err := tp.ReadLine()
			if err != nil {
				t.Fatalf("%q: %v", req, err)
			}
			h, err := tp.ReadMIMEHeader()
			if err != nil {
				t.Fatalf("%q: %v", req, err)
			}
			if !strings.Contains(status, " 103 ") {
				return status, h.Values("Connection")
			}
		}
	}
	for _, c := range []struct {
		name, req, status string
		want              []string
	}{
		{"deduplicated", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"model\":\"m1\"}\n", "200", []string{"close"}},
		{"passed through after 103", "GET /v1/hints HTTP/1.1\r\nHost: x\r\n\r\n", "200", []string{"close"}},
		{"upgrade", "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", "101", []string{"Upgrade"}},
	} {
		status, conn := head(c.req)
		if !strings.Contains(status, " "+c.status+" ") || !slices.Equal(conn, c.want) {
			t.Errorf("%s while draining: %q, Connection %q; want %s, Connection %q", c.name, status, conn, c.status, c.want)
		}
	}
}

func TestReadyz(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	get := func() (int, map[string]any) {
		res, err := http.Get(in.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(res.Body).Decode(&v)
		return res.StatusCode, v
	}
	if code, v := get(); code != 200 || v["backend"] != "memory" || v["degraded"] != false {
		t.Fatalf("readyz: %d %v; want 200 memory not degraded", code, v)
	}
	in.Proxy.Drain()
	if code, v := get(); code != 503 || v["status"] != "draining" {
		t.Fatalf("readyz while draining: %d %v; want 503 draining", code, v)
	}
}
