package sim

import (
	"bufio"
	"strings"
	"time"
)

// Faults, each an event of a schedule: it starts at a virtual time and, unless it is for
// good, heals. Each one is recorded with the span of time it may explain (check_test.go).

// fault is one injected fault, as the checks see it.
type fault struct {
	name       string
	start, end time.Duration // end < 0: for good
	inst       string        // the instance it hits; "" for Redis
	node       string        // the Redis address it hits; "" for all (or an instance's fault)
	loses      bool          // Redis lost data: answers stored before it may be gone
	// after: how much longer than w.settle it may explain waits once it is over.
	after time.Duration
}

func (w *world) addFault(f fault) {
	w.mu.Lock()
	w.faults = append(w.faults, f)
	w.mu.Unlock()
}

// eachLink calls f with every link from inst ("" every instance) to addr ("" every address).
func (w *world) eachLink(inst, addr string, f func(*link)) {
	for _, in := range w.insts {
		for _, n := range w.nodes {
			if (inst == "" || inst == in.id) && (addr == "" || addr == n.addr) {
				f(w.link(in.id, n.addr))
			}
		}
	}
}

// setLinks puts a fault asking for state s in force on those links (on), or ends it: then
// what each held goes a few µs after the previous link's, instance by instance.
func (w *world) setLinks(inst, addr string, s linkState, on bool) {
	var after time.Duration
	w.eachLink(inst, addr, func(l *link) {
		l.apply(s, on, after)
		after += 20 * time.Microsecond
	})
}

func (w *world) nodeAddr(i int) string {
	if i < 0 || len(w.nodes) == 0 {
		return ""
	}
	return w.nodes[i%len(w.nodes)].addr
}

// hangRedis: node i (-1 every node) answers nothing for d; connections stay open, dials
// succeed, and what was sent meanwhile is answered once it resumes (a paused server).
func (w *world) hangRedis(at, d time.Duration, i int) {
	addr := w.nodeAddr(i)
	w.addFault(fault{name: "redis hangs", start: at, end: at + d, node: addr})
	w.at(at, func() {
		w.hist.add("redis", kFault, "", "%s hangs for %s", nodeName(addr), d)
		w.setLinks("", addr, linkHeld, true)
	})
	w.at(at+d, func() {
		w.hist.add("redis", kFault, "", "%s answers again", nodeName(addr))
		w.setLinks("", addr, linkHeld, false)
	})
}

// nodeName is how the timeline names a Redis address ("" for all of them): the sim's
// addresses are IPs, which go-redis uses without asking a resolver.
func nodeName(addr string) string {
	if addr == "" {
		return "redis"
	}
	return "redis " + strings.TrimSuffix(addr, ":6379")
}

// slowRedis: node i answers extra later, both ways, for d.
func (w *world) slowRedis(at, d, extra time.Duration, i int) {
	addr := w.nodeAddr(i)
	w.addFault(fault{name: "redis slow", start: at, end: at + d, node: addr})
	w.at(at, func() {
		w.hist.add("redis", kFault, "", "%s answers %s late, for %s", nodeName(addr), extra, d)
		w.eachLink("", addr, func(l *link) { l.slow(extra, true) })
	})
	w.at(at+d, func() {
		w.hist.add("redis", kFault, "", "%s answers on time again", nodeName(addr))
		w.eachLink("", addr, func(l *link) { l.slow(extra, false) })
	})
}

// dropConns: node i closes every connection (a client kill, a proxy restarting); dials work.
func (w *world) dropConns(at time.Duration, i int) {
	addr := w.nodeAddr(i)
	w.addFault(fault{name: "connections dropped", start: at, end: at, node: addr})
	w.at(at, func() {
		w.hist.add("redis", kFault, "", "%s drops every connection", nodeName(addr))
		w.eachLink("", addr, (*link).resetAll)
	})
}

// restartRedis: node i stops at at, for down, and comes back with what it had at snapshot
// (a time before at; what was written since is lost, as an RDB save or a lagging replica
// loses it; snapshot < 0: comes back empty). Its scripts and subscriptions are gone.
func (w *world) restartRedis(at, down, snapshot time.Duration, i int) {
	n := w.nodes[i%len(w.nodes)]
	w.addFault(fault{name: "redis restarts", start: min(at, max(snapshot, 0)), end: at + down, node: n.addr, loses: true})
	if snapshot >= 0 {
		w.at(snapshot, func() {
			w.hist.add("redis", kFault, "", "%s saves a snapshot", nodeName(n.addr))
			n.takeSnapshot()
		})
	}
	// Restarts that overlap keep the server down until the last one ends.
	w.at(at, func() {
		w.hist.add("redis", kFault, "", "%s stops", nodeName(n.addr))
		w.eachLink("", n.addr, (*link).resetAll) // in a known order, before the server drops them
		n.halt()
	})
	w.at(at+down, func() {
		if n.restart() {
			w.hist.add("redis", kFault, "", "%s starts from its snapshot", nodeName(n.addr))
		} else {
			w.hist.add("redis", kFault, "", "%s stays down: another restart holds it", nodeName(n.addr))
		}
	})
}

