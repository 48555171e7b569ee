package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/faultproxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The marks of followers elsewhere (ADR 0074): a mark stands while its callers wait, and
// comes off when they stop, whatever Redis was doing at that moment.

// An instance that shuts down takes its followers' marks off: a call whose only waiter
// elsewhere was on it is cut a grace later.
func TestShutdownTakesItsMarksOff(t *testing.T) {
	a, b, _ := twoInstances(t, 50*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	follower := firstChunk(t, b, key, c.fn)
	owner.Close()
	waitRounds(t, a, 3)
	c.notCut(t)
	follower.Close() // its reader leaves, and its lead ends with the Group
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitCut(t)
}

// A follower whose callers left while its instance could not reach Redis takes its mark
// off once it can: the call is cut then, not left to run to its end.
func TestMarkLeftInAnOutageComesOffOnceRedisAnswers(t *testing.T) {
	srv := redistest.Start(t)
	px, err := faultproxy.Listen(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	o := Options{AbandonGrace: 50 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond, LeaseTTL: 2 * time.Second,
		RedisTimeout: 200 * time.Millisecond}
	a := backend{name: "redis", redis: srv}.group(t, o)
	ob := o
	ob.Redis = redis.NewClient(&redis.Options{Addr: px.Addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = ob.Redis.Close() })
	b := New(ob)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	follower := firstChunk(t, b, key, c.fn)
	owner.Close()
	waitRounds(t, a, 3)
	px.Set(faultproxy.Fault{Mode: faultproxy.Hang}) // b is cut off from Redis, and finds it so
	other := newReply("b's own")
	other.release()
	_ = readAll(context.Background(), mustDo(t, b, uniqueKey(), other.fn))
	waitCond(t, 5*time.Second, "b degraded", b.Degraded)
	follower.Close()
	waitCond(t, 5*time.Second, "b's flight ended", func() bool { return b.flightRole(key) == RoleUnknown })
	waitRounds(t, a, 3)
	c.notCut(t) // b's mark still stands: b could not take it off
	px.Set(faultproxy.Fault{Mode: faultproxy.Pass})
	c.waitCut(t)
}

// A Redis that restarts from a snapshot taken before a follower marked the flight has lost
// that mark, and the lease and batches its owner has since written: the owner sees that
// Redis went back in time, and the call finishes instead of being cut under the follower.
func TestRestartFromAnOlderSnapshotDoesNotCutUnderAFollower(t *testing.T) {
	srv := redistest.Start(t)
	a, b, _ := twoInstancesOn(t, srv, 30*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	rdb := srv.Client()
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	follower, err := b.Do(key, false, c.fn)
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 5*time.Second, "b follows", func() bool { return b.flightRole(key) == RoleFollower })
	got := readIn(follower)
	waitRounds(t, a, 3) // the lease moves past the snapshot's
	owner.Close()
	srv.Stop()
	srv.Restart() // from the snapshot: no mark of b's
	waitRounds(t, a, 5)
	meta := a.coord.(*remote).keys(key).meta
	if f, _ := rdb.HGet(context.Background(), meta, "finish").Result(); f != "1" {
		t.Errorf("after the restart the meta has finish %q; want 1: its marks cannot be trusted", f)
	}
	c.notCut(t)
	close(c.release)
	if o := <-got; o.err != nil || o.body != c.whole(1) {
		t.Fatalf("follower: %q %v; want the whole call", o.body, o.err)
	}
}
