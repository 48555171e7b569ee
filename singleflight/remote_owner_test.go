package singleflight

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/faultproxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

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

// restore.lua puts a lost meta back for an owner whose last lease still runs, on the
// ground that "within its lease nobody else can have owned and finished the flight".
// That holds only while a finished flight's meta outlives the rest of that lease: a meta
// lost to a restart is claimed at once by the next caller (lookup on absent), which may
// complete before the old owner's next renewal. So a finished meta lives at least a lease,
// whatever Linger (any linger ≥ 1ms is allowed): the old owner's renewal finds it, and
// neither restores its stale token nor overwrites the answer the new owner stored.
func TestStaleOwnerDoesNotRestoreOverFinishedFlight(t *testing.T) {
	srv := redistest.Start(t)
	o := Options{LeaseTTL: 3 * time.Second, HeartbeatInterval: time.Second, Linger: 200 * time.Millisecond, ResultTTL: time.Minute}
	oa := o
	renewed := &replied{match: scriptCalls(renewScript), ch: make(chan struct{}, 8)}
	oa.Redis = srv.Client()
	oa.Redis.AddHook(renewed)
	a, c := backend{}.group(t, oa), backend{redis: srv}.group(t, o)
	// a's renewals wait until c has finished the flight: the renewal that comes then is
	// the one that finds the meta gone or c's.
	hold := make(chan struct{})
	unhold := sync.OnceFunc(func() { close(hold) })
	defer unhold()
	a.hooks.beforeRenew = func(ctx context.Context) {
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}
	key := uniqueKey()
	meta := "ai:flight:meta:{" + key + "}"
	running, proceed := make(chan struct{}, 1), make(chan struct{})
	release := sync.OnceFunc(func() { close(proceed) })
	defer release()
	ra, _ := a.Do(key, false, started(running, func(ctx context.Context, w *Writer) (Result, error) {
		<-proceed
		return Result{Head: Head{Status: 200}, Body: []byte("from-a"), Outcome: Store}, nil
	}))
	<-running
	ctx := context.Background()
	rdb := srv.Client()
	aUntil, err := rdb.HGet(ctx, meta, "lease_until").Int64() // a's claim's: not renewed since
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil { // a restart without persistence
		t.Fatalf("FLUSHALL: %v", err)
	}
	rc, _ := c.Do(key, false, func(ctx context.Context, w *Writer) (Result, error) {
		return Result{Head: Head{Status: 200}, Body: []byte("from-c"), Outcome: Store}, nil
	})
	if got := readWithin(rc, 3*time.Second); got.body != "from-c" || got.role != RoleOwner {
		t.Fatalf("c got (%q, %v, %v); want to own the lost flight", got.body, got.role, got.err)
	}
	// By Redis's clock, c's finished meta lives until a's lease has run out, past c's
	// linger: whenever a's renewal comes, it finds c's meta and restores nothing.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, meta).Val(); now.UnixMilli()+ttl.Milliseconds() < aUntil {
		t.Fatalf("c's finished meta expires %v from now, %dms before a's lease ends: a could restore its token over it",
			ttl, aUntil-now.UnixMilli()-ttl.Milliseconds())
	}
	unhold()
	select {
	case <-renewed.ch: // a's renewal was answered
	case <-time.After(5 * time.Second):
		t.Fatal("a's renewal was not answered within 5s")
	}
	release()
	if got := readWithin(ra, 3*time.Second); got.err != nil || (got.body != "from-a" && got.body != "from-c") {
		t.Fatalf("a's own caller got (%q, %v); want a whole answer to its request", got.body, got.err)
	}
	if body := rdb.HGet(ctx, "ai:flight:result:{"+key+"}", "body").Val(); body != "from-c" {
		t.Fatalf("stored answer is %q, written by a's token after c owned and finished the flight; want c's %q", body, "from-c")
	}
}

// A Redis that restarts empty after being down longer than an owner's lease: the flight's
// meta is gone and the owner cannot put it back (its lease ran out: another might have
// taken the flight over and finished it meanwhile). Its call goes on for the callers in
// its process, which get its answer, and its final write is refused. A missing meta is not
// another owner's: the call is not cancelled, and no second call is made.
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

