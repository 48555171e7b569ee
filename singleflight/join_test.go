package singleflight

import (
	"context"
	"testing"
	"time"
)

// TestMaxAgeJoinsAFlightInProgress: a caller with a max-age joins an upstream call in
// flight (its answer is fresh).
func TestMaxAgeJoinsAFlightInProgress(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			rec := newRecorder()
			g := b.group(t, Options{ResultTTL: time.Minute, Observer: rec})
			key := uniqueKey()
			rp := newReply("fresh")
			wait := doAll(t, g, key, 1, rp.fn)
			rec.waitFor(t, EventRole, 1, 5*time.Second)
			r, err := g.DoWith(key, CallOptions{MaxAge: time.Second}, newReply("second").fn)
			if err != nil {
				t.Fatal(err)
			}
			rp.release()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			o := readAll(ctx, r)
			if o.role != RoleFollower || o.body != "fresh" || rp.calls.Load() != 1 {
				t.Fatalf("max-age caller: role %v body %q calls %d; want follower fresh 1", o.role, o.body, rp.calls.Load())
			}
			wait()
		})
	}
}

// A no-cache caller joins an identical call in flight, in memory too.
func TestNoCacheJoinsCallInFlight(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			rp := newReply("x")
			running := make(chan struct{}, 2)
			fn := started(running, rp.fn)
			r1, _ := g.Do(key, false, fn)
			<-running
			r2, _ := g.Do(key, true, fn)
			rp.release()
			ctx := context.Background()
			if o1, o2 := readAll(ctx, r1), readAll(ctx, r2); o1.body != "x" || o2.body != "x" || rp.calls.Load() != 1 {
				t.Fatalf("got %q and %q with %d calls; want x twice, 1 call", o1.body, o2.body, rp.calls.Load())
			}
		})
	}
}
