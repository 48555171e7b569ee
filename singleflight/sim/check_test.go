package sim

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// The invariants, checked on every run from its history: what each client got, each call
// the upstream saw, each fault, and each answer Redis acknowledged storing. A fault
// explains what it can cause for a while after it heals (settle); nothing else does. That
// no goroutine is left once the Groups close is synctest's own check: one still blocked
// when the bubble's function returns fails the run as a deadlock, and one still ticking
// keeps it from ending until the watchdog fails it.

const forever = time.Duration(math.MaxInt64 / 2)

func (w *world) violate(format string, args ...any) {
	w.mu.Lock()
	w.viol = append(w.viol, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

// settle is how long a healed fault may still explain what happens: a lease to run out,
// the jitter, a Redis operation's deadline and its retry, a heartbeat.
func (w *world) settle() time.Duration {
	o := w.cfg.opts
	return o.LeaseTTL + o.TakeoverJitter + 2*o.RedisTimeout + o.HeartbeatInterval
}

// explained names a fault that may explain what happened to key between from and to, for
// the instances given.
func (w *world) explained(key string, from, to time.Duration, insts ...string) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.faults {
		end := f.end
		if end < 0 {
			end = forever
		}
		if f.start > to || end+w.settle() < from {
			continue
		}
		switch {
		case f.inst != "":
			hit := false
			for _, in := range insts {
				hit = hit || in == f.inst
			}
			if !hit {
				continue
			}
		case f.node != "" && w.cl != nil && f.node != w.nodeOf(key):
			continue
		}
		return f.name, true
	}
	return "", false
}

// nodeIndex is the index in w.nodes of the node that holds key's flight.
func (w *world) nodeIndex(key string) int {
	for i, n := range w.nodes {
		if n.addr == w.nodeOf(key) {
			return i
		}
	}
	return 0
}

// nodeOf is the address of the Redis node that holds key's flight.
func (w *world) nodeOf(key string) string {
	if w.cl == nil {
		return w.nodes[0].addr
	}
	slot := int(crc16([]byte(key)) % 16384)
	for _, n := range w.nodes {
		if slot >= n.slots[0] && slot <= n.slots[1] {
			return n.addr
		}
	}
	return ""
}

// ack is a stored answer whose final write Redis acknowledged.
type ack struct {
	key  string
	at   time.Duration
	ttl  time.Duration
	call int // the call whose answer it is, from the stored body (0: not one of ours)
}

func (w *world) acked(key, ttlMs, body string) {
	ms, _ := strconv.ParseInt(ttlMs, 10, 64)
	a := ack{key: key, at: w.now(), ttl: time.Duration(ms) * time.Millisecond}
	if ns, _, ok := tokens([]byte(body)); ok && len(ns) > 0 {
		a.call = ns[0]
	}
	w.mu.Lock()
	w.acks = append(w.acks, a)
	w.mu.Unlock()
}

// check runs every invariant once the run is over.
func (w *world) check() {
	calls := w.up.snapshot()
	byKey := map[string][]call{}
	for _, c := range calls {
		byKey[c.key] = append(byKey[c.key], c)
	}
	for _, c := range w.clients {
		w.checkAnswer(c, calls)
		w.checkWait(c, byKey[c.key])
	}
	for _, cs := range byKey {
		w.checkSecondCalls(cs)
		for _, c := range cs {
			w.checkCut(c, calls)
		}
	}
	w.checkHits(calls)
}

// checkHits: a hit never serves an answer whose final write Redis refused (fenced: another
// owner took the flight over, and the flight's answer is that owner's), on any instance,
// once it was refused (before, an instance that cannot reach Redis answers for itself).
func (w *world) checkHits(calls []call) {
	for _, c := range w.clients {
		if c.role != singleflight.RoleHit || c.first == 0 {
			continue
		}
		ns, _, _ := tokens(c.body)
		if len(ns) == 0 {
			continue
		}
		if at, ok := w.refused[ns[0]]; ok && at < c.asked {
			w.violate("%s (%s, on %s) was served call %d as a hit at %s, whose final write Redis refused at %s",
				c, c.key, c.inst.id, ns[0], fmtAt(c.asked), fmtAt(at))
		}
	}
}

// fencedAnswer records a call whose answer's final write Redis refused.
func (w *world) fencedAnswer(body string) {
	ns, _, ok := tokens([]byte(body))
	if !ok || len(ns) == 0 {
		return
	}
	w.mu.Lock()
	if w.refused == nil {
		w.refused = map[int]time.Duration{}
	}
	if _, ok := w.refused[ns[0]]; !ok {
		w.refused[ns[0]] = w.now()
	}
	w.mu.Unlock()
}

// tokens splits a client's bytes into (call, chunk) pairs; chunk -1 is a failed answer.
func tokens(body []byte) (calls []int, chunks []int, ok bool) {
	if len(body) == 0 {
		return nil, nil, true
	}
	for _, p := range strings.Split(strings.TrimSuffix(string(body), ";"), ";") {
		f := strings.Split(p, ".")
		if len(f) != 3 {
			return nil, nil, false
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, nil, false
		}
		i, err := strconv.Atoi(f[2])
		if err != nil {
			i = -1
		}
		calls, chunks = append(calls, n), append(chunks, i)
	}
	return calls, chunks, true
}

// checkAnswer: every answer is whole and from one call; an error is one the README
// documents, after bytes of one call at most.
func (w *world) checkAnswer(c *client, calls []call) {
	if c.refused || c.lost {
		return
	}
	ns, idx, ok := tokens(c.body)
	if !ok {
		w.violate("%s (%s) got bytes that are no call's: %q", c, c.key, c.body)
		return
	}
	for i := range ns {
		if ns[i] != ns[0] || (idx[i] >= 0 && idx[i] != i) || (idx[i] < 0 && len(ns) > 1) {
			w.violate("%s (%s) got a mixed or holed answer: %s", c, c.key, c.bodyWord())
			return
		}
	}
	var from *call
	if len(ns) > 0 {
		from = &calls[ns[0]-1]
		if from.key != c.key {
			w.violate("%s asked %s and got an answer of %s", c, c.key, from.key)
			return
		}
	}
	switch {
	case c.left, c.err != nil && c.done >= w.endAt():
		return // it gave up, or the run ended under it
	case c.err != nil:
		documented := []error{singleflight.ErrFailed, singleflight.ErrShutdown, singleflight.ErrClosed}
		if len(ns) > 0 {
			documented = append(documented, singleflight.ErrGenerationChanged)
		}
		for _, e := range documented {
			if errors.Is(c.err, e) {
				return
			}
		}
		w.violate("%s (%s) got an error the README does not document for it: %v", c, c.key, c.err)
	case from == nil:
		w.violate("%s (%s) was answered %d with no bytes", c, c.key, c.status)
	case c.status == 200 && (string(c.body) != from.body() || from.how != "ok"):
		w.violate("%s (%s) was answered 200 with %s, not call %d whole (%s)", c, c.key, c.bodyWord(), from.n, from.how)
	case c.status != 200 && (idx[0] >= 0 || from.how == "ok"):
		w.violate("%s (%s) was answered %d with bytes of call %d, which %s", c, c.key, c.status, from.n, from.how)
	case c.role == singleflight.RoleHit && from.outcome != singleflight.Store:
		w.violate("%s (%s) was served call %d as a hit, which was not to be stored", c, c.key, from.n)
	}
}

func (w *world) endAt() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended
}

