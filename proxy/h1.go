package proxy

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// h1Transport makes an owner's calls to a plain-HTTP upstream over HTTP/1.1 on the calling
// goroutine: it writes the request, then reads the answer, and keeps no goroutine per
// connection (a large request is written by one of its own while it lasts, below).
// net/http's Transport runs a read loop and a write loop for every connection, so that it
// can send a body while an answer arrives and notice an idle connection's close at once;
// an owner has its whole body in memory before it calls, and an idle connection is checked
// when it is taken instead. With ten thousand calls in flight over HTTP/1.1 (one
// connection each) that is twenty thousand goroutines fewer, and an idle connection holds
// no buffer. Everything else goes to the fallback, net/http's: HTTPS (where HTTP/2 carries
// many calls on one connection) and an upstream reached through a proxy from HTTP_PROXY.
//
// An upstream may answer before it has read the whole body (413), then close the
// connection: the write then fails, and the answer, already received, is read and handed
// on all the same. A request larger than maxInline, whose write might wait for the
// upstream to read it, is written by a goroutine of its own while the answer is read.
//
// It never sends a request twice: a POST is not idempotent, and net/http does not either
// once the request may have reached the upstream. A kept connection the upstream closed
// is found before it is used (alive); one closed in the microseconds after that fails the
// attempt, and the flight's retry policy decides, as with net/http. Like net/http it asks
// for gzip and hands on the answer decompressed.
type h1Transport struct {
	fallback *http.Transport
	// maxIdle bounds the idle connections kept per host; idleTimeout closes one unused for
	// that long; maxHeader bounds an answer's head. All are the fallback's.
	maxIdle     int
	idleTimeout time.Duration
	maxHeader   int64

	mu   sync.Mutex
	idle map[string][]*h1Conn // by host:port, most recently used last
}

var _ http.RoundTripper = (*h1Transport)(nil)

// maxInline is the largest request, head and body, h1Transport writes on the calling
// goroutine before it reads the answer. A fresh TCP connection's send buffer took about 67
// KiB on Linux's defaults before a write blocked, with a peer reading nothing across a
// network; a request that fits does not wait for the upstream to read it.
const maxInline = 48 << 10

func newH1Transport(fallback *http.Transport) *h1Transport {
	t := &h1Transport{fallback: fallback, maxIdle: fallback.MaxIdleConnsPerHost, idleTimeout: fallback.IdleConnTimeout, maxHeader: fallback.MaxResponseHeaderBytes, idle: map[string][]*h1Conn{}}
	if t.maxIdle <= 0 {
		t.maxIdle = http.DefaultMaxIdleConnsPerHost
	}
	if t.idleTimeout <= 0 {
		t.idleTimeout = 90 * time.Second
	}
	if t.maxHeader <= 0 {
		t.maxHeader = 10 << 20 // net/http's default
	}
	return t
}

// h1Conn is one connection to the upstream; br is set only while a call uses it.
type h1Conn struct {
	addr string
	nc   net.Conn
	lr   limitReader // what br reads: nc, bounded while an answer's head is read
	br   *bufio.Reader
	// checkable is whether alive can tell if the upstream closed the connection while it
	// was kept; one it cannot is never kept.
	checkable bool
	// idle closes the connection when it stayed in the pool for idleTimeout.
	idle *time.Timer
	// wrote has the outcome of a request written by a goroutine of its own.
	wrote chan error
}

// limitReader reads r, at most n bytes.
type limitReader struct {
	r net.Conn
	n int64
}

var errHeaderTooLarge = errors.New("proxy: upstream answer's head too large")

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderTooLarge
	}
	p = p[:min(int64(len(p)), l.n)]
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
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
	fail := func(err error) (*http.Response, error) {
		if req.Body != nil {
			req.Body.Close()
		}
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	c, err := t.get(ctx, hostPort(req))
	if err != nil {
		return fail(err)
	}
	// Cancelling the call closes its connection: a blocked write or read returns.
	stop := context.AfterFunc(ctx, func() { c.nc.Close() })
	// Asked for as net/http asks: not for a part of an answer, nor over the caller's own.
	gz := !t.fallback.DisableCompression && req.Method != http.MethodHead &&
		req.Header.Get("Range") == "" && req.Header.Get("Accept-Encoding") == ""
	resp, err := c.call(req, gz, t.maxHeader)
	if err != nil {
		stop()
		c.nc.Close()
		return fail(err)
	}
	b := &h1Body{t: t, c: c, r: resp.Body, stop: stop, keep: c.checkable && !resp.Close && !req.Close}
	resp.Body = b
	if gz && strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") {
		resp.Body = &gunzip{b: b}
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		resp.Uncompressed = true
	}
	return resp, nil
}

// handles is whether a request is one h1Transport makes: plain HTTP, no proxy between, a
// known length, on a system where a kept connection can be checked.
func (t *h1Transport) handles(req *http.Request) bool {
	if !canCheck || req.URL.Scheme != "http" || req.ContentLength < 0 {
		return false
	}
	if t.fallback.Proxy != nil {
		if u, err := t.fallback.Proxy(req); err != nil || u != nil {
			return false
		}
	}
	return true
}

// headSize is about what req's head takes on the wire.
func headSize(req *http.Request) int64 {
	n := len(req.Method) + len(req.URL.RequestURI()) + len(req.URL.Host) + 64 // request line, Host, User-Agent, Content-Length
	for k, vs := range req.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}

func hostPort(req *http.Request) string {
	port := req.URL.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(req.URL.Hostname(), port)
}

