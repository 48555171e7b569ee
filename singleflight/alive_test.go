package singleflight

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestAliveMessagesWakeNoFollower: an owner instance's alive messages, once a heartbeat,
// are recorded once per process; the followers of its flights stay parked.
func TestAliveMessagesWakeNoFollower(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{HeartbeatInterval: 20 * time.Millisecond, LeaseTTL: 500 * time.Millisecond}
	owner := b.group(t, o)
	follower := New(Options{Redis: b.redis.Client(), HeartbeatInterval: o.HeartbeatInterval, LeaseTTL: o.LeaseTTL})
	var resumed, looks atomic.Int64
	heard := make(chan struct{}, 100)
	follower.hooks.resumed = func() { resumed.Add(1) }
	follower.hooks.readGap = func() { looks.Add(1) }
	follower.hooks.aliveHeard = func() {
		select {
		case heard <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { follower.Close(context.Background()) })
	const n = 100
	rp := newReply(`{"answer":42}`)
	keys, readers := ownEach(t, owner, n, func(int) Func { return rp.fn })
	readers = append(readers, followEach(t, follower, keys, rp.fn)...)
	// Every follower has looked once at its lease's end, and found its owner renewing it:
	// from then on the alive messages speak for it (ADR 0059).
	waitCond(t, 10*time.Second, "followers looked once", func() bool { return looks.Load() >= n })
	// Settled: every follower has read its stream and its subscription was confirmed.
	waitCond(t, 10*time.Second, "followers parked", func() bool { return resumed.Swap(0) == 0 })
	for range 10 {
		select {
		case <-heard:
		case <-time.After(5 * time.Second):
			t.Fatal("no alive message from the owner instance")
		}
	}
	if r := resumed.Load(); r > n/10 {
		t.Fatalf("%d followers woken by 10 alive messages", r)
	}
	rp.release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, r := range readers {
		if o := readAll(ctx, r); o.err != nil || o.body != rp.body {
			t.Fatalf("reader %d: %+v", i, o)
		}
	}
	if c := rp.calls.Load(); c != n {
		t.Fatalf("%d upstream calls for %d keys", c, n)
	}
}

// An owner function stuck past its hard timeout loses its lease: its renewal is skipped.
// The alive messages of its instance are per instance, not per flight: while that instance
// owns other flights, they must not tell the stuck flight's followers that "the owner" is
// alive; the followers look their flight up and take over once the lease ran out, rather
// than wait as long as the stuck function (TestHeartbeatStopsAtHardTimeout, with the same
// owner holding one more flight).
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
// must look the flight up then and take over, although the alive messages of the owner's
// instance, busy with other flights, go on.
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
	stream := f.rem().keys(key).stream // its channel has the stream's name
	waitCond(t, 5*time.Second, "f's subscription confirmed", func() bool { return f.rem().wake.UnconfirmedSince(stream).IsZero() })
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

// When an owner finds its flight gone from Redis (lost after its lease ran out), its
// followers on other instances are told on the alive channel, which another flight of the
// owner's instance keeps busy: otherwise they would wait on those alive messages until the
// hard timeout. Here an append is the first write to find it gone (the loss is made with
// the meta deleted and the owner's last lease set in the past), and the flight ends before
// a renewal round could find it so.
func TestFollowersElsewhereToldWhenFlightIsGone(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{BatchDelay: time.Millisecond, Timeout: time.Minute}
	rec := newRecorder()
	oa := o
	oa.Observer = rec
	a, other := b.group(t, oa), b.group(t, o)
	busy := make(chan struct{})
	defer close(busy)
	rx, err := a.Do(uniqueKey(), false, func(ctx context.Context, w *Writer) (Result, error) {
		<-busy // another flight of a's: its alive messages keep coming
		return Result{Head: Head{Status: 200}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	key := uniqueKey()
	first, step1, step2 := make(chan struct{}), make(chan struct{}), make(chan struct{})
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200})
		if _, err := w.Write([]byte("a")); err != nil {
			return Result{}, err
		}
		close(first)
		for _, c := range []chan struct{}{step1, step2} {
			<-c
			if _, err := w.Write([]byte("b")); err != nil {
				return Result{}, err
			}
		}
		return Result{Outcome: Share}, nil
	}
	ra, err := a.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	<-first
	heard := make(chan struct{}, 100)
	other.hooks.aliveHeard = func() { heard <- struct{}{} }
	rb := firstChunk(t, other, key, fn)
	ctx := context.Background()
	<-heard // the follower waits on a's alive messages
	rn := a.rem().renewer
	var owned *remoteOwnership
	rn.mu.Lock()
	for rl := range rn.owned {
		if rl.o.key == key {
			owned = rl.o
		}
	}
	rn.mu.Unlock()
	// Right after a renewal's reply (no event says so: its lease's start moves), so that
	// the next round is an interval away, and no reply gives the owner a lease again.
	from := owned.leaseFrom.Load()
	waitCond(t, 5*time.Second, "a renewal's reply", func() bool { return owned.leaseFrom.Load() != from })
	owned.until.Store(1) // its lease ran out: restore.lua will not put the meta back
	if err := srv.Client().Del(ctx, "ai:flight:meta:{"+key+"}").Err(); err != nil {
		t.Fatal(err)
	}
	close(step1)
	rec.waitMatch(t, "a write finds the flight gone", func(e Event) bool {
		return errors.Is(e.Err, ErrFlightGone)
	}, 10*time.Second)
	close(step2)
	// The flight ends here before a renewal round could find it gone: only its writes can
	// have said so.
	rec.waitMatch(t, "the owner's flight ends", func(e Event) bool { return e.Kind == EventFlightEnd && e.Key == key }, 10*time.Second)
	if n := rec.count(EventHeartbeatFailed); n != 0 {
		t.Fatalf("%d renewals failed before the flight ended; want the writes alone to find it gone", n)
	}
	start := time.Now()
	out := readWithin(rb, 4*a.opts.LeaseTTL)
	// Told at the next round (an interval), it neither waits on the alive messages nor
	// for the owner to put the flight back (which it said it will not).
	waited := time.Since(start)
	t.Logf("the follower elsewhere ended after %v with %v", waited, out.err)
	if out.err == nil || errors.Is(out.err, context.DeadlineExceeded) || waited > a.opts.HeartbeatInterval+a.opts.LeaseTTL/2 {
		t.Fatalf("the follower elsewhere ended after %v with (%q, %v); want an error within an interval and a half lease", waited, out.body, out.err)
	}
}
