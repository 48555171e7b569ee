package singleflight

import (
	"strings"
	"time"
)

// lookResult is what a follower's look learnt. The stream is the truth about its own
// attempt; the meta says what runs now (ADR 0006).
type lookResult uint8

const (
	lookGoOn   lookResult = iota // go on following: the clock moved, or a read is asked for
	lookNoWord                   // Redis could not be asked: nothing was learnt of the attempt
	lookEnd                      // the follow is over
)

// look looks the flight up; an attempt said gone is waited on for its lease alone.
func (fw *follower) look() followState {
	fw.l.r.g.observe(Event{Kind: EventLook, Key: fw.l.f.key, Reason: fw.lookWhy.String()})
	fw.clock.looking(time.Now(), fw.aliveView())
	switch fw.recheck() {
	case lookEnd:
		return followEnded
	case lookNoWord:
		fw.clock.blindLook(fw.l.r.sharded())
		return followWait
	}
	fw.clock.looked(time.Now())
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
		// A look that timed out was watched: the PING that suspected its server decides by
		// then, and the follower acts on its verdict (ADR 0056).
		r.awaitVerdict(l.ctx, f.key)
		return fw.blind()
	}
	f.sawRedis(d.clock)
	if r.g.hooks.looked != nil {
		r.g.hooks.looked(d)
	}
	now := time.Now()
	fw.clock.answered(now)
	switch {
	case d.verdict == verdictFollow && d.token == pos.token:
		fw.clock.found(now, d.remaining)
		fw.looks = 0
		return lookGoOn
	case d.verdict == verdictClaim && d.seen == seenAbsent && now.Before(fw.clock.leaseEnd):
		fw.clock.restoring() // its owner puts it back while its lease runs (ADR 0010)
		return lookGoOn
	case d.verdict == verdictHit && d.token == pos.token:
		r.serveHit(f, d, pos) // our attempt's own answer: readers go on where they are
		fw.end(followEnd{kind: followDone})
		return lookEnd
	case d.verdict == verdictClaim && d.seen == seenExpired && d.token == pos.token:
		fw.clock.ranOut(now)
		if fw.waitsLate() {
			fw.clock.late()
			return lookGoOn
		}
		fw.end(followEnd{kind: followExpired})
		return lookEnd
	case fw.looks < 2:
		// The stream before the meta (ADR 0006).
		fw.looks++
		fw.read = true
		fw.clock.rereading(now)
		return lookGoOn
	}
	switch d.verdict {
	case verdictHit: // our attempt's entries are gone (trimmed, or lost with a failover)
		r.serveHit(f, d, pos)
		fw.end(followEnd{kind: followDone})
		return lookEnd
	case verdictFollow:
		pos.switchTo(f, d)
		fw.clock.switched(now, d.remaining, d.token)
		fw.looks, fw.read = 0, true
		return lookGoOn
	}
	fw.end(followEnd{kind: followExpired})
	return lookEnd
}

// waitsLate reports whether an attempt whose lease ran out is waited for a while, by callers
// with bytes, whom no other attempt can serve: a takeover jitter after it was first found run
// out (a renewal late, ADR 0086), or a lease after an outage, when its owner, which may have
// lost Redis too, makes its final write once Redis answers it (ADR 0060). Not once its owner's instance said
// the token gone; the token decides whether a late write lands.
func (fw *follower) waitsLate() bool {
	c := &fw.clock
	return !c.saidGone() && time.Now().Before(c.lateUntil) && !fw.l.f.canUseNewGen()
}

// blind is a look Redis did not answer: look again while the lease runs, unless Redis
// hangs (ADR 0023); with callers that have bytes, until Redis answers (ADR 0060).
func (fw *follower) blind() lookResult {
	now := time.Now()
	if !fw.l.f.canUseNewGen() && now.Before(fw.outlastUntil()) {
		fw.clock.blind(now, true)
		return lookNoWord
	}
	if now.Before(fw.clock.leaseEnd) && !fw.l.r.hangingFor(fw.l.f.key) {
		fw.clock.blind(now, false)
		return lookNoWord
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
