// Package faultproxy is a TCP proxy for tests that puts network faults between a client and
// a server: a hang, latency, resets, a server that stops reading or answering, a slow link,
// a cut.
//
// Each Proxy listens on a loopback port and forwards every connection to one target; Set
// switches its Fault at any time, for the connections it holds and the ones that come.
// Bytes it stops are held, never dropped: when the fault ends they flow on, in order, as
// TCP delivers them after a partition heals or a paused server continues. See
// docs/redis-faults.md.
package faultproxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what a Proxy does to the connections that pass it.
type Mode int

const (
	// Pass forwards bytes as they come.
	Pass Mode = iota
	// Hang holds the bytes of both directions and closes nothing: a paused server, or a
	// network that drops every packet.
	Hang
	// HalfOpen holds the bytes to the server and forwards those from it: a server that
	// stopped reading its sockets, but whose replies already written still arrive.
	HalfOpen
	// Silent forwards the bytes to the server and holds those from it: commands run, and
	// their replies do not arrive. Reset after Silent loses the replies of commands the
	// server has run.
	Silent
	// Latency delays each chunk, each way, by Fault.Delay from when it was read.
	Latency
	// Bandwidth forwards at most Fault.Rate bytes per second each way, per connection.
	Bandwidth
	// Reset resets a connection (an RST to both sides, nothing flushed) when the server
	// next sends it a byte, which is not delivered: a command in flight has reached the
	// server, and its reply is lost.
	Reset
	// Cut closes every connection and, while it lasts, each new one as soon as it is
	// accepted.
	Cut
)

var modeNames = [...]string{"pass", "hang", "half-open", "silent", "latency", "bandwidth", "reset", "cut"}

func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "unknown"
}

// Fault is a mode and its parameter. The zero value passes everything.
type Fault struct {
	Mode  Mode
	Delay time.Duration // Latency: added to each direction
	Rate  int           // Bandwidth: bytes per second, each direction, per connection; at least 1
}

// Stats counts what a Proxy did.
type Stats struct {
	Accepted int64 // connections accepted
	Resets   int64 // connections reset by the Reset mode
}

// Proxy forwards connections from its loopback address to a target, with a Fault.
type Proxy struct {
	ln     net.Listener
	target string

	accepted atomic.Int64
	resets   atomic.Int64

	mu      sync.Mutex
	fault   Fault
	changed chan struct{} // closed and replaced by Set
	pairs   map[*pair]struct{}
	closed  bool
	wg      sync.WaitGroup // the accept loop and every pair's goroutines
}

// Listen starts a Proxy on a free port of 127.0.0.1 that forwards to target, in Pass mode.
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, changed: make(chan struct{}), pairs: map[*pair]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Fault returns the current fault.
func (p *Proxy) Fault() Fault {
	f, _ := p.current()
	return f
}

// Set switches the fault, at once for the bytes held or in flight.
func (p *Proxy) Set(f Fault) {
	p.mu.Lock()
	p.fault = f
	close(p.changed)
	p.changed = make(chan struct{})
	var cut []*pair
	if f.Mode == Cut {
		for c := range p.pairs {
			cut = append(cut, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.close(false)
	}
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{Accepted: p.accepted.Load(), Resets: p.resets.Load()}
}

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	pairs := make([]*pair, 0, len(p.pairs))
	for c := range p.pairs {
		pairs = append(pairs, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range pairs {
		c.close(false)
	}
	p.wg.Wait()
	return err
}

// current is the fault and the channel that Set closes when it changes.
func (p *Proxy) current() (Fault, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fault, p.changed
}

func (p *Proxy) accept() {
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a client gone before it was accepted
		}
		p.accepted.Add(1)
		if f, _ := p.current(); f.Mode == Cut {
			conn.Close()
			continue
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			conn.Close()
			continue
		}
		c := &pair{p: p, client: conn.(*net.TCPConn), server: server.(*net.TCPConn), done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close(false)
			return
		}
		p.pairs[c] = struct{}{}
		cut := p.fault.Mode == Cut // set while it dialled: Set did not see it
		p.mu.Unlock()
		if cut {
			c.close(false)
			continue
		}
		c.start()
	}
}