// call writes req and reads the answer's head, of at most maxHeader bytes. Informational
// answers (100 Continue, 103 Early Hints) are skipped, as net/http does.
func (c *h1Conn) call(req *http.Request, gz bool, maxHeader int64) (*http.Response, error) {
	out := req
	if gz {
		r := *req
		r.Header = req.Header.Clone()
		r.Header.Set("Accept-Encoding", "gzip")
		out = &r
	}
	var werr error
	if req.ContentLength+headSize(req) <= maxInline {
		if werr = c.write(out); werr != nil {
			defer c.nc.SetReadDeadline(time.Time{}) // the early answer's body reads on
		}
	} else {
		c.wrote = make(chan error, 1)
		go func() { c.wrote <- c.write(out) }()
	}
	c.lr.n = maxHeader
	defer func() { c.lr.n = math.MaxInt64 }()
	for {
		resp, err := http.ReadResponse(c.br, out)
		if err != nil && c.wrote != nil {
			select {
			case werr = <-c.wrote: // what ended the read, if it ended the write first
			default:
			}
		}
		switch {
		case err != nil && werr != nil:
			return nil, fmt.Errorf("proxy: writing the upstream request: %w", werr)
		case err != nil:
			return nil, fmt.Errorf("proxy: reading the upstream answer: %w", err)
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("proxy: upstream switched protocols unasked")
		case resp.StatusCode >= 200:
			resp.Request = req
			resp.Close = resp.Close || werr != nil
			return resp, nil
		}
		// 1xx: the head limit bounds how many.
	}
}

// write sends req. When that fails, the answer is read for earlyAnswerWait only: one the
// upstream sent before it closed is in the socket already.
func (c *h1Conn) write(req *http.Request) error {
	bw := h1Writers.Get().(*bufio.Writer)
	bw.Reset(c.nc)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	h1Writers.Put(bw)
	if err != nil {
		c.nc.SetReadDeadline(time.Now().Add(earlyAnswerWait))
	}
	return err
}

// sent reports whether the whole request went out, once the answer has been read. A
// request written by its own goroutine may still be going (the upstream answered before
// reading it all), and then the connection cannot carry another; or its writer, done, has
// not yet said so, which it does within earlyAnswerWait, as net/http waits for its write
// loop.
func (c *h1Conn) sent() bool {
	if c.wrote == nil {
		return true
	}
	var err error
	select {
	case err = <-c.wrote:
	default:
		t := time.NewTimer(earlyAnswerWait)
		defer t.Stop()
		select {
		case err = <-c.wrote:
		case <-t.C:
			return false
		}
	}
	c.wrote = nil
	return err == nil
}

// earlyAnswerWait is how long an answer is looked for after a failed write: it arrived
// before the upstream closed, so it is there at once or not at all.
const earlyAnswerWait = 50 * time.Millisecond

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
		// Should its timer fire now, expire finds c gone from the list.
		c.idle.Stop()
		if alive(c.nc) {
			c.takeReader()
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
	c := &h1Conn{addr: addr, nc: nc, lr: limitReader{r: nc, n: math.MaxInt64}, checkable: checkable(nc)}
	c.takeReader()
	return c, nil
}

// put keeps c for the next call to its host. When enough are kept it drops the one unused
// longest, the likeliest to have been closed by the upstream meanwhile.
func (t *h1Transport) put(c *h1Conn) {
	c.br.Reset(nil)
	h1Readers.Put(c.br)
	c.br = nil
	var drop *h1Conn
	t.mu.Lock()
	conns := t.idle[c.addr]
	if len(conns) >= t.maxIdle {
		drop = conns[0]
		conns = append(conns[:0], conns[1:]...)
	}
	t.idle[c.addr] = append(conns, c)
	if c.idle == nil {
		c.idle = time.AfterFunc(t.idleTimeout, func() { t.expire(c) })
	} else {
		c.idle.Reset(t.idleTimeout)
	}
	t.mu.Unlock()
	if drop != nil {
		drop.idle.Stop()
		drop.nc.Close()
	}
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
	idle := t.idle
	t.idle = map[string][]*h1Conn{}
	t.mu.Unlock()
	for _, conns := range idle {
		for _, c := range conns {
			c.idle.Stop()
			c.nc.Close()
		}
	}
	t.fallback.CloseIdleConnections()
}

func (c *h1Conn) takeReader() {
	c.br = h1Readers.Get().(*bufio.Reader)
	c.br.Reset(&c.lr)
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
	// stop fails once the call's context ended: the connection is closed or closing. Its
	// reader is then left to the collector, not pooled: a read may still be using it.
	if b.stop() && whole && b.keep && b.c.br.Buffered() == 0 && b.c.sent() {
		b.t.put(b.c)
		return
	}
	b.c.nc.Close()
}

// gunzip decompresses a gzip answer, as net/http's transport does for the gzip it asked
// for.
type gunzip struct {
	b   *h1Body
	zr  *gzip.Reader
	err error // of the gzip header, kept
}

func (g *gunzip) Read(p []byte) (int, error) {
	if g.zr == nil {
		if g.err != nil {
			return 0, g.err
		}
		if g.zr, g.err = gzip.NewReader(g.b); g.err != nil {
			return 0, g.err
		}
	}
	// gzip.Reader reads on to the body's end, looking for another member, before it
	// answers io.EOF, so a whole answer's connection is kept.
	return g.zr.Read(p)
}

func (g *gunzip) Close() error { return g.b.Close() }
