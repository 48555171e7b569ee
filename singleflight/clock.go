package singleflight

import (
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/poll"
)

// A follower's clock: when it next looks its flight up in Redis, and why (ADR 0083). What
// the follower observed is recorded by the methods below, each the only writer of the
// fields it names; next alone turns it, with what the hub heard of the owner's instance,
// into the one timer a wait arms.
//
//	field       set by                              what it bounds
//	own, why    newClock, entries, found, switched,  the look, unless alive messages put it off:
//	            restoring, late, rereading, gone,    the lease the follower knows, a re-read, a
//	            blind                                poll, a late final write
//	leaseEnd    newClock, entries, found, switched,  how long a blind look asks again, and how long
//	            gone, looking, blindLook             a meta Redis lost is waited back (ADR 0010)
//	leaseWas    looking                              what blindLook puts back in a Cluster (ADR 0023)
//	since       newClock, entries, looked            alive messages heard before it count for nothing
//	renewed     entries, found, owner                alive messages count once the owner is seen at
//	                                                 work (ADR 0059)
//	token       newClock, owner                      the attempt followed: always the position's
//	trusted     newClock, owner, looked, gone        alive messages count until then: the follow's
//	                                                 age, one to ten leases (ADR 0082); zero: the
//	                                                 owner's instance said the token gone (ADR 0009)
//	outage      blind, outlasting, answered          Redis could not be asked while the callers had
//	                                                 bytes since the last look it answered
//	lapsed      ranOut, entries, found, owner        a look found the lease run out, and the owner
//	                                                 was not seen at work since
//	lateUntil   answered, ranOut                     a lease that ran out is waited that long for
//	                                                 a late write: a lease after an outage (ADR 0060),
//	                                                 a grace after it was first found run out (ADR 0086)
//
// What the hub heard (aliveView) puts the look off to a lease after the owner's instance's
// last alive message, within the trust; the hub's silence timer of that channel wakes the
// follower when the messages stop (internal/wake/alive.go), so the wait's own timer is set
// at the trust's end (lookAlive). A wait arms next's time, or, while the callers outlast an
// outage, outageNext's.
type followClock struct {
	lease   time.Duration // Options.LeaseTTL
	grace   time.Duration // Options.TakeoverJitter: how long a claimer may wait on a lease run out
	recheck time.Duration // caps every wait when set (remote.recheckEvery, tests)

	start     time.Time // the follow began
	own       time.Time // when to look unless alive messages put it off
	why       lookReason
	since     time.Time
	leaseEnd  time.Time
	leaseWas  time.Time // leaseEnd before the look under way took the alive messages' word
	renewed   bool
	token     string
	trusted   time.Time
	outage    bool
	lapsed    bool
	lateUntil time.Time
}

// lookReason says why a follower looks (or reads) when it does.
type lookReason uint8

const (
	lookLease      lookReason = iota // the lease the follower knows runs out
	lookReread                       // the meta moved on before the stream said so: read it, look again (ADR 0006)
	lookBlind                        // Redis did not answer the last look: ask again
	lookGone                         // the owner's instance said the attempt gone (ADRs 0009, 0011)
	lookLate                         // a late final write after an outage may still land (ADR 0060)
	lookAlive                        // the owner's instance is alive: look when it falls silent, or at the trust's end
	lookVouched                      // alive messages vouched for the attempt until then, and no message moves it
	lookTrust                        // the trust in the alive messages runs out (ADR 0082)
	lookRecheck                      // remote.recheckEvery (tests)
	readPubsub                       // the pub/sub connection is down: read the stream instead (ADR 0012)
	readOutage                       // Redis cannot be asked and the callers have bytes: read once it answers (ADR 0060)
	lookReadFailed                   // a read of the stream failed (a failover, say): ask the meta
	lookHang                         // the shard hangs: a look says whether the follower may call (ADR 0023)
)

var lookReasons = [...]string{"the lease known ends", "a re-read", "a blind look again", "said gone", "a late write waited", "alive", "vouched until then", "trust ends", "recheck", "pub/sub down", "outage", "a read failed", "Redis hangs"}

