package singleflight

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestOneOwnerAcrossGroups(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	var groups []*Group
	for range 5 {
		groups = append(groups, b.group(t, Options{ResultTTL: time.Minute}))
	}
	key := uniqueKey()
	rp := newReply("shared")
	var waits []func() []outcome
	for _, g := range groups {
		waits = append(waits, doAll(t, g, key, 20, rp.fn))
	}
	rp.release()
	roles := map[Role]int{}
	for _, w := range waits {
		for _, o := range w() {
			if o.err != nil || o.body != "shared" {
				t.Fatalf("got (%q, %v); want shared", o.body, o.err)
			}
			roles[o.role]++
		}
	}
	if rp.calls.Load() != 1 || roles[RoleOwner] != 1 {
		t.Fatalf("%d calls, roles %v; want 1 call and exactly 1 owner", rp.calls.Load(), roles)
	}
}

// Two local flights of one key (a no-cache caller arriving before the first flight's role
// is known gets its own) still make one upstream call: their lookups offer different
// tokens, so only one of them can claim. Both lookups are held on their way to Redis, so
// that there are two flights, and let go in either order.
func TestTwoLocalFlightsOneClaim(t *testing.T) {
	srv := redistest.Start(t)
	for _, noCacheFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain looks first", true: "no-cache looks first"}[noCacheFirst], func(t *testing.T) {
			rec := newRecorder()
			lookups := &heldCommands{match: scriptCalls(lookupScript), arrived: make(chan chan struct{}, 2)}
			lookups.left.Store(2)
			o := Options{ResultTTL: time.Minute, Observer: rec, RedisTimeout: 10 * time.Second, Redis: srv.Client()}
			o.Redis.AddHook(lookups)
			g := backend{}.group(t, o)
			key := uniqueKey()
			rp := newReply("one")
			r1, _ := g.Do(key, false, rp.fn)
			plain := lookups.next(t) // its role is not known until this lookup is answered
			r2, _ := g.Do(key, true, rp.fn)
			noCache := lookups.next(t)
			g.mu.Lock()
			two := g.flights[key] != nil && g.flights[key+"\x00nocache"] != nil
			g.mu.Unlock()
			if !two {
				t.Fatal("one local flight for a no-cache caller that came before the first flight's role; want two")
			}
			first, second := plain, noCache
			if noCacheFirst {
				first, second = noCache, plain
			}
			close(first)
			rec.waitFor(t, EventRole, 1, 10*time.Second) // the first lookup decided its flight's role
			close(second)
			rec.waitFor(t, EventRole, 2, 10*time.Second)
			rp.release()
			ctx := context.Background()
			o1, o2 := readAll(ctx, r1), readAll(ctx, r2)
			if o1.body != "one" || o2.body != "one" || rp.calls.Load() != 1 {
				t.Fatalf("got %q and %q with %d calls; want one call for both", o1.body, o2.body, rp.calls.Load())
			}
			if roles := []Role{o1.role, o2.role}; !slices.Contains(roles, RoleOwner) || !slices.Contains(roles, RoleFollower) {
				t.Fatalf("roles %v; want an owner and a follower", roles)
			}
		})
	}
}

// heldCommands is a client hook that holds the first left commands match accepts, sent
// alone or in a pipeline, each until the test closes the channel it got from next.
type heldCommands struct {
	match   func(redis.Cmder) bool
	left    atomic.Int32
	arrived chan chan struct{}
}

func (h *heldCommands) hold(cmds ...redis.Cmder) {
	if slices.ContainsFunc(cmds, h.match) && h.left.Add(-1) >= 0 {
		proceed := make(chan struct{})
		h.arrived <- proceed
		<-proceed
	}
}

// next waits for the next held command and returns what lets it go.
func (h *heldCommands) next(t *testing.T) chan struct{} {
	t.Helper()
	select {
	case c := <-h.arrived:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no command held within 10s")
		return nil
	}
}

func (h *heldCommands) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.hold(cmd); return next(ctx, cmd) }
}

func (h *heldCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.hold(cmds...); return next(ctx, cmds) }
}

func TestOwnerDiesFollowerTakesOver(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{LeaseTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond, TakeoverJitter: 100 * time.Millisecond}
	a, bg := b.group(t, o), b.group(t, o)
	revive := deadOwner(a)
	defer revive()
	key := uniqueKey()

	var calls atomic.Int32
	ran := make(chan time.Time, 2)
	hang := make(chan struct{})
	defer close(hang)
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		n := calls.Add(1)
		ran <- time.Now()
		if n == 1 {
			<-hang // the dead owner never answers
			return Result{}, errors.New("dead")
		}
		return Result{Head: Head{Status: 200}, Body: []byte("second")}, nil
	}
	ra, _ := a.Do(key, false, fn)
	defer ra.Close()
	claimed := <-ran
	outs := doAll(t, bg, key, 10, fn)()
	took := (<-ran).Sub(claimed)
	for _, o := range outs {
		if o.err != nil || o.body != "second" {
			t.Fatalf("follower got (%q, %v); want second", o.body, o.err)
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("%d calls; want 2", calls.Load())
	}
	if limit := o.LeaseTTL + o.TakeoverJitter + 500*time.Millisecond; took > limit {
		t.Fatalf("takeover after %v; want within lease + jitter (+500ms slack) = %v", took, limit)
	}
	t.Logf("takeover %v after the claim (lease %v, jitter %v)", took, o.LeaseTTL, o.TakeoverJitter)
}

