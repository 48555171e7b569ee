package singleflight

import (
	"strings"
	"time"
)

// lookResult is what a follower's look learnt. The stream is the truth about its own
// attempt; the meta says what runs now (ADR 0006).
type lookResult uint8

const (
	lookGoOn  lookResult = iota // go on following: the deadline moved, or a read is asked for
	lookBlind                   // Redis could not be asked: nothing was learnt of the attempt
	lookEnd                     // the follow is over
)

// trust believes the current owner's alive messages for as long as the follow has lasted,
// one lease at least and ten at most: a lost word costs no more than that (ADR 0082).
func (fw *follower) trust() {
	lease := fw.l.r.g.opts.LeaseTTL
	fw.trustFor, fw.trustUntil = fw.l.pos.token, time.Now().Add(min(max(time.Since(fw.start), lease), 10*lease))
}

// lookAt is when the follower looks its flight up unless something comes: its deadline,
// or later while its trusted owner says it is alive, heard since the deadline was set.
// byAlive says the alive messages set it: the hub wakes the follower when they stop.
func (fw *follower) lookAt() (at time.Time, byAlive bool) {
	at = fw.deadline
	r := fw.l.r
	if fw.l.pos.token != fw.trustFor {
		fw.trust() // a new owner: trusted anew, once seen at work
		fw.renewed = false
	}
	if !fw.renewed || fw.alive == nil || fw.trustUntil.IsZero() || r.sharded() && r.degradedFor(fw.l.f.key) {
		return at, false // a Cluster's alive messages say nothing of a down shard (ADR 0023)
	}
	// moving: until moves with each alive message, and the hub wakes the follower when they
	// stop; a bound below it does not move, and needs a timer.
	until, moving := r.wake.AliveUntil(fw.alive.Channel(), fw.l.pos.token)
	if since := r.wake.UnconfirmedSince(fw.stream); !since.IsZero() && since.Add(r.g.opts.LeaseTTL).Before(until) {
		// Alive messages heard while the flight's own channel is not known to hold put its
		// look-up off no further than a lease (ADR 0055).
		until, moving = since.Add(r.g.opts.LeaseTTL), false
	}
	if !until.After(time.Now()) || !until.Add(-r.g.opts.LeaseTTL).After(fw.since) {
		return at, false // silent for a lease: only the deadline counts
	}
	ext := until
	if fw.trustUntil.Before(ext) {
		ext = fw.trustUntil
	}
	if ext.After(at) {
		return ext, moving && until.Before(fw.trustUntil)
	}
	return at, false
}

// look looks the flight up; an attempt said gone is waited on for its lease alone.
func (fw *follower) look() followState {
	known := fw.leaseEnd
	if at, _ := fw.lookAt(); at.After(fw.leaseEnd) {
		fw.leaseEnd = at // the owner said it is alive: its lease runs that long
	}
	switch fw.recheck() {
	case lookEnd:
		return followEnded
	case lookBlind:
		// A blind look extends no lease in a Cluster; on one server the alive messages
		// heard stand (ADR 0023).
		if fw.l.r.sharded() {
			fw.leaseEnd = known
		}
		return followWait
	}
	fw.since = time.Now()
	if !fw.saidGone() {
		fw.trust()
	}
	return followWait
}

// recheck asks Redis what runs now: go on following, or how the attempt ended (fw.ending).
func (fw *follower) recheck() lookResult {
	l := fw.l
	r, f, pos := l.r, l.f, &l.pos
	if !r.usableAfterVerdict(l.ctx, f.key) {
		return fw.blind() // a look would wait on a Redis that may hang (ADR 0056)
	}
	mark, callers := f.mark()
	d, err := r.lookup(f.key, f.noCache, "", f.call, mark, callers)
	if l.ctx.Err() != nil {
		fw.end(followEnd{kind: followLeft})
		return lookEnd
	}
	if err != nil {
		return fw.blind()
	}
	f.sawRedis(d.clock)
	if r.g.hooks.looked != nil {
		r.g.hooks.looked(d)
	}
	if fw.outage {
		// The first answer after an outage: an owner that lost Redis too writes late.
		fw.outage, fw.lateUntil = false, time.Now().Add(r.g.opts.LeaseTTL)
	}
	switch {
	case d.verdict == verdictFollow && d.token == pos.token:
		fw.deadline, fw.looks = time.Now().Add(d.remaining), 0
		fw.renewed = fw.renewed || fw.deadline.After(fw.leaseEnd)
		fw.leaseEnd = fw.deadline
		return lookGoOn
	case d.verdict == verdictClaim && d.seen == seenAbsent && time.Now().Before(fw.leaseEnd):
		fw.deadline = fw.leaseEnd // its owner puts it back while its lease runs (ADR 0010)
		return lookGoOn
	case d.verdict == verdictHit && d.token == pos.token:
		r.serveHit(f, d, pos) // our attempt's own answer: readers go on where they are
		fw.end(followEnd{kind: followDone})
		return lookEnd
	case d.verdict == verdictClaim && d.seen == seenExpired && d.token == pos.token:
		if fw.waitsLate() {
			fw.deadline = fw.lateUntil
			return lookGoOn
		}
		fw.end(followEnd{kind: followExpired})
		return lookEnd
	case fw.looks < 2:
		// The stream before the meta (ADR 0006).
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

// waitsLate reports whether an attempt whose lease ran out is waited for a while after an
// outage: its owner, which may have lost Redis too, makes its final write once Redis answers
// it, unless it said the token gone; the token decides whether it lands (ADR 0060).
func (fw *follower) waitsLate() bool {
	return !fw.saidGone() && time.Now().Before(fw.lateUntil) && !fw.l.f.canUseNewGen()
}

// saidGone reports whether the owner's instance said the followed token gone (see heardAlive).
func (fw *follower) saidGone() bool {
	return fw.trustFor == fw.l.pos.token && fw.trustUntil.IsZero()
}

// blind is a look Redis did not answer: look again while the lease runs, unless Redis
// hangs (ADR 0023); with callers that have bytes, until Redis answers (ADR 0060).
func (fw *follower) blind() lookResult {
	now := time.Now()
	if !fw.l.f.canUseNewGen() && now.Before(fw.outlastUntil()) {
		fw.outage, fw.deadline = true, now.Add(pollEvery)
		return lookBlind
	}
	if now.Before(fw.leaseEnd) && !fw.l.r.hangingFor(fw.l.f.key) {
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
