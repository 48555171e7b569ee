package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// When owner-seq cannot be used (in a Cluster, its shard failing over; here, an ACL that
// denies its key), flights whose own keys are fine keep their distributed dedupe: tokens
// stay unique without a new number, and scripts only compare them for equality.
func TestOwnerSeqUnusableKeepsDedupe(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "flights", "on", ">pw",
		"~ai:flight:meta:*", "~ai:flight:stream:*", "~ai:flight:result:*", "&ai:flight:*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	client := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "flights", Password: "pw", MaxRetries: 1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	if err := client().Incr(ctx, "ai:flight:owner-seq").Err(); err == nil {
		t.Fatal("the ACL lets owner-seq be written; the test would prove nothing")
	}
	var groups []*Group
	for range 2 {
		c := client()
		g := New(Options{Redis: c, ResultTTL: time.Minute, TakeoverJitter: 20 * time.Millisecond})
		t.Cleanup(func() { g.Close(context.Background()) })
		groups = append(groups, g)
	}
	key := uniqueKey()
	rp := newReply("one")
	wa := doAll(t, groups[0], key, 3, rp.fn)
	wb := doAll(t, groups[1], key, 3, rp.fn)
	rp.release()
	roles := countRoles(append(wa(), wb()...))
	if n := rp.calls.Load(); n != 1 || roles[RoleOwner] != 1 {
		t.Fatalf("%d calls, roles %v; want 1 call, 1 owner", n, roles)
	}
	for _, g := range groups {
		if g.Degraded() {
			t.Fatal("a Group degraded though only owner-seq failed")
		}
	}
}

func TestEveryKeyExpires(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	g := b.group(t, Options{ResultTTL: time.Minute, MaxAttempts: 2})
	rp := newReply("x")
	rp.release()
	doAll(t, g, uniqueKey(), 3, rp.fn)()
	fail := func(ctx context.Context, w *Writer) (Result, error) {
		return Result{Head: Head{Status: 500}, Outcome: Retry}, nil
	}
	doAll(t, g, uniqueKey(), 3, fail)()
	share := func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200})
		w.Write([]byte("data: 1\n\n"))
		return Result{Outcome: Share}, nil
	}
	doAll(t, g, uniqueKey(), 3, share)()

	ctx := context.Background()
	c := srv.Client()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 5 {
		t.Fatalf("only %d keys written: %v", len(keys), keys)
	}
	for _, k := range keys {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %s has no TTL (%v)", k, ttl)
		}
	}
}
