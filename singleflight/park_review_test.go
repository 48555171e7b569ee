package singleflight

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// silentOwner makes g's heartbeats, and so its alive messages, stop once the returned
// function is called, as when its process dies after its followers have heard it for a
// while.
func silentOwner(g *Group) (silence func()) {
	var silent atomic.Bool
	g.hooks.beforeRenew = func(ctx context.Context) {
		if silent.Load() {
			<-ctx.Done()
		}
	}
	return func() { silent.Store(true) }
}

// A follower that heard its owner's instance say it is alive after its look-up, so that the
// last alive message's lease ends after the lease the look-up gave it, and then heard no
// more: the hub's silence timer wakes it a lease after the last message, and it must look
// its flight up then and take over, not park again until the trust (the hard timeout) runs
// out.
func TestFollowerTakesOverWhenOwnerFallsSilent(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, Timeout: time.Minute}
	a, fg := b.group(t, o), b.group(t, o)
	silence := silentOwner(a)
	key := uniqueKey()
	first := newReply("first")
	defer first.release()
	running := make(chan struct{}, 1)
	ra, _ := a.Do(key, false, started(running, first.fn))
	defer ra.Close()
	<-running

	heard := make(chan struct{}, 1)
	fg.hooks.aliveHeard = func() {
		select {
		case heard <- struct{}{}:
		default:
		}
	}
	second := newReply("second")
	second.release()
	rf, _ := fg.Do(key, false, second.fn)
	waitCond(t, 5*time.Second, "following", func() bool { return fg.flightRole(key) == RoleFollower })
	channel := fg.rem().wake.aliveChannel(a.opts.InstanceID)
	// Alive messages recorded after the follower's look-up: their lease ends after its own.
	for range 3 {
		<-heard
	}
	waitCond(t, 5*time.Second, "alive recorded", func() bool { return !fg.rem().wake.aliveUntil(channel).IsZero() })
	<-heard
	silence()
	start := time.Now()
	if got := readWithin(rf, 5*time.Second); got.body != "second" {
		t.Fatalf("follower of a silent owner got (%q, %v) after %v; want a takeover once a lease passed without alive messages (~%v)",
			got.body, got.err, time.Since(start).Round(time.Millisecond), o.LeaseTTL)
	}
}
