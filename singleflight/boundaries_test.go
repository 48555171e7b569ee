package singleflight

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// Hole 3: a contender saw the owner's lease run out and waits the jitter; the paused owner
// wakes and completes, storing its answer. The contender's claim must not start a second
// upstream call: it gets the stored answer.
func TestClaimAfterOwnerCompletedGetsTheAnswer(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, ResultTTL: time.Minute}
	a, fg := b.group(t, o), b.group(t, o)
	revive := deadOwner(a) // a's lease runs out while its call goes on
	defer revive()
	key := uniqueKey()
	var calls atomic.Int32
	running := make(chan struct{}, 1)
	gate := make(chan struct{})
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		n := calls.Add(1)
		running <- struct{}{}
		if n == 1 {
			<-gate
			return Result{Head: Head{Status: 200}, Body: []byte("first")}, nil
		}
		return Result{Head: Head{Status: 200}, Body: []byte("second")}, nil
	}
	ra, _ := a.Do(key, false, fn)
	ownerOut := readStream(context.Background(), ra)
	<-running
	fg.hooks.beforeClaim = once(func() {
		close(gate) // the paused owner completes before the contender's claim lands
		if out := <-ownerOut.done; out.err != nil || out.body != "first" {
			t.Errorf("owner got (%q, %v); want first", out.body, out.err)
		}
	})
	out := doAll(t, fg, key, 2, fn)()
	for _, got := range out {
		if got.err != nil || got.body != "first" {
			t.Fatalf("contender's caller got (%q, %v); want first", got.body, got.err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d upstream calls; want 1 (the answer was stored before the claim)", n)
	}
	body, _ := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "body").Result()
	if body != "first" {
		t.Fatalf("stored %q; want first", body)
	}
}

// Redis loses a running flight (a restart without persistence, a failover to a replica that
// had not received the claim): the owner puts its meta back with its next renewal, while
// its lease runs, so that a new identical request follows it instead of calling again, and
// a follower that already streams bytes of it reads on. (The new request cannot read the
// lost entries: it gets the answer whole, when it is stored.)
func TestOwnerRestoresLostFlight(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: 600 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, BatchDelay: time.Millisecond, ResultTTL: time.Minute}
	a, bg, cg := b.group(t, o), b.group(t, o), b.group(t, o)
	key := uniqueKey()
	s := newStreamer(3)
	fn := s.fn
	ra, _ := a.Do(key, false, fn)
	ownerOut := readStream(context.Background(), ra)
	<-s.first
	rc, _ := cg.Do(key, false, fn)
	early := readStream(context.Background(), rc)
	<-early.first

	ctx := context.Background()
	rdb := srv.Client()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	meta := "ai:flight:meta:{" + key + "}"
	// No event tells a test that a script ran.
	waitCond(t, 5*time.Second, "the owner puts its lost flight back", func() bool { return rdb.Exists(ctx, meta).Val() == 1 })
	late := readStream(ctx, func() *Reader { r, _ := bg.Do(key, false, fn); return r }())
	close(s.hold)
	for name, sr := range map[string]*streamReader{"owner": ownerOut, "early follower": early, "late follower": late} {
		if out := <-sr.done; out.err != nil || out.body != s.transcript() {
			t.Errorf("%s got (%q, %v); want (%q, nil)", name, out.body, out.err, s.transcript())
		}
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("%d upstream calls; want 1", n)
	}
}

