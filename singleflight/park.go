package singleflight

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// wakeEvent is what ended a parked follower's wait: the first of its hooks to fire
// resumes the leader on a new goroutine (leader.resume). See ADR 0015.
type wakeEvent uint8

const (
	evNone   wakeEvent = iota
	evCtx              // the flight's context ended
	evAlive            // the owner's instance fell silent for a lease, or named tokens gone or newly unrenewed (ADR 0057)
	evNotify           // entries were pushed, or the stream must be read
	evTimer            // the deadline (or the poll interval) passed
)

// ready returns what is there to act on without waiting, or evNone; wait <= 0 has passed.
func (fw *follower) ready(wait time.Duration) wakeEvent {
	if fw.l.ctx.Err() != nil {
		return evCtx
	}
	if fw.alive != nil {
		select {
		case <-fw.alive.Notify():
			return evAlive
		default:
		}
	}
	select {
	case <-fw.w.Notify():
		return evNotify
	default:
	}
	if wait <= 0 {
		return evTimer
	}
	return evNone
}

// parking is one wait of a parked follower.
type parking struct {
	fw    *follower
	fired atomic.Bool

	mu      sync.Mutex // held while the hooks are set, so that a wake-up finds them all
	w       *watch
	alive   *watch
	timer   *time.Timer
	stopCtx func() bool
}

// park hooks fw to what can wake it for at most wait.
func (fw *follower) park(wait time.Duration) {
	p := &parking{fw: fw, w: fw.w, alive: fw.alive}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.w.OnWake(func() { p.fire(evNotify) })
	if p.alive != nil {
		p.alive.OnWake(func() { p.fire(evAlive) })
	}
	p.timer = time.AfterFunc(wait, func() { p.fire(evTimer) })
	p.stopCtx = context.AfterFunc(fw.l.ctx, func() { p.fire(evCtx) })
	// A wake-up between ready and the hooks left its signal on the channel.
	if len(p.w.Notify()) > 0 {
		p.fire(evNotify)
	} else if p.alive != nil && len(p.alive.Notify()) > 0 {
		p.fire(evAlive)
	}
}

// fire resumes the follower, once per parking.
func (p *parking) fire(ev wakeEvent) {
	if p.fired.Swap(true) {
		return
	}
	go p.resume(ev)
}

func (p *parking) resume(ev wakeEvent) {
	if h := p.fw.l.r.g.hooks.resumed; h != nil {
		h()
	}
	p.mu.Lock()
	p.w.OnWake(nil)
	if p.alive != nil {
		p.alive.OnWake(nil)
	}
	p.timer.Stop()
	p.stopCtx()
	p.mu.Unlock()
	// The wake-up's signal is taken as ready would have taken it.
	switch ev {
	case evNotify:
		drainSignal(p.w.Notify())
	case evAlive:
		drainSignal(p.alive.Notify())
	}
	p.fw.l.resume(ev)
}

func drainSignal(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}
