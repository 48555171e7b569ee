package singleflight

import (
	"strings"
	"time"
)

// A follower looks its flight up again when nothing came for a lease and its owner's
// instance did not say it is alive, or when a read failed. The stream is the truth about
// its own attempt; the meta says what runs now.

// lookResult is what a look learnt.
type lookResult uint8

const (
	lookGoOn  lookResult = iota // go on following: the deadline moved, or a read is asked for
	lookBlind                   // Redis could not be asked: nothing was learnt of the attempt
	lookEnd                     // the follow is over
)

func (fw *follower) trust() {
	o := fw.l.r.g.opts
	fw.trustFor, fw.trustUntil = fw.l.pos.token, time.Now().Add(o.Timeout+o.LeaseTTL)
}

// lookAt is when the follower looks its flight up unless something comes: its deadline,
// or later while its owner's instance keeps saying it is alive (and is trusted to), as far
// as it said so after the deadline was set: a look asked for soon is not put off by what
// was heard before. byAlive says the alive messages set it: then no timer is needed for
// it, as the hub wakes the follower when they stop.
func (fw *follower) lookAt() (at time.Time, byAlive bool) {
	at = fw.deadline
	r := fw.l.r
	if fw.l.pos.token != fw.trustFor {
		fw.trust() // a new owner: trusted anew
	}
	if fw.alive == nil || fw.trustUntil.IsZero() || r.sharded() && r.degradedFor(fw.l.f.key) {
		// In a Cluster the alive messages are the owner instance's: they go on while the
		// flight's own shard is down, and then say nothing of this flight (see sharded).
		return at, false
	}
	until := r.wake.aliveUntil(fw.alive.channel)
	if !until.After(time.Now()) || !until.Add(-r.g.opts.LeaseTTL).After(fw.since) {
		// Silent for a lease: the hub has woken its watchers, and will not again until a
		// message comes. Only the deadline counts.
		return at, false
	}
	ext := until
	if fw.trustUntil.Before(ext) {
		ext = fw.trustUntil
	}
	if ext.After(at) {
		return ext, until.Before(fw.trustUntil)
	}
	return at, false
}

// lookUp looks the flight up. A look that found another attempt trusts its owner anew;
// one that found this attempt still running, after its owner said it stopped renewing it,
// waits for its lease alone.
func (fw *follower) lookUp() followState {
	known := fw.leaseEnd
	if at, _ := fw.lookAt(); at.After(fw.leaseEnd) {
		fw.leaseEnd = at // the owner said it is alive: its lease runs that long
	}
	switch fw.recheck() {
	case lookEnd:
		return followEnded
	case lookBlind:
		// In a Cluster the owner's alive messages, which are its instance's and go on while
		// this flight's own shard is down, extend neither its lease nor the trust in them.
		// On one server, those heard before it stopped answering each followed a renewal
		// of this lease: a restart that ends within it costs no call.
		if fw.l.r.sharded() {
			fw.leaseEnd = known
		}
		return followWait
	}
	fw.since = time.Now()
	if fw.l.pos.token != fw.trustFor || !fw.trustUntil.IsZero() {
		fw.trust()
	}
	return followWait
}

// recheck asks Redis what runs now, and decides whether to go on following (with the
// deadline moved or a read asked for) or how the attempt ended (fw.ending).
func (fw *follower) recheck() lookResult {
	l := fw.l
	r, f, pos := l.r, l.f, &l.pos
	if r.degradedFor(f.key) {
		return fw.blind()
	}
	d, err := r.lookup(f.key, f.noCache, "", f.call)
	if l.ctx.Err() != nil {
		fw.end(followEnd{kind: followDone})
		return lookEnd
	}
	if err != nil {
		return fw.blind()
	}
	f.sawRedis(d.clock)
	switch {
	case d.verdict == verdictFollow && d.token == pos.token:
		fw.deadline, fw.looks = time.Now().Add(d.remaining), 0
		fw.leaseEnd = fw.deadline
		return lookGoOn
	case d.verdict == verdictClaim && d.seen == seenAbsent && time.Now().Before(fw.leaseEnd):
		// Redis lost the flight (a restart without persistence, a failover): its owner
		// puts it back with its next write while its lease runs (restore.lua).
		fw.deadline = fw.leaseEnd
		return lookGoOn
	case d.verdict == verdictHit && d.token == pos.token:
		r.serveHit(f, d, pos) // our attempt's own answer: readers go on where they are
		fw.end(followEnd{kind: followDone})
		return lookEnd
	case d.verdict == verdictClaim && d.seen == seenExpired && d.token == pos.token:
		fw.end(followEnd{kind: followExpired})
		return lookEnd
	case fw.looks < 2:
		// Our attempt ended, or another began. The stream says which, in order: read what
		// follows our position before believing the meta. An attempt that finished wrote
		// its end before any later generation's first entry.
		fw.looks++
		fw.read = true
		fw.deadline = time.Now().Add(20 * time.Millisecond)
		return lookGoOn
	}
	switch d.verdict {
	case verdictHit: // our attempt's entries are gone (trimmed, or lost with a failover)
		r.serveHit(f, d, pos)
		fw.end(followEnd{kind: followDone})
		return lookEnd
	case verdictFollow:
		pos.switchTo(f, d)
		fw.deadline, fw.looks = time.Now().Add(d.remaining), 0
		fw.leaseEnd = fw.deadline
		fw.read = true
		return lookGoOn
	}
	fw.end(followEnd{kind: followExpired})
	return lookEnd
}

// blind is a look that could not ask Redis. While the owner's lease, as far as we know,
// runs on, a restart or a failover that ends before it costs no call of our own: look
// again soon. Past the lease, the flight goes local-only.
func (fw *follower) blind() lookResult {
	if now := time.Now(); now.Before(fw.leaseEnd) {
		fw.deadline = now.Add(pollEvery)
		if fw.leaseEnd.Before(fw.deadline) {
			fw.deadline = fw.leaseEnd
		}
		return lookBlind
	}
	fw.end(followEnd{kind: followRedisErr})
	return lookEnd
}

// tokenInstance is the instance id in a token ("seq-instance-local").
func tokenInstance(token string) string {
	_, rest, ok := strings.Cut(token, "-")
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return ""
	}
	return rest[:i]
}
