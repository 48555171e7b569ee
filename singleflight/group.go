package singleflight

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Group coalesces calls by key, in this process and, with Redis, across processes.
type Group struct {
	opts    Options
	ctx     context.Context // ends when the Group is closed
	stop    context.CancelCauseFunc
	wg      sync.WaitGroup
	cacheMu sync.Mutex
	cache   *lruCache   // stored results in this process; see cached
	coord   coordinator // remote with Redis, memory without

	mu        sync.Mutex
	flights   map[string]*flight
	owned     map[*flight]bool // flights whose owner function runs here
	ownedIdle chan struct{}    // closed and replaced when owned shrinks
	closed    bool

	degraded atomic.Bool
	seq      atomic.Uint64 // numbers local flights: each follow's mark in Redis names its flight
	hooks    hooks
	inv      invalidation // purges and namespace generations; see purge.go
}

// hooks let the package's tests stop the world at the points where faults matter.
type hooks struct {
	beforeRenew  func(ctx context.Context) // blocks a heartbeat (a paused or dead owner)
	beforeFollow func()                    // runs between a follower's lookup and its subscription
	readGap      func()                    // a follower's read found nothing (or failed), before it looks again
	looked       func(decision)            // a follower's look of its flight was answered
	afterEntries func()                    // a follower applied one read's entries, before its next read
	beforeClaim  func()                    // a contender is about to run claim.lua
	aliveHeard   func()                    // the hub heard an alive message (on its receiving goroutine)
	resumed      func()                    // a parked follower was woken
	completed    func()                    // an owner's final write returned, before its flight ends here
	leadStarted  func()                    // a flight's lead goroutine started; its first caller is not counted yet (g.mu held)
	probed       func()                    // the probe of a degraded Redis asked it once
	confirmed    func(answers bool)        // a timeout's confirmation PING ended (see confirm)
	cutAsked     func(cut bool)            // an idle spell's grace ran out and the coordinator answered, before the call is cut
	unwaiting    func(sent bool)           // a lead that may have marked ended without the answer: before its mark is taken off, and after
	lookingUp    func()                    // a leader is about to look its flight up in Redis
}

// New returns a Group. Close it to stop its goroutines.
func New(opts Options) *Group {
	opts.setDefaults()
	ctx, stop := context.WithCancelCause(context.Background())
	g := &Group{opts: opts, ctx: ctx, stop: stop, flights: map[string]*flight{}, owned: map[*flight]bool{}, ownedIdle: make(chan struct{})}
	// The result store without Redis; with Redis a first level in front of it (ADR 0028).
	g.cache = newLRU(opts.MemoryMaxEntries, opts.MemoryMaxBytes)
	g.coord = memory{g}
	if opts.Redis != nil {
		g.coord = newRemote(g)
	}
	g.startInvalidation()
	return g
}

// Backend names the coordinator: "redis" or "memory".
func (g *Group) Backend() string { return g.coord.name() }

// Degraded reports whether a Redis Group is serving local-only because Redis failed.
func (g *Group) Degraded() bool { return g.degraded.Load() }

// Do joins the flight of key, starting it with fn if this process has none, or serves a
// result stored in this process (fn is not called). The caller's Reader blocks in Next, and
// must be closed. With noCache, no stored result is served; a call in flight is joined.
func (g *Group) Do(key string, noCache bool, fn Func) (*Reader, error) {
	return g.DoWith(key, CallOptions{NoCache: noCache}, fn)
}

