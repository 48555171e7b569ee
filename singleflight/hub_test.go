package singleflight

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestIdleChannelStaysSubscribedThenLeaves: a follower's channel stays subscribed after its
// flight ends (no unsubscription while answers are being delivered), a new follower of the
// same key on it misses nothing, and it is unsubscribed once it has been idle for keepIdle.
func TestIdleChannelStaysSubscribedThenLeaves(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	owner := b.group(t, Options{}) // ResultTTL 0: each round is a new flight
	follower := b.group(t, Options{})
	hub := follower.rem().wake
	hub.mu.Lock()
	hub.keepIdle = time.Hour
	hub.mu.Unlock()
	key := uniqueKey()
	channel := follower.rem().keys(key).stream
	ctx := context.Background()
	subscribers := func() int64 {
		n, err := srv.Client().PubSubNumSub(ctx, channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n[channel]
	}
	for round := range 2 {
		want := fmt.Sprintf("answer %d", round)
		rp := newReply(want)
		own, err := owner.Do(key, false, rp.fn)
		if err != nil {
			t.Fatal(err)
		}
		waitCond(t, 10*time.Second, "the owner running", func() bool { return owner.Owned() == 1 })
		r := followEach(t, follower, []string{key}, rp.fn)[0]
		rp.release()
		if out := readAll(ctx, own); out.err != nil || out.body != want {
			t.Fatalf("round %d: owner got %q, %v", round, out.body, out.err)
		}
		if out := readAll(ctx, r); out.err != nil || out.body != want || out.role != RoleFollower {
			t.Fatalf("round %d: follower got %q, %v, %v; want %q as a follower", round, out.body, out.role, out.err, want)
		}
		waitCond(t, 10*time.Second, "the channel idle", func() bool {
			hub.mu.Lock()
			defer hub.mu.Unlock()
			_, idle := hub.idle[channel]
			return idle
		})
		if n := subscribers(); n != 1 {
			t.Fatalf("round %d: %d subscribers of the idle channel; want 1 (kept subscribed)", round, n)
		}
	}
	hub.mu.Lock()
	hub.keepIdle = 0
	hub.mu.Unlock()
	hub.kick()
	waitCond(t, 10*time.Second, "the idle channel unsubscribed", func() bool { return subscribers() == 0 })
}
