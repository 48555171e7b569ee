package singleflight

import (
	"context"
	"errors"
	"fmt"
)

// Errors reported by the package. Check them with errors.Is.
var (
	// ErrLeaseLost is the cause of an owner's flight context when another owner took over.
	ErrLeaseLost = errors.New("singleflight: lease lost")
	// ErrFlightGone means Redis lost the flight past the owner's lease: its call goes on for
	// its own process's callers only. See ADR 0011.
	ErrFlightGone = errors.New("singleflight: Redis lost the flight after its lease ran out")
	// ErrTimeout is the cause of an owner's flight context when the hard timeout ran out.
	ErrTimeout = errors.New("singleflight: owner timed out")
	// ErrShutdown is the cause of an owner's flight context when the Group was closed.
	ErrShutdown = errors.New("singleflight: shutdown")
	// ErrFailed means the flight failed on every attempt without a response to share.
	ErrFailed = errors.New("singleflight: flight failed")
	// ErrGenerationChanged means the owner changed after this reader had bytes of the old
	// one's response, whose rest will never come.
	ErrGenerationChanged = errors.New("singleflight: generation changed")
	// ErrClosed is returned by a Group that has been closed.
	ErrClosed = errors.New("singleflight: closed")
	// ErrPanic wraps a panic recovered from an owner function.
	ErrPanic = errors.New("singleflight: owner panicked")
	// ErrAbandoned is the cause of an owner's flight context when no caller, here or on
	// any instance, waited for its call for the grace: the call was cut. See ADR 0074.
	ErrAbandoned = errors.New("singleflight: abandoned: no caller waits")
)

// errCallersLeft ends a local flight that is not owned here once its last reader closed.
var errCallersLeft = fmt.Errorf("singleflight: every caller left: %w", context.Canceled)

// errShardDown is why a write was not sent: the flight's Redis shard is degraded.
var errShardDown = errors.New("singleflight: the flight's Redis is down")
