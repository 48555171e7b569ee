package singleflight

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// This file is where every flight starts and ends, whichever backend leads it: Group.lead
// runs on the goroutine Group.DoWith gives it (its caller's, if Inline), and endLead ends
// the flight on whichever goroutine ends its lead (see doc.go, Goroutines and ownership).

// lead runs the flight f until it has an outcome for its readers.
func (g *Group) lead(ctx context.Context, f *flight) {
	g.observe(Event{Kind: EventFlightStart, Key: f.key})
	ended := true // false when a parked follower goes on elsewhere: it ends the flight
	defer func() {
		if ended {
			g.endLead(ctx, f)
		}
	}()
	if !f.noCache {
		if sr, ok := g.cachedWithin(f.key, f.call.MaxAge); ok {
			g.observe(Event{Kind: EventRole, Key: f.key, Role: RoleHit})
			f.finishHit(sr.head, sr.body, time.Since(sr.at))
			return
		}
	}
	ended = g.coord.lead(ctx, f)
}

// endLead ends the flight f: its last readers get an error if nothing served them.
func (g *Group) endLead(ctx context.Context, f *flight) {
	defer g.wg.Done()
	g.mu.Lock()
	g.forget(f)
	g.mu.Unlock()
	if cause := context.Cause(ctx); cause != nil {
		f.fail(errors.Join(ErrFailed, cause))
	} else {
		f.fail(ErrFailed)
	}
	g.observe(Event{Kind: EventFlightEnd, Key: f.key})
}

// retryDue reports whether another attempt is due: callers other than the starter wait and
// attempts are left (ADR 0026). With none left, it delivers the last error.
func (g *Group) retryDue(f *flight, attempt int, last Result) bool {
	if g.endIfAlone(f) {
		return false
	}
	if attempt >= g.opts.MaxAttempts {
		g.deliverLastError(f, last)
		return false
	}
	return true
}

// retryAfterJitter runs retry after the jitter, on a goroutine if Inline (ADR 0025).
func (g *Group) retryAfterJitter(ctx context.Context, f *flight, retry func() bool) bool {
	if !f.call.Inline {
		return !g.jitter(ctx) || retry()
	}
	go func() {
		if !g.jitter(ctx) || retry() {
			g.endLead(ctx, f)
		}
	}()
	return false
}

// deliverLastError ends f with the last failed response, or ErrFailed when there is none.
func (g *Group) deliverLastError(f *flight, last Result) {
	if last.Head.Status == 0 {
		f.fail(ErrFailed)
		return
	}
	f.finishWith(last.Head, last.Body)
}

// jitter waits a random part of TakeoverJitter (ADR 0003); false when ctx ended first.
func (g *Group) jitter(ctx context.Context) bool {
	if g.opts.TakeoverJitter <= 0 {
		return ctx.Err() == nil
	}
	if g.opts.Jitter != nil {
		return sleep(ctx, g.opts.Jitter(g.opts.TakeoverJitter))
	}
	return sleep(ctx, rand.N(g.opts.TakeoverJitter))
}

// endIfAlone forgets f when no caller but the starter waits: newcomers start anew.
func (g *Group) endIfAlone(f *flight) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.othersWaiting() {
		return false
	}
	g.forget(f)
	return true
}