// A stream whose last event comes while Redis restarts still reaches its followers on
// other instances, whole, from the one call: the owner makes its final write again while
// its lease runs, and the restarted Redis takes it (the flight put back). One failed write
// does not end the attempt: followers elsewhere get the end of the stream, and the answer
// is stored.
func TestStreamEndingDuringARedisRestartReachesFollowers(t *testing.T) {
	srv := redistest.Start(t)
	a, other := restartPair(t, srv)
	key := uniqueKey()
	s := newStreamer(3) // its last event waits for s.hold
	ra, err := a.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	<-s.first
	rb, err := other.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	first, err := rb.Next(context.Background())
	if err != nil {
		t.Fatalf("follower's first chunk: %v", err)
	}

	endDuringRestart(t, srv, a, func() { close(s.hold) })

	want := s.transcript()
	if out := readWithin(ra, 10*time.Second); out.err != nil || out.body != want {
		t.Fatalf("owner got (%q, %v); want the whole stream", out.body, out.err)
	}
	if out := readWithin(rb, 10*time.Second); out.err != nil || string(first)+out.body != want {
		t.Fatalf("follower got (%q, %v) after %q; want the rest of the stream", out.body, out.err, first)
	}
	wantStored(t, srv, key, want, s.calls.Load())
}

// The same for a unary answer: the follower elsewhere gets it, and nobody calls again.
func TestUnaryEndingDuringARedisRestartReachesFollowers(t *testing.T) {
	srv := redistest.Start(t)
	a, other := restartPair(t, srv)
	rp, led, rb := ownAndFollow(t, a, other)

	endDuringRestart(t, srv, a, rp.release)

	for name, r := range map[string]*Reader{"owner": <-led, "follower": rb} {
		if out := readWithin(r, 10*time.Second); out.err != nil || out.body != "call 1" {
			t.Fatalf("%s got (%q, %v); want call 1", name, out.body, out.err)
		}
	}
	wantStored(t, srv, rp.key, "call 1", rp.calls.Load())
}

// restartPair is two instances of srv, their clients set up as the proxy's are, with a
// lease long enough to outlast a restart.
func restartPair(t *testing.T, srv *redistest.Server) (a, other *Group) {
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, ResultTTL: time.Minute, BatchDelay: time.Millisecond}
	oa, ob := o, o
	oa.Redis, ob.Redis = productClient(t, srv), productClient(t, srv)
	return backend{}.group(t, oa), backend{}.group(t, ob)
}

// endDuringRestart stops Redis, lets the owner's call on a end (end), and starts Redis
// again (empty) once the owner's final write has been tried and has not landed.
func endDuringRestart(t *testing.T, srv *redistest.Server, a *Group, end func()) {
	t.Helper()
	tried := finalWriteTried(a)
	srv.Stop()
	end()
	waitTried(t, tried)
	srv.Restart()
}

// finalWriteTried is closed once an owner of g has tried its first final write.
func finalWriteTried(g *Group) <-chan struct{} {
	tried := make(chan struct{})
	g.hooks.completed = once(func() { close(tried) })
	return tried
}

func waitTried(t *testing.T, tried <-chan struct{}) {
	t.Helper()
	select {
	case <-tried:
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's final write was not tried within 5s")
	}
}

// wantStored checks that the one call's answer was stored.
func wantStored(t *testing.T, srv *redistest.Server, key, want string, calls int32) {
	t.Helper()
	if calls != 1 {
		t.Fatalf("%d upstream calls; want 1", calls)
	}
	if got := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "body").Val(); got != want {
		t.Fatalf("stored answer %q; want %q", got, want)
	}
}

