package singleflight

import (
	"context"
	"testing"
	"time"
)

func TestFlightsListing(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			rec := newRecorder()
			g := b.group(t, Options{Observer: rec, InstanceID: "inst-a"})
			key := uniqueKey()
			rp := newReply("x")
			r, err := g.DoWith(key, CallOptions{Route: "/v1/chat/completions", Model: "gpt-x"}, rp.fn)
			if err != nil {
				t.Fatal(err)
			}
			rec.waitFor(t, EventRole, 1, 5*time.Second)
			list, more, err := g.Flights(context.Background(), 0)
			if err != nil || more {
				t.Fatalf("Flights: %v more %v", err, more)
			}
			var got *FlightInfo
			for i := range list {
				if list[i].Key == key {
					got = &list[i]
				}
			}
			if got == nil {
				t.Fatalf("Flights: %+v; want %s in it", list, key)
			}
			if got.State != "running" || got.Owner != "inst-a" || got.Attempt != 1 ||
				got.Route != "/v1/chat/completions" || got.Model != "gpt-x" || got.Age < 0 {
				t.Fatalf("flight %+v", *got)
			}
			if b.redis != nil && (got.LeaseLeft <= 0 || got.LeaseLeft > 3*time.Second) {
				t.Fatalf("lease left %v; want in (0, 3s]", got.LeaseLeft)
			}
			rp.release()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			readAll(ctx, r)
			list, _, _ = g.Flights(context.Background(), 0)
			for _, f := range list {
				if f.Key == key {
					t.Fatalf("a finished flight is listed: %+v", f)
				}
			}
		})
	}
}

// TestFlightsListingIsBounded: the listing stops at its limit and says so.
func TestFlightsListingIsBounded(t *testing.T) {
	b := backends(t)[1]
	g := b.group(t, Options{})
	ctx := context.Background()
	for range 5 {
		k := g.rem().keys(uniqueKey())
		b.redis.Client().HSet(ctx, k.meta, "state", "R", "lease_until", 0, "attempt", 1, "created", 0)
	}
	list, more, err := g.Flights(ctx, 3)
	if err != nil || len(list) != 3 || !more {
		t.Fatalf("Flights(3): %d flights, more %v, %v; want 3, true", len(list), more, err)
	}
	if list[0].State != "expired" {
		t.Fatalf("state %q; want expired", list[0].State)
	}
}
