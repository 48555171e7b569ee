package singleflight

import "time"

// No caller is given an answer it may have been sent after. An answer reaches clients only
// once its final write has landed: the owner's after complete's reply, followers elsewhere
// after its done entry. But a local flight takes new callers until it has ended, and it
// ends a moment after other instances may have answered: a request sent by a client that
// already has the answer could join, on another instance (or on the owner's, before
// complete's reply is handled), a flight that has not ended yet, and be given the answer
// it was sent to replace (no-cache, or an answer not stored).
//
// Each caller records when it joined. The owner's own flight is fenced by its own clock: a
// caller that joined once the final write was sent is sent back (the margin: that write's
// round trip). Elsewhere, complete's own time, Redis's clock in µs, is in the done entry
// ("landed") and the stored answer, and a following flight keeps the first and the latest
// Redis time its lookups and claims answered and when each was sent: an upper bound of Redis's clock when a caller joined is the reading of a lookup
// sent after it, or one sent before plus the time since, plus 0.1 % for drift. A caller
// whose bound is not below the landing may have joined after it: it is not given the
// answer, and joins the key anew (Reader.rejoin), getting the stored answer if it takes
// one, or the next call. The caller whose lookup started the flight looked before
// complete: it is never sent back. A later caller is sent back if it joined within the
// margin before the landing: the drift on the flight's wait, plus the way of the lookup it
// is bounded by to Redis. Sent back needlessly, a caller that takes stored answers (the
// default) pays a round trip; one that does not, a call of its own.
//
// Only a caller that has delivered nothing can be sent back. A streamed answer's callers
// are handed its chunks as they come, from the first, so one that joins before the end
// gets the stream whole, and the owner's own callers have its last chunk before complete:
// the fence covers answers read whole (unary ones) and callers that first read after the
// end.
//
// It trusts the clocks: Redis's not to step back between a lookup and the complete after
// it (a failover to a replica whose clock is behind could send callers back, the flight's
// first included, who then call again; one whose clock is ahead could let a late caller
// through), and a process's monotonic clock to drift less than 0.1 % from it. An answer
// written by a version before this one has no landing, and fences nobody.
//
// Answering the owner's client before complete lands was built on a fence like this one and
// undone: docs/decisions.md says why.

// driftDiv is the drift allowed between a process's clock and Redis's: 1/driftDiv.
const driftDiv = 1000

// clockRef pairs a reading of Redis's clock, in µs, with the local time its command was
// sent.
type clockRef struct {
	us   int64
	sent time.Time
}

// before is an upper bound of Redis's clock at local time t. A time before the command was
// sent is bounded by the reading itself.
func (c clockRef) before(t time.Time) int64 {
	d := max(t.Sub(c.sent).Microseconds(), 0)
	return c.us + 1 + d + d/driftDiv
}

// sawRedis records a reading of Redis's clock by one of f's lookups: the first and the
// latest are kept.
func (f *flight) sawRedis(ref clockRef) {
	if ref.us <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.clockFirst.us == 0 {
		f.clockFirst = ref
	}
	f.clockLast = ref
}

// fence sets when the answer the flight is about to end with landed (Redis's clock, µs;
// 0: not known, no caller is sent back).
func (f *flight) fence(landed int64) {
	f.mu.Lock()
	f.landed = landed
	f.mu.Unlock()
}

// fenceAt sets, for a flight owned here, the local time its final write was sent: no
// client had the answer before, and callers that joined before are given it. One clock,
// no margin but the write's round trip.
func (f *flight) fenceAt(sent time.Time) {
	f.mu.Lock()
	f.landedAt = sent
	f.mu.Unlock()
}

// joinedAfterAnswer reports whether a caller that joined f at local time joined may have
// joined after its answer landed; f.mu held.
func (f *flight) joinedAfterAnswer(joined time.Time) bool {
	switch {
	case !f.landedAt.IsZero():
		return !joined.Before(f.landedAt)
	case f.landed == 0:
		return false
	case f.clockFirst.us == 0:
		return true // nothing to tell by: look again
	}
	return min(f.clockFirst.before(joined), f.clockLast.before(joined)) >= f.landed
}
