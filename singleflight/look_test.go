package singleflight

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

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

// TestFollowerOfAClaimNobodyRunsTakesOver: a lookup that claimed a key but whose reply was
// lost leaves a flight running under a token its instance never renews. That instance's
// alive messages, which go on for its other flights, do not speak for it: the follower
// looks at the lease's end, finds it run out, and takes the flight over.
func TestFollowerOfAClaimNobodyRunsTakesOver(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{LeaseTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond}
	a, f := b.group(t, o), b.group(t, o)
	busy := newReply("busy")
	defer busy.release()
	ownEach(t, a, 1, func(int) Func { return busy.fn }) // A's alive messages go on
	key := uniqueKey()
	ctx := context.Background()
	if d, err := a.rem().lookup(key, false, a.rem().newToken(ctx), CallOptions{}, "1", 1); err != nil || d.verdict != verdictOwner {
		t.Fatalf("the lost claim: %+v, %v", d, err)
	}
	local := newReply("local")
	local.release()
	start := time.Now()
	r := followEach(t, f, []string{key}, local.fn)[0]
	if out := readWithin(r, 3*o.LeaseTTL+2*time.Second); out.err != nil || out.body != "local" {
		t.Fatalf("follower of a claim nobody runs got (%q, %v) after %v; want its own call's answer within a few leases", out.body, out.err, time.Since(start))
	}
}

// TestTakeoverSeenInTheStreamCountsAliveMessagesOnlyOnceItsOwnerWorks: a follower that saw
// its first owner at work (a look found its lease moved on), then reads the gen entry of a
// claim nobody runs, does not take the claimer's instance's alive messages as that claim's:
// it looks at the claim's lease end and takes the flight over (ADR 0059).
func TestTakeoverSeenInTheStreamCountsAliveMessagesOnlyOnceItsOwnerWorks(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond, Timeout: 30 * time.Second}
	a, c, f := b.group(t, o), b.group(t, o), b.group(t, o)
	busy, held := newReply("busy"), newReply("held")
	defer busy.release()
	defer held.release()
	ownEach(t, c, 1, func(int) Func { return busy.fn }) // C's alive messages go on
	var dead atomic.Bool                                // then A renews no more
	stop := make(chan struct{})
	defer close(stop)
	a.hooks.beforeRenew = func(context.Context) {
		if dead.Load() {
			<-stop
		}
	}
	keys, _ := ownEach(t, a, 1, func(int) Func { return held.fn })
	key := keys[0]
	looked := make(chan decision, 16)
	f.hooks.looked = func(d decision) {
		select {
		case looked <- d:
		default:
		}
	}
	local := newReply("local")
	local.release()
	r := followEach(t, f, keys, local.fn)[0]
	for seen := false; !seen; { // F looks at the lease's end and finds A renewed it: at work
		select {
		case d := <-looked:
			seen = d.verdict == verdictFollow && d.remaining > 0
		case <-time.After(10 * time.Second):
			t.Fatal("the follower never found its owner's lease moved on")
		}
	}
	dead.Store(true)
	ctx := context.Background()
	// A's lease runs out now, and C claims the flight with a reply that is lost: C never
	// runs it, but its instance goes on saying it is alive.
	if err := srv.Client().HSet(ctx, f.rem().keys(key).meta, "lease_until", "0").Err(); err != nil {
		t.Fatal(err)
	}
	seen, err := c.rem().lookup(key, false, "", CallOptions{}, "1", 1)
	if err != nil || seen.verdict != verdictClaim || seen.seen != seenExpired {
		t.Fatalf("C's look: %+v, %v; want an expired lease to claim", seen, err)
	}
	if d, err := c.rem().claim(ctx, key, c.rem().newToken(ctx), seen, false, CallOptions{}, "1", 1); err != nil || d.verdict != verdictOwner {
		t.Fatalf("the lost claim: %+v, %v", d, err)
	}
	start := time.Now()
	if out := readWithin(r, 3*o.LeaseTTL+2*time.Second); out.err != nil || out.body != "local" {
		t.Fatalf("follower got (%q, %v) after %v; want its own call's answer within a few leases", out.body, out.err, time.Since(start))
	}
}

// A follower whose callers have bytes, finding its attempt's lease run out with nobody
// taking it over, waits a lease more before it takes the attempt for dead: its owner's
// renewal may only be late (a slow link, a starved process), and lands while nobody else
// claims. Its callers get the whole answer of the one call (ADR 0086).
func TestFollowerWithBytesOutwaitsALateRenewal(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond, Timeout: 30 * time.Second,
		TakeoverJitter: 500 * time.Millisecond} // the follower's wait, ample for the released renewal
	a, f := b.group(t, o), b.group(t, o)
	var held atomic.Bool
	release, more := make(chan struct{}), make(chan struct{})
	releaseNow, moreNow := sync.OnceFunc(func() { close(release) }), sync.OnceFunc(func() { close(more) })
	defer releaseNow()
	defer moreNow()
	a.hooks.beforeRenew = func(context.Context) {
		if held.Load() {
			<-release
		}
	}
	var calls atomic.Int32
	key := uniqueKey()
	ra, err := a.Do(key, false, func(ctx context.Context, w *Writer) (Result, error) {
		calls.Add(1)
		w.WriteHead(Head{Status: 200})
		w.Write([]byte("a"))
		<-more
		w.Write([]byte("b"))
		return Result{Outcome: Store}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	waitCond(t, 10*time.Second, "A owns the flight", func() bool { return a.Owned() == 1 })
	lapsed := make(chan struct{}, 1)
	f.hooks.looked = func(d decision) {
		if d.verdict == verdictClaim && d.seen == seenExpired {
			select {
			case lapsed <- struct{}{}:
			default:
			}
		}
	}
	local := newReply("local")
	local.release()
	rf, err := f.Do(key, false, local.fn)
	if err != nil {
		t.Fatal(err)
	}
	sr := readStream(context.Background(), rf)
	select {
	case <-sr.first: // the follower's caller has bytes of A's attempt
	case <-time.After(10 * time.Second):
		t.Fatal("the follower got no bytes")
	}
	held.Store(true) // A's renewals stall now, its lease runs out
	select {
	case <-lapsed:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower never found the lease run out")
	}
	held.Store(false)
	releaseNow() // the stalled renewal lands: nobody claimed meanwhile
	moreNow()
	select {
	case out := <-sr.done:
		if out.err != nil || out.body != "ab" {
			t.Fatalf("the follower's caller got (%q, %v); want the whole answer of A's call", out.body, out.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower's caller got no end")
	}
	if n := calls.Load() + local.calls.Load(); n != 1 {
		t.Fatalf("%d calls; want 1", n)
	}
}
