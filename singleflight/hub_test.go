package singleflight

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
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
	hub.SetKeepIdle(time.Hour)
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
		waitCond(t, 10*time.Second, "the channel idle", func() bool { return hub.Idle(channel) })
		if n := subscribers(); n != 1 {
			t.Fatalf("round %d: %d subscribers of the idle channel; want 1 (kept subscribed)", round, n)
		}
	}
	hub.SetKeepIdle(0)
	waitCond(t, 10*time.Second, "the idle channel unsubscribed", func() bool { return subscribers() == 0 })
}

// TestConnectionCutWhileSubscribingLeavesNoFollowerBehind drives the interleaving in which
// go-redis reconnects inside a SUBSCRIBE with its old channel list: instance A owns keys 0,
// 1 and 2 (and a fourth, which runs on); F follows key 0; F's receiving goroutine is held
// busy; the pub/sub connection is killed; F follows key 1 (its SUBSCRIBE meets the dead
// socket), then key 2 (go-redis reconnects without it). Every follower is answered within
// a lease of its owner's end, although A's alive messages, heard all along, speak for the
// owner of all three.
func TestConnectionCutWhileSubscribingLeavesNoFollowerBehind(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{HeartbeatInterval: 50 * time.Millisecond, LeaseTTL: time.Second}
	a, f := b.group(t, o), b.group(t, o)
	ctx := context.Background()

	hold, release := holdReceiver(t, f)
	sent := make(chan []string, 16)
	f.rem().wake.OnSent(func(channels []string, err error) { sent <- channels })
	sentFor := func(key string) {
		t.Helper()
		want := f.rem().keys(key).stream
		for {
			select {
			case chs := <-sent:
				if slices.Contains(chs, want) {
					return
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no SUBSCRIBE sent for %s", want)
			}
		}
	}

	// Key 3 runs on throughout: A's alive messages go on after keys 0-2 end.
	rps := []*reply{newReply("zero"), newReply("one"), newReply("two"), newReply("three")}
	keys, owned := ownEach(t, a, 4, func(i int) Func { return rps[i].fn })
	defer rps[3].release()
	followers := followEach(t, f, keys[:1], rps[0].fn)
	sentFor(keys[0])
	hold()
	if err := srv.Client().ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	followers = append(followers, followEach(t, f, keys[1:2], rps[1].fn)...)
	sentFor(keys[1])
	followers = append(followers, followEach(t, f, keys[2:3], rps[2].fn)...)
	sentFor(keys[2])
	release()

	for i, rp := range rps[:3] {
		rp.release()
		if out := readWithin(owned[i], 10*time.Second); out.err != nil || out.body != rp.body {
			t.Fatalf("owner of key %d got %q, %v", i, out.body, out.err)
		}
		if out := readWithin(followers[i], o.LeaseTTL+time.Second); out.err != nil || out.body != rp.body {
			t.Errorf("follower of key %d got %q, %v within a lease of its owner's end; want %q", i, out.body, out.err, rp.body)
		}
	}
}

// TestFollowersAnsweredAfterTheConnectionIsKilled: whether the pub/sub connection is killed
// while its receiving goroutine waits for Redis or while it is behind (busy with what came
// before), every follower is answered within a lease of its owner's end, while the owner
// instance goes on saying it is alive.
func TestFollowersAnsweredAfterTheConnectionIsKilled(t *testing.T) {
	for _, behind := range []bool{false, true} {
		t.Run(map[bool]string{false: "idle", true: "behind"}[behind], func(t *testing.T) {
			srv := redistest.Start(t)
			b := backend{name: "redis", redis: srv}
			o := Options{HeartbeatInterval: 50 * time.Millisecond, LeaseTTL: time.Second}
			a, f := b.group(t, o), b.group(t, o)
			hold, release := holdReceiver(t, f)
			rps := []*reply{newReply("zero"), newReply("one"), newReply("three")}
			keys, owned := ownEach(t, a, 3, func(i int) Func { return rps[i].fn })
			defer rps[2].release() // runs on: A's alive messages go on
			followers := followEach(t, f, keys[:2], rps[0].fn)
			waitCond(t, 10*time.Second, "followers' channels confirmed", func() bool {
				for _, k := range keys[:2] {
					if !f.rem().wake.UnconfirmedSince(f.rem().keys(k).stream).IsZero() {
						return false
					}
				}
				return true
			})
			if behind {
				hold()
			}
			if err := srv.Client().ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
				t.Fatal(err)
			}
			release()
			for i, rp := range rps[:2] {
				rp.release()
				if out := readWithin(owned[i], 10*time.Second); out.err != nil || out.body != rp.body {
					t.Fatalf("owner of key %d got %q, %v", i, out.body, out.err)
				}
				if out := readWithin(followers[i], o.LeaseTTL+time.Second); out.err != nil || out.body != rp.body {
					t.Errorf("follower of key %d got %q, %v within a lease of its owner's end; want %q", i, out.body, out.err, rp.body)
				}
			}
		})
	}
}

// holdReceiver lets a test hold g's receiving goroutine busy: hold returns once it is held
// in the next alive message it hears, and release lets it go on.
func holdReceiver(t *testing.T, g *Group) (hold, release func()) {
	var holding atomic.Bool
	held, released := make(chan struct{}), make(chan struct{})
	var once sync.Once
	g.hooks.aliveHeard = func() { // on the receiving goroutine
		if holding.Load() {
			once.Do(func() { close(held) })
			<-released
		}
	}
	hold = func() {
		t.Helper()
		holding.Store(true)
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("no alive message heard")
		}
	}
	release = sync.OnceFunc(func() { close(released) })
	t.Cleanup(release) // a test that failed while holding does not hang its Close
	return hold, release
}
