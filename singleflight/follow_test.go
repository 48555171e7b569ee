package singleflight

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestStreamLiveAcrossGroups(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			o := Options{ResultTTL: time.Minute, BatchDelay: time.Millisecond}
			a := b.group(t, o)
			groups := []*Group{a}
			if b.redis != nil {
				groups = append(groups, b.group(t, o), b.group(t, o))
			}
			key := uniqueKey()
			s := newStreamer(5)
			ra, _ := a.Do(key, false, s.fn)
			<-s.first
			// Every caller, on every instance, gets the first event while the owner still
			// holds the last one: fan-out is live, not buffered.
			var readers []*Reader
			for _, g := range groups {
				for range 3 {
					r, _ := g.Do(key, false, s.fn)
					readers = append(readers, r)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for i, r := range readers {
				c, err := r.Next(ctx)
				if err != nil || !strings.HasPrefix(string(c), "data: 0\n\n") {
					t.Fatalf("reader %d: first chunk (%q, %v) before the last was released; want data: 0", i, c, err)
				}
				if r.Head().Status != 200 {
					t.Fatalf("reader %d: status %d; want 200", i, r.Head().Status)
				}
			}
			close(s.hold)
			want := s.transcript()
			if got := readAll(ctx, ra); got.body != want {
				t.Fatalf("owner got %q; want %q", got.body, want)
			}
			for i, r := range readers {
				got := readAll(ctx, r)
				// the first chunk was read above; reassemble
				if got.err != nil || !strings.HasSuffix(want, got.body) || got.role != RoleFollower {
					t.Fatalf("reader %d: got (%q, %v, %v); want the rest of the transcript as follower", i, got.body, got.role, got.err)
				}
			}
			// A late caller (mid-stream joiner or hit) gets the whole transcript from the start.
			if late := doAll(t, groups[len(groups)-1], key, 1, s.fn)()[0]; late.body != want || late.role != RoleHit {
				t.Fatalf("hit: got (%q, %v); want the whole transcript as hit", late.body, late.role)
			}
		})
	}
}

