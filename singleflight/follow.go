package singleflight

import (
	"slices"
	"time"
)

// followKind is how a follow ended.
type followKind uint8

const (
	followDone     followKind = iota // the flight has its response
	followFailed                     // the attempt failed; res is its response
	followExpired                    // the owner's lease ran out, or its meta is gone
	followRedisErr                   // Redis does not answer
	followLost                       // the attempt ended, but its entries could not all be read
	followParked                     // nothing to do until something happens: see park
	followLeft                       // the flight's context ended: its callers left
)

type followEnd struct {
	kind     followKind
	res      Result
	shutdown bool // followFailed: the owner released the flight at shutdown
}

// followState is where a follower is in its wait. See ADR 0052.
type followState uint8

const (
	followWait   followState = iota // wait for what comes, or park
	followRead                      // take what was pushed, reading the stream first if asked
	followAlive                     // the owner's instance fell silent, or named tokens it stopped renewing
	followTimer                     // the deadline (or the poll interval) passed
	followLook                      // look the flight up: nothing came for a lease, or a read failed
	followOutage                    // Redis cannot be asked, and only this attempt can serve its callers
	followEnded                     // the follow is over: see follower.ending
	followHeld                      // parked: a wake-up goes on from here
)

// followMoves is the follower's transition table: the states each may be followed by. A
// follow starts in followWait; followEnded and followHeld end loop, and a wake-up goes on
// from followHeld on the goroutine it starts (park.go). See ADRs 0052, 0076.
var followMoves = moves[followState]{
	followWait:   to(followRead, followAlive, followTimer, followLook, followOutage, followEnded, followHeld),
	followRead:   to(followWait, followLook, followEnded),
	followAlive:  to(followWait),
	followTimer:  to(followWait, followRead, followLook),
	followLook:   to(followWait, followEnded),
	followOutage: to(followWait, followRead, followAlive, followTimer, followEnded, followHeld),
	followEnded:  0,
	followHeld:   to(followWait, followRead, followAlive, followTimer, followEnded),
}

// follower follows the owner's stream into its flight until the attempt ends: it reads
// after its last ID, takes what is pushed (ADR 0012), and looks up a silent flight. Owned
// with its leader by the goroutine in run; a park hands both to the resume it starts.
type follower struct {
	l      *leader
	start  time.Time
	stream string
	w      *watch
	// The owner instance's alive messages stand for this attempt while trusted (ADR 0009).
	alive      *watch // the owner's alive channel
	aliveOf    string
	deadline   time.Time // when to look again: the lease's end, or sooner to re-read
	since      time.Time // when deadline was set: only alive messages heard later extend it
	leaseEnd   time.Time // when the owner's lease runs out, as far as we know
	looks      int       // looks in a row that found the meta moved on before the stream said so
	read       bool      // read the stream before waiting
	polling    bool      // the wait is a poll while the pub/sub connection is down
	trustFor   string
	trustUntil time.Time
	// renewed: a look found this attempt's lease moved on, or its owner wrote; only then do
	// its instance's alive messages speak for it (ADR 0059).
	renewed bool
	// outage: Redis could not be asked since the last look it answered, while the callers
	// had bytes; lateUntil: until when the first look after it waits for a late final
	// write of an attempt whose lease ran out (ADR 0060).
	outage    bool
	lateUntil time.Time
	ending    followEnd // with followEnded: how the follow ended
}

func (r *remote) newFollower(l *leader, remaining time.Duration, readNow bool) (*follower, bool) {
	if r.g.hooks.beforeFollow != nil {
		r.g.hooks.beforeFollow()
	}
	fw := &follower{l: l, start: time.Now(), stream: r.keys(l.f.key).stream}
	w, err := r.wake.Watch(fw.stream)
	if err != nil {
		r.g.observe(Event{Kind: EventWait, Key: l.f.key})
		return nil, false
	}
	fw.w = w
	fw.since = time.Now()
	fw.deadline = fw.since.Add(remaining)
	fw.leaseEnd = fw.deadline
	fw.read = readNow // what is there already does not wait for the confirmation
	fw.trust()
	return fw, true
}

// loop follows until the attempt ends or it parks (followParked); ev woke it, or evNone.
// Each move is checked against followMoves.
func (fw *follower) loop(ev wakeEvent) followEnd {
	st := fw.on(ev) // the start, with evNone, is followWait
	if ev != evNone {
		followMoves.check("follow", followHeld, st)
	}
	for {
		var next followState
		switch st {
		case followWait:
			next = fw.wait()
		case followRead:
			next = fw.take()
		case followAlive:
			next = fw.heardAlive()
		case followTimer:
			next = fw.timerFired()
		case followLook:
			next = fw.look()
		case followOutage:
			next = fw.waitOutage()
		case followHeld:
			return followEnd{kind: followParked}
		case followEnded:
			fw.w.Close()
			if fw.alive != nil {
				fw.alive.Close()
			}
			fw.l.r.g.observe(Event{Kind: EventWait, Key: fw.l.f.key, Duration: time.Since(fw.start)})
			return fw.ending
		}
		followMoves.check("follow", st, next)
		st = next
	}
}

