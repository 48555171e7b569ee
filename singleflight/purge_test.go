package singleflight

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// waitListening waits until g receives purges from other instances.
func waitListening(t *testing.T, g *Group) {
	t.Helper()
	select {
	case <-g.Listening():
	case <-time.After(5 * time.Second):
		t.Fatal("the purge subscription did not start")
	}
}

func TestForgetReachesEveryInstance(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			recB := newRecorder()
			a := b.group(t, Options{ResultTTL: time.Minute})
			bOpts := Options{ResultTTL: time.Minute, Observer: recB}
			second := a
			if b.redis != nil {
				second = b.group(t, bOpts)
				waitListening(t, second)
			}
			key := uniqueKey()
			if o := storeOne(t, a, key, "v1"); o.role != RoleOwner {
				t.Fatalf("first call: role %v; want owner", o.role)
			}
			// The second instance serves it, and so keeps it in its memory.
			if o := storeOne(t, second, key, "other"); o.role != RoleHit || o.body != "v1" {
				t.Fatalf("before purge: role %v body %q; want hit v1", o.role, o.body)
			}
			found, err := a.Forget(context.Background(), key)
			if err != nil || !found {
				t.Fatalf("Forget: %v %v; want true nil", found, err)
			}
			if b.redis != nil {
				// Awaited, not timed: how soon it comes is BenchmarkPurgeReachesAnotherInstance's.
				recB.waitFor(t, EventInvalidated, 1, 10*time.Second)
			}
			if o := storeOne(t, second, key, "v2"); o.role != RoleOwner || o.body != "v2" {
				t.Fatalf("other instance after purge: role %v body %q; want owner v2", o.role, o.body)
			}
			if o := storeOne(t, a, key, "v3"); o.body == "v1" {
				t.Fatalf("purging instance after purge: role %v body %q; want anything but v1", o.role, o.body)
			}
			if found, _ := a.Forget(context.Background(), uniqueKey()); found {
				t.Fatal("Forget of an unknown key reports found")
			}
		})
	}
}

// TestForgetIsNotUndoneByALateLookup: a lookup answered before the purge must not put the
// purged answer back into memory after the purge's message.
func TestForgetIsNotUndoneByALateLookup(t *testing.T) {
	g := New(Options{ResultTTL: time.Minute})
	defer g.Close(context.Background())
	key := uniqueKey()
	if _, err := g.Forget(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	g.keep(key, Head{Status: 200}, []byte("old"), time.Second) // what a late lookup would keep
	if _, ok := g.cached(key); ok {
		t.Fatal("a purged key was kept again right after its purge")
	}
}

func TestPurgeNamespace(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			recB := newRecorder()
			a := b.group(t, Options{ResultTTL: time.Minute})
			second := a
			if b.redis != nil {
				second = b.group(t, Options{ResultTTL: time.Minute, Observer: recB})
				waitListening(t, second)
			}
			ctx := context.Background()
			ns := "team-" + uniqueKey()[:8]
			for _, g := range []*Group{a, second} {
				if gen, err := g.NamespaceGeneration(ctx, ns); gen != 0 || err != nil {
					t.Fatalf("Generation of a new namespace: %d %v; want 0 nil", gen, err)
				}
			}
			gen, err := a.PurgeNamespace(ctx, ns)
			if err != nil || gen == 0 {
				t.Fatalf("PurgeNamespace: %d %v", gen, err)
			}
			if b.redis != nil {
				// Awaited, not timed: how soon it comes is BenchmarkPurgeReachesAnotherInstance's.
				recB.waitFor(t, EventInvalidated, 1, 10*time.Second)
			}
			for name, g := range map[string]*Group{"purging": a, "other": second} {
				if got, err := g.NamespaceGeneration(ctx, ns); got != gen || err != nil {
					t.Fatalf("%s instance: Generation %d %v; want %d", name, got, err, gen)
				}
			}
			gen2, err := second.PurgeNamespace(ctx, ns)
			if err != nil || gen2 <= gen {
				t.Fatalf("second purge: %d %v; want more than %d", gen2, err, gen)
			}
			if got, _ := second.NamespaceGeneration(ctx, "another-"+ns); got != 0 {
				t.Fatalf("another namespace: generation %d; want 0", got)
			}
		})
	}
}

// TestGenerationIsReadOnce: a generation is read from Redis once, then from memory.
func TestGenerationIsReadOnce(t *testing.T) {
	b := backends(t)[1]
	g := b.group(t, Options{})
	ctx := context.Background()
	ns := "ns-" + uniqueKey()[:8]
	if _, err := g.NamespaceGeneration(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// A generation written behind the Group's back (no message) is not seen: the
	// request path did not go to Redis again.
	if err := b.redis.Client().Set(ctx, g.nsKey(ns), 42, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := g.NamespaceGeneration(ctx, ns); got != 0 {
		t.Fatalf("Generation read Redis again: %d", got)
	}
	g.apply("n 42 " + ns)
	if got, _ := g.NamespaceGeneration(ctx, ns); got != 42 {
		t.Fatalf("after the message: %d; want 42", got)
	}
}

// arrivals is an Observer that tells which answer's purge reached its Group last.
type arrivals struct {
	key  atomic.Pointer[string]
	wake chan struct{}
}

func (a *arrivals) Observe(e Event) {
	if e.Kind == EventInvalidated && e.Op == "answer" {
		a.key.Store(&e.Key)
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}

// BenchmarkPurgeReachesAnotherInstance measures the time from Forget on one instance to the
// purge's arrival in another instance's memory (ADR 0046).
func BenchmarkPurgeReachesAnotherInstance(b *testing.B) {
	srv := redistest.Start(b)
	a := New(Options{Redis: srv.Client()})
	defer a.Close(context.Background())
	seen := &arrivals{wake: make(chan struct{}, 1)}
	other := New(Options{Redis: srv.Client(), Observer: seen})
	defer other.Close(context.Background())
	select {
	case <-other.Listening():
	case <-time.After(5 * time.Second):
		b.Fatal("the purge subscription did not start")
	}
	ctx := context.Background()
	for b.Loop() {
		key := uniqueKey()
		if _, err := a.Forget(ctx, key); err != nil {
			b.Fatal(err)
		}
		for k := seen.key.Load(); k == nil || *k != key; k = seen.key.Load() {
			select {
			case <-seen.wake:
			case <-time.After(5 * time.Second):
				b.Fatal("a purge did not reach the other instance within 5s")
			}
		}
	}
}
