// Package poll holds the waits shared by the protocol and its wake-up hub: the interval at
// which what pub/sub would announce is read instead, and a sleep that ends with a context.
package poll

import (
	"context"
	"time"
)

// Every is how often a follower reads its stream while the pub/sub connection is down, and
// how soon a SUBSCRIBE that failed is sent again (ADRs 0012, 0055).
const Every = 250 * time.Millisecond

// Sleep waits d, or until ctx ends (then false).
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