// A Redis that restarts with its data a moment old (an RDB snapshot, an append-only file
// synced every second) while a stream runs: the flight is there, running under the same
// token, but its last batch is lost. The owner's final write, made again once Redis
// answers, must number its done entry after the batches the owner knows landed, not the
// ones the old meta counts, so that a follower that had not applied the lost batch sees the
// gap rather than take the done entry for the next batch: it never ends with an answer
// missing its middle, and no error. The follower is held once it applied batch 1, as a slow
// process would be, and its link is cut meanwhile, so that batch 2's message is lost with
// the restart.
func TestCompleteAfterARolledBackStreamLeavesNoHole(t *testing.T) {
	srv := redistest.Start(t)
	recA := newRecorder()
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, ResultTTL: time.Minute, BatchDelay: time.Millisecond}
	oa := o
	appended := &replied{match: scriptCalls(appendScript), ch: make(chan struct{}, 8)}
	oa.Observer, oa.Redis = recA, productClient(t, srv)
	oa.Redis.AddHook(appended)
	a := backend{}.group(t, oa)
	b, link, _ := behindLink(t, srv, o)
	held, hold := make(chan struct{}), make(chan struct{})
	let := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(let) // before b's Close
	b.hooks.afterEntries = once(func() { close(held); <-hold })

	key := uniqueKey()
	step := []chan struct{}{make(chan struct{}), make(chan struct{})}
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}})
		for i := range 3 {
			if i > 0 {
				<-step[i-1]
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
		}
		return Result{Outcome: Store}, nil
	}
	ra, err := a.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	<-appended.ch // batch 1 landed, and the owner knows it
	rb, err := b.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held: // the follower applied batch 1, and goes on only when let
	case <-time.After(10 * time.Second):
		t.Fatal("the follower applied nothing within 10s")
	}
	link.Set(faultproxy.Fault{Mode: faultproxy.Cut})

	if err := srv.Client().Save(context.Background()).Err(); err != nil { // the snapshot: batch 1
		t.Fatal(err)
	}
	close(step[0])
	<-appended.ch // batch 2 landed, and the owner knows it
	tried := finalWriteTried(a)
	srv.Stop()
	close(step[1])
	waitTried(t, tried)
	srv.Restart() // loads the snapshot: the flight running, batch 2 lost
	link.Set(faultproxy.Fault{})

	owner := readWithin(ra, 10*time.Second)
	if owner.err != nil {
		t.Fatalf("owner: %v", owner.err)
	}
	recA.waitFor(t, EventFlightEnd, 1, 10*time.Second) // after its final write landed
	// The fault needs a follower that has batch 1 alone when it goes on.
	if got := b.flightBytes(key); got != "data: 0\n\n" {
		t.Fatalf("the follower held %q; want batch 1 alone", got)
	}
	let()
	// The gap makes it read the stream, whose done entry carries every byte from the last
	// batch the owner knew landed: the whole answer, not an error.
	if out := readWithin(rb, 10*time.Second); out.err != nil || out.body != owner.body {
		t.Fatalf("the follower got (%q, %v); the call answered %q", out.body, out.err, owner.body)
	}
}

// replied signals on ch each time a command that match accepts got a reply without error,
// sent alone or in a pipeline. A signal that finds ch full is dropped: the client is never
// held by its hook (a Group closing after a failed test still renews).
type replied struct {
	match func(redis.Cmder) bool
	ch    chan struct{}
}

func (h *replied) signal() {
	select {
	case h.ch <- struct{}{}:
	default:
	}
}

func (h *replied) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *replied) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.match(cmd) {
			h.signal()
		}
		return err
	}
}

func (h *replied) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if cmd.Err() == nil && h.match(cmd) {
				h.signal()
			}
		}
		return err
	}
}

// slowScript makes every run of script outlast its deadline (a write too large to land in
// time), while every other command answers.
type slowScript struct{ match func(redis.Cmder) bool }

func (h slowScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slowScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

func (h slowScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, h.match) {
			<-ctx.Done()
			return failAll(cmds, ctx.Err())
		}
		return next(ctx, cmds)
	}
}

// TestFinalWriteThatNeverLandsEndsWithItsLease: a final write that cannot land in its
// deadline, while the heartbeat's renewals do, is made again within the lease it had when
// its client was answered, not until the hard timeout: the follower elsewhere takes over
// a lease or two later.
func TestFinalWriteThatNeverLandsEndsWithItsLease(t *testing.T) {
	srv := redistest.Start(t)
	ca := srv.Client()
	ca.AddHook(slowScript{match: scriptCalls(completeScript)})
	o := Options{RedisTimeout: 100 * time.Millisecond, LeaseTTL: time.Second, HeartbeatInterval: 250 * time.Millisecond,
		Timeout: time.Minute, TakeoverJitter: 20 * time.Millisecond}
	oa := o
	oa.Redis = ca
	a := backend{}.group(t, oa)
	b := backend{redis: srv}.group(t, o)
	rp, led, follower := ownAndFollow(t, a, b)
	start := time.Now()
	rp.release()
	if out := readWithin(<-led, 5*time.Second); out.err != nil || out.body != "call 1" {
		t.Fatalf("owner got (%q, %v); want call 1 at once", out.body, out.err)
	}
	out := readWithin(follower, 10*time.Second)
	if out.err != nil || out.body != "call 1" || rp.calls.Load() != 2 {
		t.Fatalf("follower elsewhere got (%q, %v) after %v, %d calls; want the answer of a call of its own", out.body, out.err, time.Since(start), rp.calls.Load())
	}
	if took := time.Since(start); took > 4*o.LeaseTTL {
		t.Fatalf("follower elsewhere answered after %v; want within a few leases of the owner's end", took)
	}
}