// on is the state a wake-up leads to.
func (fw *follower) on(ev wakeEvent) followState {
	switch ev {
	case evCtx:
		return fw.end(followEnd{kind: followLeft})
	case evAlive:
		return followAlive
	case evNotify:
		return followRead
	case evTimer:
		return followTimer
	}
	return followWait
}

func (fw *follower) end(e followEnd) followState {
	fw.ending = e
	return followEnded
}

// wait watches the current owner's alive channel, then takes what is there or parks.
func (fw *follower) wait() followState {
	r := fw.l.r
	if r.unusable(fw.l.f.key) && !fw.l.f.canUseNewGen() {
		return followOutage
	}
	if r.hangingFor(fw.l.f.key) {
		return followLook // a hang says nothing of when Redis answers again (ADR 0023)
	}
	if inst := tokenInstance(fw.l.pos.token); inst != fw.aliveOf {
		if fw.alive != nil {
			fw.alive.Close()
			fw.alive = nil
		}
		fw.aliveOf = inst
		if inst != "" {
			fw.alive, _ = r.wake.Watch(r.wake.AliveChannel(inst)) // nil: the meta is looked up
		}
	}
	if fw.read {
		return followRead
	}
	at, byAlive := fw.lookAt()
	if byAlive {
		at = fw.trustUntil // the hub wakes us if the alive messages stop
	}
	wait := max(time.Until(at), 0)
	if r.recheckEvery > 0 {
		wait = min(wait, r.recheckEvery)
	}
	// With the pub/sub connection down, poll: the reads tell whether the shard answers.
	fw.polling = r.wake.Down() && wait > pollEvery
	if fw.polling {
		wait = pollEvery
	}
	ev := fw.ready(wait)
	if ev == evNone {
		fw.park(wait)
		return followHeld
	}
	return fw.on(ev)
}

// heardAlive acts on the owner's instance falling silent or naming tokens gone.
func (fw *follower) heardAlive() followState {
	if fw.l.pos.token != fw.trustFor {
		fw.trust()
	}
	if slices.Contains(fw.alive.TakeGone(), fw.l.pos.token) {
		// Look it up now; the first time, take its lease as over (ADRs 0009, 0011).
		if !fw.trustUntil.IsZero() {
			fw.leaseEnd = time.Now()
		}
		fw.trustUntil = time.Time{}
		fw.deadline = time.Now()
	}
	return followWait
}

// timerFired waits on while the owner says it is alive, else looks (or, polling, reads).
func (fw *follower) timerFired() followState {
	r := fw.l.r
	if at, _ := fw.lookAt(); !fw.polling && time.Until(at) > 0 && r.recheckEvery == 0 {
		fw.looks = 0 // the owner said it is alive since the wait began
		return followWait
	}
	if fw.polling {
		fw.read = true
		return followRead
	}
	if r.g.hooks.readGap != nil {
		r.g.hooks.readGap()
	}
	return followLook
}

// take applies what the stream holds, when a read is asked for, then what was pushed.
func (fw *follower) take() followState {
	l := fw.l
	r, g, f, pos := l.r, l.r.g, l.f, &l.pos
	resync, pushed := fw.w.Take()
	var stored []entry
	if resync || fw.read {
		if r.unusable(f.key) && !f.canUseNewGen() {
			fw.read = true // once Redis answers: what was pushed meanwhile is read then
			return followWait
		}
		fw.read = false
		var err error
		stored, err = r.readAfter(l.ctx, fw.stream, pos.last)
		if l.ctx.Err() != nil {
			return fw.end(followEnd{kind: followLeft})
		}
		if err != nil {
			r.redisErr("xread", f.key, err) // e.g. a failover: check again
			return followLook
		}
	}
	got := false
	// Entries pushed that the read already had are skipped by their IDs.
	for i, e := range append(stored, pushed...) {
		if !afterID(e.id, pos.last) {
			continue
		}
		if i >= len(stored) && pos.gap(e) {
			fw.read = true
			break
		}
		got = true
		if end, ok := pos.apply(f, e); ok {
			return fw.end(end)
		}
	}
	if got {
		if g.hooks.afterEntries != nil {
			g.hooks.afterEntries()
		}
		fw.renewed = true // the owner is at work
		fw.since = time.Now()
		fw.leaseEnd = fw.since.Add(g.opts.LeaseTTL)
		fw.deadline, fw.looks = fw.leaseEnd, 0
	}
	return followWait
}

// outlastUntil is how long a follower whose callers have bytes waits for Redis: while its
// owner's call may run (Options.Timeout), then a lease and a linger, within which the
// owner's late final write may land (ADR 0060).
func (fw *follower) outlastUntil() time.Time {
	o := fw.l.r.g.opts
	return fw.start.Add(o.Timeout + o.LeaseTTL + o.Linger)
}

// waitOutage waits for the flight's shard to be usable again: its callers have bytes of
// this attempt, and a call of their own cannot serve them. Then the stream is read on from
// where it was (ADR 0060).
func (fw *follower) waitOutage() followState {
	if !time.Now().Before(fw.outlastUntil()) {
		return fw.end(followEnd{kind: followRedisErr})
	}
	fw.outage, fw.read, fw.polling = true, true, false
	ev := fw.ready(pollEvery)
	if ev == evNone {
		fw.park(pollEvery)
		return followHeld
	}
	return fw.on(ev)
}
