package singleflight

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// readWithin reads r to its end, giving up after d.
func readWithin(r *Reader, d time.Duration) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return readAll(ctx, r)
}

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

	// a is busy: it keeps owning other flights, each well within the hard timeout, so its
	// renewals (and so its alive messages) go on.
	busy, stopBusy := context.WithCancel(context.Background())
	busyDone := make(chan struct{})
	defer func() { stopBusy(); <-busyDone }()
	go func() {
		defer close(busyDone)
		for busy.Err() == nil {
			r, err := a.Do(uniqueKey(), false, func(ctx context.Context, w *Writer) (Result, error) {
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
	running := make(chan struct{}, 1)

	key := uniqueKey()
	stuck := make(chan struct{})
	defer close(stuck)
	ra, _ := a.Do(key, false, started(running, func(ctx context.Context, w *Writer) (Result, error) {
		<-stuck // ignores ctx
		return Result{}, errors.New("stuck")
	}))
	defer ra.Close()
	<-running
	rp := newReply("second")
	rp.release()
	rf, _ := f.Do(key, false, rp.fn)
	start := time.Now()
	if got := readWithin(rf, 3*time.Second); got.body != "second" {
		t.Fatalf("follower of a stuck owner got (%q, %v) after %v; want the takeover's answer once the lease ran out (~%v)",
			got.body, got.err, time.Since(start).Round(time.Millisecond), o.Timeout+o.LeaseTTL)
	}
}
