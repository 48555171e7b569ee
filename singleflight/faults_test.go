package singleflight

import (
	"context"
	"testing"
	"time"
)

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
