package singleflight

import "context"

// Attempt is what an owner function is told of the attempt it runs, for its traces (ADR
// 0061): its number within the flight (1, 2, ...) and, for a takeover, why.
type Attempt struct {
	N        int
	Takeover string // "" for a first attempt; else expired, failed, shutdown or degraded
}

type attemptKey struct{}

func withAttempt(ctx context.Context, a Attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

// AttemptOf is the attempt an owner function's context runs; N is 0 outside one.
func AttemptOf(ctx context.Context) Attempt {
	a, _ := ctx.Value(attemptKey{}).(Attempt)
	return a
}
