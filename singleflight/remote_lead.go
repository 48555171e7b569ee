package singleflight

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// position is where a follower is in the stream of the generation it follows.
type position struct {
	token   string
	last    string // ID of the last entry read
	n       int    // batch number expected next
	attempt int
	lost    bool // entries of this generation are missing: only its end matters
}

// switchTo starts following the generation of the owner d names, from its first entry.
func (p *position) switchTo(f *flight, d decision) {
	f.startGen(RoleFollower, false)
	*p = position{token: d.token, last: d.gen, n: 1, attempt: d.attempt}
}

// serveHit ends f with the stored answer d found, and keeps it in this process. A flight
// that was following the attempt that stored it finishes that same answer: its readers go
// on from where they are. One that followed another attempt gives that generation up for
// it; one that followed nothing is a hit.
func (r *remote) serveHit(f *flight, d decision, pos *position) {
	d.head = r.g.keepFor(f.key, d.head, d.body, d.age, d.ttl) // annotated: its readers need not parse it
	if pos.token != "" {
		// Its callers joined a flight in progress, some maybe after that answer landed:
		// the same fence as the done entry's.
		f.fence(d.landed)
	}
	switch {
	case pos.token == "":
		f.finishHit(d.head, d.body, d.age)
	case d.token != pos.token || !f.continueWith(d.head, d.body):
		f.finishWith(d.head, d.body)
	}
}

// leader is one local flight's way through Redis. Its state lives here rather than on a
// goroutine's stack: while it follows an owner and nothing happens, it holds no goroutine
// at all (see park), so ten thousand flights followed from one process cost their state,
// not ten thousand stacks.
type leader struct {
	r   *remote
	ctx context.Context
	f   *flight

	pos         position
	last        Result // the last failed response seen, for when no attempt is left
	failures    int    // failed attempts this flight saw (releases at shutdown excepted)
	fresh       bool   // this flight has not yet seen an attempt of its key
	contended   bool   // the jitter before a takeover was waited
	reason      string // why we contend
	decided     bool
	streamTried bool // read the stream for a finished newer attempt
	local       bool // a Redis command failed: serve this flight in-process

	fw   *follower  // the follow in progress
	site followSite // what the lead does when it ends
}

// followSite is why a leader follows: the end of the follow means something different.
type followSite uint8

const (
	followOwner followSite = iota // the owner lookup or claim found
	followNewer                   // a newer attempt that finished, read from the stream
)

// lead runs one local flight against Redis: look up, then serve a hit, follow the owner,
// or claim and own; after a failed or expired attempt, contend again after a jitter. It
// reports false when the flight parked (see park): it goes on, on another goroutine, when
// something happens, and that goroutine ends it.
func (r *remote) lead(ctx context.Context, f *flight) bool {
	l := &leader{r: r, ctx: ctx, f: f, fresh: true}
	return l.run()
}

func (l *leader) role(ro Role) {
	if !l.decided {
		l.decided = true
		l.f.decide(ro)
		l.r.g.observe(Event{Kind: EventRole, Key: l.f.key, Role: ro})
	}
}

// gaveUp reports whether the attempts are used up: by the flight's count in Redis or, when
// new callers keep restarting that count, by what this flight itself saw.
func (l *leader) gaveUp(attempt int) bool {
	return attempt >= l.r.g.opts.MaxAttempts || l.failures >= l.r.g.opts.MaxAttempts
}

