package singleflight

import (
	"fmt"
	"strconv"
	"time"
)

// verdict is what lookup.lua or claim.lua told a leader to do.
type verdict uint8

const (
	verdictHit       verdict = iota + 1 // a stored answer serves the flight
	verdictFollow                       // another attempt runs: follow its stream
	verdictClaim                        // nobody runs the flight: it may be claimed (see seen)
	verdictOwner                        // the script claimed the flight with our token
	verdictChanged                      // claim: the meta moved on since the lookup
	verdictExhausted                    // claim: no attempt is left
)

var verdictOf = map[string]verdict{"hit": verdictHit, "follow": verdictFollow, "claim": verdictClaim,
	"owner": verdictOwner, "changed": verdictChanged, "exhausted": verdictExhausted}

func (v verdict) String() string {
	return [...]string{"", "hit", "follow", "claim", "owner", "changed", "exhausted"}[v]
}

// seen is the state in which a lookup that answered claim found the flight.
type seen uint8

const (
	seenAbsent  seen = iota + 1 // no meta
	seenExpired                 // running, with its lease run out
	seenFailed                  // its last attempt failed
	seenDone                    // done, with no stored answer to serve
	seenCut                     // cut: nobody waited for it (ADR 0074); a new flight starts at once
)

var seenOf = map[string]seen{"absent": seenAbsent, "expired": seenExpired, "failed": seenFailed, "done": seenDone, "cut": seenCut}

// state is the meta state claim.lua compares with what the lookup saw.
func (s seen) state() string {
	switch s {
	case seenExpired:
		return "R"
	case seenFailed:
		return "F"
	case seenDone:
		return "D"
	case seenCut:
		return "A"
	}
	return ""
}

// takeover is why a leader contends for a flight it did not start (Event.Reason).
type takeover uint8

const (
	takeoverNone takeover = iota
	takeoverExpired
	takeoverFailed
	takeoverShutdown
	takeoverDegraded
)

func (t takeover) String() string {
	return [...]string{"", "expired", "failed", "shutdown", "degraded"}[t]
}

// takeoverOf is the takeover a claim of a flight seen in s would be.
func takeoverOf(s seen) takeover {
	switch s {
	case seenExpired:
		return takeoverExpired
	case seenFailed:
		return takeoverFailed
	}
	return takeoverNone
}

// decision is the answer of lookup.lua or claim.lua, decoded once. See ADR 0052.
type decision struct {
	verdict   verdict
	token     string // follow: the owner's; claim: the one seen; hit: the one that stored it; owner: ours
	remaining time.Duration
	gen       string // stream ID of the generation's first entry
	attempt   int
	batches   int   // follow: batches the owner appended so far (-1: not known)
	until     int64 // owner: lease_until, Redis time in ms
	seen      seen  // claim
	head      Head  // hit
	body      []byte
	age       time.Duration
	ttl       time.Duration // hit: its whole time to live, age included (0: unknown)
	clock     clockRef      // owner and follow: Redis's clock when the script ran (see answered.go)
	landed    int64         // hit: when the stored answer's complete ran, Redis's clock in µs
}

// decodeLookup decodes lookup.lua's answer; candidate is the token it was offered.
func decodeLookup(v []any, candidate string, sent time.Time) (decision, error) {
	d := decision{verdict: verdictOf[str(v, 0)], clock: clockRef{sent: sent}}
	var err error
	switch d.verdict {
	case verdictHit:
		d.head, err = decodeHead(str(v, 1), str(v, 2))
		d.body = []byte(str(v, 3))
		d.age = time.Duration(num(v, 4)) * time.Millisecond
		d.token = str(v, 5)
		if left := num(v, 6); left > 0 {
			d.ttl = d.age + time.Duration(left)*time.Millisecond
		}
		d.landed = num(v, 7)
	case verdictFollow:
		d.decodeFollow(v)
		d.batches = -1
		if len(v) > 5 {
			d.batches = int(num(v, 5))
		}
		d.clock.us = num(v, 6)
	case verdictClaim:
		d.token, d.attempt, d.seen, d.gen = str(v, 1), int(num(v, 2)), seenOf[str(v, 3)], str(v, 4)
	case verdictOwner:
		d.decodeOwner(v, candidate)
	default:
		err = fmt.Errorf("singleflight: lookup: unexpected answer %q", str(v, 0))
	}
	return d, err
}

// decodeClaim decodes claim.lua's answer to a claim with token.
func decodeClaim(v []any, token string, sent time.Time) (decision, error) {
	d := decision{verdict: verdictOf[str(v, 0)], clock: clockRef{sent: sent}}
	switch d.verdict {
	case verdictOwner:
		d.decodeOwner(v, token)
	case verdictFollow:
		d.decodeFollow(v)
		d.batches = -1 // not known: the follower reads the stream at once
		d.clock.us = num(v, 5)
	case verdictChanged, verdictExhausted:
	default:
		return d, fmt.Errorf("singleflight: claim: unexpected answer %q", str(v, 0))
	}
	return d, nil
}

func (d *decision) decodeOwner(v []any, token string) {
	d.token, d.attempt, d.gen, d.until, d.clock.us = token, int(num(v, 1)), str(v, 2), num(v, 3), num(v, 4)
}

func (d *decision) decodeFollow(v []any) {
	d.token, d.remaining, d.gen, d.attempt = str(v, 1), time.Duration(num(v, 2))*time.Millisecond, str(v, 3), int(num(v, 4))
}

func str(v []any, i int) string {
	if i >= len(v) {
		return ""
	}
	switch x := v[i].(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

func num(v []any, i int) int64 {
	if i >= len(v) {
		return 0
	}
	switch x := v[i].(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
