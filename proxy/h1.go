package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// h1Transport makes an owner's calls to a plain-HTTP upstream over HTTP/1.1 on the calling
// goroutine: it writes the request, then reads the answer, and keeps no goroutine per
// connection. net/http's Transport runs a read loop and a write loop for every connection,
// so that it can send a body while an answer arrives and notice an idle connection's close
// at once; an owner has its whole body in memory before it calls, and an idle connection is
// checked when it is taken instead. With ten thousand calls in flight over HTTP/1.1 (one
// connection each) that is twenty thousand goroutines fewer, and an idle connection holds
// no buffer. Everything else (HTTPS, where HTTP/2 carries many calls on one connection, and
// an upstream reached through a proxy from HTTP_PROXY) goes to the fallback.
//
// It never sends a request twice: a POST is not idempotent, and net/http does not either
// once the request may have reached the upstream. A kept connection the upstream closed
// is found before it is used (alive); one closed in the microseconds after that fails the
// attempt, and the flight's retry policy decides, as with net/http.
// Unlike net/http it does not ask for gzip: the answer comes as the upstream sends it
// unasked, which for an OpenAI-style server is plain.
type h1Transport struct {
	fallback *http.Transport
	// maxIdle bounds the idle connections kept per host; idleTimeout closes one unused for
	// that long. Both are the fallback's.
	maxIdle     int
	idleTimeout time.Duration

	mu   sync.Mutex
	idle map[string][]*h1Conn // by host:port, most recently used last
}

var _ http.RoundTripper = (*h1Transport)(nil)

func newH1Transport(fallback *http.Transport) *h1Transport {
	t := &h1Transport{fallback: fallback, maxIdle: fallback.MaxIdleConnsPerHost, idleTimeout: fallback.IdleConnTimeout, idle: map[string][]*h1Conn{}}
	if t.maxIdle <= 0 {
		t.maxIdle = http.DefaultMaxIdleConnsPerHost
	}
	if t.idleTimeout <= 0 {
		t.idleTimeout = 90 * time.Second
	}
	return t
}

// h1Conn is one connection to the upstream; br is set only while a call uses it.
type h1Conn struct {
	addr string
	nc   net.Conn
	br   *bufio.Reader
	// idle closes the connection when it stayed in the pool for idleTimeout.
	idle *time.Timer
}

var (
	h1Readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}
	h1Writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

// RoundTrip makes one call. The answer's body reads from the connection; reading it to its
// end gives the connection back for the next call, closing it early closes the connection.
func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.handles(req) {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	addr := hostPort(req)
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	c, err := t.get(ctx, addr)
	if err != nil {
		return nil, err
	}
	// Cancelling the call closes its connection: a blocked write or read returns.
	stop := context.AfterFunc(ctx, func() { c.nc.Close() })
	resp, err := c.call(req)
	if err != nil {
		stop()
		c.close()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	resp.Body = &h1Body{t: t, c: c, r: resp.Body, stop: stop, keep: !resp.Close && !req.Close}
	return resp, nil
}

// handles is whether a request is one h1Transport makes: plain HTTP, no proxy between.
func (t *h1Transport) handles(req *http.Request) bool {
	if req.URL.Scheme != "http" {
		return false
	}
	if t.fallback.Proxy != nil {
		if u, err := t.fallback.Proxy(req); err != nil || u != nil {
			return false
		}
	}
	return true
}

func hostPort(req *http.Request) string {
	port := req.URL.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(req.URL.Hostname(), port)
}

// call writes req and reads the answer's head. Informational answers (100 Continue, 103
// Early Hints) are skipped, as net/http does.
func (c *h1Conn) call(req *http.Request) (*http.Response, error) {
	bw := h1Writers.Get().(*bufio.Writer)
	bw.Reset(c.nc)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	h1Writers.Put(bw)
	if err != nil {
		return nil, fmt.Errorf("proxy: writing the upstream request: %w", err)
	}
	for range 5 {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			return nil, fmt.Errorf("proxy: reading the upstream answer: %w", err)
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("proxy: upstream switched protocols unasked")
		case resp.StatusCode >= 200:
			return resp, nil
		}
	}
	return nil, errors.New("proxy: upstream sent too many informational answers")
}