// run is the lead's loop; false when it parked.
func (l *leader) run() bool {
	r, g, f, ctx := l.r, l.r.g, l.f, l.ctx
	for ctx.Err() == nil {
		if l.local || r.degradedFor(f.key) {
			begun := f.begun()
			if begun && !f.canUseNewGen() {
				// Every caller here has bytes of an answer that can no longer reach
				// them: a call of our own would be read by nobody.
				return true
			}
			if begun || l.reason != "" {
				// A flight that had an owner (followed or its own) is taken over; a new
				// one just runs here.
				g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: "degraded"})
			}
			l.role(RoleOwner)
			return g.leadLocal(ctx, f, l.failures+1)
		}
		// A flight that has followed nothing yet offers a token: if the key is free, the
		// lookup claims it in the same round trip.
		var (
			candidate string
			err       error
		)
		if l.pos.last == "" || l.streamTried {
			candidate = r.newToken(ctx)
		}
		d, err := r.lookup(f.key, f.noCache, candidate, f.call)
		if err != nil {
			l.local = true
			continue
		}
		f.sawRedis(d.clock)
		var (
			token string // of the attempt to own, from lookup or claim
			c     decision
		)
		if d.kind == "owner" {
			token, c = candidate, d
			goto own
		}
	decide:
		switch d.kind {
		case "hit":
			l.role(RoleHit)
			r.serveHit(f, d, &l.pos)
			return true
		case "follow":
			l.role(RoleFollower)
			if d.token != l.pos.token {
				l.pos.switchTo(f, d)
			}
			// Nothing after the generation's first entry yet (a unary answer, or a stream
			// before its first batch): the read Redis's confirmation of the subscription
			// brings is the only one needed.
			empty := d.batches == 0 && l.pos.last == d.gen
			end := l.follow(followOwner, d.remaining, !empty)
			if end.kind == followParked {
				return false
			}
			if l.afterFollow(end) {
				return true
			}
		case "claim":
			if d.reason == "done" && l.pos.last != "" && !l.streamTried {
				// The attempt we waited for was followed by one that already finished:
				// its entries are in the stream after our position.
				l.streamTried = true
				end := l.follow(followNewer, 0, true)
				if end.kind == followParked {
					return false
				}
				if l.afterFollow(end) {
					return true
				}
				continue
			}
			if (d.reason == "expired" || d.reason == "failed") && !l.contended {
				// Someone else's attempt ended: wait the jitter, then look again, so
				// that of all contenders the first to wake wins and the rest follow.
				if l.reason == "" {
					l.reason = d.reason
				}
				if !g.jitter(ctx) {
					return true
				}
				l.contended = true
				continue
			}
			token = r.newToken(ctx)
			if g.hooks.beforeClaim != nil {
				g.hooks.beforeClaim()
			}
			c, err = r.claim(ctx, f.key, token, d, l.fresh, f.call)
			if err != nil {
				l.local = true
				continue
			}
			f.sawRedis(c.clock)
			l.contended = false
			switch c.kind {
			case "follow":
				d = c
				goto decide
			case "changed":
				continue
			case "exhausted":
				g.deliverLastError(f, l.last)
				return true
			}
			goto own
		}
		continue
	own:
		{
			l.role(RoleOwner)
			if d.reason == "expired" || d.reason == "failed" || l.reason != "" {
				g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: orDefault(l.reason, d.reason)})
			}
			l.reason, l.fresh = "", false
			l.pos = position{token: token}
			c.token = token
			o := newRemoteOwnership(r, f.key, c)
			end, res, _ := g.own(ctx, f, o)
			switch end {
			case attemptDone:
				return true
			case attemptLeaseLost:
				if !f.canUseNewGen() {
					return true // nobody here can use the new owner's answer
				}
				continue // follow whoever owns it now
			}
			l.last = res
			l.failures++
			if ctx.Err() != nil || !g.retryDue(f, max(c.attempt, l.failures), l.last) {
				return true
			}
			l.reason, l.contended = "failed", true
			return g.retryAfterJitter(ctx, f, l.run)
		}
	}
	return true
}

// follow follows the stream from l.pos until the attempt ends or the wait parks.
func (l *leader) follow(site followSite, remaining time.Duration, readNow bool) followEnd {
	l.site = site
	fw, ok := l.r.newFollower(l, remaining, readNow)
	if !ok {
		return followEnd{kind: followDone} // the Group is closing
	}
	l.fw = fw
	return fw.loop(evNone)
}

// resume goes on with a parked follow on the goroutine ev started, and ends the flight
// when the lead is over.
func (l *leader) resume(ev wakeEvent) {
	end := l.fw.loop(ev)
	if end.kind == followParked {
		return
	}
	if l.afterFollow(end) || l.run() {
		l.r.g.endLead(l.ctx, l.f)
	}
}

