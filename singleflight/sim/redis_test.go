package sim

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// The Redis stand-in: each node a miniredis, which runs the project's own Lua scripts with
// gopher-lua, its clock the bubble's (ClockTTL), served over the simulated network. What it
// adds to miniredis: a Cluster's slot map and its bus (a PUBLISH reaches every node), a lost
// pub/sub message, and a restart from a snapshot. conformance_test.go checks its replies
// against a real redis-server.

// node is one Redis server.
type node struct {
	addr  string
	cl    *cluster // nil: standalone
	slots [2]int   // in a Cluster, the slots it serves (inclusive)
	lose  atomic.Int32
	lost  func(channel string) // told of each message lost (set by the world before any client)
	seen  sync.Map             // the names of the commands it ran, scripts' own calls included

	mu    sync.Mutex
	m     *miniredis.Miniredis
	up    bool
	snap  *snapshot
	downs int // restarts under way: the server is up again once the last one ends
}

func newNode(addr string) *node {
	n := &node{addr: addr}
	n.m = n.start(nil)
	n.up = true
	return n
}

// start makes a miniredis loaded with snap (nil: empty) and serving no connection yet.
func (n *node) start(snap *snapshot) *miniredis.Miniredis {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	c, err := m.Dial() // starts its server, without a listener
	if err != nil {
		panic(err)
	}
	_ = c.Close()
	m.Server().SetPreHook(n.hook)
	snap.load(m)
	return m
}

// serve hands a new connection's server end to the node; false: nothing listens.
func (n *node) serve(c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up {
		return false
	}
	n.m.Server().ServeConn(c)
	return true
}

// hook runs before every command, those of scripts included (with the server's lock held:
// it takes no lock of the node's).
func (n *node) hook(p *server.Peer, cmd string, args ...string) bool {
	n.seen.Store(cmd, true)
	switch cmd {
	case "PUBLISH":
		if n.lose.Load() > 0 && n.lose.Add(-1) >= 0 {
			if n.lost != nil && len(args) > 0 {
				n.lost(args[0])
			}
			p.WriteInt(0)
			return true
		}
		if n.cl != nil && len(args) == 2 {
			n.cl.bus.send(n, args[0], args[1])
		}
	case "CLUSTER":
		if n.cl != nil && len(args) > 0 {
			return n.cl.answer(p, strings.ToUpper(args[0]))
		}
	}
	return false
}

// miniredis returns the server as it is now (a restart replaces it).
func (n *node) miniredis() *miniredis.Miniredis {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.m
}

// takeSnapshot keeps what a restart will come back with (an RDB save, or what a replica had).
func (n *node) takeSnapshot() {
	m := n.miniredis()
	s := takeSnapshot(m)
	n.mu.Lock()
	n.snap = s
	n.mu.Unlock()
}

// stop ends the server: every connection is closed, nothing listens.
func (n *node) stop() {
	n.mu.Lock()
	m := n.m
	n.up = false
	n.mu.Unlock()
	m.Close()
}

// halt stops the server for a restart; false: another restart holds it down already.
func (n *node) halt() bool {
	n.mu.Lock()
	n.downs++
	first := n.downs == 1
	n.mu.Unlock()
	if first {
		n.stop()
	}
	return first
}

// restart brings the server back from its last snapshot (empty without one) once no other
// restart holds it down: what was written since is lost, and so are its scripts and
// subscriptions. False: another restart holds it down still.
func (n *node) restart() bool {
	n.mu.Lock()
	n.downs--
	last, snap := n.downs == 0, n.snap
	n.mu.Unlock()
	if !last {
		return false
	}
	m := n.start(snap)
	n.mu.Lock()
	n.m, n.up = m, true
	n.mu.Unlock()
	return true
}

// snapshot is the data of a server at one time.
type snapshot struct {
	at   time.Time
	keys []snapKey
}

type snapKey struct {
	key, typ string
	str      string
	hash     []string // field, value, ...
	stream   []miniredis.StreamEntry
	ttl      time.Duration // 0: none
}

