package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestMaxAge(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			storeOne(t, g, key, "old")
			// Age the stored answer by two seconds, in memory and in Redis.
			g.cacheMu.Lock()
			sr, _ := g.cache.get(key)
			sr.at = sr.at.Add(-2 * time.Second)
			g.cache.add(key, sr)
			g.cacheMu.Unlock()
			if b.redis != nil {
				k := g.rem().keys(key)
				at, _ := b.redis.Client().HGet(context.Background(), k.result, "at").Int64()
				b.redis.Client().HSet(context.Background(), k.result, "at", at-2000)
			}
			do := func(maxAge time.Duration, body string) outcome {
				rp := newReply(body)
				rp.release()
				r, err := g.DoWith(key, CallOptions{MaxAge: maxAge}, rp.fn)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				return readAll(ctx, r)
			}
			if o := do(10*time.Second, "x"); o.role != RoleHit || o.body != "old" {
				t.Fatalf("max-age 10s: role %v body %q; want hit old", o.role, o.body)
			}
			if o := do(time.Second, "new"); o.role != RoleOwner || o.body != "new" {
				t.Fatalf("max-age 1s: role %v body %q; want owner new", o.role, o.body)
			}
			if o := do(time.Second, "x"); o.role != RoleHit || o.body != "new" {
				t.Fatalf("after the fresh call: role %v body %q; want hit new", o.role, o.body)
			}
		})
	}
}

func TestResultTTLPerAnswer(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{}) // ResultTTL 0: dedupe only by default
			key := uniqueKey()
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				return Result{Head: Head{Status: 200}, Body: []byte("kept"), TTL: time.Minute}, nil
			}
			if o := doAll(t, g, key, 1, fn)(); o[0].role != RoleOwner {
				t.Fatalf("first: %v", o[0].role)
			}
			if o := doAll(t, g, key, 1, fn)(); o[0].role != RoleHit || o[0].body != "kept" {
				t.Fatalf("second: role %v body %q; want hit kept", o[0].role, o[0].body)
			}
			if b.redis != nil {
				ttl := b.redis.Client().PTTL(context.Background(), g.rem().keys(key).result).Val()
				if ttl <= 50*time.Second || ttl > time.Minute {
					t.Fatalf("result PTTL %v; want about 1m", ttl)
				}
				// A hit from Redis is kept in memory as long as Redis keeps it, not ResultTTL.
				g2 := b.group(t, Options{ResultTTL: time.Hour})
				if o := doAll(t, g2, key, 1, fn)(); o[0].role != RoleHit {
					t.Fatalf("other instance: %v", o[0].role)
				}
				if sr, ok := g2.cached(key); !ok || sr.ttl > time.Minute+50*time.Millisecond {
					t.Fatalf("kept in memory: %v ttl %v; want at most 1m", ok, sr.ttl)
				}
			}
		})
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
