package singleflight

import "errors"

// Errors reported by the package. Check them with errors.Is.
var (
	// ErrLeaseLost is the cause of an owner's flight context when another owner took over.
	ErrLeaseLost = errors.New("singleflight: lease lost")
	// ErrFlightGone is the error of an owner's renewal (EventHeartbeatFailed) when Redis
	// lost the flight and the owner's lease ran out before it could put it back (an outage
	// longer than the lease, then a restart without persistence): nobody holds the flight
	// in Redis, and the owner cannot tell whether another took it over and finished
	// meanwhile. Its call goes on for the callers in its process; it stops renewing and
	// appending, and its final write, fenced, decides.
	ErrFlightGone = errors.New("singleflight: Redis lost the flight after its lease ran out")
	// ErrTimeout is the cause of an owner's flight context when the hard timeout ran out.
	ErrTimeout = errors.New("singleflight: owner timed out")
	// ErrShutdown is the cause of an owner's flight context when the Group was closed.
	ErrShutdown = errors.New("singleflight: shutdown")
	// ErrFailed means the flight failed on every attempt without a response to share.
	ErrFailed = errors.New("singleflight: flight failed")
	// ErrGenerationChanged means the owner changed after this reader had received bytes of
	// the old owner's response; the rest of that response will never come.
	ErrGenerationChanged = errors.New("singleflight: generation changed")
	// ErrClosed is returned by a Group that has been closed.
	ErrClosed = errors.New("singleflight: closed")
	// ErrPanic wraps a panic recovered from an owner function.
	ErrPanic = errors.New("singleflight: owner panicked")
)