// afterFollow acts on how a follow ended; true when the lead is over.
func (l *leader) afterFollow(end followEnd) bool {
	g, f := l.r.g, l.f
	l.fw = nil
	switch end.kind {
	case followDone:
		return true
	case followRedisErr:
		l.local = true
		return false
	}
	if l.site == followNewer {
		return false // the newer attempt was not in the stream: look again
	}
	switch end.kind {
	case followLost:
		// Take the stored answer if there is one, else call again.
		l.fresh, l.contended, l.streamTried = false, true, true
		return false
	case followFailed:
		l.last, l.reason = end.res, "failed"
		if end.reason == "shutdown" {
			l.reason = "shutdown"
		} else {
			l.failures++
			if l.gaveUp(l.pos.attempt) {
				g.deliverLastError(f, l.last)
				return true
			}
		}
	case followExpired:
		l.reason = "expired"
	}
	l.fresh = false
	if !f.canUseNewGen() || !g.jitter(l.ctx) {
		return true
	}
	l.contended = true
	return false
}

func orDefault(s, d string) string {
	if s != "" {
		return s
	}
	return d
}

// errShardDown is why a follower did not look its flight up: the probe says its Redis
// (shard) is down.
var errShardDown = errors.New("singleflight: the flight's Redis is down")

type followKind uint8

const (
	followDone     followKind = iota // the flight has its response
	followFailed                     // the attempt failed; res is its response
	followExpired                    // the owner's lease ran out, or its meta is gone
	followRedisErr                   // Redis does not answer
	followLost                       // the attempt ended, but its entries could not all be read
	followParked                     // nothing to do until something happens: see park
)

type followEnd struct {
	kind   followKind
	res    Result
	reason string
	err    error
}

// follower is a leader following the owner's stream into its flight until the attempt
// ends. It subscribes to the stream's channel first, then reads the stream from the
// concrete ID it last read (never "$"), then takes what is pushed (see wake.go): no entry
// written since the lookup can be missed, and no command is sent while it waits. When
// nothing came for a lease (the owner silent, and not saying it is alive), the meta is
// checked again.
type follower struct {
	l      *leader
	start  time.Time
	stream string
	w      *watch
	// The owner instance's alive messages stand for this attempt only while it can still
	// run: not once the instance said it stopped renewing it, nor past the hard timeout
	// any attempt has (counted from the last look, which found it running).
	alive      *watch // the owner's alive channel
	aliveOf    string
	deadline   time.Time // when to look again: the lease's end, or sooner to re-read
	since      time.Time // when deadline was set: only alive messages heard later extend it
	leaseEnd   time.Time // when the owner's lease runs out, as far as we know
	recheck    int
	read       bool // read the stream before waiting
	polling    bool // the wait is a poll while the pub/sub connection is down
	trustFor   string
	trustUntil time.Time
}

func (r *remote) newFollower(l *leader, remaining time.Duration, readNow bool) (*follower, bool) {
	if r.g.hooks.beforeFollow != nil {
		r.g.hooks.beforeFollow()
	}
	fw := &follower{l: l, start: time.Now(), stream: r.keys(l.f.key).stream}
	w, err := r.wake.watch(fw.stream)
	if err != nil {
		r.g.observe(Event{Kind: EventWait, Key: l.f.key})
		return nil, false
	}
	fw.w = w
	fw.since = time.Now()
	fw.deadline = fw.since.Add(remaining)
	fw.leaseEnd = fw.deadline
	// Read the stream at once, as the subscription is made: what is already there is not
	// kept waiting for the confirmation, which then makes the follower read once more.
	fw.read = readNow
	fw.trust()
	return fw, true
}

func (fw *follower) trust() {
	fw.trustFor, fw.trustUntil = fw.l.pos.token, time.Now().Add(fw.l.r.g.opts.Timeout+fw.l.r.g.opts.LeaseTTL)
}

