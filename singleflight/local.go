package singleflight

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// memory is the backend of a Group without Redis: every flight is owned in this process.
type memory struct{ g *Group }

func (memory) name() string { return "memory" }

func (m memory) lead(ctx context.Context, f *flight) bool {
	f.decide(RoleOwner)
	m.g.observe(Event{Kind: EventRole, Key: f.key, Role: RoleOwner})
	return m.g.leadLocal(ctx, f, 1)
}

func (memory) check(context.Context) error { return nil }

func (memory) forget(context.Context, string) (bool, error) { return false, nil }

func (m memory) flights(_ context.Context, limit int) ([]FlightInfo, bool, error) {
	list, more := m.g.localFlights(limit)
	return list, more, nil
}

// localOwnership is ownership inside one process: nothing to renew, fence or write.
type localOwnership struct{}

func (localOwnership) heartbeat(context.Context, context.CancelCauseFunc) func() { return func() {} }
func (localOwnership) appendBatch(context.Context, int, *Head, []byte) error     { return nil }
func (localOwnership) fail(context.Context, Result, string) error                { return nil }
func (localOwnership) degraded() bool                                            { return false }
func (localOwnership) goesOn() bool                                              { return false }
func (localOwnership) again(context.Context) error                               { return nil }
func (localOwnership) remote() bool                                              { return false }

func (localOwnership) complete(context.Context, final) error { return nil }
func (localOwnership) abandon()                              {}
func (localOwnership) cut(context.Context) bool              { return true }

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

// leadLocal owns f in this process alone, attempt after attempt; false when another
// goroutine ends f.
func (g *Group) leadLocal(ctx context.Context, f *flight, attempt int) bool {
	a := AttemptOf(ctx)
	a.N = attempt
	end, res, _ := g.own(withAttempt(ctx, a), f, localOwnership{})
	if end == attemptDone || end == attemptAbandoned || ctx.Err() != nil || !g.retryDue(f, attempt, res) {
		return true
	}
	return g.retryAfterJitter(ctx, f, func() bool {
		g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: takeoverFailed.String()})
		return g.leadLocal(withAttempt(ctx, Attempt{Takeover: takeoverFailed.String()}), f, attempt+1)
	})
}

// retryDue reports whether another attempt is due: callers other than the leader wait and
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
	return sleep(ctx, rand.N(g.opts.TakeoverJitter))
}

// endIfAlone forgets f when no caller but the leader waits: newcomers start anew.
func (g *Group) endIfAlone(f *flight) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.othersWaiting() {
		return false
	}
	g.forget(f)
	return true
}