// checkSecondCalls: no second call for a key while its first could still serve: while it
// runs, or while its acknowledged answer is stored, unless a fault, a cut or the caller's
// no-cache explains it.
func (w *world) checkSecondCalls(cs []call) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].start < cs[j].start })
	for j := 1; j < len(cs); j++ {
		c2 := cs[j]
		for _, c1 := range cs[:j] {
			live := !c1.ended || c1.end > c2.start
			if !live {
				continue
			}
			if c1.ended && errors.Is(c1.cause, singleflight.ErrAbandoned) {
				continue // cut: checkCut judges whether it should have been
			}
			if _, ok := w.explained(c2.key, c1.start, c2.start, c1.inst, c2.inst); ok {
				continue
			}
			w.violate("%s: call %d started on %s at %s while call %d (on %s since %s) ran, and nothing explains it",
				c2.key, c2.n, c2.inst, fmtAt(c2.start), c1.n, c1.inst, fmtAt(c1.start))
		}
		if c2.by != nil && c2.by.noCache {
			continue
		}
		for _, a := range w.acks {
			if a.key != c2.key || a.at >= c2.start || c2.start >= a.at+a.ttl || w.lost(a) {
				continue
			}
			if _, ok := w.explained(c2.key, a.at, c2.start, c2.inst); ok {
				continue
			}
			w.violate("%s: call %d started on %s at %s while the answer Redis acknowledged at %s was stored",
				c2.key, c2.n, c2.inst, fmtAt(c2.start), fmtAt(a.at))
		}
	}
}

