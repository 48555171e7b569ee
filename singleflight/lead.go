package singleflight

import (
	"context"
	"time"
)

// leadState is where a leader is in its way through Redis. See ADR 0052.
type leadState uint8

const (
	leadLookup   leadState = iota // look the key up, offering a token when it may be free
	leadClaim                     // the lookup found nobody running it: claim, or contend first
	leadContend                   // another attempt ended: wait the jitter, then look again
	leadRetry                     // our own attempt failed: contend, on another goroutine if Inline
	leadOwn                       // run the owner function as one attempt
	leadFollow                    // follow the owner the lookup or claim named
	leadCatchUp                   // read the stream for a newer attempt that already finished
	leadLocal                     // Redis failed: own the flight in this process
	leadEnded                     // the lead is over: end the flight
	leadDetached                  // the lead goes on on another goroutine, which ends the flight
)

// leadMoves is the lead's transition table: the states each may be followed by. leadEnded
// and leadDetached end run; a detached lead goes on from the state it detached in (leadRetry
// to leadContend, leadFollow and leadCatchUp to what follows the follow), on the goroutine
// that picks it up; leadLocal's goes on in run.go retryAfterJitter, which ends the flight.
// See ADRs 0052, 0076.
var leadMoves = moves[leadState]{
	leadLookup:   to(leadClaim, leadOwn, leadFollow, leadLocal, leadEnded),
	leadClaim:    to(leadLookup, leadContend, leadOwn, leadFollow, leadCatchUp, leadLocal, leadEnded),
	leadContend:  to(leadLookup, leadEnded),
	leadRetry:    to(leadContend, leadDetached),
	leadOwn:      to(leadLookup, leadRetry, leadEnded),
	leadFollow:   to(leadLookup, leadContend, leadLocal, leadEnded, leadDetached),
	leadCatchUp:  to(leadLookup, leadLocal, leadEnded, leadDetached),
	leadLocal:    to(leadEnded, leadDetached),
	leadEnded:    0,
	leadDetached: 0,
}

// followSite is why a leader follows, which says what the follow's end means.
type followSite uint8

const (
	followOwner followSite = iota // the owner lookup or claim found
	followNewer                   // a newer attempt that finished, read from the stream
)

// leader is one local flight's way through Redis. Its state lives here, not on a stack,
// so that a parked follower holds no goroutine (ADR 0015). Owned by the goroutine in run:
// the lead, a resume or an Inline retry, handed over at leadDetached (doc.go).
type leader struct {
	r   *remote
	ctx context.Context
	f   *flight

	d        decision // the last answer of lookup or claim, which the next state acts on
	pos      position
	last     Result   // the last failed response seen, for when no attempt is left
	failures int      // failed attempts this flight saw (releases at shutdown excepted)
	reason   takeover // why we contend
	role     Role     // the role reported for the flight

	fresh      bool // no attempt of its key seen yet (claim.lua may restart the count)
	marked     bool // a lookup or claim may have marked the flight waited for by f (ADR 0074)
	flightOver bool // Redis's flight is over for this lead (answered, or cut): its mark needs no unwait
	contended  bool // the jitter before a takeover was waited
	caughtUp   bool // the stream was read for a finished newer attempt

	fw   *follower  // the follow in progress
	site followSite // what the lead does when it ends
	sp   leadSpan   // the span of the current phase, when traced
}

// lead runs one local flight against Redis; false when another goroutine ends it.
func (r *remote) lead(ctx context.Context, f *flight) bool {
	l := &leader{r: r, ctx: ctx, f: f, fresh: true}
	return l.run(leadLookup)
}

// run is the lead's state machine, from st; each move is checked against leadMoves.
// Invariant: one goroutine at a time runs a leader, the one that called run.
func (l *leader) run(st leadState) bool {
	for {
		l.enter(st)
		var next leadState
		switch st {
		case leadLookup:
			next = l.lookup()
		case leadClaim:
			next = l.claim()
		case leadContend:
			next = l.contend()
		case leadRetry:
			next = l.retry()
		case leadOwn:
			next = l.own()
		case leadFollow:
			next = l.follow()
		case leadCatchUp:
			next = l.startFollow(followNewer, 0, true)
		case leadLocal:
			next = l.local()
		case leadEnded:
			l.unmark() // no mark stays of callers that wait no more (ADR 0074)
			return true
		case leadDetached:
			return false
		}
		leadMoves.check("lead", st, next)
		st = next
	}
}

