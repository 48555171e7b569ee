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

var followKinds = [...]string{"done", "failed", "expired", "Redis unusable", "entries lost", "parked", "left"}

func (k followKind) String() string { return followKinds[k] }

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
	stream string
	w      *watch
	alive  *watch // the owner instance's alive channel (ADR 0009)
	// aliveOf: the instance alive watches; the clock follows pos.token.
	aliveOf string
	clock   followClock // when to look next, and why (clock.go)
	waiting lookReason  // why the wait under way ends when its timer fires
	lookWhy lookReason  // why the look under way is made (EventLook)
	looks   int         // looks in a row that found the meta moved on before the stream said so
	read    bool        // read the stream before waiting
	ending  followEnd   // with followEnded: how the follow ended
}

func (r *remote) newFollower(l *leader, remaining time.Duration, readNow bool) (*follower, bool) {
	if r.g.hooks.beforeFollow != nil {
		r.g.hooks.beforeFollow()
	}
	now := time.Now()
	fw := &follower{l: l, stream: r.keys(l.f.key).stream}
	w, err := r.wake.Watch(fw.stream)
	if err != nil {
		r.g.observe(Event{Kind: EventWait, Key: l.f.key})
		return nil, false
	}
	fw.w = w
	fw.clock = newClock(now, r.g.opts.LeaseTTL, r.g.opts.TakeoverJitter, r.recheckEvery, remaining, l.pos.token)
	fw.read = readNow // what is there already does not wait for the confirmation
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
			fw.l.r.g.observe(Event{Kind: EventWait, Key: fw.l.f.key, Duration: time.Since(fw.clock.start), Reason: fw.ending.kind.String()})
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
		fw.lookWhy = lookHang
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
	at, why := fw.next()
	wait := max(time.Until(at), 0)
	fw.waiting = why
	ev := fw.ready(wait)
	if ev == evNone {
		fw.park(wait)
		return followHeld
	}
	return fw.on(ev)
}

// next is the clock's next look, by what the hub heard of the owner's instance. The clock
// follows the position's token: every change of it is observed (take, recheck).
func (fw *follower) next() (time.Time, lookReason) {
	if fw.clock.token != fw.l.pos.token {
		panic("singleflight: the follower's clock follows " + fw.clock.token + ", its position " + fw.l.pos.token)
	}
	return fw.clock.next(time.Now(), fw.aliveView())
}

// aliveView is what the hub heard of the owner's instance, for this follower.
func (fw *follower) aliveView() aliveView {
	r := fw.l.r
	a := aliveView{listening: fw.alive != nil, pubsubDown: r.wake.Down()}
	if a.listening {
		a.until, a.moving = r.wake.AliveUntil(fw.alive.Channel(), fw.l.pos.token)
		a.unconfirmed = r.wake.UnconfirmedSince(fw.stream)
		a.blindShard = r.sharded() && r.degradedFor(fw.l.f.key)
	}
	return a
}

// heardAlive acts on the owner's instance falling silent or naming tokens gone.
func (fw *follower) heardAlive() followState {
	if slices.Contains(fw.alive.TakeGone(), fw.l.pos.token) {
		fw.clock.gone(time.Now()) // look it up now (ADRs 0009, 0011)
	}
	return followWait
}

// timerFired reads while the pub/sub connection is down; otherwise it waits on while the
// owner says it is alive, and looks.
func (fw *follower) timerFired() followState {
	r := fw.l.r
	if fw.waiting == readPubsub {
		fw.read = true
		return followRead
	}
	at, why := fw.next()
	if time.Until(at) > 0 && fw.clock.recheck == 0 {
		fw.looks = 0 // the owner said it is alive since the wait began
		return followWait
	}
	fw.lookWhy = why
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
			fw.lookWhy = lookReadFailed
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
		fw.clock.entries(time.Now())
		fw.clock.owner(time.Now(), pos.token) // a gen entry's claim is no owner at work (ADR 0059)
		fw.looks = 0
	}
	return followWait
}

// outlastUntil is how long a follower whose callers have bytes waits for Redis: while its
// owner's call may run (Options.Timeout), then a lease and a linger, within which the
// owner's late final write may land (ADR 0060).
func (fw *follower) outlastUntil() time.Time {
	o := fw.l.r.g.opts
	return fw.clock.start.Add(o.Timeout + o.LeaseTTL + o.Linger)
}

// waitOutage waits for the flight's shard to be usable again: its callers have bytes of
// this attempt, and a call of their own cannot serve them. Then the stream is read on from
// where it was (ADR 0060).
func (fw *follower) waitOutage() followState {
	if !time.Now().Before(fw.outlastUntil()) {
		return fw.end(followEnd{kind: followRedisErr})
	}
	fw.clock.outlasting()
	at, why := fw.clock.outageNext(time.Now())
	wait := time.Until(at)
	fw.read, fw.waiting = true, why
	ev := fw.ready(wait)
	if ev == evNone {
		fw.park(wait)
		return followHeld
	}
	return fw.on(ev)
}