// lost reports whether a fault that loses data came after an acknowledged write.
func (w *world) lost(a ack) bool {
	for _, f := range w.faults {
		if f.loses && f.end >= a.at && (w.cl == nil || f.node == w.nodeOf(a.key)) {
			return true
		}
	}
	return false
}

// spans is a set of time intervals [from, to).
type spans []span

type span struct{ from, to time.Duration }

// gaps lists the stretches of [from, to) that no span covers.
func (ss spans) gaps(from, to time.Duration) []span {
	sorted := append(spans(nil), ss...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].from < sorted[j].from })
	var out []span
	at := from
	for _, s := range sorted {
		if s.from > at && at < to {
			out = append(out, span{at, min(s.from, to)})
		}
		at = max(at, s.to)
	}
	if at < to {
		out = append(out, span{at, to})
	}
	return out
}

// faultSpans are the times faults that concern key may explain, for the instances given
// (nil: any).
func (w *world) faultSpans(key string, insts ...string) spans {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ss spans
	for _, f := range w.faults {
		if f.inst != "" && insts != nil {
			hit := false
			for _, in := range insts {
				hit = hit || in == f.inst
			}
			if !hit {
				continue
			}
		}
		if f.inst == "" && f.node != "" && w.cl != nil && f.node != w.nodeOf(key) {
			continue
		}
		to := f.end
		if to < 0 {
			to = forever
		}
		ss = append(ss, span{f.start, to + w.settle() + f.after})
	}
	return ss
}

// checkWait: nobody waits long with no call of its key running and no fault to explain it.
func (w *world) checkWait(c *client, cs []call) {
	if c.refused || c.inst == nil {
		return
	}
	insts := []string{c.inst.id}
	var cover spans
	for _, cl := range cs {
		to := forever
		if cl.ended {
			to = cl.end + 100*time.Millisecond
		}
		cover = append(cover, span{cl.start, to})
		insts = append(insts, cl.inst)
	}
	cover = append(cover, w.faultSpans(c.key, insts...)...)
	o := w.cfg.opts
	gapMax := o.TakeoverJitter + o.RedisTimeout + 100*time.Millisecond
	for _, g := range cover.gaps(c.asked, c.done) {
		if g.to-g.from > gapMax {
			w.violate("%s (%s, on %s) waited from %s to %s with no call of its key running and no fault",
				c, c.key, c.inst.id, fmtAt(g.from), fmtAt(g.to))
			return
		}
	}
}

