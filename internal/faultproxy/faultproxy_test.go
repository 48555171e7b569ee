package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// link is a client connected through a Proxy to a server end the test holds.
type link struct {
	p      *Proxy
	client net.Conn
	server net.Conn
}

// newLink starts a target listener and a Proxy to it, and connects one client.
func newLink(t *testing.T) *link {
	t.Helper()
	p, ln := newProxy(t)
	l := &link{p: p}
	l.client, l.server = connect(t, p, ln)
	return l
}

// newProxy starts a target listener and a proxy to it, both closed when the test ends.
func newProxy(t *testing.T) (*Proxy, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p, err := Listen(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, ln
}

// connect dials p and accepts the connection it makes to the target.
func connect(t *testing.T, p *Proxy, ln net.Listener) (client, server net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// readN reads exactly n bytes from c within d.
func readN(c net.Conn, n int, d time.Duration) (string, error) {
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return string(b), err
}

// nothing checks that c receives nothing for d.
func nothing(t *testing.T, who string, c net.Conn, d time.Duration) {
	t.Helper()
	if got, err := readN(c, 1, d); !isTimeout(err) {
		t.Fatalf("%s got %q, %v; want nothing for %v", who, got, err, d)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

func want(t *testing.T, who string, c net.Conn, s string) {
	t.Helper()
	got, err := readN(c, len(s), 5*time.Second)
	if err != nil || got != s {
		t.Fatalf("%s got %q, %v; want %q", who, got, err, s)
	}
}

func TestPassForwardsBothWays(t *testing.T) {
	l := newLink(t)
	send(t, l.client, "PING\r\n")
	want(t, "server", l.server, "PING\r\n")
	send(t, l.server, "+PONG\r\n")
	want(t, "client", l.client, "+PONG\r\n")
}

func TestHangHoldsBytesBothWaysAndDeliversThemAfter(t *testing.T) {
	l := newLink(t)
	l.p.Set(Fault{Mode: Hang})
	send(t, l.client, "GET a\r\n")
	send(t, l.server, "+late\r\n")
	nothing(t, "server", l.server, 200*time.Millisecond)
	nothing(t, "client", l.client, 10*time.Millisecond)
	l.p.Set(Fault{})
	want(t, "server", l.server, "GET a\r\n")
	want(t, "client", l.client, "+late\r\n")
}

func TestHangKeepsNewConnectionsOpenAndSilent(t *testing.T) {
	p, ln := newProxy(t)
	p.Set(Fault{Mode: Hang})
	client, server := connect(t, p, ln)
	send(t, client, "HELLO 3\r\n")
	nothing(t, "server", server, 200*time.Millisecond)
	p.Set(Fault{})
	want(t, "server", server, "HELLO 3\r\n")
}

func TestHalfOpenHoldsBytesToTheServerOnly(t *testing.T) {
	l := newLink(t)
	l.p.Set(Fault{Mode: HalfOpen})
	send(t, l.client, "SUBSCRIBE c\r\n")
	send(t, l.server, ">3\r\n")
	want(t, "client", l.client, ">3\r\n")
	nothing(t, "server", l.server, 200*time.Millisecond)
	l.p.Set(Fault{})
	want(t, "server", l.server, "SUBSCRIBE c\r\n")
}

func TestSilentHoldsRepliesAndResetLosesThem(t *testing.T) {
	l := newLink(t)
	l.p.Set(Fault{Mode: Silent})
	send(t, l.client, "INCR n\r\n")
	want(t, "server", l.server, "INCR n\r\n") // the command runs
	send(t, l.server, ":1\r\n")
	nothing(t, "client", l.client, 200*time.Millisecond)
	l.p.Set(Fault{Mode: Reset}) // the held reply is never delivered
	if got, err := readN(l.client, 1, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client read %q, %v; want connection reset by peer", got, err)
	}
}

func TestLatencyDelaysEachDirection(t *testing.T) {
	const delay = 50 * time.Millisecond
	l := newLink(t)
	l.p.Set(Fault{Mode: Latency, Delay: delay})
	start := time.Now()
	send(t, l.client, "PING\r\n")
	want(t, "server", l.server, "PING\r\n")
	send(t, l.server, "+PONG\r\n")
	want(t, "client", l.client, "+PONG\r\n")
	if took := time.Since(start); took < 2*delay {
		t.Errorf("round trip took %v; want at least %v", took, 2*delay)
	}
	// Chunks in a row are delayed from when each was read, not one after another.
	start = time.Now()
	for range 10 {
		send(t, l.client, "x")
		time.Sleep(5 * time.Millisecond)
	}
	want(t, "server", l.server, strings.Repeat("x", 10))
	if took := time.Since(start); took > 10*delay {
		t.Errorf("10 chunks 5ms apart took %v; want about %v, not %v", took, delay+50*time.Millisecond, 10*delay)
	}
}

func TestBandwidthLimitsEachDirection(t *testing.T) {
	const rate = 10_000 // bytes/s
	l := newLink(t)
	l.p.Set(Fault{Mode: Bandwidth, Rate: rate})
	msg := strings.Repeat("b", 3*rate/10) // 0.3 s worth: the first tenth at once
	start := time.Now()
	send(t, l.client, msg)
	want(t, "server", l.server, msg)
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("%d bytes at %d B/s took %v; want at least 200ms", len(msg), rate, took)
	}
}

func TestResetSendsRSTWhenTheServerAnswers(t *testing.T) {
	l := newLink(t)
	l.p.Set(Fault{Mode: Reset})
	send(t, l.client, "EVALSHA x 0\r\n")
	want(t, "server", l.server, "EVALSHA x 0\r\n") // the command reaches the server
	send(t, l.server, "+OK\r\n")
	_, err := readN(l.client, 1, 5*time.Second)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client read: %v; want connection reset by peer (an RST)", err)
	}
	if _, err := readN(l.server, 1, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("server read: %v; want connection reset by peer", err)
	}
	if s := l.p.Stats(); s.Resets != 1 {
		t.Errorf("stats %+v; want 1 reset", s)
	}
}

func TestCutClosesConnectionsAndRefusesNewOnes(t *testing.T) {
	p, ln := newProxy(t)
	client, _ := connect(t, p, ln)
	p.Set(Fault{Mode: Cut})
	if _, err := readN(client, 1, 5*time.Second); err == nil || isTimeout(err) {
		t.Errorf("existing connection: %v; want it closed", err)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := readN(c2, 1, 5*time.Second); err == nil || isTimeout(err) {
		t.Errorf("new connection: %v; want it closed", err)
	}
	p.Set(Fault{})
	client, server := connect(t, p, ln)
	send(t, client, "PING\r\n")
	want(t, "server", server, "PING\r\n")
}

func TestEndOfStreamIsPassedOn(t *testing.T) {
	l := newLink(t)
	send(t, l.client, "QUIT\r\n")
	l.client.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(readerWithin(l.server, 5*time.Second))
	if err != nil || !bytes.Equal(b, []byte("QUIT\r\n")) {
		t.Errorf("server read %q, %v; want QUIT then EOF", b, err)
	}
}

func readerWithin(c net.Conn, d time.Duration) io.Reader {
	c.SetReadDeadline(time.Now().Add(d))
	return c
}
