package singleflight

import "context"

// memory is the backend of a Group without Redis: every flight is owned in this process.
type memory struct{ g *Group }

func (memory) name() string { return "memory" }

func (m memory) lead(ctx context.Context, f *flight) bool {
	f.decide(RoleOwner)
	m.g.observe(Event{Kind: EventRole, Key: f.key, Role: RoleOwner})
	return m.g.ownLocally(ctx, f, 1)
}

func (memory) check(context.Context) error { return nil }

func (memory) forget(context.Context, string) (bool, error) { return false, nil }

func (m memory) flights(_ context.Context, limit int) ([]FlightInfo, bool, error) {
	list, more := m.g.localFlights(limit)
	return list, more, nil
}

// localOwnership is ownership inside one process: nothing to renew, fence or write.
type localOwnership struct{}

func (localOwnership) heartbeat(context.Context, context.CancelCauseFunc) func() { return func() {} }
func (localOwnership) appendBatch(context.Context, int, *Head, []byte) error     { return nil }
func (localOwnership) fail(context.Context, Result, string) error                { return nil }
func (localOwnership) unusable() bool                                            { return false }
func (localOwnership) goesOn() bool                                              { return false }
func (localOwnership) again(context.Context) error                               { return nil }
func (localOwnership) shared() bool                                              { return false }

func (localOwnership) complete(context.Context, final) error { return nil }
func (localOwnership) unwritten()                            {}
func (localOwnership) cut(context.Context) bool              { return true }

// ownLocally owns f in this process alone, attempt after attempt; false when another
// goroutine ends f.
func (g *Group) ownLocally(ctx context.Context, f *flight, attempt int) bool {
	a := AttemptOf(ctx)
	a.N = attempt
	end, res, _ := g.own(withAttempt(ctx, a), f, localOwnership{})
	if end == attemptDone || end == attemptAbandoned || ctx.Err() != nil || !g.retryDue(f, attempt, res) {
		return true
	}
	return g.retryAfterJitter(ctx, f, func() bool {
		g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: takeoverFailed.String()})
		return g.ownLocally(withAttempt(ctx, Attempt{Takeover: takeoverFailed.String()}), f, attempt+1)
	})
}