func (l *leader) decide(ro Role) {
	if l.role == RoleUnknown {
		l.role = ro
		l.f.decide(ro)
		l.r.g.observe(Event{Kind: EventRole, Key: l.f.key, Role: ro})
	}
}

// lookup asks Redis what the flight is, offering a token to claim a free key (ADR 0002).
func (l *leader) lookup() leadState {
	r, f := l.r, l.f
	if l.ctx.Err() != nil {
		return leadEnded
	}
	if !r.usableAfterVerdict(l.ctx, f.key) {
		return leadLocal
	}
	var candidate string
	if (l.pos.last == "" || l.caughtUp) && l.canCall() {
		candidate = r.newToken(l.ctx)
		if !r.usableAfterVerdict(l.ctx, f.key) {
			return leadLocal // the token's owner-seq timed out: one deadline is all a caller waits
		}
	}
	if r.g.hooks.lookingUp != nil {
		r.g.hooks.lookingUp()
	}
	mark, callers := f.mark()
	l.marked = true // a follow marks the flight, even if its answer is lost (ADR 0074)
	d, err := r.lookup(f.key, f.noCache, candidate, f.call, mark, callers)
	if err != nil {
		return leadLocal
	}
	f.sawRedis(d.clock)
	l.d = d
	switch d.verdict {
	case verdictOwner:
		return leadOwn
	case verdictHit:
		l.decide(RoleHit)
		r.serveHit(f, d, &l.pos)
		l.flightOver = true
		return leadEnded
	case verdictFollow:
		return leadFollow
	}
	return leadClaim
}

// claim takes over a flight nobody runs: after reading the stream for a newer attempt that
// finished (ADR 0006), and after the jitter for a failed or expired one (ADR 0003).
func (l *leader) claim() leadState {
	r, g, f, prev := l.r, l.r.g, l.f, l.d // prev: the lookup the claim compares against
	if prev.seen == seenDone && l.pos.last != "" && !l.caughtUp {
		l.caughtUp = true
		return leadCatchUp
	}
	if t := takeoverOf(prev.seen); t != takeoverNone && !l.contended {
		if l.reason == takeoverNone {
			l.reason = t
		}
		return leadContend
	}
	if !l.canCall() {
		return leadEnded
	}
	token := r.newToken(l.ctx)
	if !r.usableAfterVerdict(l.ctx, f.key) {
		return leadLocal
	}
	if g.hooks.beforeClaim != nil {
		g.hooks.beforeClaim()
	}
	mark, callers := f.mark()
	l.marked = true
	d, err := r.claim(l.ctx, f.key, token, prev, l.fresh, f.call, mark, callers)
	if err != nil {
		return leadLocal
	}
	f.sawRedis(d.clock)
	l.contended = false
	l.d = d
	switch d.verdict {
	case verdictFollow:
		return leadFollow
	case verdictChanged:
		return leadLookup
	case verdictExhausted:
		g.deliverLastError(f, l.last)
		return leadEnded
	}
	if l.reason == takeoverNone {
		l.reason = takeoverOf(prev.seen)
	}
	return leadOwn
}

func (l *leader) contend() leadState {
	if !l.r.g.jitter(l.ctx) {
		return leadEnded
	}
	l.contended = true
	return leadLookup
}

// retry contends after our own failed attempt; Inline, on another goroutine (ADR 0025).
func (l *leader) retry() leadState {
	if !l.f.call.Inline {
		return leadContend
	}
	go func() {
		leadMoves.check("lead", leadRetry, leadContend)
		if l.run(leadContend) {
			l.r.g.endLead(l.ctx, l.f)
		}
	}()
	return leadDetached
}

// own runs one attempt with the token the lookup or claim took (l.d).
func (l *leader) own() leadState {
	g, f := l.r.g, l.f
	l.decide(RoleOwner)
	if l.reason != takeoverNone {
		g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: l.reason.String()})
	}
	a := Attempt{N: l.d.attempt, Takeover: l.reason.String()}
	l.reason, l.fresh = takeoverNone, false
	l.pos = position{token: l.d.token}
	end, res, _ := g.own(withAttempt(l.ctx, a), f, newRemoteOwnership(l.r, f, l.d))
	switch end {
	case attemptDone, attemptAbandoned:
		l.flightOver = true // done, or cut: no mark counts any more
		return leadEnded
	case attemptLeaseLost:
		if !f.canUseNewGen() {
			return leadEnded // nobody here can use the new owner's answer
		}
		return leadLookup // follow whoever owns it now
	}
	l.last = res
	l.failures++
	if l.ctx.Err() != nil || !g.retryDue(f, max(l.d.attempt, l.failures), l.last) {
		return leadEnded
	}
	l.reason, l.contended = takeoverFailed, true
	return leadRetry
}

