package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

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

// Stored results are kept in the process too: a repeat costs no Redis command, and hits go
// on while Redis is down.
func TestLocalFirstLevelHits(t *testing.T) {
	srv := redistest.Start(t)
	cnt := &cmdCounter{}
	rdb := srv.Client()
	rdb.AddHook(cnt)
	g := New(Options{Redis: rdb, ResultTTL: time.Minute})
	t.Cleanup(func() { g.Close(context.Background()) })
	other := backend{redis: srv}.group(t, Options{ResultTTL: time.Minute})
	key := uniqueKey()
	rp := newReply("stored")
	rp.release()
	doAll(t, other, key, 1, rp.fn)()         // stored in Redis by another instance
	first := doAll(t, g, key, 1, rp.fn)()[0] // a hit from Redis
	before := cnt.n.Load()
	again := doAll(t, g, key, 1, rp.fn)()[0] // a hit from this process
	if first.role != RoleHit || again.role != RoleHit || again.body != "stored" || cnt.n.Load() != before {
		t.Fatalf("roles %v, %v; %d Redis commands for the repeat; want hits and 0 commands", first.role, again.role, cnt.n.Load()-before)
	}
	srv.Stop()
	if down := doAll(t, g, key, 1, rp.fn)()[0]; down.role != RoleHit || down.body != "stored" || rp.calls.Load() != 1 {
		t.Fatalf("with Redis down: (%v, %q), %d calls; want the stored answer as a hit", down.role, down.body, rp.calls.Load())
	}
}