// lookAt is when the follower looks its flight up unless something comes: its deadline,
// or later while its owner's instance keeps saying it is alive (and is trusted to), as
// far as it said so after the deadline was set: a look asked for soon (to re-read, or
// because the stream holds a newer attempt) is not put off by what was heard before. byAlive
// says the alive messages set it: then no timer is needed for it, as the hub wakes the
// follower when they stop.
func (fw *follower) lookAt() (at time.Time, byAlive bool) {
	at = fw.deadline
	if fw.l.pos.token != fw.trustFor {
		fw.trust() // a new owner: trusted anew
	}
	if fw.alive == nil || fw.trustUntil.IsZero() || fw.l.r.sharded() && fw.l.r.degradedFor(fw.l.f.key) {
		// (In a Cluster the alive messages are the owner instance's: they go on while
		// the flight's own shard is down, and then say nothing of this flight. On one
		// server they stop with it, and those heard before stand: see sharded.)
		return at, false
	}
	until := fw.l.r.wake.aliveUntil(fw.alive.channel)
	if !until.After(time.Now()) || !until.Add(-fw.l.r.g.opts.LeaseTTL).After(fw.since) {
		// Silent for a lease: the hub has woken its watchers (this one, maybe), and will
		// not again until a message comes. Only the deadline counts.
		return at, false
	}
	ext := until
	if fw.trustUntil.Before(ext) {
		ext = fw.trustUntil
	}
	if ext.After(at) {
		return ext, until.Before(fw.trustUntil)
	}
	return at, false
}

// look looks the flight up (see recheck). A look that found another attempt trusts its
// owner anew; one that found this attempt still running, after its owner said it stopped
// renewing it, waits for its lease alone.
func (fw *follower) look() (followEnd, bool) {
	known := fw.leaseEnd
	if at, _ := fw.lookAt(); at.After(fw.leaseEnd) {
		fw.leaseEnd = at // the owner said it is alive: its lease runs that long
	}
	end, done := fw.l.r.recheck(fw.l.ctx, fw.l.f, &fw.l.pos, &fw.deadline, &fw.leaseEnd, &fw.recheck, &fw.read)
	if done {
		return end, true
	}
	if end.err != nil {
		// Redis could not be asked: nothing was learnt of this attempt. In a Cluster the
		// owner's alive messages, which are its instance's and go on while this flight's
		// own shard is down, extend neither its lease nor the trust in them. On one
		// server, those heard before it stopped answering each followed a renewal of
		// this lease: a restart that ends within it costs no call, however long the
		// follower had waited.
		if fw.l.r.sharded() {
			fw.leaseEnd = known
		}
		return followEnd{}, false
	}
	fw.since = time.Now()
	if fw.l.pos.token != fw.trustFor || !fw.trustUntil.IsZero() {
		fw.trust()
	}
	return followEnd{}, false
}

// end closes the follow.
func (fw *follower) end(e followEnd) followEnd {
	fw.w.close()
	if fw.alive != nil {
		fw.alive.close()
	}
	fw.l.r.g.observe(Event{Kind: EventWait, Key: fw.l.f.key, Duration: time.Since(fw.start)})
	return e
}

