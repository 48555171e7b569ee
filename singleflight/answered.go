package singleflight

import "time"

// The landing gate: a caller that has delivered nothing and may have joined after the answer
// landed joins the key anew (Reader.rejoin). A flight owned here goes by its own clock;
// elsewhere, by an upper bound of Redis's clock at the join from the flight's lookups,
// against complete's Redis time. See ADRs 0020 and 0021.

// driftDiv is the drift allowed between a process's clock and Redis's: 1/driftDiv.
const driftDiv = 1000

// clockRef pairs a reading of Redis's clock, in µs, with when its command was sent.
type clockRef struct {
	us   int64
	sent time.Time
}

// before is an upper bound of Redis's clock at local time t.
func (c clockRef) before(t time.Time) int64 {
	d := max(t.Sub(c.sent).Microseconds(), 0)
	return c.us + 1 + d + d/driftDiv
}

// sawRedis keeps the first and the latest reading of Redis's clock by f's lookups.
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

// setLanded sets when f's answer landed, in Redis's µs; 0 sends no caller back.
func (f *flight) setLanded(landed int64) {
	f.mu.Lock()
	f.landed = landed
	f.mu.Unlock()
}

// setLandedAt sets, for a flight owned here, the local time its final write was sent: callers
// that joined before it are given the answer.
func (f *flight) setLandedAt(sent time.Time) {
	f.mu.Lock()
	f.landedAt = sent
	f.mu.Unlock()
}

// joinedAfterAnswer reports whether a caller that joined f at local time joined may have
// come after its answer landed; f.mu held.
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
