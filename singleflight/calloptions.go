package singleflight

import (
	"time"
)

// CallOptions are what one caller of DoWith asks for.
type CallOptions struct {
	// NoCache: a stored result is not served; an upstream call in flight is still joined.
	NoCache bool
	// MaxAge, if positive, accepts a stored result no older than this (HTTP's max-age). A
	// caller with a MaxAge joins an upstream call in flight, never a flight that may serve
	// an older stored result.
	MaxAge time.Duration
	// Route and Model describe the call in the flights listing (see Group.Flights). They
	// are stored with the flight's meta in Redis, so they must not hold secrets.
	Route, Model string
	// Inline is for a caller that reads the answer only once it is whole: if it starts the
	// flight, DoWith leads it on the caller's goroutine, and returns once the flight has
	// ended or waits on another instance's owner (then, as always, in Reader.Next), so
	// that an owned flight costs no goroutine of its own. When its call fails while others
	// wait with it, DoWith returns with that answer, and the retries for the others go on
	// on a goroutine of their own. The owner function must not wait
	// for this caller to read (it has not started to).
	Inline bool
}
