package singleflight

import (
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// An owner answers its local readers as soon as it has a whole answer, before its final
// write has reached Redis: that round trip is not paid by the request that made the call.
// Nothing is lost if the process dies in between: the flight's lease runs out and a
// follower takes over, as for any owner that died.
//
// For that round trip, though, Redis still shows the flight running after a client has
// its answer, and a request sent after the answer (no-cache, or with nothing stored)
// would join the flight and be given the answer it was sent to replace. So the final
// write carries a fence in time: a lower bound of Redis's clock at the moment the owner
// answered (field "a" of the done entry). A follower knows an upper bound of Redis's clock
// at the moment each of its callers joined: the lookup that found the flight running
// answers Redis's time, and a caller that joined the local flight later adds the time
// it has waited since the lookup was sent. A caller that may have joined after the
// answer (its upper bound is not below the fence) is not given it: it looks the key up
// again, and gets the stored answer if it takes one, or the next call.
//
// This holds where no byte of the answer reached a follower's client before the done
// entry: answers written whole (the owner wrote nothing through its Writer). A streamed
// answer ends for its local readers only once its final write has landed, as before.
//
// The bounds compare a process's monotonic clock with Redis's: they allow for 0.1 % of
// drift between the two, ten times what NTP lets a clock slew, and they trust Redis's
// clock not to step back by more than a round trip (a failover to a replica whose clock
// is behind could let a request sent right after an answer have that answer).
//
// What it costs: Redis's clock is known to the owner only as of its last reply, so the
// fence lies below the moment of the answer by that reply's way back plus the drift
// allowed since (a fraction of a millisecond when Redis is near). A caller that looked
// the key up within that margin before the answer cannot be told from one that came
// after it, and looks again too, like a read restarted for its clock's uncertainty: it
// takes the stored answer if it takes one, else it calls (a no-cache caller, or an
// answer not stored). Callers in the owner's own Group are told exactly: the done entry
// also carries the Group's own clock at the answer, which only that Group can read.

// driftDiv is the drift allowed between a process's clock and Redis's: 1/driftDiv.
const driftDiv = 1000

// clockRef pairs a reading of Redis's clock, in µs, with a local time.
type clockRef struct {
	us int64
	at time.Time
}

// after is a lower bound of Redis's clock at local time t, for a reading made before at
// (at: when its reply arrived).
func (c clockRef) after(t time.Time) int64 {
	d := t.Sub(c.at).Microseconds()
	return c.us + d - max(d, 0)/driftDiv
}

// before is an upper bound of Redis's clock at local time t, for a reading made after at
// (at: when its command was sent). A time before at is bounded by the reading itself.
func (c clockRef) before(t time.Time) int64 {
	d := max(t.Sub(c.at).Microseconds(), 0)
	return c.us + 1 + d + d/driftDiv
}

// ownerClock is what an owner knows of Redis's clock: the latest of its claim's and its
// renewals' readings, each a lower bound.
type ownerClock struct{ ref atomic.Pointer[clockRef] }

// saw takes a reading made before at, unless the one it has bounds Redis's clock higher.
func (c *ownerClock) saw(us int64, at time.Time) {
	if us <= 0 {
		return
	}
	ref := &clockRef{us: us, at: at}
	for {
		old := c.ref.Load()
		if old != nil && old.after(at) >= us {
			return
		}
		if c.ref.CompareAndSwap(old, ref) {
			return
		}
	}
}

// by is a lower bound of Redis's clock at local time t; 0 if unknown.
func (c *ownerClock) by(t time.Time) int64 {
	r := c.ref.Load()
	if r == nil {
		return 0
	}
	return r.after(t)
}

// sawRedis records a reading of Redis's clock by one of f's lookups, sent at local time
// sent: the first and the latest are kept, each an upper bound for callers that joined
// before it was sent.
func (f *flight) sawRedis(us int64, sent time.Time) {
	if us <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ref := clockRef{us: us, at: sent}
	if f.clockFirst.us == 0 {
		f.clockFirst = ref
	}
	f.clockLast = ref
}

// answered is when an owner answered its own client, as its final write tells.
type answered struct {
	redis int64     // a lower bound of Redis's clock, µs; 0: not before the final write
	local time.Time // the moment, if the owner's Group is this one
}

// stamp is the done entry's "l": the Group's epoch and its clock at t, which only a
// Group of that epoch can read back (see localAt).
func (g *Group) stamp(t time.Time) string {
	return g.epoch + ":" + strconv.FormatInt(int64(t.Sub(g.born)), 10)
}

// localAt reads a stamp back: the moment, if it was made by this Group; zero otherwise.
func (g *Group) localAt(s string) time.Time {
	ep, ns, ok := strings.Cut(s, ":")
	if !ok || ep != g.epoch {
		return time.Time{}
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return g.born.Add(time.Duration(n))
}

// finishAnswered ends the flight with an answer whose owner answered its own client
// before the final write, as a says.
func (f *flight) finishAnswered(h Head, body []byte, a answered) {
	f.fence(a)
	f.finish(h, body)
}

// fence sets the fence of the answer the flight is about to end with.
func (f *flight) fence(a answered) {
	f.mu.Lock()
	f.answered = a
	f.mu.Unlock()
}

// joinedAfterAnswer reports whether a caller that joined f at local time joined may have
// joined after its answer reached a client; f.mu held.
func (f *flight) joinedAfterAnswer(joined time.Time) bool {
	switch {
	case f.answered.redis == 0:
		return false
	case !f.answered.local.IsZero():
		return !joined.Before(f.answered.local) // one clock: exact
	case f.clockFirst.us == 0:
		return true // nothing to tell by: look again
	}
	j := min(f.clockFirst.before(joined), f.clockLast.before(joined))
	return j >= f.answered.redis
}
