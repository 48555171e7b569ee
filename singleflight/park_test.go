package singleflight

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestParkedFollowersHoldNoGoroutine: flights followed from another instance wait for
// their owners without a goroutine each, and every one still gets its owner's answer when
// it comes.
func TestParkedFollowersHoldNoGoroutine(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	owner := b.group(t, Options{})
	follower := b.group(t, Options{})
	const n = 200
	rp := newReply(`{"answer":42}`)
	keys := make([]string, n)
	var owned []*Reader
	for i := range keys {
		keys[i] = uniqueKey()
		r, err := owner.Do(keys[i], false, rp.fn)
		if err != nil {
			t.Fatal(err)
		}
		owned = append(owned, r)
	}
	waitCond(t, 10*time.Second, "owners running", func() bool { return owner.Owned() == n })
	base := runtime.NumGoroutine()

	notCalled := func(context.Context, *Writer) (Result, error) {
		t.Error("a follower called upstream")
		return Result{}, nil
	}
	var waiting []*Reader
	for _, k := range keys {
		r, err := follower.Do(k, false, notCalled)
		if err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, r)
	}
	waitCond(t, 10*time.Second, "every flight following", func() bool {
		for _, k := range keys {
			if follower.flightRole(k) != RoleFollower {
				return false
			}
		}
		return true
	})
	// Each follower reads its stream, then parks: its goroutine returns.
	waitCond(t, 10*time.Second, "followers parked", func() bool { return runtime.NumGoroutine() < base+n/10 })

	rp.release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, r := range append(owned, waiting...) {
		o := readAll(ctx, r)
		if o.err != nil || o.body != rp.body || o.head.Status != 200 {
			t.Fatalf("reader %d: %+v", i, o)
		}
		if i >= n && o.role != RoleFollower {
			t.Fatalf("reader %d: role %v, want follower", i, o.role)
		}
	}
	if c := rp.calls.Load(); c != n {
		t.Fatalf("%d upstream calls for %d keys", c, n)
	}
}