// checkCut: a call is cut only when nobody waits for it, and is cut within the grace (and
// a heartbeat) once nobody does, unless a fault kept Redis from being asked or from knowing:
// an instance that cannot be heard from (killed, cut off, paused) may still have clients
// waiting, so its marks stand (ADR 0074); a meta Redis lost and an owner put back asks that
// the call finish (restore.lua).
func (w *world) checkCut(cl call, calls []call) {
	o := w.cfg.opts
	waits := w.waitsFor(cl, calls)
	if cl.ended && errors.Is(cl.cause, singleflight.ErrAbandoned) {
		t := cl.end - 10*time.Millisecond // a client that asked as the cut landed could not stop it
		for _, wt := range waits {
			if wt.from <= t && wt.to > cl.end {
				c := wt.c
				if _, ok := w.explained(cl.key, c.asked, cl.end, c.inst.id, cl.inst); ok {
					continue
				}
				w.violate("%s: call %d was cut at %s while %s (on %s, since %s) waited for it",
					cl.key, cl.n, fmtAt(cl.end), c, c.inst.id, fmtAt(c.asked))
			}
		}
		return
	}
	end := cl.end
	if !cl.ended {
		end = w.endAt()
	}
	for _, c := range w.clients {
		// finish stays in the meta across a flight's attempts, whose lives chain within a
		// linger of each other (0074: a takeover keeps it).
		if c.key == cl.key && c.finish && c.asked <= end && (c.done == 0 || c.done >= cl.start-o.Linger) {
			return // asked to finish
		}
	}
	var busy spans
	insts := []string{cl.inst}
	for _, wt := range waits {
		busy = append(busy, wt.span)
		insts = append(insts, wt.c.inst.id)
	}
	busy = append(busy, w.faultSpans(cl.key, insts...)...)
	faults := w.faultsCopy()
	for _, f := range faults {
		if f.loses && f.start <= end && f.end >= cl.start && (w.cl == nil || f.node == w.nodeOf(cl.key)) {
			return // the meta was lost and put back: the call finishes (restore.lua)
		}
		if f.name == "shutdown" && w.unreachableDuring(faults, f) {
			// An instance that closes while Redis cannot be asked leaves its marks (0080).
			busy = append(busy, span{f.start, forever})
		}
	}
	bound := o.AbandonGrace + o.HeartbeatInterval + 50*time.Millisecond
	for _, g := range busy.gaps(cl.start, end) {
		if g.to-g.from > bound {
			w.violate("%s: call %d (on %s) ran on from %s to %s with nobody waiting, past the grace",
				cl.key, cl.n, cl.inst, fmtAt(g.from), fmtAt(g.to))
			return
		}
	}
}

// wait is a client's time waiting for one call.
type wait struct {
	span
	c *client
}

// waitsFor are the times clients may have waited for call cl: those of its key, until they
// were answered by it, or by nothing, or until the call that answered them started; on its
// instance, or on one that ran no call of that key of its own meanwhile (a local-only call
// while Redis could not be asked).
func (w *world) waitsFor(cl call, calls []call) []wait {
	var out []wait
	for _, c := range w.clients {
		if c.key != cl.key || c.refused || c.inst == nil {
			continue
		}
		to := c.done
		if ns, _, _ := tokens(c.body); len(ns) > 0 && ns[0] != cl.n {
			if by := calls[ns[0]-1]; by.start < to {
				to = by.start
			}
		}
		own := false
		for _, o := range calls {
			own = own || o.key == cl.key && o.n != cl.n && o.inst == c.inst.id && c.inst.id != cl.inst &&
				o.start < to && (!o.ended || o.end > c.asked)
		}
		if !own && c.asked < to {
			out = append(out, wait{span{c.asked, to}, c})
		}
	}
	return out
}

// unreachableDuring reports whether sd's instance could not reach Redis while it shut down.
func (w *world) unreachableDuring(faults []fault, sd fault) bool {
	for _, f := range faults {
		end := f.end
		if end < 0 {
			end = forever
		}
		if f.name != "shutdown" && (f.inst == "" || f.inst == sd.inst) && f.start <= sd.end && end+w.settle() >= sd.start {
			return true
		}
	}
	return false
}

func (w *world) faultsCopy() []fault {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]fault(nil), w.faults...)
}

// checkExpiry: every key the project wrote expires.
func (w *world) checkExpiry() {
	for _, n := range w.nodes {
		m := n.miniredis()
		for _, k := range m.Keys() {
			if m.TTL(k) <= 0 {
				w.violate("%s: key %s has no TTL", n.addr, k)
			}
		}
	}
}

// crc16 is Redis Cluster's key hash (XMODEM), of a key's hash tag when it has one.
func crc16(key []byte) uint16 {
	if i := strings.IndexByte(string(key), '{'); i >= 0 {
		if j := strings.IndexByte(string(key[i+1:]), '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for _, b := range key {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