// A claim trims the generations that ended more than a linger ago, in the XADD of its own
// gen entry, and keeps those that ended since (their followers may be between two reads):
// a key asked for again and again keeps a stream of one or two generations, not of all.
func TestClaimTrimsGenerationsPastLinger(t *testing.T) {
	srv := redistest.Start(t)
	o := Options{Linger: 150 * time.Millisecond, LeaseTTL: 3 * time.Second, HeartbeatInterval: time.Second, ResultTTL: time.Minute}
	g := backend{redis: srv}.group(t, o)
	key := uniqueKey()
	stream := "ai:flight:stream:{" + key + "}"
	ctx := context.Background()
	rdb := srv.Client()
	answer := func(body string) {
		t.Helper()
		r, err := g.Do(key, true, func(ctx context.Context, w *Writer) (Result, error) {
			return Result{Head: Head{Status: 200}, Body: []byte(body)}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := readWithin(r, 3*time.Second); got.err != nil || got.body != body || got.role != RoleOwner {
			t.Fatalf("got (%q, %v, %v); want to own the call and answer %q", got.body, got.role, got.err, body)
		}
	}
	tokens := func() map[string]int {
		entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		toks := map[string]int{}
		for _, e := range entries {
			toks[e.Values["tok"].(string)]++
		}
		return toks
	}
	answer("one")
	answer("two") // within the first's linger: it stays
	if got := tokens(); len(got) != 2 {
		t.Fatalf("stream holds the entries of %d generations (%v); want both, the first ended less than a linger ago", len(got), got)
	}
	// Stream IDs are Redis's milliseconds: wait until Redis's clock is a linger past the
	// second generation's end.
	last, err := rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil || len(last) != 1 {
		t.Fatalf("XREVRANGE: %v %v", last, err)
	}
	ended, _ := strconv.ParseInt(strings.SplitN(last[0].ID, "-", 2)[0], 10, 64)
	for {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMilli() > ended+o.Linger.Milliseconds() {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	answer("three")
	got := tokens()
	if len(got) != 1 {
		t.Fatalf("stream holds the entries of %d generations (%v); want only the last, the others ended more than a linger ago", len(got), got)
	}
	for tok, n := range got {
		if n != 2 {
			t.Fatalf("generation %s has %d entries; want its gen and done", tok, n)
		}
	}
}

// A Redis that restarts empty after being down longer than an owner's lease: the flight's
// meta is gone and the owner cannot put it back (its lease ran out: another might have
// taken the flight over and finished it meanwhile). Its call goes on for the callers in
// its process, which get its answer, and its final write is refused. (The owner used to
// take the missing meta for another owner's and cancel its call: its callers then waited
// for a second call, and the log said another instance took over when none had.)
func TestOwnerKeepsItsCallWhenRedisLostFlightPastLease(t *testing.T) {
	srv := redistest.Start(t)
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "unary", true: "stream"}[stream], func(t *testing.T) {
			o := Options{LeaseTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond, ResultTTL: time.Minute, BatchDelay: time.Millisecond}
			rec := newRecorder()
			o.Observer = rec
			a := backend{redis: srv}.group(t, o)
			key := uniqueKey()
			s := newStreamer(3) // a stream: its last event waits for s.hold
			gate, want := s.hold, s.transcript()
			if !stream {
				want = "call 1"
			}
			running := make(chan struct{}, 2)
			var calls atomic.Int32
			cancelled := make(chan error, 2)
			fn := func(ctx context.Context, w *Writer) (res Result, err error) {
				n := calls.Add(1)
				running <- struct{}{}
				// Seen however late: a fenced append cancels the call as its last
				// batch is flushed, after the function returned.
				context.AfterFunc(ctx, func() {
					if cause := context.Cause(ctx); errors.Is(cause, ErrLeaseLost) {
						cancelled <- cause
					}
				})
				if stream {
					return s.fn(ctx, w)
				}
				select {
				case <-gate:
					return Result{Head: Head{Status: 200}, Body: []byte(fmt.Sprintf("call %d", n))}, nil
				case <-ctx.Done():
					return Result{}, context.Cause(ctx)
				}
			}
			led := doAsync(t, a, key, CallOptions{Inline: !stream}, fn)
			<-running
			local, err := a.Do(key, false, fn)
			if err != nil {
				t.Fatal(err)
			}
			srv.Stop()
			time.Sleep(2 * o.LeaseTTL) // the outage: longer than the lease
			srv.Restart()
			// The owner's first renewal to reach the restarted Redis finds the flight gone.
			rec.waitMatch(t, "a renewal finds the flight gone", func(e Event) bool {
				return e.Kind == EventHeartbeatFailed && errors.Is(e.Err, ErrFlightGone)
			}, 5*time.Second)
			select {
			case err := <-cancelled:
				t.Fatalf("the owner's call was cancelled (%v); want it to go on", err)
			default:
			}
			close(gate)
			roles := map[string]Role{"owner": RoleOwner, "owner's local caller": RoleFollower}
			for name, r := range map[string]*Reader{"owner": <-led, "owner's local caller": local} {
				if out := readWithin(r, 5*time.Second); out.err != nil || out.body != want || out.role != roles[name] {
					t.Errorf("%s got (%q, %v, %v); want (%q, %v)", name, out.body, out.role, out.err, want, roles[name])
				}
			}
			select {
			case err := <-cancelled:
				t.Fatalf("the owner's call was cancelled (%v); want it to go on", err)
			default:
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("%d upstream calls; want 1", n)
			}
			if srv.Client().Exists(context.Background(), "ai:flight:result:{"+key+"}").Val() != 0 {
				t.Fatal("the owner stored its answer in a flight it no longer held")
			}
		})
	}
}

// A follower on another instance that had already received bytes of a streamed answer
// when Redis stopped answering cannot use a call of its own: its caller can only end
// with an error, and no local call is made for it (one used to be, its answer read by
// nobody and then stored on that instance alone).
func TestNoDegradedCallForCallersWithBytes(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{BatchDelay: time.Millisecond, ResultTTL: time.Minute}
	a, other := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	s := newStreamer(3)
	fn := s.fn
	ra, err := a.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	<-s.first
	rb := firstChunk(t, other, key, fn)
	srv.Stop()
	out := readWithin(rb, 10*time.Second)
	if out.err == nil {
		t.Fatalf("follower got %q and no error; want its stream cut short", out.body)
	}
	waitCond(t, 10*time.Second, "the follower's flight ends", func() bool { return other.flightRole(key) == RoleUnknown })
	close(s.hold)
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("%d upstream calls; want 1 (no call for a caller that already has bytes of another)", n)
	}
}