// loop follows until the attempt ends, or until it has to wait: then it parks and
// returns followParked. ev is what woke a parked follower (evNone on the first call).
func (fw *follower) loop(ev wakeEvent) followEnd {
	l := fw.l
	r, g, f, pos, ctx := l.r, l.r.g, l.f, &l.pos, l.ctx
	for {
		if ev == evNone {
			// The owner's alive messages extend the wait; follow the current owner's.
			if inst := tokenInstance(pos.token); inst != fw.aliveOf {
				if fw.alive != nil {
					fw.alive.close()
					fw.alive = nil
				}
				fw.aliveOf = inst
				if inst != "" {
					fw.alive, _ = r.wake.watch(r.wake.aliveChannel(inst)) // nil: the meta is looked up
				}
			}
			if !fw.read {
				at, byAlive := fw.lookAt()
				if byAlive {
					at = fw.trustUntil // the hub wakes us if the alive messages stop
				}
				wait := max(time.Until(at), 0)
				if r.recheckEvery > 0 {
					wait = min(wait, r.recheckEvery)
				}
				// While the pub/sub connection is down (in a Cluster it is on one node,
				// which may be the failing one while this flight's shard is fine), poll
				// the stream: whether the flight's own shard answers, the reads tell.
				fw.polling = r.wake.down.Load() && wait > pollEvery
				if fw.polling {
					wait = pollEvery
				}
				if ev = fw.ready(wait); ev == evNone {
					fw.park(wait)
					return followEnd{kind: followParked}
				}
			}
		}
		switch ev {
		case evCtx:
			return fw.end(followEnd{kind: followDone})
		case evAlive:
			// The owner's instance fell silent, or named tokens it stopped renewing; the
			// wait is worked out again at the top.
			ev = evNone
			if pos.token != fw.trustFor {
				fw.trust()
			}
			if slices.Contains(fw.alive.takeGone(), pos.token) {
				// Its owner no longer renews it: look it up now, and, the first time it
				// says so, take its lease as over (a flight Redis lost is not put back
				// by that owner: waiting for it would only keep the callers here
				// waiting). The token is said again for a lease; a look that found the
				// attempt running since is waited on for its lease alone.
				if !fw.trustUntil.IsZero() {
					fw.leaseEnd = time.Now()
				}
				fw.trustUntil = time.Time{}
				fw.deadline = time.Now()
			}
			continue
		case evTimer:
			ev = evNone
			if at, _ := fw.lookAt(); !fw.polling && time.Until(at) > 0 && r.recheckEvery == 0 {
				fw.recheck = 0 // the owner said it is alive since the wait began
				continue
			}
			if !fw.polling {
				if g.hooks.readGap != nil {
					g.hooks.readGap()
				}
				if end, done := fw.look(); done {
					return fw.end(end)
				}
				continue
			}
			fw.read = true
		}
		ev = evNone
		resync, pushed := fw.w.take()
		var stored []redis.XMessage
		if resync || fw.read {
			fw.read = false
			var err error
			stored, err = r.readAfter(ctx, fw.stream, pos.last)
			if ctx.Err() != nil {
				return fw.end(followEnd{kind: followDone})
			}
			if err != nil {
				r.redisErr("xread", f.key, err) // e.g. a failover: check again
				if end, done := fw.look(); done {
					return fw.end(end)
				}
				continue
			}
		}
		got := false
		// What the stream holds first, then what was pushed (entries pushed meanwhile that
		// the read already had are skipped by their IDs). A pushed entry that does not
		// follow the last one read means messages were missed: read the stream again.
		for i, m := range append(stored, pushed...) {
			if !afterID(m.ID, pos.last) {
				continue
			}
			if t := val(m, "t"); i >= len(stored) && t != "gen" && val(m, "tok") == pos.token && !pos.lost {
				if n, _ := strconv.Atoi(val(m, "n")); n != pos.n {
					fw.read = true
					break
				}
			}
			got = true
			if end, ok := r.apply(f, pos, m); ok {
				return fw.end(end)
			}
		}
		if got {
			if g.hooks.afterEntries != nil {
				g.hooks.afterEntries()
			}
			// The owner is alive and writing.
			fw.since = time.Now()
			fw.leaseEnd = fw.since.Add(g.opts.LeaseTTL)
			fw.deadline, fw.recheck = fw.leaseEnd, 0
		}
	}
}

// pollEvery is how often a follower reads its stream while the pub/sub connection is down.
const pollEvery = 250 * time.Millisecond

// readAfter reads the entries of stream after id, without blocking.
func (r *remote) readAfter(ctx context.Context, stream, id string) ([]redis.XMessage, error) {
	var out []redis.XMessage
	for {
		streams, err := r.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, id}, Count: 512, Block: -1}).Result()
		if errors.Is(err, redis.Nil) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		n := 0
		for _, s := range streams {
			out = append(out, s.Messages...)
			n += len(s.Messages)
			if len(s.Messages) > 0 {
				id = s.Messages[len(s.Messages)-1].ID
			}
		}
		if n < 512 {
			return out, nil
		}
	}
}