// losePublish: node i loses its next count published messages; each loss is a fault of
// its own, at the time the message would have gone.
func (w *world) losePublish(at time.Duration, count int, i int) {
	n := w.nodes[i%len(w.nodes)]
	w.at(at, func() {
		w.hist.add("redis", kFault, "", "%s will lose its next %d published messages", nodeName(n.addr), count)
		n.lose.Add(int32(count))
	})
}

// lostMessage records a message a node lost (its hook calls it, under the server's lock).
func (w *world) lostMessage(n *node, channel string) {
	now := w.now()
	// A follower that missed it believes its owner's alive messages ten leases at most (ADR 0082).
	w.addFault(fault{name: "pub/sub message lost", start: now, end: now, node: n.addr, after: 10 * w.cfg.opts.LeaseTTL})
	w.hist.add("redis", kFault, "", "%s loses a message on %s", nodeName(n.addr), channel)
}

// flushScripts: node i forgets every script (SCRIPT FLUSH).
func (w *world) flushScripts(at time.Duration, i int) {
	n := w.nodes[i%len(w.nodes)]
	w.addFault(fault{name: "scripts flushed", start: at, end: at, node: n.addr})
	w.at(at, func() {
		w.hist.add("redis", kFault, "", "%s forgets its scripts", nodeName(n.addr))
		c, err := n.miniredis().Dial()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("*2\r\n$6\r\nSCRIPT\r\n$5\r\nFLUSH\r\n"))
		_, _ = bufio.NewReader(c).ReadString('\n')
	})
}

// partition cuts inst from Redis for d: what it sends is held, dials hang; then it heals.
func (w *world) partition(at, d time.Duration, inst string) {
	w.addFault(fault{name: "partition", start: at, end: at + d, inst: inst})
	w.at(at, func() {
		w.hist.add(inst, kFault, "", "cut off from Redis for %s", d)
		w.setLinks(inst, "", linkCut, true)
	})
	w.at(at+d, func() {
		w.hist.add(inst, kFault, "", "reaches Redis again")
		w.setLinks(inst, "", linkCut, false)
	})
}

// pause stops inst for d: its connections are frozen and its clients and upstream calls
// read nothing; then it resumes with what it believed. Its own timers still run (a real
// SIGSTOP stops them too: the e2e suite pauses real processes).
func (w *world) pause(at, d time.Duration, inst string) {
	in := w.instance(inst)
	w.addFault(fault{name: "pause", start: at, end: at + d, inst: inst})
	w.at(at, func() {
		w.hist.add(inst, kFault, "", "paused for %s", d)
		in.mu.Lock()
		if in.pauses++; in.pauses == 1 {
			in.paused = make(chan struct{})
		}
		in.mu.Unlock()
		w.setLinks(inst, "", linkHeld, true)
	})
	w.at(at+d, func() {
		w.hist.add(inst, kFault, "", "resumes")
		w.setLinks(inst, "", linkHeld, false)
		in.mu.Lock()
		if in.pauses--; in.pauses == 0 && in.paused != nil {
			close(in.paused)
			in.paused = nil
		}
		in.mu.Unlock()
	})
}

// kill ends inst for good: what it had sent is still delivered, nothing more; its
// clients' connections break and its upstream calls end.
func (w *world) kill(at time.Duration, inst string) {
	in := w.instance(inst)
	w.addFault(fault{name: "kill", start: at, end: -1, inst: inst})
	w.at(at, func() {
		if in.dead.Swap(true) {
			return // killed already
		}
		w.hist.add(inst, kFault, "", "killed")
		w.setLinks(inst, "", linkDead, true)
		close(in.killed)
	})
}

// shutdown closes inst gracefully: new clients go elsewhere, its owned calls may finish
// for grace, then are released to other instances.
func (w *world) shutdown(at, grace time.Duration, inst string) {
	in := w.instance(inst)
	w.addFault(fault{name: "shutdown", start: at, end: at + grace, inst: inst})
	w.at(at, func() {
		w.hist.add(inst, kFault, "", "shuts down, %s for its calls", grace)
		in.draining.Store(true) // the balancer sends no new client
		in.close(grace)
		w.hist.add(inst, kFault, "", "closed")
	})
}