// A stream whose last event comes while Redis hangs, for longer than the lease, for every
// instance: the owner's client gets its answer at once, its final write goes on past the
// lease until Redis answers, and a follower elsewhere that had bytes of it waits for Redis
// rather than end its stream: it gets the whole answer, from the one call (ADR 0060).
func TestStreamEndingWhileRedisHangsPastTheLeaseReachesFollowersWithBytes(t *testing.T) {
	srv := redistest.Start(t)
	a, linkA, confirmedA := behindLink(t, srv, outageOpts)
	f, linkF, confirmedF := behindLink(t, srv, outageOpts)
	key := uniqueKey()
	s := newStreamer(3)
	ra, err := a.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	<-s.first
	rf, err := f.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	sf := readStream(context.Background(), rf)
	<-sf.first

	for _, l := range []*faultproxy.Proxy{linkA, linkF} {
		l.Set(faultproxy.Fault{Mode: faultproxy.Hang})
	}
	findsHanging(t, a, key, confirmedA)
	findsHanging(t, f, key, confirmedF)
	close(s.hold)
	if out := readWithin(ra, outageOpts.RedisTimeout+time.Second); out.err != nil || out.body != s.transcript() {
		t.Fatalf("owner got (%q, %v); want the whole stream at once, Redis or not", out.body, out.err)
	}
	time.Sleep(2 * outageOpts.LeaseTTL) // the fault itself: Redis out of reach past the lease
	stillStreaming(t, "follower", sf)
	for _, l := range []*faultproxy.Proxy{linkA, linkF} {
		l.Set(faultproxy.Fault{})
	}
	wantWhole(t, "follower", sf, s.transcript())
	wantStored(t, srv, key, s.transcript(), s.calls.Load())
}

// ownedUnary starts a unary flight of a new key on g, answering "call 1" once released,
// and waits until its owner function runs.
func ownedUnary(t *testing.T, g *Group) (rp *reply, key string, owner *Reader) {
	t.Helper()
	rp, key = newReply("call 1"), uniqueKey()
	running := make(chan struct{}, 1)
	owner, err := g.Do(key, false, started(running, rp.fn))
	if err != nil {
		t.Fatal(err)
	}
	<-running
	return rp, key, owner
}

// A final write made past the lease is fenced by its token: an instance that took the
// flight over meanwhile keeps it, its answer is the one stored, and the late write changes
// nothing (ADRs 0002, 0060).
func TestLateFinalWriteIsFencedByATakeover(t *testing.T) {
	srv := redistest.Start(t)
	rec := newRecorder()
	oa := outageOpts
	oa.Observer = rec
	a, link, confirmed := behindLink(t, srv, oa)
	c := backend{redis: srv}.group(t, outageOpts)
	rp, key, ra := ownedUnary(t, a)

	link.Set(faultproxy.Fault{Mode: faultproxy.Hang})
	findsHanging(t, a, key, confirmed)
	rp.release()
	if out := readWithin(ra, outageOpts.RedisTimeout+time.Second); out.err != nil || out.body != "call 1" {
		t.Fatalf("owner got (%q, %v); want call 1 at once", out.body, out.err)
	}
	// A's lease runs out in Redis: a caller on C takes the flight over.
	second := newReply("call 2")
	second.release()
	rc, err := c.Do(key, false, second.fn)
	if err != nil {
		t.Fatal(err)
	}
	if out := readWithin(rc, 10*time.Second); out.err != nil || out.body != "call 2" {
		t.Fatalf("caller on C got (%q, %v); want call 2, its own instance's takeover", out.body, out.err)
	}
	link.Set(faultproxy.Fault{})
	rec.waitMatch(t, "A's late final write fenced", func(e Event) bool {
		return e.Kind == EventFencedWrite && e.Op == "complete" && e.Err == nil
	}, 10*time.Second)
	if got := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "body").Val(); got != "call 2" {
		t.Fatalf("stored answer %q; want call 2, the new owner's", got)
	}
}