// get returns a kept connection to addr that the upstream has not closed, or dials one.
func (t *h1Transport) get(ctx context.Context, addr string) (*h1Conn, error) {
	for {
		t.mu.Lock()
		conns := t.idle[addr]
		if len(conns) == 0 {
			t.mu.Unlock()
			break
		}
		c := conns[len(conns)-1]
		conns[len(conns)-1] = nil
		t.idle[addr] = conns[:len(conns)-1]
		t.mu.Unlock()
		c.idle.Stop()
		if alive(c.nc) {
			c.br = h1Readers.Get().(*bufio.Reader)
			c.br.Reset(c.nc)
			return c, nil
		}
		c.nc.Close()
	}
	dial := t.fallback.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	br := h1Readers.Get().(*bufio.Reader)
	br.Reset(nc)
	return &h1Conn{addr: addr, nc: nc, br: br}, nil
}

// put keeps c for the next call to its host, or closes it when enough are kept.
func (t *h1Transport) put(c *h1Conn) {
	c.releaseReader()
	t.mu.Lock()
	if len(t.idle[c.addr]) >= t.maxIdle {
		t.mu.Unlock()
		c.nc.Close()
		return
	}
	t.idle[c.addr] = append(t.idle[c.addr], c)
	if c.idle == nil {
		c.idle = time.AfterFunc(t.idleTimeout, func() { t.expire(c) })
	} else {
		c.idle.Reset(t.idleTimeout)
	}
	t.mu.Unlock()
}

// expire closes c if it is still kept unused.
func (t *h1Transport) expire(c *h1Conn) {
	t.mu.Lock()
	conns := t.idle[c.addr]
	i := slices.Index(conns, c)
	if i >= 0 {
		t.idle[c.addr] = slices.Delete(conns, i, i+1)
	}
	t.mu.Unlock()
	if i >= 0 {
		c.nc.Close()
	}
}

// CloseIdleConnections closes the connections kept unused, and the fallback's.
func (t *h1Transport) CloseIdleConnections() {
	t.mu.Lock()
	for addr, conns := range t.idle {
		for _, c := range conns {
			c.idle.Stop()
			c.nc.Close()
		}
		delete(t.idle, addr)
	}
	t.mu.Unlock()
	t.fallback.CloseIdleConnections()
}

// close closes c's connection. Its reader is left to the collector, not pooled: a read
// may still be using it.
func (c *h1Conn) close() { c.nc.Close() }

func (c *h1Conn) releaseReader() {
	if c.br != nil {
		c.br.Reset(nil)
		h1Readers.Put(c.br)
		c.br = nil
	}
}

// h1Body is an answer's body. The first of its end (the connection is kept if the answer
// was whole and said nothing against it), a read error or Close gives up the connection;
// Close may come from another goroutine while a read blocks.
type h1Body struct {
	t    *h1Transport
	c    *h1Conn
	r    io.Reader
	stop func() bool
	keep bool
	done atomic.Bool
}

// Read reads the answer. After its end, r answers io.EOF again without reading, and after a
// Close it reads a closed connection.
func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil {
		b.end(err == io.EOF)
	}
	return n, err
}

// Close ends the answer; before its end the connection is closed, not drained (an owner
// stops reading only when it gives up the call).
func (b *h1Body) Close() error {
	b.end(false)
	return nil
}

func (b *h1Body) end(whole bool) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	// stop fails once the call's context ended: the connection is closed or closing.
	if b.stop() && whole && b.keep && b.c.br.Buffered() == 0 {
		b.t.put(b.c)
		return
	}
	b.c.close()
}
