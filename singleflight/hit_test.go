package singleflight

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestStoredResultServedAtOnce: a caller whose answer is stored gets it from Do without
// waiting for anything (its reader gives the answer under a context already cancelled),
// with the same role, age and events as before, and its function is never called.
func TestStoredResultServedAtOnce(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			rec := newRecorder()
			g := b.group(t, Options{ResultTTL: time.Minute, Observer: rec})
			key := uniqueKey()
			rp := newReply(`{"n":1}`)
			rp.release()
			doAll(t, g, key, 1, rp.fn)()
			rec.waitFor(t, EventFlightEnd, 1, 5*time.Second) // its readers can finish first
			starts, ends, hits := rec.count(EventFlightStart), rec.count(EventFlightEnd), roleEvents(rec, RoleHit)

			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			r, err := g.Do(key, false, func(context.Context, *Writer) (Result, error) {
				t.Error("the owner function of a hit ran")
				return Result{}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			o := readAll(ctx, r)
			if o.err != nil || o.role != RoleHit || o.body != `{"n":1}` || o.head.Status != 200 {
				t.Fatalf("got (%v, %v, %q, %d); want (nil, hit, %q, 200)", o.err, o.role, o.body, o.head.Status, `{"n":1}`)
			}
			if o.age < 0 || o.age > time.Minute {
				t.Fatalf("age %v; want between 0 and the TTL", o.age)
			}
			if got := rec.count(EventFlightStart) - starts; got != 1 {
				t.Fatalf("%d flight starts; want 1", got)
			}
			if got := rec.count(EventFlightEnd) - ends; got != 1 {
				t.Fatalf("%d flight ends; want 1", got)
			}
			if got := roleEvents(rec, RoleHit) - hits; got != 1 {
				t.Fatalf("%d hit role events; want 1", got)
			}
			if got := rp.calls.Load(); got != 1 {
				t.Fatalf("%d upstream calls; want 1", got)
			}
			g.mu.Lock()
			n := len(g.flights)
			g.mu.Unlock()
			if n != 0 {
				t.Fatalf("%d flights left in the map; want 0", n)
			}
		})
	}
}

// TestStoredResultAfterFlightInProgress: a caller that finds a flight in progress joins it
// even when an older answer is stored (here: a no-cache flight running, as after a
// client's Cache-Control: no-cache).
func TestStoredResultAfterFlightInProgress(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			storeOne(t, g, key, "old")

			fresh := newReply("fresh")
			running := make(chan struct{}, 1)
			nc, err := g.Do(key, true, started(running, fresh.fn))
			if err != nil {
				t.Fatal(err)
			}
			<-running
			wait := doAll(t, g, key, 1, fresh.fn)
			fresh.release()
			if o := readAll(context.Background(), nc); o.body != "fresh" || o.role != RoleOwner {
				t.Fatalf("no-cache caller: got (%q, %v); want (fresh, owner)", o.body, o.role)
			}
			if o := wait()[0]; o.body != "fresh" || o.role != RoleFollower {
				t.Fatalf("caller during the flight: got (%q, %v); want (fresh, follower)", o.body, o.role)
			}
		})
	}
}

func roleEvents(r *recorder, role Role) int {
	return r.countWhere(func(e Event) bool { return e.Kind == EventRole && e.Role == role })
}

// TestAnnotateOncePerStoredAnswer: Options.Annotate runs once for an answer kept in the
// process, whether made here or, with Redis, read from it by another instance, and each
// hit served from the process's store gets what it made as Head.Note; the owner gets none,
// and neither does the hit that read the answer from Redis.
func TestAnnotateOncePerStoredAnswer(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			var calls atomic.Int64
			o := Options{ResultTTL: time.Minute, Annotate: func(h Head, body []byte) any {
				calls.Add(1)
				return fmt.Sprintf("%d %s", h.Status, body)
			}}
			g := b.group(t, o)
			key := uniqueKey()
			rp := newReply("x")
			rp.release()
			if o := doAll(t, g, key, 1, rp.fn)()[0]; o.role != RoleOwner || o.head.Note != nil {
				t.Fatalf("owner: role %v, note %v; want owner, no note", o.role, o.head.Note)
			}
			groups := []*Group{g}
			if b.redis != nil {
				groups = append(groups, b.group(t, o)) // reads the answer from Redis
			}
			for i, g := range groups {
				if i > 0 { // reads it from Redis
					if o := doAll(t, g, key, 1, rp.fn)()[0]; o.role != RoleHit {
						t.Fatalf("hit read from Redis: role %v; want hit", o.role)
					}
				}
				for range 3 {
					if o := doAll(t, g, key, 1, rp.fn)()[0]; o.role != RoleHit || o.head.Note != "200 x" {
						t.Fatalf("hit: role %v, note %v; want hit, %q", o.role, o.head.Note, "200 x")
					}
				}
			}
			if got := calls.Load(); got != int64(len(groups)) {
				t.Fatalf("Annotate ran %d times; want once per process (%d)", got, len(groups))
			}
		})
	}
}

// TestStoredAnswerFromAheadClockIsNotYounger: an answer whose stored time is ahead of
// Redis's clock (stored by a primary whose clock was ahead, before a failover) is served
// with age 0, not a negative one, and within a max-age.
func TestStoredAnswerFromAheadClockIsNotYounger(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	writer := b.group(t, Options{ResultTTL: time.Minute})
	reader := b.group(t, Options{ResultTTL: time.Minute}) // its own process store is empty
	key := uniqueKey()
	if out := storeOne(t, writer, key, "stored"); out.err != nil || out.role != RoleOwner {
		t.Fatalf("storing: %+v", out)
	}
	ctx := context.Background()
	rdb := srv.Client()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	result := reader.rem().keys(key).result
	ahead := now.Add(time.Minute).UnixMilli()
	if err := rdb.HSet(ctx, result, "at", ahead).Err(); err != nil {
		t.Fatal(err)
	}
	r, err := reader.DoWith(key, CallOptions{MaxAge: 10 * time.Second}, func(context.Context, *Writer) (Result, error) {
		t.Error("called: the stored answer was not served")
		return Result{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := readAll(ctx, r)
	if out.err != nil || out.role != RoleHit || out.body != "stored" {
		t.Fatalf("got %q as %v (%v); want the stored answer as a hit", out.body, out.role, out.err)
	}
	if out.age != 0 {
		t.Fatalf("age %v; want 0 for an answer stored ahead of the clock", out.age)
	}
}