// recheck looks the flight up when nothing came for a lease, or a read failed, and decides
// whether to go on following (done false, with the deadline moved or a read asked for) or
// how the attempt ended.
func (r *remote) recheck(ctx context.Context, f *flight, pos *position, deadline, leaseEnd *time.Time, recheck *int, read *bool) (followEnd, bool) {
	// While Redis does not answer but the owner's lease, as far as we know, runs on, a
	// restart or a failover that ends before it costs no call of our own: look again soon
	// (end.err says nothing was learnt). Past the lease, the flight goes local-only. While
	// the probe says this flight's Redis is down, the follower does not ask it itself.
	wait := func(err error) (followEnd, bool) {
		if now := time.Now(); now.Before(*leaseEnd) {
			*deadline = now.Add(pollEvery)
			if leaseEnd.Before(*deadline) {
				*deadline = *leaseEnd
			}
			return followEnd{err: err}, false
		}
		return followEnd{kind: followRedisErr, err: err}, true
	}
	if r.degradedFor(f.key) {
		return wait(errShardDown)
	}
	d, lerr := r.lookup(f.key, f.noCache, "", f.call)
	if ctx.Err() != nil {
		return followEnd{kind: followDone}, true
	}
	if lerr != nil {
		return wait(lerr)
	}
	f.sawRedis(d.clock)
	switch {
	case d.kind == "follow" && d.token == pos.token:
		*deadline, *recheck = time.Now().Add(d.remaining), 0
		*leaseEnd = *deadline
		return followEnd{}, false
	case d.kind == "claim" && d.reason == "absent" && time.Now().Before(*leaseEnd):
		// Redis lost the flight (a restart without persistence, a failover): its owner
		// puts it back with its next write while its lease runs (restore.lua). Until
		// the lease would have run out, that is worth waiting for.
		*deadline = *leaseEnd
		return followEnd{}, false
	case d.kind == "hit" && d.token == pos.token:
		r.serveHit(f, d, pos) // our attempt's own answer: readers go on where they are
		return followEnd{kind: followDone}, true
	case d.kind == "claim" && d.reason == "expired" && d.token == pos.token:
		return followEnd{kind: followExpired}, true
	case *recheck < 2:
		// Our attempt ended, or another began. The stream says which, in order: read
		// what follows our position before believing the meta. An attempt that
		// finished wrote its end before any later generation's first entry.
		*recheck++
		*read = true
		*deadline = time.Now().Add(20 * time.Millisecond)
		return followEnd{}, false
	}
	switch d.kind {
	case "hit": // our attempt's entries are gone (trimmed, or lost with a failover)
		r.serveHit(f, d, pos)
		return followEnd{kind: followDone}, true
	case "follow":
		pos.switchTo(f, d)
		*deadline, *recheck = time.Now().Add(d.remaining), 0
		*leaseEnd = *deadline
		*read = true
		return followEnd{}, false
	}
	return followEnd{kind: followExpired}, true
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

// apply feeds one stream entry to f; ok when the attempt ended.
func (r *remote) apply(f *flight, pos *position, m redis.XMessage) (followEnd, bool) {
	pos.last = m.ID
	t, _ := m.Values["t"].(string)
	tok, _ := m.Values["tok"].(string)
	if tok != pos.token {
		if t == "gen" { // a takeover: a new generation starts here
			f.startGen(RoleFollower, false)
			a, _ := strconv.Atoi(val(m, "a"))
			pos.token, pos.n, pos.attempt, pos.lost = tok, 1, a, false
		}
		return followEnd{}, false
	}
	if t == "gen" {
		return followEnd{}, false
	}
	n, _ := strconv.Atoi(val(m, "n"))
	if n != pos.n && !pos.lost {
		// Entries are missing (trimmed): this generation cannot be streamed. Wait for its
		// end, then finish from the stored answer (readers go on where they are) or give
		// the generation up and call again.
		pos.lost = true
	}
	pos.n = n + 1
	if pos.lost {
		switch t {
		case "done":
			return followEnd{kind: followLost}, true
		case "failed":
			return followEnd{kind: followFailed, reason: val(m, "r")}, true
		}
		return followEnd{}, false
	}
	var head *Head
	if s := val(m, "s"); s != "" {
		h, err := decodeHead(s, val(m, "h"))
		if err == nil {
			head = &h
		}
	}
	data := []byte(val(m, "d"))
	switch t {
	case "chunk":
		if head != nil {
			f.setHead(*head)
		}
		f.appendChunk(data)
	case "done":
		if head == nil {
			head = &Head{Status: 200}
		}
		landed, _ := strconv.ParseInt(val(m, "landed"), 10, 64)
		f.fence(landed)
		f.finish(*head, data)
		return followEnd{kind: followDone}, true
	case "failed":
		res := Result{Outcome: Retry, Body: data}
		if head != nil {
			res.Head = *head
		}
		f.resetGen(nil)
		return followEnd{kind: followFailed, res: res, reason: val(m, "r")}, true
	}
	return followEnd{}, false
}

func val(m redis.XMessage, k string) string {
	s, _ := m.Values[k].(string)
	return s
}
