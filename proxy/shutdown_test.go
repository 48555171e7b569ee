package proxy_test

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
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

// upgrade is an upstream's side of a WebSocket upgrade: a 101 on the hijacked
// connection, kept until the client goes.
func upgrade(w http.ResponseWriter, _ *http.Request) {
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	brw.Flush()
	c.Read(make([]byte, 1))
}

// lineWriter passes each log line it is given to its channel.
type lineWriter chan string

func (c lineWriter) Write(p []byte) (int, error) { c <- string(p); return len(p), nil }

// TestUpgradeIsLoggedWithItsStatus: a passed-through upgrade is logged with its 101; the
// reverse proxy writes that status on the hijacked connection, so it was logged 499, as a
// client that left before an answer.
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
