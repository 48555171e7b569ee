package singleflight

import "time"

// The fence: no caller is given an answer it may have been sent after. A flight owned here
// sends back a caller that joined once its final write was sent. Elsewhere a caller is sent
// back when an upper bound of Redis's clock at its join (a lookup's reading, plus the time
// since and 1/driftDiv) is not below the answer's landing. Only a caller that has delivered
// nothing is sent back: it joins the key anew (Reader.rejoin). See ADRs 0020 and 0021.

// driftDiv is the drift allowed between a process's clock and Redis's: 1/driftDiv.
const driftDiv = 1000

// clockRef pairs a reading of Redis's clock, in µs, with when its command was sent.
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

// fenceAt sets, for a flight owned here, the local time its final write was sent: callers
// that joined before it are given the answer.
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
