package singleflight

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestParkedFollowersHoldNoGoroutine: flights followed from another instance wait for
// their owners without a goroutine each, and every one still gets its owner's answer when
// it comes.
func TestParkedFollowersHoldNoGoroutine(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	owner := b.group(t, Options{})
	follower := b.group(t, Options{})
	const n = 200
	rp := newReply(`{"answer":42}`)
	keys, owned := ownEach(t, owner, n, func(int) Func { return rp.fn })
	base := runtime.NumGoroutine()

	notCalled := func(context.Context, *Writer) (Result, error) {
		t.Error("a follower called upstream")
		return Result{}, nil
	}
	waiting := followEach(t, follower, keys, notCalled)
	// Each follower reads its stream, then parks: its goroutine returns.
	waitCond(t, 10*time.Second, "followers parked", func() bool { return runtime.NumGoroutine() < base+n/10 })

	rp.release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, r := range append(owned, waiting...) {
		o := readAll(ctx, r)
		if o.err != nil || o.body != rp.body || o.head.Status != 200 {
			t.Fatalf("reader %d: %+v", i, o)
		}
		if i >= n && o.role != RoleFollower {
			t.Fatalf("reader %d: role %v, want follower", i, o.role)
		}
	}
	if c := rp.calls.Load(); c != n {
		t.Fatalf("%d upstream calls for %d keys", c, n)
	}
}

// TestFollowerOfUnaryFlightReadsOnce: a follower that joins a flight with nothing streamed
// yet reads the stream once, when its subscription is confirmed; the answer is pushed.
func TestFollowerOfUnaryFlightReadsOnce(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	owner := b.group(t, Options{})
	fc := b.redis.Client()
	xr := &cmdCounter{match: func(cmd redis.Cmder) bool { return cmd.Name() == "xread" }}
	fc.AddHook(xr)
	follower := New(Options{Redis: fc})
	t.Cleanup(func() { follower.Close(context.Background()) })
	key := uniqueKey()
	rp := newReply(`{"answer":42}`)
	wait := doAll(t, owner, key, 1, rp.fn)
	waitCond(t, 10*time.Second, "owner running", func() bool { return owner.Owned() == 1 })
	wait2 := doAll(t, follower, key, 1, rp.fn)
	waitCond(t, 10*time.Second, "following", func() bool { return follower.flightRole(key) == RoleFollower })
	waitCond(t, 10*time.Second, "subscription confirmed and read", func() bool { return xr.n.Load() >= 1 })
	rp.release()
	for _, o := range append(wait(), wait2()...) {
		if o.err != nil || o.body != rp.body {
			t.Fatalf("got %+v", o)
		}
	}
	if n := xr.n.Load(); n != 1 {
		t.Fatalf("the follower sent %d XREADs; want 1", n)
	}
}