func (r lookReason) String() string { return lookReasons[r] }

// The follower's short waits.
const (
	reread         = 20 * time.Millisecond // after a look found the meta ahead of the stream
	blindRetry     = poll.Every            // after a look Redis did not answer
	outageRead     = poll.Every            // between reads of a follower that outlasts an outage (ADR 0060)
	pubsubDownRead = poll.Every            // between reads while the pub/sub connection is down (ADR 0012)
)

// aliveView is what the hub heard of the owner's instance, for one follower.
type aliveView struct {
	listening bool      // the follower watches the owner instance's alive channel
	until     time.Time // a lease after the last message that did not say the token unrenewed; zero: none
	moving    bool      // until is the last message's: the next moves it, the silence timer fires at it
	// unconfirmed: since when the flight's own channel is not known to hold (zero: it is);
	// messages heard meanwhile put the look off no further than a lease from it (ADR 0055).
	unconfirmed time.Time
	blindShard  bool // a Cluster whose flight's shard is down: the messages say nothing of it (ADR 0023)
	pubsubDown  bool // the pub/sub connection is down
}

func newClock(now time.Time, lease, grace, recheck, remaining time.Duration, token string) followClock {
	c := followClock{lease: lease, grace: grace, recheck: recheck, start: now, since: now, token: token}
	c.own, c.why, c.leaseEnd = now.Add(remaining), lookLease, now.Add(remaining)
	c.trust(now)
	return c
}

// trust believes the alive messages for as long as the follow has lasted, one lease at
// least and ten at most: a lost word costs no more than that (ADR 0082).
func (c *followClock) trust(now time.Time) {
	c.trusted = now.Add(min(max(now.Sub(c.start), c.lease), 10*c.lease))
}

// owner: the attempt followed is token's. A new one is trusted anew, its alive messages
// count once it is seen at work (ADR 0059), and its lease's lapse is its own (ADR 0086).
func (c *followClock) owner(now time.Time, token string) {
	if token != c.token {
		c.token, c.renewed, c.lapsed = token, false, false
		c.trust(now)
	}
}

// entries: the owner wrote, so it is at work, and its lease runs a lease from now.
func (c *followClock) entries(now time.Time) {
	c.renewed, c.since, c.lapsed = true, now, false
	c.leaseEnd = now.Add(c.lease)
	c.own, c.why = c.leaseEnd, lookLease
}

// found: a look found the attempt running, its lease remaining; a lease moved past the one
// known shows its owner at work.
func (c *followClock) found(now time.Time, remaining time.Duration) {
	c.own, c.why, c.lapsed = now.Add(remaining), lookLease, false
	c.renewed = c.renewed || c.own.After(c.leaseEnd)
	c.leaseEnd = c.own
}

// switched: a look found another attempt running (token's), its lease remaining.
func (c *followClock) switched(now time.Time, remaining time.Duration, token string) {
	c.own, c.why, c.leaseEnd = now.Add(remaining), lookLease, now.Add(remaining)
	c.owner(now, token)
}

// restoring: the meta is gone while the lease the follower knows runs; its owner puts it
// back meanwhile (ADR 0010).
func (c *followClock) restoring() { c.own, c.why = c.leaseEnd, lookLease }

// ranOut: a look found the attempt's lease run out, nobody having taken it over. The first
// such look since its owner was seen at work waits for it as long as a claimer would (the
// takeover jitter): a renewal a little late still lands while nobody claims (ADR 0086).
func (c *followClock) ranOut(now time.Time) {
	if !c.lapsed {
		c.lapsed = true
		if until := now.Add(c.grace); until.After(c.lateUntil) {
			c.lateUntil = until
		}
	}
}

// late: the attempt's lease ran out; a renewal or its final write may land until lateUntil
// (ADRs 0060, 0086).
func (c *followClock) late() { c.own, c.why = c.lateUntil, lookLate }

// rereading: the meta moved on before the stream said so (ADR 0006).
func (c *followClock) rereading(now time.Time) { c.own, c.why = now.Add(reread), lookReread }