// unmark takes off the mark the lead may have left on Redis's flight, unless that flight
// is over (ADR 0074).
func (l *leader) unmark() {
	if l.marked && !l.flightOver {
		l.r.unwait(l.f)
		l.marked = false
	}
}

// local owns the flight in this process alone: Redis failed, or its shard is degraded.
func (l *leader) local() leadState {
	g, f := l.r.g, l.f
	if l.ctx.Err() != nil {
		return leadEnded
	}
	begun := f.begun()
	if begun && !f.canUseNewGen() {
		return leadEnded // a call nobody could use (ADR 0026)
	}
	ctx := l.ctx
	if begun || l.reason != takeoverNone { // a flight that had an owner is taken over
		g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: takeoverDegraded.String()})
		ctx = withAttempt(ctx, Attempt{Takeover: takeoverDegraded.String()}) // ownLocally numbers it
	}
	l.decide(RoleOwner)
	// Its callers wait for this call now, not Redis's: the mark comes off, once Redis can
	// take it (ADR 0080).
	l.unmark()
	if g.ownLocally(ctx, f, l.failures+1) {
		return leadEnded
	}
	return leadDetached
}

func (l *leader) follow() leadState {
	d := l.d
	if d.token == l.pos.token && l.pos.last == "" {
		// Our own failed attempt, shown running while its fail goes on being written past
		// its client (ADR 0056): look again once that write may have landed.
		if !sleep(l.ctx, finalRetry) {
			return leadEnded
		}
		return leadLookup
	}
	l.decide(RoleFollower)
	if d.token != l.pos.token {
		l.pos.switchTo(l.f, d)
	}
	// Nothing after the gen entry yet: the read on confirmation is the only one needed.
	empty := d.batches == 0 && l.pos.last == d.gen
	return l.startFollow(followOwner, d.remaining, !empty)
}

// startFollow follows the stream from l.pos until the attempt ends or the wait parks.
func (l *leader) startFollow(site followSite, remaining time.Duration, readNow bool) leadState {
	l.site = site
	fw, ok := l.r.newFollower(l, remaining, readNow)
	if !ok {
		return leadEnded // the Group is closing
	}
	l.fw = fw
	return l.followed(fw.loop(evNone))
}

// resume goes on with a parked follow, and ends the flight when the lead is over.
func (l *leader) resume(ev wakeEvent) {
	from := leadFollow // the state that started the follow
	if l.site == followNewer {
		from = leadCatchUp
	}
	next := l.followed(l.fw.loop(ev))
	leadMoves.check("lead", from, next)
	if l.run(next) {
		l.r.g.endLead(l.ctx, l.f)
	}
}

// canCall reports whether a call of this lead's would serve anyone: a flight that has begun
// needs a reader that can use a new generation (ADR 0026). Every claim asks it.
func (l *leader) canCall() bool {
	return !l.f.begun() || l.f.canUseNewGen()
}

// followed is the state after a follow that ended as end.
func (l *leader) followed(end followEnd) leadState {
	g, f := l.r.g, l.f
	if end.kind == followParked {
		return leadDetached
	}
	l.fw = nil
	switch end.kind {
	case followDone:
		l.flightOver = l.ctx.Err() == nil // else its callers left
		return leadEnded
	case followLeft:
		return leadEnded // no answer for callers who left
	case followRedisErr:
		return leadLocal
	}
	if l.site == followNewer {
		return leadLookup // the newer attempt was not in the stream: look again
	}
	switch end.kind {
	case followLost: // take the stored answer, or call again (ADR 0004)
		l.fresh, l.contended, l.caughtUp = false, true, true
		return leadLookup
	case followFailed:
		l.last, l.reason = end.res, takeoverShutdown
		if !end.shutdown {
			l.reason = takeoverFailed
			l.failures++
			if l.pos.attempt >= g.opts.MaxAttempts || l.failures >= g.opts.MaxAttempts {
				// Used up, by Redis's count or this flight's own (ADR 0026).
				g.deliverLastError(f, l.last)
				return leadEnded
			}
		}
	case followExpired:
		l.reason = takeoverExpired
	}
	l.fresh = false
	if !l.canCall() {
		return leadEnded // before the jitter: no claim would follow it
	}
	return leadContend
}