// A final write made past the lease does not put back a flight Redis lost: past its lease
// another owner may have run and ended it, so restore.lua refuses, and the write is
// dropped (ADRs 0010, 0060).
func TestLateFinalWriteDoesNotRestoreALostFlight(t *testing.T) {
	srv := redistest.Start(t)
	rec := newRecorder()
	oa := outageOpts
	oa.Observer = rec
	a, link, confirmed := behindLink(t, srv, oa)
	rp, key, ra := ownedUnary(t, a)

	link.Set(faultproxy.Fault{Mode: faultproxy.Hang})
	findsHanging(t, a, key, confirmed)
	rp.release()
	if out := readWithin(ra, outageOpts.RedisTimeout+time.Second); out.err != nil || out.body != "call 1" {
		t.Fatalf("owner got (%q, %v); want call 1 at once", out.body, out.err)
	}
	k := a.rem().keys(key)
	if err := srv.Client().Del(context.Background(), k.meta, k.stream).Err(); err != nil { // lost, as by a restart
		t.Fatal(err)
	}
	time.Sleep(2 * outageOpts.LeaseTTL) // the fault itself: A cut off past its lease
	link.Set(faultproxy.Fault{})
	rec.waitMatch(t, "A's late final write finding the flight gone", func(e Event) bool {
		return e.Kind == EventFencedWrite && e.Op == "complete" && errors.Is(e.Err, ErrFlightGone)
	}, 10*time.Second)
	if n := srv.Client().Exists(context.Background(), k.meta, k.stream, k.result).Val(); n != 0 {
		t.Fatalf("%d of the flight's keys exist after the late write; want none: a lost flight is not put back past its lease", n)
	}
}

// A final write sent while Redis hangs for its instance, with no other command out to
// suspect the shard, that times out after its lease ran out: the shard's verdict is in by
// the write's deadline, so the write goes on while the shard is degraded, and the answer is
// stored once Redis answers, though the timed-out command itself never gets there (its
// connection is cut, as a load balancer or conntrack would). A final write of 1 MiB or more,
// which goes alone, is watched the same way (ADRs 0056, 0060).
func TestFinalWriteTimingOutPastItsLeaseGoesOn(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{{"shared pipeline", 0}, {"large write alone", largeWrite}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			a, link, confirmed := behindLink(t, srv, outageOpts)
			t.Cleanup(deadOwner(a)) // no renewal: the lease runs out a lease after the claim
			key, body := uniqueKey(), "call 1"+strings.Repeat(" ", tc.size)
			rp := newReply(body)
			running := make(chan struct{}, 1)
			ra, err := a.Do(key, false, started(running, rp.fn))
			if err != nil {
				t.Fatal(err)
			}
			<-running
			// The claim was sent before the call began: the lease ends within half a deadline
			// of the write being sent, while the write waits for Redis.
			time.Sleep(outageOpts.LeaseTTL - outageOpts.RedisTimeout/2)
			link.Set(faultproxy.Fault{Mode: faultproxy.Hang})
			rp.release()
			if out := readWithin(ra, 2*outageOpts.RedisTimeout+time.Second); out.err != nil || out.body != body {
				t.Fatalf("owner got (%.20q, %v); want its answer within the write's deadline", out.body, out.err)
			}
			pingUnanswered(t, confirmed)
			link.Set(faultproxy.Fault{Mode: faultproxy.Cut}) // the held write is lost with its connection
			link.Set(faultproxy.Fault{})
			k := a.rem().keys(key)
			waitCond(t, 10*time.Second, "the answer stored once Redis answers", func() bool {
				return srv.Client().HGet(context.Background(), k.result, "body").Val() == body
			})
			if n := rp.calls.Load(); n != 1 {
				t.Fatalf("%d upstream calls; want 1", n)
			}
		})
	}
}