// A follower whose owner completes between the follower's lookup and its first read gets
// the answer from that read: it misses no entry written before it, and waits for no lease.
func TestFollowerMissesNoEntryWrittenBeforeItsFirstRead(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	// A long lease: a follower that missed the done entry would wait for it to run out.
	o := Options{LeaseTTL: 30 * time.Second, HeartbeatInterval: 10 * time.Second}
	a, f := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	rp := newReply("late")
	running := make(chan struct{}, 1)
	ra, _ := a.Do(key, false, started(running, rp.fn))
	defer ra.Close()
	<-running
	// Between the follower's lookup and its first read, the owner completes.
	f.hooks.beforeFollow = func() {
		rp.release()
		readAll(context.Background(), ra)
	}
	start := time.Now()
	out := doAll(t, f, key, 1, rp.fn)()[0]
	if out.body != "late" || out.role != RoleFollower {
		t.Fatalf("got (%q, %v, %v); want (late, follower)", out.body, out.role, out.err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("follower took %v: it missed the entry written before its read", d)
	}
}

// The interleavings at a flight's end, each driven on a real Redis with the package's hooks:
// a follower of another instance that already holds bytes of an answer must read that
// answer to its end, whatever happens to the key around it, and an answer that completed
// must never be asked of the upstream a second time.

// A follower's read runs out while the owner is silent mid-stream; the owner
// completes and stores its answer before the follower looks again. The follower must finish
// the answer it was streaming (the stored result has its token), not start it over.
func TestFollowerFinishesWhenStoredDuringReadGap(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{ResultTTL: time.Minute, BatchDelay: time.Millisecond}
	a, fg := b.group(t, o), b.group(t, o)
	fg.rem().recheckEvery = 50 * time.Millisecond // looks again while the owner is silent
	key := uniqueKey()
	s := newStreamer(3)
	ra, _ := a.Do(key, false, s.fn)
	ownerOut := readStream(context.Background(), ra)
	<-s.first

	var follower *streamReader
	ready := make(chan struct{})
	fg.hooks.readGap = once(func() {
		<-ready
		<-follower.first
		close(s.hold) // the owner writes its last event and completes
		if out := <-ownerOut.done; out.err != nil || out.body != s.transcript() {
			t.Errorf("owner got (%q, %v); want the transcript", out.body, out.err)
		}
	})
	rf, _ := fg.Do(key, false, s.fn)
	follower = readStream(context.Background(), rf)
	close(ready)
	out := <-follower.done
	if out.err != nil || out.body != s.transcript() || out.role != RoleFollower {
		t.Fatalf("follower got (%q, %v, %v); want (%q, nil, follower)", out.body, out.err, out.role, s.transcript())
	}
}

// The owner completes without storing (dedupe only, or a no-cache caller claims
// the finished flight), and a new identical request claims the key while a follower is
// between two reads of the finished answer. The follower must still read to its done.
func TestFollowerFinishesWhenNewFlightClaimsAfterEnd(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	for _, tc := range []struct {
		name    string
		ttl     time.Duration
		noCache bool
	}{
		{"result_ttl 0", 0, false},
		{"no-cache", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{ResultTTL: tc.ttl, BatchDelay: time.Millisecond}
			a, fg, cg := b.group(t, o), b.group(t, o), b.group(t, o)
			key := uniqueKey()
			s := newStreamer(3)
			ra, _ := a.Do(key, false, s.fn)
			ownerOut := readStream(context.Background(), ra)
			<-s.first

			var second atomic.Int32
			secondRunning := make(chan struct{})
			secondGate := make(chan struct{})
			secondFn := func(ctx context.Context, w *Writer) (Result, error) {
				second.Add(1)
				close(secondRunning)
				select {
				case <-secondGate:
				case <-ctx.Done():
					return Result{}, context.Cause(ctx)
				}
				return Result{Head: Head{Status: 200}, Body: []byte("second")}, nil
			}
			defer func() {
				select {
				case <-secondGate:
				default:
					close(secondGate)
				}
			}()
			newReader := make(chan *Reader, 1)
			var follower *streamReader
			ready := make(chan struct{})
			fg.hooks.afterEntries = once(func() {
				<-ready
				<-follower.first
				close(s.hold)
				if out := <-ownerOut.done; out.err != nil {
					t.Errorf("owner: %v", out.err)
				}
				// The flight is over; an identical request arrives on a third instance.
				rc, _ := cg.Do(key, tc.noCache, secondFn)
				newReader <- rc
				<-secondRunning
			})
			rf, _ := fg.Do(key, false, s.fn)
			follower = readStream(context.Background(), rf)
			close(ready)
			out := <-follower.done
			if out.err != nil || out.body != s.transcript() {
				t.Fatalf("follower got (%q, %v); want (%q, nil)", out.body, out.err, s.transcript())
			}
			close(secondGate)
			var rc *Reader
			select {
			case rc = <-newReader:
			default:
				t.Fatal("the new request never ran")
			}
			if got := readAll(context.Background(), rc); got.body != "second" || got.role != RoleOwner {
				t.Fatalf("new request got (%q, %v, %v); want (second, owner)", got.body, got.role, got.err)
			}
			if n := second.Load(); n != 1 {
				t.Fatalf("%d calls for the new request; want 1", n)
			}
		})
	}
}

// TestAliveHeardBeforeDeadlineDoesNotPutOffLook: a look asked for soon (a re-read after the
// meta disagreed, or a newer attempt's end to find) waits for alive messages heard after
// it was asked for, not for one heard before.
func TestAliveHeardBeforeDeadlineDoesNotPutOffLook(t *testing.T) {
	g := New(Options{Redis: redistest.Start(t).Client(), LeaseTTL: time.Second})
	t.Cleanup(func() { g.Close(context.Background()) })
	ch := g.rem().wake.aliveChannel("owner-instance")
	w, err := g.rem().wake.watch(ch)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	l := &leader{r: g.rem(), ctx: context.Background(), f: &flight{key: uniqueKey()}, pos: position{token: "1-owner-instance-1"}}
	fw := &follower{l: l, alive: w}
	fw.trust()
	g.rem().wake.heard(ch, nil)
	fw.since = time.Now()
	fw.deadline = fw.since.Add(20 * time.Millisecond)
	if at, byAlive := fw.lookAt(); byAlive || !at.Equal(fw.deadline) {
		t.Fatalf("look at %v (by alive %v); want the deadline %v", at, byAlive, fw.deadline)
	}
	g.rem().wake.heard(ch, nil)
	if at, byAlive := fw.lookAt(); !byAlive || !at.After(fw.deadline) {
		t.Fatalf("look at %v (by alive %v); want later than the deadline %v, by alive", at, byAlive, fw.deadline)
	}
}

