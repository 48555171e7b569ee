package singleflight

import (
	"context"
	"strconv"
	"time"
)

// An owned call nobody waits for is cut (ADRs 0074, 0080). Here, a caller waits from DoWith
// until it closes its Reader; an Inline starter, which cannot close it while DoWith leads
// on its goroutine, stops waiting when its CallOptions.Context ends. Elsewhere, each local
// flight that follows marks the flight in its meta (lookup.lua, claim.lua) and takes the
// mark off once its lead ended without the answer (unwait.lua). Once no caller has waited
// here for AbandonGrace, the owner asks Redis to cut the flight; renew.lua does so,
// atomically, only when no mark stands, none asked that the call finish, the last left a
// grace ago and Redis has not gone back in time, and it is asked again with every renewal.
// A cut writes a failed entry (r=cut) and ends the flight in Redis (state A), so that the
// next caller, anywhere, starts a new call at once; then the call is cancelled.
//
// Invariant: a call that Redis holds is cut only when Redis counted no caller waiting for
// it at that instant, and never while its shard cannot be asked; a call that only this
// process knows (in memory, local-only while its shard is down, or a flight Redis lost) is
// cut when nobody here has waited for it for the grace.

// ownedAttempt is the attempt owned here, which a cut would end.
type ownedAttempt struct {
	o      ownership
	cancel context.CancelCauseFunc
}

// idleSpell is a time during which no caller waited here for an attempt owned here.
type idleSpell struct {
	since  time.Time // zero: a caller waits
	unread int64     // bytes the attempt produced meanwhile, for nobody
	ended  *Event    // the end of the last spell, observed by emitIdle outside the locks
}

// Outcomes of an idle spell (Event.Reason of EventAbandoned).
const (
	abandonCancelled = "cancelled" // the call was cut
	abandonFinished  = "finished"  // the call ran to its end: someone elsewhere waited, a caller asked to finish, or Redis could not be asked
	abandonRejoined  = "rejoined"  // a caller came back within the grace
)

// waiting counts the callers that still wait; f.mu held.
func (f *flight) waiting() int {
	n := f.readers
	if f.starterOpen && f.starterGone {
		n--
	}
	return n
}

// mark is what a lookup or claim that follows writes in Redis (w:<instance>:<flight> =
// callers): f's number among this process's flights, and how many callers wait on it.
func (f *flight) mark() (flight string, callers int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strconv.FormatUint(f.seq, 10), max(f.waiting(), 1) // the first caller may not be counted yet
}

// markOf is f's mark field in Redis, less its "w:" prefix.
func (r *remote) markOf(f *flight) string {
	return r.g.opts.InstanceID + ":" + strconv.FormatUint(f.seq, 10)
}

// mayCut reports whether the idle spell may end in a cut; f.mu held.
func (f *flight) mayCut() bool {
	return f.owned != nil && !f.idle.since.IsZero() && !f.finishAll
}

// updateIdle starts or ends the idle spell of the attempt owned here as callers come and
// go; f.mu held. A spell that ends because a caller came is one rejoined.
func (g *Group) updateIdle(f *flight) {
	idle := f.owned != nil && !f.ended && f.waiting() == 0
	if idle == !f.idle.since.IsZero() {
		return
	}
	if idle {
		f.idle = idleSpell{since: time.Now(), ended: f.idle.ended}
		if !f.finishAll {
			f.idleTimer = time.AfterFunc(g.opts.AbandonGrace, func() { g.cutDue(f) })
		}
		return
	}
	g.endIdle(f, abandonRejoined)
}

// endIdle ends the idle spell, if any, with outcome; f.mu held.
func (g *Group) endIdle(f *flight, outcome string) {
	if f.idle.since.IsZero() {
		return
	}
	if f.idleTimer != nil {
		f.idleTimer.Stop()
		f.idleTimer = nil
	}
	f.idle = idleSpell{ended: &Event{Kind: EventAbandoned, Key: f.key, Reason: outcome, Bytes: f.idle.unread,
		Duration: time.Since(f.idle.since)}}
}

// emitIdle observes the end of an idle spell, if one ended; no lock held.
func (g *Group) emitIdle(f *flight) {
	f.mu.Lock()
	ev := f.idle.ended
	f.idle.ended = nil
	f.mu.Unlock()
	if ev != nil {
		g.observe(*ev)
	}
}

// ownedBy records the attempt that runs here, or its end (a nil a) as cancelled or
// finished; its idle spell starts at once if no caller waits.
func (g *Group) ownedBy(f *flight, a *ownedAttempt, cancelled bool) {
	defer g.emitIdle(f)
	g.mu.Lock()
	defer g.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if a == nil {
		outcome := abandonFinished
		if cancelled {
			outcome = abandonCancelled
		}
		g.endIdle(f, outcome)
	}
	f.owned = a
	g.updateIdle(f)
}

// callerGone is the end of a caller's Context: it waits no more (see CallOptions.Context).
func (g *Group) callerGone(f *flight) {
	g.stopWaiting(f, func() { f.starterGone = true })
}

// cutDue runs when an idle spell has lasted the grace: the attempt is cut if its
// coordinator agrees that no caller waits anywhere (see ownership.cut).
func (g *Group) cutDue(f *flight) {
	counted := g.counted()
	if counted {
		defer g.wg.Done()
	}
	f.mu.Lock()
	a := f.owned
	due := f.mayCut() && time.Since(f.idle.since) >= g.opts.AbandonGrace
	f.mu.Unlock()
	if !due || !counted && a.o.shared() {
		return // a closed Group asks Redis nothing; its renewals still cut
	}
	cut := a.o.cut(g.ctx)
	if g.hooks.cutAsked != nil {
		g.hooks.cutAsked(cut)
	}
	if cut {
		g.cutAttempt(f, a.o)
	}
}

// cutAttempt cancels the attempt of o that its coordinator has ended. A caller that came
// meanwhile keeps it: the call goes on for this process's callers alone.
func (g *Group) cutAttempt(f *flight, o ownership) {
	g.mu.Lock()
	f.mu.Lock()
	a := f.owned
	if a == nil || a.o != o {
		f.mu.Unlock()
		g.mu.Unlock()
		return // the attempt ended meanwhile
	}
	if f.waiting() > 0 || f.finishAll {
		f.mu.Unlock()
		g.mu.Unlock()
		return
	}
	g.forget(f) // a caller from now on starts a new call
	f.mu.Unlock()
	g.mu.Unlock()
	a.cancel(ErrAbandoned)
}

// noteUnread counts n bytes of the attempt produced while nobody waited; f.mu held.
func (f *flight) noteUnread(n int) {
	if !f.idle.since.IsZero() {
		f.idle.unread += int64(n)
	}
}
