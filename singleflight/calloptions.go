package singleflight

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// CallOptions are what one caller of DoWith asks for.
type CallOptions struct {
	// NoCache: a stored result is not served; an upstream call in flight is still joined.
	NoCache bool
	// MaxAge, if positive, accepts no stored result older (HTTP's max-age; ADR 0048).
	MaxAge time.Duration
	// Route and Model describe the call in the flights listing (see Group.Flights). They
	// are stored with the flight's meta in Redis, so they must not hold secrets.
	Route, Model string
	// Inline is for a caller that reads the answer only once it is whole: if it starts the
	// flight, DoWith leads it on the caller's goroutine and returns once the flight has
	// ended or waits on another instance's owner. The owner function must not wait for this
	// caller to read. See ADRs 0025 and 0029.
	Inline bool
	// Trace is the caller's span, parent of the spans of a flight it starts (Options.Tracer).
	Trace trace.SpanContext
	// Finish asks that the call run to its end and its answer be kept even if no caller
	// waits for it any more: any caller of a flight that asks it makes it so (ADR 0074).
	Finish bool
	// Context, if set, is an Inline starter's: once it ends while DoWith leads on its
	// goroutine, where the caller cannot close its Reader, the caller no longer waits. Every
	// other caller stops waiting when it closes its Reader (ADR 0074).
	Context context.Context
}