// A flight whose lead goroutine finds Redis down before its first caller is counted (the
// goroutine starts before DoWith counts the caller) goes local and calls: that it has no
// caller with nothing delivered yet does not mean its callers have bytes of another
// answer, as no generation has begun.
func TestDegradedLeadBeforeItsCallerIsCounted(t *testing.T) {
	srv := redistest.Start(t)
	rec := newRecorder()
	g := backend{redis: srv}.group(t, Options{Observer: rec})
	srv.Stop()
	// A first flight finds Redis down: the Group is degraded from then on, and the next
	// flight's lead goes local at once.
	first, err := g.Do(uniqueKey(), false, instant)
	if err != nil {
		t.Fatal(err)
	}
	if out := readWithin(first, 10*time.Second); out.err != nil {
		t.Fatalf("first flight: %v", out.err)
	}
	rec.waitFor(t, EventDegraded, 1, 10*time.Second)
	before := rec.count(EventTakeover)
	g.hooks.leadStarted = func() {
		// Hold DoWith here until the lead has decided what to do without Redis. With
		// the check of old, the lead ended the flight instead, and no takeover came.
		deadline := time.After(5 * time.Second)
		for rec.count(EventTakeover) == before {
			rec.mu.Lock()
			ch := rec.ch
			rec.mu.Unlock()
			select {
			case <-ch:
			case <-deadline:
				return
			}
		}
	}
	var calls atomic.Int32
	r, err := g.Do(uniqueKey(), false, func(ctx context.Context, w *Writer) (Result, error) {
		calls.Add(1)
		return Result{Head: Head{Status: 200}, Body: []byte("local")}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := readWithin(r, 5*time.Second); out.err != nil || out.body != "local" {
		t.Fatalf("got (%q, %v); want the local call's answer", out.body, out.err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d upstream calls; want 1", n)
	}
}
