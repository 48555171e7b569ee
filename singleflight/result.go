package singleflight

import (
	"context"
	"time"
)

// Role says how a caller was served.
type Role uint8

// Roles.
const (
	RoleUnknown  Role = iota
	RoleOwner         // this caller's process ran the upstream call for it
	RoleFollower      // another caller's upstream call served it
	RoleHit           // a stored result served it
)

func (r Role) String() string {
	switch r {
	case RoleOwner:
		return "owner"
	case RoleFollower:
		return "follower"
	case RoleHit:
		return "hit"
	}
	return "unknown"
}

// Head is the status and the headers worth replaying of a response.
type Head struct {
	Status int
	Header map[string][]string
	// Note is what Options.Annotate made of a stored answer, for hits served here only.
	Note any
	// Origin says which call made the answer (the proxy's trace origin; ADR 0061): it
	// travels with the answer to followers and hits, in Redis and in memory.
	Origin string
}

// Outcome says what may be done with a response.
type Outcome uint8

// Outcomes.
const (
	// Store shares the response with every waiter and stores it for Options.ResultTTL.
	Store Outcome = iota
	// Share shares the response with this flight's waiters only.
	Share
	// Retry marks this attempt failed: another waiter takes over, up to MaxAttempts; then
	// the waiters get this response.
	Retry
)

// Result is what an owner function returns. Body, if any, follows what was written to the
// Writer; Head is used when WriteHead was not called.
type Result struct {
	Head    Head
	Body    []byte
	Outcome Outcome
	// TTL keeps a Store outcome this long. If zero, Options.ResultTTL is used.
	TTL time.Duration
}

// Func runs the upstream call of a flight, under a context detached from every caller and
// ended by the hard timeout, a lost lease or shutdown. An error fails the attempt (Retry).
type Func func(ctx context.Context, w *Writer) (Result, error)
