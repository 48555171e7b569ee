package singleflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestPausedOwnerIsFenced(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, ResultTTL: time.Minute}
	for _, mode := range []string{"renew refused", "complete refused"} {
		t.Run(mode, func(t *testing.T) {
			recA := newRecorder()
			oa := o
			oa.Observer = recA
			a, bg := b.group(t, oa), b.group(t, o)
			revive := deadOwner(a)
			defer revive()
			key := uniqueKey()

			cause := make(chan error, 1)
			finishA := make(chan struct{})
			started := make(chan struct{}, 1)
			fnA := func(ctx context.Context, w *Writer) (Result, error) {
				started <- struct{}{}
				select {
				case <-ctx.Done():
					cause <- context.Cause(ctx)
					return Result{}, context.Cause(ctx)
				case <-finishA:
					return Result{Head: Head{Status: 200}, Body: []byte("stale")}, nil
				}
			}
			ra, _ := a.Do(key, false, fnA)
			defer ra.Close()
			<-started
			rpB := newReply("fresh")
			rpB.release()
			outs := doAll(t, bg, key, 3, rpB.fn)()
			for _, o := range outs {
				if o.body != "fresh" {
					t.Fatalf("B got %q; want fresh", o.body)
				}
			}
			if mode == "renew refused" {
				revive()
				if c := <-cause; !errors.Is(c, ErrLeaseLost) {
					t.Fatalf("old owner's cause %v; want ErrLeaseLost", c)
				}
				recA.waitFor(t, EventLeaseLost, 1, 5*time.Second)
			} else {
				close(finishA)
				recA.waitFor(t, EventFencedWrite, 1, 5*time.Second)
			}
			// The stored result is the new owner's.
			tok, err := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "token").Result()
			if err != nil {
				t.Fatalf("HGET token: %v", err)
			}
			body, _ := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "body").Result()
			if body != "fresh" || !containsInstance(tok, bg.opts.InstanceID) {
				t.Fatalf("stored (%q, token %q); want (fresh, a token of instance %s)", body, tok, bg.opts.InstanceID)
			}
		})
	}
}

func containsInstance(token, id string) bool {
	return strings.Contains(token, "-"+id+"-")
}

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
