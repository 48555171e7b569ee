package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// An owner function stuck past its hard timeout loses its lease: its renewal is skipped.
// The alive messages of its instance are per instance, not per flight, so while that
// instance owns any other flight, they keep telling the stuck flight's followers that
// "the owner" is alive; the followers never look their flight up, never take over, and
// wait as long as the stuck function (TestHeartbeatStopsAtHardTimeout, with the same owner
// holding one more flight).
func TestAliveOfOtherFlightDoesNotKeepStuckOwner(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{Timeout: 300 * time.Millisecond, LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, MaxAttempts: 2}
	a, f := b.group(t, o), b.group(t, o)

	defer keepBusy(a)()

	key := uniqueKey()
	stuckOwner(t, a, key)
	rp := newReply("second")
	rp.release()
	rf, _ := f.Do(key, false, rp.fn)
	start := time.Now()
	if got := readWithin(rf, 3*time.Second); got.body != "second" {
		t.Fatalf("follower of a stuck owner got (%q, %v) after %v; want the takeover's answer once the lease ran out (~%v)",
			got.body, got.err, time.Since(start).Round(time.Millisecond), o.Timeout+o.LeaseTTL)
	}
}

// keepBusy makes g own other flights, one after another, each well within its hard
// timeout, so that its renewals (and so its alive messages) go on; stop waits for it.
func keepBusy(g *Group) (stop func()) {
	busy, stopBusy := context.WithCancel(context.Background())
	busyDone := make(chan struct{})
	go func() {
		defer close(busyDone)
		for busy.Err() == nil {
			r, err := g.Do(uniqueKey(), false, func(ctx context.Context, w *Writer) (Result, error) {
				time.Sleep(150 * time.Millisecond)
				return Result{Head: Head{Status: 200}, Body: []byte("other"), Outcome: Share}, nil
			})
			if err != nil {
				return
			}
			go readWithin(r, 5*time.Second)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() { stopBusy(); <-busyDone }
}

// The flight ended without a stream entry: its complete failed (here Redis refuses writes
// for a moment, OOM; PUBLISH is still allowed). The owner's own caller has its answer; the
// meta stays RUNNING with nobody renewing it, so its lease runs out. A follower elsewhere
// should look the flight up then and take over; the alive messages of the owner's instance,
// busy with other flights, keep it waiting instead, for as long as that instance is busy.
func TestAliveDoesNotHideAFlightWhoseCompleteFailed(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond}
	a, f := b.group(t, o), b.group(t, o)
	defer keepBusy(a)()
	key := uniqueKey()
	rp := newReply("first")
	running := make(chan struct{}, 1)
	ra, _ := a.Do(key, false, started(running, rp.fn))
	<-running
	following := make(chan struct{})
	f.hooks.beforeFollow = once(func() { close(following) })
	second := newReply("second")
	second.release()
	rf, _ := f.Do(key, false, second.fn)
	select {
	case <-following:
	case <-time.After(3 * time.Second):
		t.Fatal("f did not follow a within 3s")
	}
	time.Sleep(100 * time.Millisecond) // f has subscribed
	ctx := context.Background()
	rdb := srv.Client()
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory: %v", err)
	}
	rp.release()
	got := readWithin(ra, 3*time.Second)
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory: %v", err)
	}
	if got.body != "first" {
		t.Fatalf("owner's caller got (%q, %v); want its answer", got.body, got.err)
	}
	start := time.Now()
	if got := readWithin(rf, 3*time.Second); got.body != "second" {
		t.Fatalf("follower of a flight whose complete failed got (%q, %v) after %v; want a takeover once the lease ran out (~%v)",
			got.body, got.err, time.Since(start).Round(time.Millisecond), o.LeaseTTL)
	}
}
