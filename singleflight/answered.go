package singleflight

import "time"

// No caller is given an answer it may have been sent after. An answer reaches clients only
// once its final write has landed: the owner's after complete's reply, followers elsewhere
// after its done entry. But a follower's local flight takes new callers until it has read
// that entry, and it reads it a moment after other instances may have: a request sent by
// a client that already has the answer from one instance could join another instance's
// flight in that moment and be given the answer it was sent to replace (no-cache, or an
// answer not stored).
//
// So complete writes its own time, Redis's clock in µs, into the done entry ("a") and the
// stored answer. A follower keeps, for its local flight, the first and the latest Redis
// time its lookups answered and when each was sent, and each caller records when it
// joined: an upper bound of Redis's clock when a caller joined is the reading of a lookup
// sent after it, or one sent before plus the time since, plus 0.1 % for drift. A caller
// whose bound is not below the fence may have joined after the answer landed: it is not
// given it, and joins the key anew (Reader.rejoin), getting the stored answer if it takes
// one, or the next call. The caller whose lookup started the flight saw it running, so
// before complete: it is never sent back.
//
// Only a caller that has delivered nothing can be sent back: for a streamed answer that
// is one that joined after the last chunk but before the end.
//
// Answering the owner's client before complete lands was built on this fence and undone:
// docs/decisions.md says why.

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
func (f *flight) sawRedis(us int64, sent time.Time) {
	if us <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ref := clockRef{us: us, sent: sent}
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

// joinedAfterAnswer reports whether a caller that joined f at local time joined may have
// joined after its answer landed; f.mu held.
func (f *flight) joinedAfterAnswer(joined time.Time) bool {
	switch {
	case f.landed == 0:
		return false
	case f.clockFirst.us == 0:
		return true // nothing to tell by: look again
	}
	return min(f.clockFirst.before(joined), f.clockLast.before(joined)) >= f.landed
}