// DoWith is Do with the caller's options: freshness, and what the flights listing shows.
func (g *Group) DoWith(key string, o CallOptions, fn Func) (*Reader, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	f, lkey := g.joinableWith(key, o)
	if f == nil && !o.NoCache {
		// After the flights in progress: a caller that would have joined one still does.
		if sr, ok := g.cachedWithin(key, o.MaxAge); ok {
			g.mu.Unlock()
			return g.serveStored(key, lkey, o, sr), nil
		}
	}
	starter := f == nil
	var ctx context.Context
	if starter {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(g.ctx)
		f = newFlight(key, lkey, o.NoCache, fn, cancel)
		f.call, f.started, f.seq = o, time.Now(), g.seq.Add(1)
		g.flights[lkey] = f
		g.wg.Add(1)
		if !o.Inline {
			go g.lead(ctx, f)
			if g.hooks.leadStarted != nil {
				g.hooks.leadStarted()
			}
		}
	}
	f.mu.Lock()
	f.readers++
	f.unserved++
	f.starterOpen = f.starterOpen || starter
	f.finishAll = f.finishAll || o.Finish
	g.updateIdle(f) // a caller that comes back within the grace keeps the call (ADR 0074)
	f.mu.Unlock()
	g.mu.Unlock()
	g.emitIdle(f)
	rd := &Reader{g: g, f: f, starter: starter, fn: fn, call: o}
	rd.joined = f.started
	if !starter {
		rd.joined = time.Now()
	}
	if starter && o.Inline {
		// The caller cannot close its Reader before the lead returns: its Context says
		// when it stops waiting.
		if o.Context != nil {
			defer context.AfterFunc(o.Context, func() { g.callerGone(f) })()
		}
		g.lead(ctx, f)
	}
	return rd, nil
}

// serveStored is what lead does with a stored result, without a goroutine or a context.
func (g *Group) serveStored(key, lkey string, o CallOptions, sr storedResult) *Reader {
	g.observe(Event{Kind: EventFlightStart, Key: key})
	g.observe(Event{Kind: EventRole, Key: key, Role: RoleHit})
	f := newFlight(key, lkey, false, nil, noCancel)
	f.call, f.started = o, time.Now()
	f.finishHit(sr.head, sr.body, time.Since(sr.at))
	f.mu.Lock()
	f.readers, f.unserved, f.starterOpen = 1, 1, true
	f.mu.Unlock()
	g.observe(Event{Kind: EventFlightEnd, Key: key})
	return &Reader{g: g, f: f, starter: true}
}

// noCancel is the cancel function of a flight that has no lead to end.
var noCancel context.CancelCauseFunc = func(error) {}

// leave is called when a reader closes. A flight whose last caller leaves ends, unless
// owned here: then it may be cut once nobody waits anywhere (ADR 0074).
func (g *Group) leave(f *flight, starter, delivered bool) {
	g.stopWaiting(f, func() {
		f.readers--
		if !delivered {
			f.unserved--
		}
		if starter {
			f.starterOpen = false
		}
	})
}

// stopWaiting applies a caller's leaving (gone, with f.mu held); a flight nobody waits for
// ends unless owned here, and an owned one starts its idle spell.
func (g *Group) stopWaiting(f *flight, gone func()) {
	defer g.emitIdle(f)
	g.mu.Lock()
	defer g.mu.Unlock()
	f.mu.Lock()
	gone()
	idle := f.waiting() == 0 && !f.owning && !f.ended
	g.updateIdle(f)
	f.mu.Unlock()
	if idle {
		g.forget(f)
		f.cancel(errCallersLeft)
	}
}

// forget removes f from the flight map, so that new callers start anew; g.mu held.
func (g *Group) forget(f *flight) {
	if g.flights[f.lkey] == f {
		delete(g.flights, f.lkey)
	}
}

// Close stops the Group and its goroutines. New calls get ErrClosed; owned flights may
// finish until ctx ends, then are released for takeover (ADR 0026) and their local readers
// get an error wrapping ErrShutdown.
func (g *Group) Close(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	var err error
	for {
		g.mu.Lock()
		n, idle := len(g.owned), g.ownedIdle
		g.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-idle:
			continue
		case <-ctx.Done():
			err = fmt.Errorf("singleflight: close: %d owned flights released: %w", n, context.Cause(ctx))
		}
		break
	}
	g.stop(ErrShutdown)
	g.wg.Wait()
	return err
}

// counted counts a goroutine about to start in the Group's WaitGroup, unless the Group is
// closed (then false: it must not start).
func (g *Group) counted() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.wg.Add(1)
	}
	return !g.closed
}

func (g *Group) setOwned(f *flight, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if on {
		g.owned[f] = true
		return
	}
	delete(g.owned, f)
	close(g.ownedIdle)
	g.ownedIdle = make(chan struct{})
}

// Owned is the number of flights whose upstream call runs in this process.
func (g *Group) Owned() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.owned)
}

func (g *Group) observe(e Event) { g.opts.Observer.Observe(e) }