func TestThunderingHerd(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: 500 * time.Millisecond, HeartbeatInterval: 150 * time.Millisecond, TakeoverJitter: 300 * time.Millisecond}
	owner := b.group(t, o)
	revive := deadOwner(owner)
	defer revive()
	key := uniqueKey()
	hang := make(chan struct{})
	defer close(hang)
	started := make(chan struct{}, 1)
	ro, _ := owner.Do(key, false, func(ctx context.Context, w *Writer) (Result, error) {
		started <- struct{}{}
		<-hang
		return Result{}, errors.New("dead")
	})
	defer ro.Close()
	<-started

	var calls atomic.Int32
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		calls.Add(1)
		return Result{Head: Head{Status: 200}, Body: []byte("won")}, nil
	}
	claims := &cmdCounter{match: scriptRuns(claimScript)}
	var waits []func() []outcome
	for range 20 {
		oi := o
		rdb := srv.Client()
		rdb.AddHook(claims)
		oi.Redis = rdb
		g := New(oi)
		t.Cleanup(func() { g.Close(context.Background()) })
		waits = append(waits, doAll(t, g, key, 2, fn))
	}
	for _, w := range waits {
		for _, out := range w() {
			if out.body != "won" {
				t.Fatalf("got (%q, %v); want won", out.body, out.err)
			}
		}
	}
	if n := claims.n.Load(); calls.Load() != 1 || n < 1 || n > 20 {
		t.Fatalf("%d winners, %d claim attempts; want exactly 1 winner and 1..20 attempts", calls.Load(), n)
	}
	t.Logf("20 instances: %d claim attempts for 1 takeover", claims.n.Load())
}

// A contender saw the owner's lease run out and waits the jitter; the paused owner
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

// A follower on another instance that had already received bytes of a streamed answer
// when Redis stopped answering cannot use a call of its own: it waits for Redis as long as
// its owner's call and final write may last (Timeout, a lease and a linger; ADR 0060),
// then its caller can only end with an error, and no local call is made for it (its answer
// would be read by nobody, and stored on that instance alone).
func TestNoDegradedCallForCallersWithBytes(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{BatchDelay: time.Millisecond, ResultTTL: time.Minute, Timeout: time.Second, LeaseTTL: 600 * time.Millisecond,
		HeartbeatInterval: 200 * time.Millisecond, Linger: 400 * time.Millisecond}
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
	stopped := time.Now()
	srv.Stop()
	out := readWithin(rb, 10*time.Second)
	if out.err == nil || errors.Is(out.err, context.DeadlineExceeded) {
		t.Fatalf("follower got (%q, %v); want its stream cut short once its wait for Redis ended", out.body, out.err)
	}
	if took, bound := time.Since(stopped), o.Timeout+o.LeaseTTL+o.Linger; took < bound-o.LeaseTTL {
		t.Fatalf("follower's stream ended %v after Redis stopped; want it to wait for Redis about %v", took, bound)
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
		// Hold DoWith here until the lead has decided what to do without Redis: take the
		// flight over locally; a lead that ended the flight instead brings no takeover.
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

// failScriptBroken fails the first n runs of fail.lua as a connection that broke.
type failScriptBroken struct{ n atomic.Int64 }

func (h *failScriptBroken) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failScriptBroken) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if scriptCalls(failScript)(cmd) && h.n.Add(-1) >= 0 {
			err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset (injected)")}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *failScriptBroken) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRetryWaitsForItsOwnFailToLand: a failed attempt whose fail goes on being written past
// its client is not followed by its own leader's retry once the probe has found Redis
// back: the owner's caller gets its own call's 500, the caller waiting with it the retry's
// answer, and the retry takes the flight over once, as failed (or degraded, before the
// probe), never as expired; no read of its stream errs.
func TestRetryWaitsForItsOwnFailToLand(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	h := &failScriptBroken{}
	h.n.Store(6) // about 1.5 s of the write's tries
	c.AddHook(h)
	rec := newRecorder()
	g := backend{}.group(t, Options{Redis: c, Observer: rec, TakeoverJitter: 1200 * time.Millisecond, LeaseTTL: 4 * time.Second, HeartbeatInterval: time.Second})
	var calls atomic.Int32
	both := make(chan struct{})
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		if calls.Add(1) == 1 {
			<-both // the second caller waits with the first attempt
			return Result{Head: Head{Status: 500}, Body: []byte("boom"), Outcome: Retry}, nil
		}
		return Result{Head: Head{Status: 200}, Body: []byte("ok"), Outcome: Share}, nil
	}
	wait := doAll(t, g, uniqueKey(), 2, fn)
	close(both)
	outs := wait()
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls; want 2", n)
	}
	if o := outs[0]; o.head.Status != 500 || o.body != "boom" || o.err != nil {
		t.Errorf("the owner's caller got %d %q %v; want its own call's 500", o.head.Status, o.body, o.err)
	}
	if o := outs[1]; o.head.Status != 200 || o.body != "ok" || o.err != nil {
		t.Errorf("the caller waiting with it got %d %q %v; want the retry's 200", o.head.Status, o.body, o.err)
	}
	var reasons []string
	for _, e := range rec.eventsOf(EventTakeover) {
		reasons = append(reasons, e.Reason)
	}
	if len(reasons) != 1 || reasons[0] != "failed" && reasons[0] != "degraded" {
		t.Errorf("takeovers %q; want one, as failed or degraded", reasons)
	}
	for _, e := range rec.eventsOf(EventRedisError) {
		if e.Op == "xread" {
			t.Errorf("the retry read a stream and failed: %v", e.Err)
		}
	}
}
