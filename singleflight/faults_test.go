package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// A no-cache caller joins an identical call in flight, in memory too.
func TestNoCacheJoinsCallInFlight(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			rp := newReply("x")
			running := make(chan struct{}, 2)
			fn := started(running, rp.fn)
			r1, _ := g.Do(key, false, fn)
			<-running
			r2, _ := g.Do(key, true, fn)
			rp.release()
			ctx := context.Background()
			if o1, o2 := readAll(ctx, r1), readAll(ctx, r2); o1.body != "x" || o2.body != "x" || rp.calls.Load() != 1 {
				t.Fatalf("got %q and %q with %d calls; want x twice, 1 call", o1.body, o2.body, rp.calls.Load())
			}
		})
	}
}

// The heartbeat ends with the hard timeout, even for an owner function that ignores its
// context: the lease then runs out and a follower takes over.
func TestHeartbeatStopsAtHardTimeout(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{Timeout: 300 * time.Millisecond, LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, MaxAttempts: 2}
	a, f := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	stuckOwner(t, a, key)
	rp := newReply("second")
	rp.release()
	if got := doAll(t, f, key, 1, rp.fn)()[0]; got.body != "second" {
		t.Fatalf("follower got (%q, %v); want the takeover's answer", got.body, got.err)
	}
}