// gone: the owner's instance said the attempt gone: look now; the first time, its lease
// is taken as over (ADRs 0009, 0011).
func (c *followClock) gone(now time.Time) {
	if !c.trusted.IsZero() {
		c.leaseEnd = now
	}
	c.trusted = time.Time{}
	c.own, c.why = now, lookGone
}

// saidGone reports whether the owner's instance said the attempt followed gone.
func (c *followClock) saidGone() bool { return c.trusted.IsZero() }

// looking: a look begins; the lease known is taken to run as long as the alive messages
// vouch for it (blindLook may take that back).
func (c *followClock) looking(now time.Time, a aliveView) {
	c.leaseWas = c.leaseEnd
	if v, _ := c.vouched(now, a); v.After(c.leaseEnd) {
		c.leaseEnd = v
	}
}

// looked: Redis answered the look; alive messages from now on count, trusted anew unless
// the attempt was said gone.
func (c *followClock) looked(now time.Time) {
	c.since = now
	if !c.saidGone() {
		c.trust(now)
	}
}

// blindLook: Redis did not answer the look. In a Cluster, the alive messages' word is
// taken back: they go on while one shard is down (ADR 0023).
func (c *followClock) blindLook(sharded bool) {
	if sharded {
		c.leaseEnd = c.leaseWas
	}
}

// blind: ask again soon; within the lease known, or (outage) while the callers, who have
// bytes, outlast Redis (ADRs 0023, 0060).
func (c *followClock) blind(now time.Time, outage bool) {
	c.own, c.why = now.Add(blindRetry), lookBlind
	if outage {
		c.outage = true
	} else if c.leaseEnd.Before(c.own) {
		c.own = c.leaseEnd
	}
}

// outlasting: the follower waits for Redis, its callers having bytes (ADR 0060).
func (c *followClock) outlasting() { c.outage = true }

// outageNext is when a follower that outlasts an outage reads again (ADR 0060).
func (c *followClock) outageNext(now time.Time) (time.Time, lookReason) {
	return now.Add(outageRead), readOutage
}

// answered: Redis answered a look; the first answer after an outage waits a lease for an
// owner that lost Redis too and writes late (ADR 0060).
func (c *followClock) answered(now time.Time) {
	if c.outage {
		c.outage, c.lateUntil = false, now.Add(c.lease)
	}
}

// vouched is how long the alive messages put the look off: zero unless the owner was seen
// at work, its channel is watched and trusted, and a message came since; onSilence says the
// hub's silence timer ends it sooner.
func (c *followClock) vouched(now time.Time, a aliveView) (until time.Time, onSilence bool) {
	if !c.renewed || !a.listening || c.saidGone() || a.blindShard {
		return time.Time{}, false
	}
	until, moving := a.until, a.moving
	if !a.unconfirmed.IsZero() && a.unconfirmed.Add(c.lease).Before(until) {
		until, moving = a.unconfirmed.Add(c.lease), false
	}
	if !until.After(now) || !until.Add(-c.lease).After(c.since) {
		return time.Time{}, false // silent for a lease, or heard only before since
	}
	if !until.Before(c.trusted) {
		return c.trusted, false
	}
	return until, moving
}

// next is when the follower looks (or reads) next, and why: the one timer its wait arms.
func (c *followClock) next(now time.Time, a aliveView) (time.Time, lookReason) {
	at, why := c.own, c.why
	if v, onSilence := c.vouched(now, a); v.After(at) {
		switch {
		case onSilence:
			at, why = c.trusted, lookAlive // the hub wakes the follower at v if no message comes
		case v.Equal(c.trusted):
			at, why = v, lookTrust
		default:
			at, why = v, lookVouched
		}
	}
	if c.recheck > 0 && at.After(now.Add(c.recheck)) {
		at, why = now.Add(c.recheck), lookRecheck
	}
	if a.pubsubDown && at.After(now.Add(pubsubDownRead)) {
		at, why = now.Add(pubsubDownRead), readPubsub
	}
	return at, why
}