func takeSnapshot(m *miniredis.Miniredis) *snapshot {
	s := &snapshot{at: time.Now()}
	for _, k := range m.Keys() {
		sk := snapKey{key: k, typ: m.Type(k), ttl: m.TTL(k)}
		switch sk.typ {
		case "string":
			sk.str, _ = m.Get(k)
		case "hash":
			fields, _ := m.HKeys(k)
			for _, f := range fields {
				sk.hash = append(sk.hash, f, m.HGet(k, f))
			}
		case "stream":
			sk.stream, _ = m.Stream(k)
		default:
			continue
		}
		s.keys = append(s.keys, sk)
	}
	return s
}

// load writes s into m, with the time passed since it was taken off each TTL, as a server
// that keeps absolute expiry times does.
func (s *snapshot) load(m *miniredis.Miniredis) {
	if s == nil {
		return
	}
	gone := time.Since(s.at)
	for _, k := range s.keys {
		if k.ttl > 0 && k.ttl <= gone {
			continue
		}
		switch k.typ {
		case "string":
			_ = m.Set(k.key, k.str)
		case "hash":
			m.HSet(k.key, k.hash...)
		case "stream":
			for _, e := range k.stream {
				_, _ = m.XAdd(k.key, e.ID, e.Values)
			}
		}
		if k.ttl > 0 {
			m.SetTTL(k.key, k.ttl-gone)
		}
	}
}

// cluster is several nodes sharing the slots, and a bus that carries every PUBLISH to all.
type cluster struct {
	nodes []*node
	bus   *bus
}

func newCluster(addrs []string) *cluster {
	c := &cluster{bus: newBus()}
	per := 16384 / len(addrs)
	for i, a := range addrs {
		n := newNode(a)
		n.cl = c
		n.slots = [2]int{i * per, (i+1)*per - 1}
		if i == len(addrs)-1 {
			n.slots[1] = 16383
		}
		c.nodes = append(c.nodes, n)
	}
	c.bus.nodes = c.nodes
	return c
}

// answer replies to the CLUSTER commands a client sends to learn the layout.
func (c *cluster) answer(p *server.Peer, sub string) bool {
	switch sub {
	case "SLOTS":
		p.WriteLen(len(c.nodes))
		for _, n := range c.nodes {
			host, port, _ := net.SplitHostPort(n.addr)
			pn, _ := strconv.Atoi(port)
			p.WriteLen(3)
			p.WriteInt(n.slots[0])
			p.WriteInt(n.slots[1])
			p.WriteLen(3)
			p.WriteBulk(host)
			p.WriteInt(pn)
			p.WriteBulk(strings.Repeat(host, 40)[:40])
		}
		return true
	case "INFO":
		p.WriteBulk("cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_known_nodes:" +
			strconv.Itoa(len(c.nodes)) + "\r\n")
		return true
	}
	return false
}

// bus carries a PUBLISH from the node it was sent to to every other node, in order, on a
// goroutine of its own: never under a server's lock.
type bus struct {
	nodes []*node

	mu      sync.Mutex
	queue   []busMsg
	notify  chan struct{}
	stopped bool
	done    chan struct{}
}

type busMsg struct {
	from         *node
	channel, msg string
}

func newBus() *bus { return &bus{notify: make(chan struct{}, 1), done: make(chan struct{})} }

func (b *bus) send(from *node, channel, msg string) {
	b.mu.Lock()
	b.queue = append(b.queue, busMsg{from, channel, msg})
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

func (b *bus) run() {
	defer close(b.done)
	for {
		b.mu.Lock()
		q, stopped := b.queue, b.stopped
		b.queue = nil
		b.mu.Unlock()
		for _, m := range q {
			for _, n := range b.nodes {
				if n != m.from {
					n.mu.Lock()
					up, srv := n.up, n.m
					n.mu.Unlock()
					if up {
						srv.Publish(m.channel, m.msg)
					}
				}
			}
		}
		if stopped {
			return
		}
		<-b.notify
	}
}

func (b *bus) stop() {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
	<-b.done
}