// silentOwner makes g's heartbeats, and so its alive messages, stop once the returned
// function is called, as when its process dies after its followers have heard it for a
// while.
func silentOwner(g *Group) (silence func()) {
	var silent atomic.Bool
	g.hooks.beforeRenew = func(ctx context.Context) {
		if silent.Load() {
			<-ctx.Done()
		}
	}
	return func() { silent.Store(true) }
}

// A follower that heard its owner's instance say it is alive after its look-up, so that the
// last alive message's lease ends after the lease the look-up gave it, and then heard no
// more: the hub's silence timer wakes it a lease after the last message, and it must look
// its flight up then and take over, not park again until the trust (the hard timeout) runs
// out.
func TestFollowerTakesOverWhenOwnerFallsSilent(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, Timeout: time.Minute}
	a, fg := b.group(t, o), b.group(t, o)
	silence := silentOwner(a)
	key := uniqueKey()
	first := newReply("first")
	defer first.release()
	running := make(chan struct{}, 1)
	ra, _ := a.Do(key, false, started(running, first.fn))
	defer ra.Close()
	<-running

	heard := make(chan struct{}, 1)
	fg.hooks.aliveHeard = func() {
		select {
		case heard <- struct{}{}:
		default:
		}
	}
	second := newReply("second")
	second.release()
	rf, _ := fg.Do(key, false, second.fn)
	waitCond(t, 5*time.Second, "following", func() bool { return fg.flightRole(key) == RoleFollower })
	channel := fg.rem().wake.aliveChannel(a.opts.InstanceID)
	// Alive messages recorded after the follower's look-up: their lease ends after its own.
	for range 3 {
		<-heard
	}
	waitCond(t, 5*time.Second, "alive recorded", func() bool { return !fg.rem().wake.aliveUntil(channel).IsZero() })
	<-heard
	silence()
	start := time.Now()
	if got := readWithin(rf, 5*time.Second); got.body != "second" {
		t.Fatalf("follower of a silent owner got (%q, %v) after %v; want a takeover once a lease passed without alive messages (~%v)",
			got.body, got.err, time.Since(start).Round(time.Millisecond), o.LeaseTTL)
	}
}

// A short Redis outage (a restart without persistence) costs no call, however long the
// follower had been waiting when it came: a follower kept waiting past the lease its lookup
// gave it by its owner's alive messages goes on counting on them while Redis does not
// answer, rather than take the flight over at once on the lease of its lookup.
func TestFollowerWaitsOutARedisRestartLateInItsWait(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	recA, recB := newRecorder(), newRecorder()
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, ResultTTL: time.Minute}
	oa, ob := o, o
	oa.Observer, ob.Observer = recA, recB
	a, other := b.group(t, oa), b.group(t, ob)
	rp, led, follower := ownAndFollow(t, a, other)
	// Renewal rounds for more than the lease the follower's lookup gave it: from then on
	// only the owner's alive messages keep it waiting.
	from := a.rem().renewer.round.Load()
	waitCond(t, 10*time.Second, "renewals past the follower's first lease", func() bool {
		return a.rem().renewer.round.Load() >= from+int64(o.LeaseTTL/o.HeartbeatInterval)+2
	})

	srv.Stop()
	recB.waitFor(t, EventDegraded, 1, 5*time.Second) // the follower's instance saw it
	srv.Restart()
	recB.waitFor(t, EventRecovered, 1, 10*time.Second)
	rp.release()

	if out := readWithin(<-led, 10*time.Second); out.err != nil || out.body != "call 1" {
		t.Fatalf("owner got (%q, %v); want call 1", out.body, out.err)
	}
	if out := readWithin(follower, 10*time.Second); out.err != nil || out.body != "call 1" || out.role != RoleFollower {
		t.Fatalf("follower got (%q, %v, %v); want call 1 as a follower", out.body, out.role, out.err)
	}
	if n, tk := rp.calls.Load(), recB.count(EventTakeover); n != 1 || tk != 0 {
		t.Fatalf("%d upstream calls, %d takeovers by the follower's instance; want 1 and 0", n, tk)
	}
}
