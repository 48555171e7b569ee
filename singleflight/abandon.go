package singleflight

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// An owned call nobody waits for is cut (ADR 0074). Here, a caller waits from DoWith until
// it closes its Reader or its CallOptions.Context ends. Elsewhere, an instance that follows
// the flight marks it in the meta (lookup.lua, claim.lua) and takes the mark off once its
// callers have all left (unwait.lua). Once no caller has waited here for AbandonGrace, the
// owner asks Redis to cut the flight; renew.lua does so, atomically, only when no other
// instance's mark stands, none asked that the call finish and the last left a grace ago,
// and it is asked again with every renewal. A cut ends the flight in Redis (state A), so
// that the next caller, anywhere, starts a new call at once, then cancels the call.
//
// Invariant: a call is cut only when Redis (or, without Redis, this process) saw no caller
// waiting for it at that instant; a flight whose shard cannot be asked is never cut.

// attemptCut is the attempt owned here that a cut would end.
type attemptCut struct {
	o      ownership
	cancel context.CancelCauseFunc
}

// idleSpell is a time during which no caller waited here for an attempt owned here.
type idleSpell struct {
	since  time.Time // zero: a caller waits
	unread int64     // bytes the attempt produced meanwhile, for nobody
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
	if f.leaderOpen && f.leaderGone {
		n--
	}
	return n
}

// mark is what a follow's mark in Redis holds: how many callers wait here, and which local
// flight wrote it ("3/17"), so that the unwait of an older flight leaves a newer one's mark.
func (f *flight) mark() string {
	f.mu.Lock()
	n := max(f.waiting(), 1) // the first caller may not be counted yet
	f.mu.Unlock()
	return strconv.Itoa(n) + "/" + strconv.FormatUint(f.seq, 10)
}

// mayCut reports whether the idle spell may end in a cut; f.mu held.
func (f *flight) mayCut() bool {
	return f.cut != nil && !f.idle.since.IsZero() && !f.finishAll
}

// updateIdle starts or ends the idle spell of the attempt owned here as callers come and
// go; f.mu held. A spell that ends because a caller came is one rejoined.
func (g *Group) updateIdle(f *flight) {
	idle := f.cut != nil && !f.ended && f.waiting() == 0
	if idle == !f.idle.since.IsZero() {
		return
	}
	if idle {
		f.idle = idleSpell{since: time.Now()}
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
	g.observe(Event{Kind: EventAbandoned, Key: f.key, Reason: outcome, Bytes: f.idle.unread,
		Duration: time.Since(f.idle.since)})
	f.idle = idleSpell{}
}

// ownedBy records the attempt that runs here, or its end (a nil a) as cancelled or
// finished; its idle spell starts at once if no caller waits.
func (g *Group) ownedBy(f *flight, a *attemptCut, cancelled bool) {
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
	f.cut = a
	g.updateIdle(f)
}

// callerGone is the end of a caller's Context: it waits no more (see CallOptions.Context).
func (g *Group) callerGone(f *flight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.mu.Lock()
	f.leaderGone = true
	idle := f.waiting() == 0 && !f.owning && !f.ended
	g.updateIdle(f)
	f.mu.Unlock()
	if idle {
		g.forget(f)
		f.cancel(errCallersLeft)
	}
}

// cutDue runs when an idle spell has lasted the grace: the attempt is cut if its
// coordinator agrees that no caller waits anywhere (see ownership.cut).
func (g *Group) cutDue(f *flight) {
	if !g.counted() {
		return
	}
	defer g.wg.Done()
	f.mu.Lock()
	a := f.cut
	due := f.mayCut() && time.Since(f.idle.since) >= g.opts.AbandonGrace
	f.mu.Unlock()
	if !due {
		return
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
	a := f.cut
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

// othersOf reports whether this process has another local flight of f's key (one with
// other CallOptions), whose callers the instance's mark in Redis also stands for; g.mu held.
func (g *Group) othersOf(f *flight) bool {
	for _, o := range g.flights {
		if o != f && o.key == f.key {
			return true
		}
	}
	return false
}

// noteUnread counts n bytes of the attempt produced while nobody waited; f.mu held.
func (f *flight) noteUnread(n int) {
	if !f.idle.since.IsZero() {
		f.idle.unread += int64(n)
	}
}

// unwait takes this instance's mark off a flight it followed, once its callers have all
// left: the owner may cut the call a grace later (unwait.lua). Without an answer the mark
// stays, and the call runs to its end.
func (r *remote) unwait(f *flight) {
	r.g.mu.Lock()
	others := r.g.othersOf(f)
	r.g.mu.Unlock()
	if others {
		return
	}
	if r.g.hooks.unwaiting != nil {
		r.g.hooks.unwaiting(false)
		defer r.g.hooks.unwaiting(true)
	}
	f.mu.Lock()
	finish := f.finishAll
	f.mu.Unlock()
	k := r.keys(f.key)
	ctx, cancel := r.watchedOp(r.g.ctx, k.meta)
	defer cancel()
	err := unwaitScript.Run(ctx, r.rdb, []string{k.meta}, r.g.opts.InstanceID, flag(finish), "/"+strconv.FormatUint(f.seq, 10)).Err()
	if err != nil && !errors.Is(err, context.Canceled) {
		_ = r.redisErr("unwait", f.key, err)
	}
}
