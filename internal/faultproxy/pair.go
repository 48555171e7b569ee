package faultproxy

import (
	"net"
	"sync"
	"time"
)

// pair is one client connection and its connection to the target. Each direction has a
// reader, which reads chunks as they come and stamps them, and a writer, which delivers
// them when the fault lets it: held bytes stay in the queue and, once it is full, in the
// kernel's buffers, as they would in a real network.
type pair struct {
	p              *Proxy
	client, server *net.TCPConn

	done chan struct{} // closed when both connections are closed

	mu     sync.Mutex // orders a direction's end (a FIN) before or after the close (an RST)
	closed bool
	halfs  int // directions ended by EOF; at 2 the pair closes
}

// direction is one way through a pair.
type direction struct {
	c        *pair
	src, dst *net.TCPConn
	up       bool // client to server
}

// chunk is what a reader read: bytes and when, or the end of its source.
type chunk struct {
	data []byte
	at   time.Time
	eof  bool // the source closed its side (or failed): pass the end on
}

// queueLen bounds the chunks a direction holds before its reader stops reading.
const queueLen = 16

func (c *pair) start() {
	for _, d := range []*direction{
		{c: c, src: c.client, dst: c.server, up: true},
		{c: c, src: c.server, dst: c.client},
	} {
		q := make(chan chunk, queueLen)
		c.p.wg.Go(func() { d.read(q) })
		c.p.wg.Go(func() { d.write(q) })
	}
}

// close closes both connections, with an RST if reset (nothing flushed), once.
func (c *pair) close(reset bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked(reset)
}

func (c *pair) closeLocked(reset bool) {
	if c.closed {
		return
	}
	c.closed = true
	if reset {
		c.p.resets.Add(1)
		_ = c.client.SetLinger(0)
		_ = c.server.SetLinger(0)
	}
	c.client.Close()
	c.server.Close()
	close(c.done)
	c.p.mu.Lock()
	delete(c.p.pairs, c)
	c.p.mu.Unlock()
}

// end passes one direction's EOF on to dst, unless the pair is closed (a FIN after a
// reset would tell the peer of a clean end); after both directions, the pair is closed.
func (c *pair) end(dst *net.TCPConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	_ = dst.CloseWrite()
	c.halfs++
	if c.halfs == 2 {
		c.closeLocked(false)
	}
}

// read reads chunks from src into q until src ends or the pair closes. A byte from the
// server in Reset mode resets the pair instead.
func (d *direction) read(q chan<- chunk) {
	for {
		buf := make([]byte, 32<<10)
		n, err := d.src.Read(buf)
		if n > 0 {
			if f, _ := d.c.p.current(); f.Mode == Reset && !d.up {
				d.c.close(true)
				return
			}
			select {
			case q <- chunk{data: buf[:n], at: time.Now()}:
			case <-d.c.done:
				return
			}
		}
		if err != nil {
			select {
			case q <- chunk{eof: true}:
			case <-d.c.done:
			}
			return
		}
	}
}

// write delivers q's chunks to dst as the fault allows, and passes the end on.
func (d *direction) write(q <-chan chunk) {
	var next time.Time // Bandwidth: when the next byte may go
	for {
		var ch chunk
		select {
		case ch = <-q:
		case <-d.c.done:
			return
		}
		if ch.eof {
			d.c.end(d.dst)
			return
		}
		for len(ch.data) > 0 {
			n, ok := d.deliver(ch, &next)
			if !ok {
				return
			}
			ch.data = ch.data[n:]
		}
	}
}

// deliver writes what the current fault lets go of ch now, after waiting as it says; it
// returns how many bytes it wrote, and false if the pair is closed.
func (d *direction) deliver(ch chunk, next *time.Time) (int, bool) {
	for {
		f, changed := d.c.p.current()
		hold, wait, n := false, time.Duration(0), len(ch.data)
		switch f.Mode {
		case Hang, Cut:
			hold = true
		case HalfOpen:
			hold = d.up
		case Silent:
			hold = !d.up
		case Reset:
			if !d.up {
				d.c.close(true)
				return 0, false
			}
		case Latency:
			wait = time.Until(ch.at.Add(f.Delay))
		case Bandwidth:
			n = min(n, max(f.Rate/10, 1)) // a tenth of a second's worth at a time
			if now := time.Now(); next.Before(now) {
				*next = now
			}
			wait = time.Until(*next)
		}
		if !hold && wait <= 0 {
			if _, err := d.dst.Write(ch.data[:n]); err != nil {
				d.c.close(false)
				return 0, false
			}
			if f.Mode == Bandwidth {
				*next = next.Add(time.Duration(n) * time.Second / time.Duration(max(f.Rate, 1)))
			}
			return n, true
		}
		if !d.sleep(hold, wait, changed) {
			return 0, false
		}
	}
}

// sleep waits for wait (forever if hold) or until the fault changes; false if the pair
// closed meanwhile.
func (d *direction) sleep(hold bool, wait time.Duration, changed <-chan struct{}) bool {
	var timer <-chan time.Time
	if !hold {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-timer:
	case <-changed:
	case <-d.c.done:
		return false
	}
	return true
}
