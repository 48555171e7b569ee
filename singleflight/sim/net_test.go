package sim

import (
	"bytes"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The network between instances and Redis nodes: every connection is a pair of in-memory
// queues whose delivery a link's state decides. Writes never block (a kernel's send buffer
// without a bound); a read waits for bytes that may be delivered, its deadline, or a reset.
// Everything waits on channels made inside the bubble, so that virtual time advances.

// linkState is what the network does between one instance and one Redis address.
type linkState int

const (
	linkUp      linkState = iota
	linkHeld              // bytes are accepted and held, both ways; dials succeed (a paused peer)
	linkCut               // bytes are held; dials hang until their deadline (a partition)
	linkRefused           // dials are refused and connections reset (nothing listens)
	linkDead              // the instance is gone: what it sent arrives, it sends and learns nothing more
)

func (s linkState) String() string {
	return [...]string{"up", "held", "cut", "refused", "dead"}[s]
}

// link is the path between one instance and one Redis address.
type link struct {
	inst, addr string
	progress   *atomic.Int64 // counts bytes moved, for the watchdog

	mu      sync.Mutex
	state   linkState         // the most severe of the faults in force
	active  [linkDead + 1]int // faults in force, by the state each asks for
	delay   time.Duration     // added to every delivery, both ways (a slow Redis): the largest asked
	delays  []time.Duration
	conns   map[*conn]bool
	dialed  int           // connections made, numbering the next
	changed chan struct{} // closed and replaced when state or delay change
}

func newLink(inst, addr string, progress *atomic.Int64) *link {
	return &link{inst: inst, addr: addr, progress: progress, conns: map[*conn]bool{}, changed: make(chan struct{})}
}

// apply puts a fault asking for state s in force (on) or ends it; faults overlap, and the
// most severe in force decides. Connections learn it at their next read or write. What an
// ended fault held goes from after, then one connection a µs after another (see stagger).
func (l *link) apply(s linkState, on bool, after time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on {
		l.active[s]++
	} else if l.active[s] > 0 {
		l.active[s]--
	}
	l.state = linkUp
	for st := linkDead; st > linkUp; st-- {
		if l.active[st] > 0 {
			l.state = st
			break
		}
	}
	if l.state == linkRefused {
		for c := range l.conns {
			c.resetLocked()
		}
	}
	if !on && (l.state == linkUp || l.state == linkRefused) {
		l.staggerLocked(after)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// staggerLocked lets what a released fault held go one connection after another, a µs
// apart, in the order they were made, from after: all at one instant, what they carry would
// race, and a story could not tell one order.
func (l *link) staggerLocked(after time.Duration) {
	cs := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(a, b *conn) int { return a.seq - b.seq })
	now := time.Now()
	for i, c := range cs {
		at := now.Add(after + time.Duration(i)*time.Microsecond)
		for _, h := range []*half{&c.up, &c.down} {
			h.mu.Lock()
			for j := range h.chunks {
				h.chunks[j].at = later(h.chunks[j].at, at)
			}
			h.mu.Unlock()
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// slow adds (on) or ends a delay; the largest in force applies.
func (l *link) slow(d time.Duration, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on {
		l.delays = append(l.delays, d)
	} else if i := slices.Index(l.delays, d); i >= 0 {
		l.delays = slices.Delete(l.delays, i, i+1)
	}
	l.delay = 0
	for _, x := range l.delays {
		l.delay = max(l.delay, x)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// resetAll resets every connection on the link (a server that closed them all), one a µs
// after another in the order they were made, on the caller's goroutine: all at one
// instant, what their readers do next would race (see staggerLocked).
func (l *link) resetAll() {
	l.mu.Lock()
	cs := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		cs = append(cs, c)
	}
	l.mu.Unlock()
	slices.SortFunc(cs, func(a, b *conn) int { return a.seq - b.seq })
	for _, c := range cs {
		l.mu.Lock()
		c.resetLocked()
		l.mu.Unlock()
		time.Sleep(time.Microsecond)
	}
}

// look returns the link's state, its delay and the channel closed at its next change.
func (l *link) look() (linkState, time.Duration, chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, l.delay, l.changed
}

// conn is both ends of one connection; its two halves carry one direction each.
type conn struct {
	l       *link
	seq     int // its place among the link's connections
	latency time.Duration
	up      half // instance → Redis
	down    half // Redis → instance
	reset   bool // under l.mu
	onBytes func(p []byte)
	// established: the client sent a command that is not part of its connection's
	// handshake (under up.mu). Until then the bytes flow whatever the link's state.
	established atomic.Bool
}

// The handshake a go-redis client sends on a new connection (HELLO, CLIENT SETINFO), and
// the layout and command table a Cluster client asks for on a new connection, flow even where the link holds bytes:
// go-redis holds a mutex across them (a PubSub's, the command table's), and a goroutine
// waiting for a mutex keeps the bubble's clock still, so that a link fault would stop the
// world instead of timing the wait out. A dial is answered at once for the same reason.
var handshake = map[string]bool{"HELLO": true, "CLIENT": true, "AUTH": true, "SELECT": true, "COMMAND": true,
	"READONLY": true, "CLUSTER": true}

// firstCommand returns the offset in p of the first command that is not part of the
// handshake, or -1 when every command of p is.
func firstCommand(p []byte) int {
	i := 0
	for i < len(p) {
		start := i
		if p[i] != '*' {
			return start
		}
		n, next, ok := respInt(p, i+1)
		if !ok {
			return start
		}
		i = next
		for k := 0; k < n; k++ {
			if i >= len(p) || p[i] != '$' {
				return start
			}
			l, next, ok := respInt(p, i+1)
			if !ok || next+l+2 > len(p) {
				return start
			}
			if k == 0 && !handshake[strings.ToUpper(string(p[next:next+l]))] {
				return start
			}
			i = next + l + 2
		}
	}
	return -1
}

// respInt reads the decimal number at p[i:] up to CRLF; next is past the CRLF.
func respInt(p []byte, i int) (n, next int, ok bool) {
	j := bytes.Index(p[i:], []byte("\r\n"))
	if j < 0 {
		return 0, 0, false
	}
	n, err := strconv.Atoi(string(p[i : i+j]))
	return n, i + j + 2, err == nil
}

type chunk struct {
	b    []byte
	at   time.Time // when it may be read
	free bool      // part of the handshake: delivered whatever the link's state
}

// half is one direction of a connection.
type half struct {
	mu       sync.Mutex
	chunks   []chunk
	closed   bool          // its writer closed: reads drain, then EOF
	notify   chan struct{} // closed and replaced when bytes come, or the half closes
	deadline time.Time     // of the reader
}

func (h *half) init() { h.notify = make(chan struct{}) }

func (h *half) wakeLocked() {
	close(h.notify)
	h.notify = make(chan struct{})
}

// end is one side of a conn, a net.Conn.
type end struct {
	c      *conn
	client bool // the instance's side
	in     *half
	out    *half
	closed atomic.Bool // by this side: its reads and writes fail at once
}

var _ net.Conn = (*end)(nil)

// newConn connects inst to addr over l; onBytes, if set, sees what the instance sends.
func newConn(l *link, latency time.Duration, onBytes func([]byte)) (client, server *end) {
	c := &conn{l: l, onBytes: onBytes}
	c.up.init()
	c.down.init()
	l.mu.Lock()
	l.conns[c] = true
	c.latency, c.seq = latency, l.dialed
	l.dialed++
	l.mu.Unlock()
	return &end{c: c, client: true, in: &c.down, out: &c.up}, &end{c: c, in: &c.up, out: &c.down}
}

func (c *conn) resetLocked() {
	c.reset = true
	for _, h := range []*half{&c.up, &c.down} {
		h.mu.Lock()
		h.wakeLocked()
		h.mu.Unlock()
	}
}

var errReset = &net.OpError{Op: "read", Net: "sim", Err: os.NewSyscallError("read", syscall.ECONNRESET)}

func (e *end) Read(p []byte) (int, error) {
	for {
		if e.closed.Load() {
			return 0, net.ErrClosed
		}
		l := e.c.l
		l.mu.Lock()
		reset, state, changed := e.c.reset, l.state, l.changed
		l.mu.Unlock()
		if reset || state == linkDead && e.client {
			return 0, errReset // a dead process learns nothing more (and waits for nothing)
		}
		h := e.in
		h.mu.Lock()
		now := time.Now()
		if !h.deadline.IsZero() && !now.Before(h.deadline) {
			h.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		deliver := state == linkUp || state == linkRefused || state == linkDead
		var wait time.Duration = -1
		if len(h.chunks) > 0 && (deliver || h.chunks[0].free) {
			if c := h.chunks[0]; !now.Before(c.at) {
				n := copy(p, c.b)
				if n < len(c.b) {
					h.chunks[0].b = c.b[n:]
				} else {
					h.chunks = h.chunks[1:]
				}
				h.mu.Unlock()
				l.progress.Add(1)
				return n, nil
			} else {
				wait = c.at.Sub(now)
			}
		}
		if deliver && len(h.chunks) == 0 && h.closed {
			h.mu.Unlock()
			return 0, io.EOF
		}
		if !h.deadline.IsZero() {
			if d := h.deadline.Sub(now); wait < 0 || d < wait {
				wait = d
			}
		}
		notify := h.notify
		h.mu.Unlock()
		var t *time.Timer
		var timer <-chan time.Time
		if wait >= 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		select {
		case <-notify:
		case <-changed:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
	}
}

func (e *end) Write(p []byte) (int, error) {
	if e.closed.Load() {
		return 0, net.ErrClosed
	}
	l := e.c.l
	l.mu.Lock()
	reset, state, delay := e.c.reset, l.state, l.delay
	l.mu.Unlock()
	if reset {
		return 0, errReset
	}
	if state == linkDead && e.client {
		return 0, errReset // a dead process sends nothing more
	}
	h := e.out
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, &net.OpError{Op: "write", Net: "sim", Err: os.NewSyscallError("write", syscall.EPIPE)}
	}
	if e.client && e.c.onBytes != nil {
		e.c.onBytes(p)
	}
	at := time.Now().Add(e.c.latency + delay)
	b := append([]byte(nil), p...)
	switch {
	case e.c.established.Load():
		h.chunks = append(h.chunks, chunk{b: b, at: at})
	case !e.client:
		h.chunks = append(h.chunks, chunk{b: b, at: time.Now(), free: true})
	default:
		i := firstCommand(b)
		if i != 0 {
			free := b
			if i > 0 {
				free = b[:i]
			}
			h.chunks = append(h.chunks, chunk{b: free, at: time.Now(), free: true})
		}
		if i >= 0 {
			e.c.established.Store(true)
			h.chunks = append(h.chunks, chunk{b: b[i:], at: at})
		}
	}
	h.wakeLocked()
	return len(p), nil
}

func (e *end) Close() error {
	e.closed.Store(true)
	for _, h := range []*half{e.out, e.in} {
		h.mu.Lock()
		h.closed = true
		h.wakeLocked()
		h.mu.Unlock()
	}
	l := e.c.l
	l.mu.Lock()
	delete(l.conns, e.c)
	l.mu.Unlock()
	return nil
}

type simAddr string

func (a simAddr) Network() string { return "sim" }
func (a simAddr) String() string  { return string(a) }

func (e *end) LocalAddr() net.Addr  { return simAddr(e.c.l.inst) }
func (e *end) RemoteAddr() net.Addr { return simAddr(e.c.l.addr) }

func (e *end) SetDeadline(t time.Time) error {
	_ = e.SetReadDeadline(t)
	return e.SetWriteDeadline(t)
}

func (e *end) SetReadDeadline(t time.Time) error {
	e.in.mu.Lock()
	e.in.deadline = t
	e.in.wakeLocked()
	e.in.mu.Unlock()
	return nil
}

// SetWriteDeadline does nothing: writes never block.
func (e *end) SetWriteDeadline(time.Time) error { return nil }

var errRefused = &net.OpError{Op: "dial", Net: "sim", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// dial connects over l: refused at once where nothing listens, else connected at once
// (see handshake), its bytes held as the link's state says.
func dial(l *link, latency time.Duration, serve func(net.Conn) bool, onBytes func([]byte)) (net.Conn, error) {
	if state, _, _ := l.look(); state == linkRefused || state == linkDead {
		return nil, errRefused
	}
	client, server := newConn(l, latency, onBytes)
	if !serve(server) {
		_ = client.Close()
		return nil, errRefused
	}
	return client, nil
}
