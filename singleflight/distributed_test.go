package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestRedisStoppedDuringFlight(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	recA, recB := newRecorder(), newRecorder()
	o := Options{LeaseTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond}
	oa, ob := o, o
	oa.Observer, ob.Observer = recA, recB
	a, bg := b.group(t, oa), b.group(t, ob)
	key := uniqueKey()
	rp := newReply("local")
	running := make(chan struct{}, 4)
	fn := started(running, rp.fn)
	waitA := doAll(t, a, key, 3, fn)
	<-running
	waitB := doAll(t, bg, key, 3, fn)
	recB.waitFor(t, EventRole, 1, 5*time.Second) // B follows
	srv.Stop()
	recB.waitFor(t, EventDegraded, 1, 10*time.Second)
	rp.release()
	for _, w := range []func() []outcome{waitA, waitB} {
		for _, o := range w() {
			if o.err != nil || o.body != "local" {
				t.Fatalf("with Redis down: got (%q, %v); want local", o.body, o.err)
			}
		}
	}
	if !bg.Degraded() {
		t.Fatalf("B not degraded with Redis down")
	}

	srv.Restart()
	recA.waitFor(t, EventRecovered, 1, 10*time.Second)
	recB.waitFor(t, EventRecovered, 1, 10*time.Second)
	rp2 := newReply("distributed")
	running2 := make(chan struct{}, 4)
	fn2 := started(running2, rp2.fn)
	key2 := uniqueKey()
	w2a := doAll(t, a, key2, 2, fn2)
	<-running2
	w2b := doAll(t, bg, key2, 2, fn2)
	recB.waitFor(t, EventRole, 2, 5*time.Second)
	rp2.release()
	for _, w := range []func() []outcome{w2a, w2b} {
		for _, o := range w() {
			if o.body != "distributed" {
				t.Fatalf("after recovery: got (%q, %v)", o.body, o.err)
			}
		}
	}
	if rp2.calls.Load() != 1 {
		t.Fatalf("after recovery %d calls; want 1 (distributed dedupe resumed)", rp2.calls.Load())
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
